// planBuckets: the pure grouping of gradients into buckets (include/loom/ddp.hpp).
#include <map>

#include "loom/ddp.hpp"

namespace loom {
namespace ddp {

std::vector<std::vector<size_t>> planBuckets(const std::vector<size_t>& bytes, const std::vector<int>& kinds,
                                             size_t firstCapBytes, size_t capBytes) {
  std::vector<std::vector<size_t>> buckets;
  // The bucket being filled for each kind: its index in `buckets` and its bytes so far.
  struct Open {
    size_t index = 0;
    size_t bytes = 0;
  };
  std::map<int, Open> open;
  std::map<int, bool> firstDone;  // whether a kind's first (small) bucket has been closed
  for (size_t k = bytes.size(); k-- > 0;) {
    const int kind = k < kinds.size() ? kinds[k] : 0;
    const size_t cap = firstDone[kind] ? capBytes : firstCapBytes;
    auto it = open.find(kind);
    if (it != open.end() && it->second.bytes > 0 && it->second.bytes + bytes[k] > cap) {
      // Adding this one would pass the cap: the bucket is closed.
      firstDone[kind] = true;
      open.erase(it);
      it = open.end();
    }
    if (it == open.end()) {
      buckets.emplace_back();
      it = open.emplace(kind, Open{buckets.size() - 1, 0}).first;
    }
    buckets[it->second.index].push_back(k);
    it->second.bytes += bytes[k];
  }
  return buckets;
}

}  // namespace ddp
}  // namespace loom
