// How torch tensors, dtypes and reduce ops map onto Loom's buffers, DataTypes and ReduceOps, with
// the errors a user reads when they do not.
#pragma once

#include <ATen/ATen.h>

#include <loom/loom.hpp>
#include <torch/csrc/distributed/c10d/Types.hpp>
#include <vector>

namespace loom_torch {

/// Throws unless `t` is a dense tensor on the CPU or a CUDA device (`op` names the call in the
/// message; whether this build takes CUDA tensors is deviceOfCall's to say).
void checkTensor(const at::Tensor& t, const char* op);
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

/// The bytes of `tensors` one after another, whatever their dtypes, and each one's width in bytes:
/// one rank's block of a byte all-gather that moves them all at once.
struct PackedBytes {
  at::Tensor block;
  std::vector<int64_t> widths;
};
PackedBytes packBytes(const std::vector<at::Tensor>& tensors);
/// Tensor i of every rank's block in `all` (the gathered blocks of `size` ranks, in rank order),
/// as `like` (its dtype and shape) per rank: a [size, ...like's shape] view.
at::Tensor unpackFromEveryRank(const at::Tensor& all, int size, const PackedBytes& packed, size_t i,
                               const at::Tensor& like);

}  // namespace loom_torch
