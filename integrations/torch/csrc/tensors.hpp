// How torch tensors, dtypes and reduce ops map onto Loom's buffers, DataTypes and ReduceOps, with
// the errors a user reads when they do not.
#pragma once

#include <ATen/ATen.h>

#include <loom/loom.hpp>
#include <torch/csrc/distributed/c10d/Types.hpp>
#include <vector>

namespace loom_torch {

/// Throws unless `t` is a dense CPU tensor (`op` names the call in the message).
void checkHostTensor(const at::Tensor& t, const char* op);
/// Throws unless `tensors` holds exactly one tensor (one device per process), and returns it.
at::Tensor& single(std::vector<at::Tensor>& tensors, const char* op);
/// Throws unless every tensor has `t`'s dtype and the same number of elements.
void checkSameShape(const std::vector<at::Tensor>& tensors, const at::Tensor& t, const char* op);

/// Loom's DataType for reducing tensors of `type` (bool reduces as uint8); throws for the others.
loom::DataType reduceType(at::ScalarType type, const char* op);
/// Loom's ReduceOp for `op` on `type`; throws for the ops Loom does not have (bitwise, premul-sum).
/// On bool, SUM and MAX are a logical or, PRODUCT and MIN a logical and.
loom::ReduceOp reduceOp(const c10d::ReduceOp& op, at::ScalarType type, const char* call);

/// Bytes of a tensor's elements.
inline size_t bytesOf(const at::Tensor& t) { return static_cast<size_t>(t.numel()) * t.element_size(); }

/// A contiguous tensor with `t`'s contents: `t` itself when it is contiguous, else a copy (which
/// the caller copies back into `t` after an operation that writes it).
at::Tensor contiguousView(const at::Tensor& t);

}  // namespace loom_torch
