// Bruck's all-gather: ceil(log2 n) steps for any n. Rank r gathers the blocks of r, r+1, r+2, ...
// (mod n) in that order into scratch: at step k it sends the first min(2^k, n - 2^k) blocks it
// holds to rank r - 2^k and appends as many from rank r + 2^k; a final rotation puts each block
// at its rank's place. Latency-bound sizes on many ranks: log2 n messages where the ring sends
// n - 1, and only the 2 log2 n peers at distance 2^k are linked.
#include <cstring>

#include "collectives/context.hpp"
#include "kernels/copy.hpp"

namespace loom {
namespace coll {

void allGatherBruck(Context& c, const Args& a) {
  const int n = c.size(), r = c.rank();
  const size_t block = a.count * a.elem;
  const auto N = static_cast<size_t>(n);
  uint8_t* out = bytes(a.recv);
  if (n == 1 || block == 0) {
    copyIfDistinct(out, a.send, block);
    return;
  }
  // held[i]: the block of rank (r + i) mod n; the first `have` are here.
  uint8_t* held = c.scratch(block * N, 0);
  std::memcpy(held, a.send, block);
  size_t have = 1;
  for (size_t dist = 1; dist < N; dist *= 2) {
    const size_t cnt = std::min(dist, N - dist);
    const int to = static_cast<int>((static_cast<size_t>(r) + N - dist) % N);
    const int from = static_cast<int>((static_cast<size_t>(r) + dist) % N);
    auto rq = c.recv(from, held + have * block, cnt * block);
    auto sq = c.send(to, held, cnt * block);
    c.wait(sq);
    c.wait(rq);
    have += cnt;
  }
  // Rotate: held[i] is rank (r + i)'s block.
  const size_t head = N - static_cast<size_t>(r);  // blocks of ranks r .. n-1
  kernels::copy(out + static_cast<size_t>(r) * block, held, head * block);
  if (r > 0) kernels::copy(out, held + head * block, static_cast<size_t>(r) * block);
}

}  // namespace coll
}  // namespace loom
