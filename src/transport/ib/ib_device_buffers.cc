// The ib connection's device buffers (ib_connection.hpp, "Device buffers"): which buffers are,
// their registrations, and the one copy into device memory the protocol may need.
#include "core/format.hpp"
#include "device/runtime.hpp"
#include "transport/ib/ib_connection.hpp"

namespace loom {
namespace ib {

bool IbConnection::onDevice(const void* p) const {
  if (deviceRegs_ == nullptr || p == nullptr) return false;
  device::DeviceRuntime* rt = device::runtime();
  return rt != nullptr && rt->deviceOf(p) >= 0;
}

Registration IbConnection::acquire(const void* p, size_t bytes, bool device, Status* error) {
  return device ? deviceRegs_->acquire(p, bytes, error) : cache_.acquire(p, bytes, error);
}

Status IbConnection::copyToDevice(void* dst, const void* src, size_t bytes) noexcept {
  device::DeviceRuntime* rt = device::runtime();
  try {
    if (copyStream_ == nullptr) copyStream_ = rt->createStream();
    rt->copyAsync(dst, src, bytes, copyStream_);
    rt->synchronize(copyStream_);  // the payload's slot is reposted once this returns
    return Status::success();
  } catch (const Error& e) {
    return Status::error(
        ErrorCode::Cuda,
        strFormat("copying a message of %zu bytes from rank %d into device memory failed: %s", bytes, peer_, e.what()),
        peer_);
  }
}

}  // namespace ib
}  // namespace loom
