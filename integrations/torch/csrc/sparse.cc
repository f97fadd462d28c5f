// All-reduce of sparse COO tensors (the gradients of sparse embeddings under DDP), with Gloo's
// semantics: each rank's tensor is coalesced, every rank's indices and values are gathered, and
// the sum of them all, coalesced, is every rank's result (the same on every rank, entries in
// index order). Sum only, as Gloo.
//
// Two collectives: a blocking all-gather of each rank's metadata (its number of entries and the
// tensor's shape, which must agree), then an all-gather of indices and values, each rank's padded
// to the largest number of entries; the result is built when it completes.
#include <ATen/ATen.h>
#include <c10/util/Exception.h>

#include <algorithm>
#include <cstring>

#include "backend.hpp"
#include "start.hpp"
#include "tensors.hpp"

namespace loom_torch {
namespace {

// Per rank: entries, sparse and dense dimensions, number of sizes, then the sizes.
constexpr size_t kMaxDims = 28;
constexpr size_t kMetaWords = 4 + kMaxDims;

}  // namespace

c10::intrusive_ptr<c10d::Work> ProcessGroupLoom::sparseAllreduce(std::vector<at::Tensor>& tensors,
                                                                 const c10d::AllreduceOptions& opts) {
  at::Tensor& t = tensors[0];
  TORCH_CHECK(t.device().is_cpu(), "loom: allreduce: sparse tensors on ", t.device(), " (CPU tensors only)");
  TORCH_CHECK(opts.reduceOp == c10d::ReduceOp::SUM, "loom: allreduce: sparse tensors are summed only (as Gloo)");
  TORCH_CHECK(static_cast<size_t>(t.dim()) <= kMaxDims, "loom: allreduce: sparse tensor of ", t.dim(),
              " dimensions (at most ", kMaxDims, ")");
  const int size = getSize();
  at::Tensor input = t.coalesce();
  const int64_t nnz = input._nnz(), sparseDim = input.sparse_dim(), denseDim = input.dense_dim();

  std::vector<int64_t> meta(kMetaWords, 0), all(kMetaWords * static_cast<size_t>(size));
  meta[0] = nnz;
  meta[1] = sparseDim;
  meta[2] = denseDim;
  meta[3] = input.dim();
  for (int64_t d = 0; d < input.dim(); ++d) meta[4 + static_cast<size_t>(d)] = input.size(d);
  comm_->allGather(meta.data(), all.data(), kMetaWords, loom::DataType::Int64);
  int64_t maxNnz = 0;
  for (int r = 0; r < size; ++r) {
    const int64_t* m = all.data() + kMetaWords * static_cast<size_t>(r);
    TORCH_CHECK(std::equal(m + 1, m + kMetaWords, meta.begin() + 1),
                "loom: allreduce: sparse dimensions do not match: rank ", r, "'s tensor is not shaped as this rank's ",
                input.sizes(), " (sparse_dim ", sparseDim, ", dense_dim ", denseDim, ")");
    maxNnz = std::max(maxNnz, m[0]);
  }

  // This rank's block: indices as [entries][sparse_dim] int64, then values as [entries][row].
  at::Tensor values = input._values().contiguous();
  std::vector<int64_t> rowShape(values.sizes().begin() + 1, values.sizes().end());
  int64_t rowBytes = static_cast<int64_t>(values.element_size());
  for (int64_t d : rowShape) rowBytes *= d;
  const int64_t indexBytes = maxNnz * sparseDim * 8;
  // Each rank's block starts where any dtype may be viewed (a view of bytes as wider elements
  // wants its offset aligned to them).
  const int64_t block = (indexBytes + maxNnz * rowBytes + 15) / 16 * 16;
  at::Tensor mine = at::zeros({block}, at::kByte);
  if (nnz > 0) {
    at::Tensor idx = input._indices().t().contiguous();
    std::memcpy(mine.data_ptr(), idx.data_ptr(), idx.nbytes());
    std::memcpy(static_cast<uint8_t*>(mine.data_ptr()) + indexBytes, values.data_ptr(), values.nbytes());
  }
  at::Tensor gathered = at::empty({block * size}, at::kByte);
  std::vector<int64_t> nnzs(static_cast<size_t>(size));
  for (int r = 0; r < size; ++r) nnzs[static_cast<size_t>(r)] = all[kMetaWords * static_cast<size_t>(r)];
  const at::ScalarType valueType = values.scalar_type();
  const std::vector<int64_t> sizes(input.sizes().begin(), input.sizes().end());
  auto finisher = [t, gathered, nnzs, block, indexBytes, rowBytes, sparseDim, rowShape, valueType, sizes]() mutable {
    std::vector<at::Tensor> allIdx, allVals;
    for (size_t r = 0; r < nnzs.size(); ++r) {
      const int64_t n = nnzs[r];
      std::vector<int64_t> shape{n};
      shape.insert(shape.end(), rowShape.begin(), rowShape.end());
      if (n == 0) {
        allIdx.push_back(at::empty({sparseDim, 0}, at::kLong));
        allVals.push_back(at::empty(shape, at::TensorOptions().dtype(valueType)));
        continue;
      }
      at::Tensor b = gathered.narrow(0, static_cast<int64_t>(r) * block, block);
      allIdx.push_back(b.narrow(0, 0, n * sparseDim * 8).view(at::kLong).view({n, sparseDim}).t());
      allVals.push_back(b.narrow(0, indexBytes, n * rowBytes).view(valueType).view(shape));
    }
    at::Tensor out = at::sparse_coo_tensor(at::cat(allIdx, 1), at::cat(allVals, 0), sizes, t.options()).coalesce();
    t.copy_(out);
  };
  return start(*this, c10d::OpType::ALLREDUCE, "loom:all_reduce_sparse", tensors,
               [&](void*) {  // CPU tensors only
                 return comm_->iallGather(mine.data_ptr(), gathered.data_ptr(), static_cast<size_t>(block),
                                          loom::DataType::Uint8);
               },
               std::move(finisher), {mine, gathered});
}

}  // namespace loom_torch
