#include "backend.hpp"

#include <Python.h>
#include <c10/util/Exception.h>

#include <cstring>
#include <map>
#include <mutex>
#include <numeric>
#include <random>

#include "start.hpp"
#include "tensors.hpp"
#include "work.hpp"

namespace loom_torch {
namespace {

// The key rank 0 publishes Loom's rendezvous id under (in the group's PrefixStore).
constexpr const char* kIdKey = "loom_unique_id";

using OpType = c10d::OpType;
using WorkPtr = c10::intrusive_ptr<c10d::Work>;

// A finisher copying `staged` back into `t` when they are different tensors (non-contiguous `t`).
std::function<void()> copyBack(const at::Tensor& t, const at::Tensor& staged) {
  if (staged.is_same(t)) return {};
  return [t, staged]() mutable { t.copy_(staged); };
}

// One contiguous flat tensor holding `tensors` one after another.
at::Tensor flatten(const std::vector<at::Tensor>& tensors) {
  std::vector<at::Tensor> flat;
  flat.reserve(tensors.size());
  for (const auto& t : tensors) flat.push_back(t.reshape({-1}));
  return at::cat(flat);
}

// Copies consecutive pieces of `flat` into `tensors` (the inverse of flatten).
void unflatten(const at::Tensor& flat, std::vector<at::Tensor>& tensors) {
  int64_t offset = 0;
  for (auto& t : tensors) {
    t.copy_(flat.narrow(0, offset, t.numel()).view(t.sizes()));
    offset += t.numel();
  }
}

void checkRank(int rank, int size, const char* what, const char* op) {
  TORCH_CHECK(rank >= 0 && rank < size, "loom: ", op, ": ", what, " ", rank, " is out of range (world size ", size,
              ")");
}

// A group's Loom options: its timeout for joining and for every operation.
loom::Options groupOptions(std::chrono::milliseconds timeout) {
  loom::Options options;
  options.timeout = timeout;
  options.initTimeout = timeout;
  options.name = "torch";
  return options;
}

void checkTag(int tag, const char* op) {
  TORCH_CHECK(tag >= 0, "loom: ", op, ": tag ", tag, " is negative (tags are 0 to 2^31-1)");
}

}  // namespace

ProcessGroupLoom::ProcessGroupLoom(const c10::intrusive_ptr<c10d::Store>& store, int rank, int size,
                                   std::chrono::milliseconds timeout, std::shared_ptr<loom::Communicator> shared)
    : BackendBase(rank, size), comm_(std::move(shared)), store_(store), timeout_(timeout) {
  TORCH_CHECK(store, "loom: init_process_group gave no store");
  if (comm_) return;
  loom::UniqueId id;
  if (rank == 0) {
    id = loom::UniqueId::create();
    const auto& b = id.bytes();
    store->set(kIdKey, std::vector<uint8_t>(b.begin(), b.end()));
  } else {
    const std::vector<uint8_t> b = store->get(kIdKey);  // waits, up to the store's timeout
    id = loom::UniqueId::fromBytes(b.data(), b.size());
  }
  const loom::Options options = groupOptions(timeout);
  comm_ = std::make_shared<loom::Communicator>(rank, size, id, options);
}

ProcessGroupLoom::~ProcessGroupLoom() {
  // Python drops the last reference with the GIL held. Closing the communicator waits for Loom's
  // threads, and those may need the GIL for a moment (a completion releasing the last reference to
  // a tensor that has a Python object): let them have it meanwhile.
  if (Py_IsInitialized() && PyGILState_Check()) {
    PyThreadState* state = PyEval_SaveThread();
    comm_.reset();
    PyEval_RestoreThread(state);
  } else {
    comm_.reset();
  }
}

WorkPtr ProcessGroupLoom::broadcast(std::vector<at::Tensor>& tensors, const c10d::BroadcastOptions& opts) {
  at::Tensor& t = single(tensors, "broadcast");
  checkRank(static_cast<int>(opts.rootRank), getSize(), "root rank", "broadcast");
  TORCH_CHECK(opts.rootTensor == 0, "loom: broadcast: root tensor ", opts.rootTensor, " (one tensor per process)");
  at::Tensor buf = contiguousView(t);
  return start(*this, OpType::BROADCAST, "loom:broadcast", tensors,
               [&](void* stream) {
                 return comm_->ibroadcast(buf.data_ptr(), buf.data_ptr(), bytesOf(buf), loom::DataType::Uint8,
                                          static_cast<int>(opts.rootRank), stream);
               },
               copyBack(t, buf), {buf});
}

WorkPtr ProcessGroupLoom::allreduce(std::vector<at::Tensor>& tensors, const c10d::AllreduceOptions& opts) {
  if (tensors.size() == 1 && tensors[0].is_sparse()) return sparseAllreduce(tensors, opts);
  at::Tensor& t = single(tensors, "allreduce");
  const loom::DataType type = reduceType(t.scalar_type(), "allreduce");
  const loom::ReduceOp op = reduceOp(opts.reduceOp, t.scalar_type(), "allreduce");
  at::Tensor buf = contiguousView(t);
  return start(*this, OpType::ALLREDUCE, "loom:all_reduce", tensors,
               [&](void* stream) {
                 return comm_->iallReduce(buf.data_ptr(), buf.data_ptr(), static_cast<size_t>(buf.numel()), type, op,
                                          stream);
               },
               copyBack(t, buf), {buf});
}

WorkPtr ProcessGroupLoom::allreduce_coalesced(std::vector<at::Tensor>& tensors,
                                              const c10d::AllreduceCoalescedOptions& opts) {
  TORCH_CHECK(!tensors.empty(), "loom: allreduce_coalesced: no tensors");
  for (const auto& t : tensors) {
    checkTensor(t, "allreduce_coalesced");
    TORCH_CHECK(t.scalar_type() == tensors[0].scalar_type(), "loom: allreduce_coalesced: tensors of dtypes ",
                tensors[0].scalar_type(), " and ", t.scalar_type(), " (one dtype per call)");
  }
  const loom::DataType type = reduceType(tensors[0].scalar_type(), "allreduce_coalesced");
  const loom::ReduceOp op = reduceOp(opts.reduceOp, tensors[0].scalar_type(), "allreduce_coalesced");
  at::Tensor flat = flatten(tensors);
  return start(
      *this, OpType::ALLREDUCE_COALESCED, "loom:all_reduce_coalesced", tensors,
      [&](void* stream) {
        return comm_->iallReduce(flat.data_ptr(), flat.data_ptr(), static_cast<size_t>(flat.numel()), type, op, stream);
      },
      [flat, tensors]() mutable { unflatten(flat, tensors); }, {flat});
}

WorkPtr ProcessGroupLoom::reduce(std::vector<at::Tensor>& tensors, const c10d::ReduceOptions& opts) {
  at::Tensor& t = single(tensors, "reduce");
  checkRank(static_cast<int>(opts.rootRank), getSize(), "root rank", "reduce");
  const loom::DataType type = reduceType(t.scalar_type(), "reduce");
  const loom::ReduceOp op = reduceOp(opts.reduceOp, t.scalar_type(), "reduce");
  at::Tensor buf = contiguousView(t);
  return start(*this, OpType::REDUCE, "loom:reduce", tensors,
               [&](void* stream) {
                 return comm_->ireduce(buf.data_ptr(), buf.data_ptr(), static_cast<size_t>(buf.numel()), type, op,
                                       static_cast<int>(opts.rootRank), stream);
               },
               copyBack(t, buf), {buf});
}

WorkPtr ProcessGroupLoom::allgather(std::vector<std::vector<at::Tensor>>& outputTensors,
                                    std::vector<at::Tensor>& inputTensors, const c10d::AllgatherOptions&) {
  at::Tensor& in = single(inputTensors, "allgather");
  TORCH_CHECK(outputTensors.size() == 1, "loom: allgather: expects one output list, got ", outputTensors.size());
  std::vector<at::Tensor>& outs = outputTensors[0];
  TORCH_CHECK(static_cast<int>(outs.size()) == getSize(), "loom: allgather: expects ", getSize(),
              " output tensors (one per rank), got ", outs.size());
  checkSameShape(outs, in, "allgather");
  at::Tensor src = contiguousView(in);
  at::Tensor flat = at::empty({static_cast<int64_t>(getSize()) * in.numel()}, in.options());
  return start(
      *this, OpType::ALLGATHER, "loom:all_gather", outs,
      [&](void* stream) {
        return comm_->iallGather(src.data_ptr(), flat.data_ptr(), bytesOf(src), loom::DataType::Uint8, stream);
      },
      [flat, outs]() mutable { unflatten(flat, outs); }, {src, flat});
}

WorkPtr ProcessGroupLoom::_allgather_base(at::Tensor& outputBuffer, at::Tensor& inputBuffer,
                                          const c10d::AllgatherOptions&) {
  checkTensor(inputBuffer, "_allgather_base");
  checkTensor(outputBuffer, "_allgather_base");
  TORCH_CHECK(outputBuffer.scalar_type() == inputBuffer.scalar_type(), "loom: _allgather_base: output dtype ",
              outputBuffer.scalar_type(), " differs from input dtype ", inputBuffer.scalar_type());
  TORCH_CHECK(outputBuffer.numel() == inputBuffer.numel() * getSize(), "loom: _allgather_base: output has ",
              outputBuffer.numel(), " elements, expected ", inputBuffer.numel(), " x ", getSize(), " ranks");
  at::Tensor src = contiguousView(inputBuffer);
  at::Tensor dst = contiguousView(outputBuffer);
  return start(*this, OpType::_ALLGATHER_BASE, "loom:all_gather_base", {outputBuffer},
               [&](void* stream) {
                 return comm_->iallGather(src.data_ptr(), dst.data_ptr(), bytesOf(src), loom::DataType::Uint8, stream);
               },
               copyBack(outputBuffer, dst), {src, dst});
}

WorkPtr ProcessGroupLoom::allgather_coalesced(std::vector<std::vector<at::Tensor>>& outputLists,
                                              std::vector<at::Tensor>& inputs, const c10d::AllgatherOptions&) {
  TORCH_CHECK(!inputs.empty(), "loom: allgather_coalesced: requires a non-empty input tensor list");
  const int size = getSize();
  TORCH_CHECK(static_cast<int>(outputLists.size()) == size, "loom: allgather_coalesced: expects ", size,
              " output lists (one per rank), got ", outputLists.size());
  for (const auto& t : inputs) checkTensor(t, "allgather_coalesced");
  std::vector<at::Tensor> outs;
  for (size_t r = 0; r < outputLists.size(); ++r) {
    TORCH_CHECK(outputLists[r].size() == inputs.size(), "loom: allgather_coalesced: output list ", r, " has ",
                outputLists[r].size(), " tensors, the input list ", inputs.size());
    for (size_t i = 0; i < inputs.size(); ++i) {
      const at::Tensor& o = outputLists[r][i];
      checkTensor(o, "allgather_coalesced");
      TORCH_CHECK(o.sizes().equals(inputs[i].sizes()), "loom: allgather_coalesced: output tensor ", i, " of list ", r,
                  " has size ", o.sizes(), ", input tensor ", i, " ", inputs[i].sizes());
      TORCH_CHECK(o.scalar_type() == inputs[i].scalar_type(), "loom: allgather_coalesced: output tensor ", i,
                  " of list ", r, " is ", o.scalar_type(), ", input tensor ", i, " ", inputs[i].scalar_type());
      outs.push_back(o);
    }
  }
  // One all-gather moves every input's bytes.
  PackedBytes packed = packBytes(inputs);
  at::Tensor flat = packed.block;
  const int64_t block = flat.numel();
  at::Tensor all = at::empty({block * size}, flat.options());
  auto finisher = [all, size, packed, outputLists]() mutable {
    for (size_t i = 0; i < packed.widths.size(); ++i) {
      at::Tensor each = unpackFromEveryRank(all, size, packed, i, outputLists[0][i]);
      for (size_t r = 0; r < outputLists.size(); ++r) outputLists[r][i].copy_(each[static_cast<int64_t>(r)]);
    }
  };
  return start(*this, OpType::ALLGATHER_COALESCED, "loom:all_gather_coalesced", outs,
               [&](void* stream) {
                 return comm_->iallGather(flat.data_ptr(), all.data_ptr(), static_cast<size_t>(block),
                                          loom::DataType::Uint8, stream);
               },
               std::move(finisher), {flat, all});
}

WorkPtr ProcessGroupLoom::reduce_scatter(std::vector<at::Tensor>& outputTensors,
                                         std::vector<std::vector<at::Tensor>>& inputTensors,
                                         const c10d::ReduceScatterOptions& opts) {
  at::Tensor& out = single(outputTensors, "reduce_scatter");
  TORCH_CHECK(inputTensors.size() == 1, "loom: reduce_scatter: expects one input list, got ", inputTensors.size());
  TORCH_CHECK(static_cast<int>(inputTensors[0].size()) == getSize(), "loom: reduce_scatter: expects ", getSize(),
              " input tensors (one per rank), got ", inputTensors[0].size());
  checkSameShape(inputTensors[0], out, "reduce_scatter");
  const loom::DataType type = reduceType(out.scalar_type(), "reduce_scatter");
  const loom::ReduceOp op = reduceOp(opts.reduceOp, out.scalar_type(), "reduce_scatter");
  at::Tensor flat = flatten(inputTensors[0]);
  at::Tensor dst = contiguousView(out);
  return start(*this, OpType::REDUCE_SCATTER, "loom:reduce_scatter", outputTensors,
               [&](void* stream) {
                 return comm_->ireduceScatter(flat.data_ptr(), dst.data_ptr(), static_cast<size_t>(dst.numel()), type,
                                              op, stream);
               },
               copyBack(out, dst), {flat, dst});
}

WorkPtr ProcessGroupLoom::_reduce_scatter_base(at::Tensor& outputBuffer, at::Tensor& inputBuffer,
                                               const c10d::ReduceScatterOptions& opts) {
  checkTensor(inputBuffer, "_reduce_scatter_base");
  checkTensor(outputBuffer, "_reduce_scatter_base");
  TORCH_CHECK(outputBuffer.scalar_type() == inputBuffer.scalar_type(), "loom: _reduce_scatter_base: output dtype ",
              outputBuffer.scalar_type(), " differs from input dtype ", inputBuffer.scalar_type());
  TORCH_CHECK(inputBuffer.numel() == outputBuffer.numel() * getSize(), "loom: _reduce_scatter_base: input has ",
              inputBuffer.numel(), " elements, expected ", outputBuffer.numel(), " x ", getSize(), " ranks");
  const loom::DataType type = reduceType(outputBuffer.scalar_type(), "_reduce_scatter_base");
  const loom::ReduceOp op = reduceOp(opts.reduceOp, outputBuffer.scalar_type(), "_reduce_scatter_base");
  at::Tensor src = contiguousView(inputBuffer);
  at::Tensor dst = contiguousView(outputBuffer);
  return start(*this, OpType::_REDUCE_SCATTER_BASE, "loom:reduce_scatter_base", {outputBuffer},
               [&](void* stream) {
                 return comm_->ireduceScatter(src.data_ptr(), dst.data_ptr(), static_cast<size_t>(dst.numel()), type,
                                              op, stream);
               },
               copyBack(outputBuffer, dst), {src, dst});
}

WorkPtr ProcessGroupLoom::gather(std::vector<std::vector<at::Tensor>>& outputTensors,
                                 std::vector<at::Tensor>& inputTensors, const c10d::GatherOptions& opts) {
  at::Tensor& in = single(inputTensors, "gather");
  const int size = getSize(), root = static_cast<int>(opts.rootRank), me = getRank();
  checkRank(root, size, "root rank", "gather");
  std::vector<at::Tensor> outs;
  if (me == root) {
    TORCH_CHECK(outputTensors.size() == 1 && static_cast<int>(outputTensors[0].size()) == size,
                "loom: gather: the root expects one list of ", size, " output tensors (one per rank)");
    outs = outputTensors[0];
    checkSameShape(outs, in, "gather");
  } else {
    TORCH_CHECK(outputTensors.empty() || (outputTensors.size() == 1 && outputTensors[0].empty()),
                "loom: gather: only the root rank takes output tensors");
  }
  // Loom's gather: every rank's block to the root, which links its peers and no one else.
  const size_t bytes = bytesOf(in);
  at::Tensor src = contiguousView(in);
  at::Tensor flat = at::empty({me == root ? static_cast<int64_t>(size) * in.numel() : 0}, in.options());
  std::function<void()> finisher;
  if (me == root) finisher = [flat, outs]() mutable { unflatten(flat, outs); };
  return start(*this, OpType::GATHER, "loom:gather", outs,
               [&](void* stream) {
                 return comm_->igather(src.data_ptr(), me == root ? flat.data_ptr() : nullptr, bytes,
                                       loom::DataType::Uint8, root, stream);
               },
               std::move(finisher), {src, flat});
}

WorkPtr ProcessGroupLoom::scatter(std::vector<at::Tensor>& outputTensors,
                                  std::vector<std::vector<at::Tensor>>& inputTensors,
                                  const c10d::ScatterOptions& opts) {
  at::Tensor& out = single(outputTensors, "scatter");
  const int size = getSize(), root = static_cast<int>(opts.rootRank), me = getRank();
  checkRank(root, size, "root rank", "scatter");
  at::Tensor flat = at::empty({0}, out.options());
  if (me == root) {
    TORCH_CHECK(inputTensors.size() == 1 && static_cast<int>(inputTensors[0].size()) == size,
                "loom: scatter: the root expects one list of ", size, " input tensors (one per rank)");
    checkSameShape(inputTensors[0], out, "scatter");
    flat = flatten(inputTensors[0]);
  } else {
    TORCH_CHECK(inputTensors.empty() || (inputTensors.size() == 1 && inputTensors[0].empty()),
                "loom: scatter: only the root rank takes input tensors");
  }
  // Loom's scatter: the root sends each rank its block, linking its peers and no one else.
  const size_t bytes = bytesOf(out);
  at::Tensor dst = contiguousView(out);
  return start(*this, OpType::SCATTER, "loom:scatter", outputTensors,
               [&](void* stream) {
                 return comm_->iscatter(me == root ? flat.data_ptr() : nullptr, dst.data_ptr(), bytes,
                                        loom::DataType::Uint8, root, stream);
               },
               copyBack(out, dst), {flat, dst});
}

namespace {

// Byte counts and displacements of an all-to-all's blocks along dimension 0 of `t`: `splits` rows
// per rank, or equal shares when `splits` is empty.
void blocksOf(const at::Tensor& t, const std::vector<int64_t>& splits, int size, const char* side,
              std::vector<size_t>& counts, std::vector<size_t>& displs) {
  const int64_t rows = t.dim() == 0 ? 1 : t.size(0);
  const size_t rowBytes = rows == 0 ? 0 : bytesOf(t) / static_cast<size_t>(rows);
  std::vector<int64_t> s = splits;
  if (s.empty()) {
    TORCH_CHECK(rows % size == 0, "loom: alltoall_base: ", side, " has ", rows, " rows, not divisible by ", size,
                " ranks (pass split sizes)");
    s.assign(static_cast<size_t>(size), rows / size);
  }
  TORCH_CHECK(static_cast<int>(s.size()) == size, "loom: alltoall_base: ", s.size(), " ", side, " split sizes for ",
              size, " ranks");
  int64_t total = 0;
  for (int64_t v : s) {
    TORCH_CHECK(v >= 0, "loom: alltoall_base: negative ", side, " split size ", v);
    total += v;
  }
  TORCH_CHECK(total == rows, "loom: alltoall_base: ", side, " split sizes add up to ", total, " rows, the tensor has ",
              rows);
  counts.resize(s.size());
  displs.resize(s.size());
  size_t offset = 0;
  for (size_t i = 0; i < s.size(); ++i) {
    counts[i] = static_cast<size_t>(s[i]) * rowBytes;
    displs[i] = offset;
    offset += counts[i];
  }
}

}  // namespace

WorkPtr ProcessGroupLoom::alltoall_base(at::Tensor& outputBuffer, at::Tensor& inputBuffer,
                                        std::vector<int64_t>& outputSplitSizes, std::vector<int64_t>& inputSplitSizes,
                                        const c10d::AllToAllOptions&) {
  checkTensor(inputBuffer, "alltoall_base");
  checkTensor(outputBuffer, "alltoall_base");
  TORCH_CHECK(outputBuffer.scalar_type() == inputBuffer.scalar_type(), "loom: alltoall_base: output dtype ",
              outputBuffer.scalar_type(), " differs from input dtype ", inputBuffer.scalar_type());
  at::Tensor src = contiguousView(inputBuffer);
  at::Tensor dst = contiguousView(outputBuffer);
  const int size = getSize();
  if (outputSplitSizes.empty() && inputSplitSizes.empty()) {
    TORCH_CHECK(inputBuffer.numel() == outputBuffer.numel() && inputBuffer.numel() % size == 0,
                "loom: alltoall_base: input and output need the same number of elements, divisible by ", size,
                " ranks; got ", inputBuffer.numel(), " and ", outputBuffer.numel());
    return start(*this, OpType::ALLTOALL_BASE, "loom:all_to_all", {outputBuffer},
                 [&](void* stream) {
                   return comm_->iallToAll(src.data_ptr(), dst.data_ptr(), bytesOf(src) / static_cast<size_t>(size),
                                           loom::DataType::Uint8, stream);
                 },
                 copyBack(outputBuffer, dst), {src, dst});
  }
  std::vector<size_t> sendCounts, sendDispls, recvCounts, recvDispls;
  blocksOf(src, inputSplitSizes, size, "input", sendCounts, sendDispls);
  blocksOf(dst, outputSplitSizes, size, "output", recvCounts, recvDispls);
  return start(*this, OpType::ALLTOALL_BASE, "loom:all_to_all_v", {outputBuffer},
               [&](void* stream) {
                 return comm_->iallToAllv(src.data_ptr(), sendCounts, sendDispls, dst.data_ptr(), recvCounts,
                                          recvDispls, loom::DataType::Uint8, stream);
               },
               copyBack(outputBuffer, dst), {src, dst});
}

WorkPtr ProcessGroupLoom::alltoall(std::vector<at::Tensor>& outputTensors, std::vector<at::Tensor>& inputTensors,
                                   const c10d::AllToAllOptions&) {
  const int size = getSize();
  TORCH_CHECK(static_cast<int>(inputTensors.size()) == size && static_cast<int>(outputTensors.size()) == size,
              "loom: alltoall: expects ", size, " input and output tensors (one per rank), got ", inputTensors.size(),
              " and ", outputTensors.size());
  std::vector<size_t> sendCounts(size), sendDispls(size), recvCounts(size), recvDispls(size);
  size_t sendOffset = 0, recvOffset = 0;
  for (int i = 0; i < size; ++i) {
    checkTensor(inputTensors[i], "alltoall");
    checkTensor(outputTensors[i], "alltoall");
    TORCH_CHECK(inputTensors[i].scalar_type() == inputTensors[0].scalar_type() &&
                    outputTensors[i].scalar_type() == inputTensors[0].scalar_type(),
                "loom: alltoall: every tensor needs the dtype ", inputTensors[0].scalar_type());
    sendCounts[i] = bytesOf(inputTensors[i]);
    sendDispls[i] = sendOffset;
    sendOffset += sendCounts[i];
    recvCounts[i] = bytesOf(outputTensors[i]);
    recvDispls[i] = recvOffset;
    recvOffset += recvCounts[i];
  }
  at::Tensor src = flatten(inputTensors);
  int64_t outElems = 0;
  for (const auto& t : outputTensors) outElems += t.numel();
  at::Tensor dst = at::empty({outElems}, inputTensors[0].options());
  return start(
      *this, OpType::ALLTOALL, "loom:all_to_all_v", outputTensors,
      [&](void* stream) {
        return comm_->iallToAllv(src.data_ptr(), sendCounts, sendDispls, dst.data_ptr(), recvCounts, recvDispls,
                                 loom::DataType::Uint8, stream);
      },
      [dst, outs = outputTensors]() mutable { unflatten(dst, outs); }, {src, dst});
}

WorkPtr ProcessGroupLoom::send(std::vector<at::Tensor>& tensors, int dstRank, int tag) {
  at::Tensor& t = single(tensors, "send");
  checkRank(dstRank, getSize(), "destination rank", "send");
  checkTag(tag, "send");
  at::Tensor buf = contiguousView(t);
  if (coalescing_)
    return coalesce(OpType::SEND, "loom:send",
                    {true, buf.data_ptr(), bytesOf(buf), loom::DataType::Uint8, dstRank, static_cast<uint32_t>(tag)}, t,
                    buf);
  return start(*this, OpType::SEND, "loom:send", tensors,
               [&](void* stream) {
                 return comm_->isend(buf.data_ptr(), bytesOf(buf), loom::DataType::Uint8, dstRank,
                                     static_cast<uint32_t>(tag), stream);
               },
               {}, {buf});
}

WorkPtr ProcessGroupLoom::recv(std::vector<at::Tensor>& tensors, int srcRank, int tag) {
  at::Tensor& t = single(tensors, "recv");
  checkRank(srcRank, getSize(), "source rank", "recv");
  checkTag(tag, "recv");
  at::Tensor buf = contiguousView(t);
  if (coalescing_)
    return coalesce(OpType::RECV, "loom:recv",
                    {false, buf.data_ptr(), bytesOf(buf), loom::DataType::Uint8, srcRank, static_cast<uint32_t>(tag)},
                    t, buf);
  return start(
      *this, OpType::RECV, "loom:recv", tensors,
      [&](void* stream) {
        return comm_->irecv(buf.data_ptr(), bytesOf(buf), loom::DataType::Uint8, srcRank, static_cast<uint32_t>(tag),
                            stream);
      },
      copyBack(t, buf), {buf}, bytesOf(buf));
}

WorkPtr ProcessGroupLoom::recvAnysource(std::vector<at::Tensor>& tensors, int tag) {
  at::Tensor& t = single(tensors, "recv");
  checkTag(tag, "recv");
  at::Tensor buf = contiguousView(t);
  if (coalescing_)
    return coalesce(
        OpType::RECVANYSOURCE, "loom:recvAnySource",
        {false, buf.data_ptr(), bytesOf(buf), loom::DataType::Uint8, loom::kAnySource, static_cast<uint32_t>(tag)}, t,
        buf);
  return start(
      *this, OpType::RECVANYSOURCE, "loom:recvAnySource", tensors,
      [&](void* stream) {
        return comm_->irecv(buf.data_ptr(), bytesOf(buf), loom::DataType::Uint8, loom::kAnySource,
                            static_cast<uint32_t>(tag), stream);
      },
      copyBack(t, buf), {buf}, bytesOf(buf));
}

WorkPtr ProcessGroupLoom::coalesce(OpType type, const char* title, const loom::PointToPoint& op,
                                   const at::Tensor& tensor, const at::Tensor& buf) {
  auto work = c10::make_intrusive<LoomWork>(getRank(), type, title, std::vector<at::Tensor>{tensor});
  pending_.push_back({op, tensor, buf, work});
  return work;
}

WorkPtr ProcessGroupLoom::barrier(const c10d::BarrierOptions&) {
  return start(*this, OpType::BARRIER, "loom:barrier", {}, [&](void*) { return comm_->ibarrier(); });
}

void ProcessGroupLoom::monitoredBarrier(const c10d::BarrierOptions& opts, bool waitAllRanks) {
  const std::chrono::milliseconds timeout = opts.timeout == c10d::kUnsetTimeout ? timeout_ : opts.timeout;
  countCollective();
  try {
    comm_->monitoredBarrier(timeout, waitAllRanks);
  } catch (const loom::Error& e) {
    TORCH_CHECK(false, e.what());
  }
}

void ProcessGroupLoom::setSequenceNumberForGroup() {
  // Rank 0's value, as Gloo agrees on one; the others read it from the store.
  constexpr const char* kKey = "loom_seq_num";
  uint64_t start = 0;
  if (getRank() == 0) {
    start = static_cast<uint64_t>(std::random_device{}()) + 1;
    std::vector<uint8_t> v(sizeof start);
    std::memcpy(v.data(), &start, sizeof start);
    store_->set(kKey, v);
  } else {
    const std::vector<uint8_t> v = store_->get(kKey);
    TORCH_CHECK(v.size() == sizeof start, "loom: the group's sequence number in the store has ", v.size(), " bytes");
    std::memcpy(&start, v.data(), sizeof start);
  }
  seqBase_ = start - calls_.load();
}

uint64_t ProcessGroupLoom::getSequenceNumberForGroup() { return seqBase_.load() + calls_.load(); }

c10::intrusive_ptr<BackendBase> createProcessGroupLoom(const c10::intrusive_ptr<c10d::Store>& store, int rank, int size,
                                                       std::chrono::milliseconds timeout, const std::string& groupId,
                                                       const c10::intrusive_ptr<BackendBase>& parent,
                                                       const std::vector<int64_t>& globalRanks) {
  static std::mutex mu;
  static std::map<std::string, std::weak_ptr<loom::Communicator>> groups;
  const std::string key = groupId + "/" + std::to_string(rank) + "/" + std::to_string(size);
  std::shared_ptr<loom::Communicator> comm;
  if (!groupId.empty()) {
    std::lock_guard<std::mutex> lock(mu);
    auto it = groups.find(key);
    if (it != groups.end()) comm = it->second.lock();
  }
  const bool found = comm != nullptr;
  auto* from = dynamic_cast<ProcessGroupLoom*>(parent.get());
  if (!found && from != nullptr && !globalRanks.empty()) {
    std::string listed;
    for (int64_t r : globalRanks) listed += (listed.empty() ? "" : ",") + std::to_string(r);
    TORCH_CHECK(static_cast<int>(globalRanks.size()) == size && rank >= 0 && rank < size &&
                    globalRanks[static_cast<size_t>(rank)] == from->communicator().rank(),
                "loom: new_group: this process is rank ", from->communicator().rank(),
                " of the default group, but rank ", rank, " of a group of ", size, " whose ranks there are ", listed);
    const loom::Options options = groupOptions(timeout);
    std::vector<int> ranks(globalRanks.begin(), globalRanks.end());
    comm = std::make_shared<loom::Communicator>(from->communicator().group(ranks, "torch " + groupId, &options));
  }
  auto pg = c10::make_intrusive<ProcessGroupLoom>(store, rank, size, timeout, comm);
  if (!groupId.empty() && !found) {
    std::lock_guard<std::mutex> lock(mu);
    for (auto it = groups.begin(); it != groups.end();) it = it->second.expired() ? groups.erase(it) : std::next(it);
    groups[key] = pg->sharedCommunicator();
  }
  return pg;
}

}  // namespace loom_torch
