#include "transport/tcp/buffer_pool.hpp"

#include <algorithm>

namespace loom {
namespace tcp {

BufferPool::Buffer BufferPool::take(size_t n) {
  size_t best = spare_.size();
  for (size_t i = 0; i < spare_.size(); ++i)
    if (spare_[i].capacity >= n && (best == spare_.size() || spare_[i].capacity < spare_[best].capacity)) best = i;
  Buffer b;
  if (best < spare_.size()) {
    b = std::move(spare_[best]);
    spare_.erase(spare_.begin() + static_cast<std::ptrdiff_t>(best));
    pooled_ -= b.capacity;
  } else {
    b.bytes.reset(new uint8_t[std::max<size_t>(n, 1)]);
    b.capacity = std::max<size_t>(n, 1);
  }
  b.size = n;
  return b;
}

void BufferPool::giveBack(Buffer b) {
  if (!b.bytes || pooled_ + b.capacity > maxBytes_) return;
  pooled_ += b.capacity;
  spare_.push_back(std::move(b));
}

}  // namespace tcp
}  // namespace loom
