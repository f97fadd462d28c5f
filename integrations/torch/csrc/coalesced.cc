// PyTorch 2.x's coalesced forms of all_gather_into_tensor and reduce_scatter_tensor (what
// dist._coalescing_manager and FSDP call): pair i of (outputs, inputs) is one all-gather or one
// reduce-scatter, and all the pairs move in one Loom collective over a staging buffer whose
// per-rank block holds each pair's share one after another.
#include <torch/version.h>

#if TORCH_VERSION_MAJOR >= 2

#include <ATen/ATen.h>
#include <c10/util/Exception.h>

#include "backend.hpp"
#include "start.hpp"
#include "tensors.hpp"

namespace loom_torch {
namespace {

// Throws unless `outputs` and `inputs` pair up, each output `factor` times its input's elements
// when `outputBigger`, else each input `factor` times its output's; same dtype within a pair.
void checkPairs(const std::vector<at::Tensor>& outputs, const std::vector<at::Tensor>& inputs, int64_t factor,
                bool outputBigger, const char* op) {
  TORCH_CHECK(!inputs.empty(), "loom: ", op, ": no tensors");
  TORCH_CHECK(outputs.size() == inputs.size(), "loom: ", op, ": ", outputs.size(), " output tensors for ",
              inputs.size(), " inputs (one output per input)");
  for (size_t i = 0; i < inputs.size(); ++i) {
    checkTensor(inputs[i], op);
    checkTensor(outputs[i], op);
    TORCH_CHECK(outputs[i].scalar_type() == inputs[i].scalar_type(), "loom: ", op, ": output ", i, " is ",
                outputs[i].scalar_type(), ", input ", i, " ", inputs[i].scalar_type());
    const int64_t big = outputBigger ? outputs[i].numel() : inputs[i].numel();
    const int64_t small = outputBigger ? inputs[i].numel() : outputs[i].numel();
    TORCH_CHECK(big == small * factor, "loom: ", op, ": ", outputBigger ? "output " : "input ", i, " has ", big,
                " elements, expected ", small, " x ", factor, " ranks");
  }
}

}  // namespace

c10::intrusive_ptr<c10d::Work> ProcessGroupLoom::allgather_into_tensor_coalesced(std::vector<at::Tensor>& outputs,
                                                                                 std::vector<at::Tensor>& inputs,
                                                                                 const c10d::AllgatherOptions&) {
  const int size = getSize();
  checkPairs(outputs, inputs, size, true, "allgather_into_tensor_coalesced");
  PackedBytes packed = packBytes(inputs);
  at::Tensor block = packed.block;
  const int64_t blockBytes = block.numel();
  at::Tensor all = at::empty({blockBytes * size}, block.options());
  // Rank r's block holds every input's bytes; output i takes input i of each block, in rank order.
  auto finisher = [all, size, packed, inputs, outputs]() mutable {
    for (size_t i = 0; i < packed.widths.size(); ++i)
      outputs[i].copy_(unpackFromEveryRank(all, size, packed, i, inputs[i]).view(outputs[i].sizes()));
  };
  return start(*this, c10d::OpType::COALESCED, "loom:all_gather_into_tensor_coalesced", outputs,
               [&](void* stream) {
                 return comm_->iallGather(block.data_ptr(), all.data_ptr(), static_cast<size_t>(blockBytes),
                                          loom::DataType::Uint8, stream);
               },
               std::move(finisher), {block, all});
}

c10::intrusive_ptr<c10d::Work> ProcessGroupLoom::reduce_scatter_tensor_coalesced(
    std::vector<at::Tensor>& outputs, std::vector<at::Tensor>& inputs, const c10d::ReduceScatterOptions& opts) {
  const char* op = "reduce_scatter_tensor_coalesced";
  const int size = getSize();
  checkPairs(outputs, inputs, size, false, op);
  for (const auto& t : inputs) {
    TORCH_CHECK(t.scalar_type() == inputs[0].scalar_type(), "loom: ", op, ": tensors of dtypes ",
                inputs[0].scalar_type(), " and ", t.scalar_type(), " (one dtype per call: one reduction)");
  }
  const loom::DataType type = reduceType(inputs[0].scalar_type(), op);
  const loom::ReduceOp reduce = reduceOp(opts.reduceOp, inputs[0].scalar_type(), op);
  // Rank r's block of the staged input: share r of every input, one after another.
  std::vector<at::Tensor> shares;
  int64_t blockCount = 0;
  for (size_t i = 0; i < inputs.size(); ++i) {
    const int64_t n = outputs[i].numel();
    shares.push_back(inputs[i].reshape({size, n}));
    blockCount += n;
  }
  at::Tensor staged = at::cat(shares, 1).contiguous();  // size x blockCount
  at::Tensor mine = at::empty({blockCount}, staged.options());
  auto finisher = [mine, outputs]() mutable {
    int64_t offset = 0;
    for (auto& out : outputs) {
      out.copy_(mine.narrow(0, offset, out.numel()).view(out.sizes()));
      offset += out.numel();
    }
  };
  return start(*this, c10d::OpType::COALESCED, "loom:reduce_scatter_tensor_coalesced", outputs,
               [&](void* stream) {
                 return comm_->ireduceScatter(staged.data_ptr(), mine.data_ptr(), static_cast<size_t>(blockCount), type,
                                              reduce, stream);
               },
               std::move(finisher), {staged, mine});
}

void ProcessGroupLoom::startCoalescing() {
  TORCH_CHECK(!coalescing_, "loom: startCoalescing: already coalescing (call endCoalescing first)");
  coalescing_ = true;
}

c10::intrusive_ptr<c10d::Work> ProcessGroupLoom::endCoalescing() {
  TORCH_CHECK(coalescing_, "loom: endCoalescing without startCoalescing");
  coalescing_ = false;
  std::vector<PendingPointToPoint> pending;
  pending.swap(pending_);
  std::vector<loom::PointToPoint> ops;
  std::vector<at::Tensor> tensors, bufs;
  std::vector<std::pair<at::Tensor, at::Tensor>> copies;  // receives into a contiguous copy
  size_t received = 0;
  for (const auto& p : pending) {
    ops.push_back(p.op);
    tensors.push_back(p.tensor);
    bufs.push_back(p.buf);
    if (!p.op.send) {
      received += p.op.count;
      if (!p.buf.is_same(p.tensor)) copies.emplace_back(p.tensor, p.buf);
    }
  }
  std::function<void()> finisher;
  if (!copies.empty())
    finisher = [copies]() mutable {
      for (auto& c : copies) c.first.copy_(c.second);
    };
  c10::intrusive_ptr<c10d::Work> work;
  try {
    // The group's Work checks the bytes received in all (a receive larger than its message).
    work = start(
        *this, c10d::OpType::COALESCED, "loom:coalesced", tensors,
        [&](void* stream) { return comm_->igroup(ops, stream); }, std::move(finisher), bufs,
        received > 0 ? received : SIZE_MAX);
  } catch (...) {
    for (auto& p : pending) p.work->failUnstarted(std::current_exception());
    throw;
  }
  // Each call's Work completes with the group, after it (onCompletion keeps the order).
  const loom::Work& group = c10::static_intrusive_pointer_cast<LoomWork>(work)->loomWork();
  for (auto& p : pending) LoomWork::watch(p.work, group);
  return work;
}

}  // namespace loom_torch

#endif
