#include "tensors.hpp"

#include <c10/util/Exception.h>

namespace loom_torch {

void checkTensor(const at::Tensor& t, const char* op) {
  TORCH_CHECK(t.defined(), "loom: ", op, ": undefined tensor");
  TORCH_CHECK(t.layout() == c10::kStrided, "loom: ", op, ": only dense tensors are supported, got a ", t.layout(),
              " tensor");
  TORCH_CHECK(t.device().is_cpu() || t.device().is_cuda(), "loom: ", op,
              ": only CPU and CUDA tensors are supported, got a tensor on ", t.device(),
              " (use a device-specific backend in init_process_group for the others, e.g. \"cpu:loom,xpu:xccl\")");
}

at::Tensor& single(std::vector<at::Tensor>& tensors, const char* op) {
  TORCH_CHECK(tensors.size() == 1, "loom: ", op, ": expects one tensor per call (one device per process), got ",
              tensors.size());
  checkTensor(tensors[0], op);
  return tensors[0];
}

void checkSameShape(const std::vector<at::Tensor>& tensors, const at::Tensor& t, const char* op) {
  for (size_t i = 0; i < tensors.size(); ++i) {
    checkTensor(tensors[i], op);
    TORCH_CHECK(tensors[i].scalar_type() == t.scalar_type(), "loom: ", op, ": tensor ", i, " has dtype ",
                tensors[i].scalar_type(), " where the input has ", t.scalar_type());
    TORCH_CHECK(tensors[i].numel() == t.numel(), "loom: ", op, ": tensor ", i, " has ", tensors[i].numel(),
                " elements where the input has ", t.numel());
  }
}

loom::DataType reduceType(at::ScalarType type, const char* op) {
  switch (type) {
    case at::kChar:
      return loom::DataType::Int8;
    case at::kByte:
    case at::kBool:
      return loom::DataType::Uint8;
    case at::kInt:
      return loom::DataType::Int32;
    case at::kLong:
      return loom::DataType::Int64;
    case at::kHalf:
      return loom::DataType::Float16;
    case at::kBFloat16:
      return loom::DataType::Bfloat16;
    case at::kFloat:
      return loom::DataType::Float32;
    case at::kDouble:
      return loom::DataType::Float64;
    default:
      TORCH_CHECK_TYPE(false, "loom: ", op, ": cannot reduce tensors of dtype ", type,
                       " (Loom reduces int8, uint8, int32, int64, float16, bfloat16, float32, float64 and bool)");
  }
}

loom::ReduceOp reduceOp(const c10d::ReduceOp& op, at::ScalarType type, const char* call) {
  const bool isBool = type == at::kBool;
  switch (op.op_) {
    case c10d::ReduceOp::SUM:
      return isBool ? loom::ReduceOp::Max : loom::ReduceOp::Sum;
    case c10d::ReduceOp::PRODUCT:
      return isBool ? loom::ReduceOp::Min : loom::ReduceOp::Prod;
    case c10d::ReduceOp::MIN:
      return loom::ReduceOp::Min;
    case c10d::ReduceOp::MAX:
      return loom::ReduceOp::Max;
    case c10d::ReduceOp::AVG:
      TORCH_CHECK(!isBool, "loom: ", call, ": AVG of bool tensors has no meaning");
      return loom::ReduceOp::Avg;
    default:
      TORCH_CHECK(false, "loom: ", call, ": reduce op ", static_cast<int>(op.op_),
                  " (bitwise or pre-multiplied sum) is not supported; Loom has SUM, AVG, PRODUCT, MIN and MAX");
  }
}

at::Tensor contiguousView(const at::Tensor& t) { return t.is_contiguous() ? t : t.contiguous(); }

PackedBytes packBytes(const std::vector<at::Tensor>& tensors) {
  PackedBytes out;
  std::vector<at::Tensor> pieces;
  for (const auto& t : tensors) {
    pieces.push_back(t.contiguous().reshape({-1}).view(at::kByte));
    out.widths.push_back(pieces.back().numel());
  }
  out.block = at::cat(pieces);
  return out;
}

at::Tensor unpackFromEveryRank(const at::Tensor& all, int size, const PackedBytes& packed, size_t i,
                               const at::Tensor& like) {
  int64_t offset = 0;
  for (size_t j = 0; j < i; ++j) offset += packed.widths[j];
  std::vector<int64_t> shape{size};
  for (int64_t d : like.sizes()) shape.push_back(d);
  return all.view({size, packed.block.numel()})
      .narrow(1, offset, packed.widths[i])
      .contiguous()
      .view(like.scalar_type())
      .view(shape);
}

}  // namespace loom_torch
