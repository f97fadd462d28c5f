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
    checkHostTensor(inputs[i], op);
    checkHostTensor(outputs[i], op);
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
               [&] {
                 return comm_->iallGather(block.data_ptr(), all.data_ptr(), static_cast<size_t>(blockBytes),
                                          loom::DataType::Uint8);
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
               [&] {
                 return comm_->ireduceScatter(staged.data_ptr(), mine.data_ptr(), static_cast<size_t>(blockCount), type,
                                              reduce);
               },
               std::move(finisher), {staged, mine});
}

}  // namespace loom_torch

#endif
