// The reproducible mode's canonical tree (docs/reproducibility.md), written here from its
// definition for the tests to check the library against: x alone, or the tree of the first p
// inputs (p the largest power of two below k) combined with the tree of the rest.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

namespace loomtest {

template <typename A>
A canonicalTree(const std::vector<A>& x, size_t lo, size_t k, bool mul) {
  if (k == 1) return x[lo];
  size_t p = 1;
  while (p * 2 < k) p *= 2;
  const A a = canonicalTree(x, lo, p, mul), b = canonicalTree(x, lo + p, k - p, mul);
  return mul ? a * b : a + b;
}

/// A 64-bit mix (splitmix's finaliser), for data that is a function of (rank, index) alone.
inline uint64_t mix64(uint64_t x) {
  x ^= x >> 33;
  x *= 0xff51afd7ed558ccdull;
  x ^= x >> 33;
  x *= 0xc4ceb9fe1a85ec53ull;
  return x ^ (x >> 33);
}

}  // namespace loomtest
