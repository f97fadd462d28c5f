// DistributedSampler (include/loom/ddp.hpp): every rank's share of a dataset's indices. The
// shuffle is written out (Fisher-Yates over SplitMix64) rather than std::shuffle, whose results
// differ between standard libraries: ranks built differently must still agree.
#include <stdexcept>

#include "core/format.hpp"
#include "core/status.hpp"
#include "loom/ddp.hpp"

namespace loom {
namespace ddp {
namespace {

uint64_t splitMix64(uint64_t& state) {
  uint64_t z = (state += 0x9E3779B97F4A7C15ull);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

// Uniform in [0, bound) without modulo bias (rejection of the short last range).
uint64_t below(uint64_t& state, uint64_t bound) {
  const uint64_t limit = UINT64_MAX - UINT64_MAX % bound;
  for (;;) {
    const uint64_t x = splitMix64(state);
    if (x < limit) return x % bound;
  }
}

}  // namespace

DistributedSampler::DistributedSampler(size_t datasetSize, int rank, int worldSize, bool shuffle, uint64_t seed,
                                       bool dropLast)
    : datasetSize_(datasetSize), perRank_(0), rank_(rank), worldSize_(worldSize), shuffle_(shuffle), seed_(seed) {
  if (worldSize < 1 || rank < 0 || rank >= worldSize) {
    LOOM_THROW(ErrorCode::InvalidArgument, rank,
               strFormat("DistributedSampler: rank %d is out of range for a world of %d ranks", rank, worldSize));
  }
  const size_t n = static_cast<size_t>(worldSize);
  perRank_ = dropLast ? datasetSize / n : (datasetSize + n - 1) / n;
}

std::vector<size_t> DistributedSampler::indices() const {
  std::vector<size_t> all(datasetSize_);
  for (size_t i = 0; i < datasetSize_; ++i) all[i] = i;
  if (shuffle_ && datasetSize_ > 1) {
    uint64_t state = seed_ * 0x2545F4914F6CDD1Dull + epoch_;
    for (size_t i = datasetSize_ - 1; i > 0; --i) std::swap(all[i], all[below(state, i + 1)]);
  }
  const size_t n = static_cast<size_t>(worldSize_), total = perRank_ * n;
  // Pad by repeating from the start (as often as needed for tiny datasets), or drop the tail.
  if (total > all.size() && !all.empty()) {
    const size_t have = all.size();
    for (size_t i = 0; all.size() < total; ++i) all.push_back(all[i % have]);
  }
  all.resize(total);
  std::vector<size_t> mine;
  mine.reserve(perRank_);
  for (size_t i = static_cast<size_t>(rank_); i < total; i += n) mine.push_back(all[i]);
  return mine;
}

}  // namespace ddp
}  // namespace loom
