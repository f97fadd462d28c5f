// How every operation of ProcessGroupLoom starts: one Loom call, wrapped in its LoomWork.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <vector>

#include "backend.hpp"
#include "device.hpp"
#include "work.hpp"

namespace loom_torch {

/// Starts one Loom operation and returns its LoomWork. `call(stream)` makes the Loom call and
/// returns its loom::Work; `stream` is the cudaStream_t to pass it (nullptr for CPU tensors).
/// `finisher` copies results out of staging tensors: on CPU tensors it runs once the operation
/// succeeded, before the Work completes; on CUDA tensors it is queued at once on Loom's stream,
/// behind the operation. `keepAlive` holds staging tensors until then. Collectives (not
/// point-to-point) count toward the group's sequence number, and carry it.
template <typename Start>
c10::intrusive_ptr<c10d::Work> start(ProcessGroupLoom& pg, c10d::OpType type, const char* title,
                                     std::vector<at::Tensor> outputs, Start&& call, std::function<void()> finisher = {},
                                     std::vector<at::Tensor> keepAlive = {}, size_t expectBytes = SIZE_MAX) {
  using c10d::OpType;
  const bool pointToPoint = type == OpType::SEND || type == OpType::RECV || type == OpType::RECVANYSOURCE;
  const std::optional<c10::Device> device = deviceOfCall(outputs, keepAlive, title);
  const uint64_t sequence = pointToPoint ? 0 : pg.countCollective();
  c10::intrusive_ptr<LoomWork> work;
  loom::Work started;
  if (device) {
    DeviceCall onDevice(pg.deviceStreams(), *device);
    started = call(onDevice.stream());
    std::shared_ptr<DeviceDone> done = onDevice.finish(finisher, outputs, keepAlive);
    work = c10::make_intrusive<LoomWork>(pg.getRank(), type, title, std::move(outputs), std::function<void()>{},
                                         std::vector<at::Tensor>{}, std::move(done));
  } else {
    started = call(nullptr);
    work = c10::make_intrusive<LoomWork>(pg.getRank(), type, title, std::move(outputs), std::move(finisher),
                                         std::move(keepAlive));
  }
  work->stamp(sequence, pg.collectivesTimed());
  if (expectBytes != SIZE_MAX) work->expectBytes(expectBytes);
  LoomWork::watch(work, std::move(started));
  return work;
}

}  // namespace loom_torch
