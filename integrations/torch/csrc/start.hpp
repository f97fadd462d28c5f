// How every operation of ProcessGroupLoom starts: one Loom call, wrapped in its LoomWork.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <vector>

#include "backend.hpp"
#include "work.hpp"

namespace loom_torch {

/// Starts one Loom operation (`call` returns its loom::Work) and returns its LoomWork. `finisher`
/// runs on success before the Work completes; `keepAlive` holds staging tensors until then.
/// Collectives (not point-to-point) count toward the group's sequence number, and carry it.
template <typename Start>
c10::intrusive_ptr<c10d::Work> start(ProcessGroupLoom& pg, c10d::OpType type, const char* title,
                                     std::vector<at::Tensor> outputs, Start&& call, std::function<void()> finisher = {},
                                     std::vector<at::Tensor> keepAlive = {}, size_t expectBytes = SIZE_MAX) {
  using c10d::OpType;
  const bool pointToPoint = type == OpType::SEND || type == OpType::RECV || type == OpType::RECVANYSOURCE;
  const uint64_t sequence = pointToPoint ? 0 : pg.countCollective();
  auto work = c10::make_intrusive<LoomWork>(pg.getRank(), type, title, std::move(outputs), std::move(finisher),
                                            std::move(keepAlive));
  work->stamp(sequence, pg.collectivesTimed());
  if (expectBytes != SIZE_MAX) work->expectBytes(expectBytes);
  LoomWork::watch(work, call());
  return work;
}

}  // namespace loom_torch
