// Pipelined chain broadcast: root -> root+1 -> ... -> root-1; every link carries the buffer once,
// so large broadcasts run at link speed whatever the world size.
#include "collectives/context.hpp"

namespace loom {
namespace coll {

void broadcastChain(Context& c, const Args& a) {
  // root -> root+1 -> ... -> root-1, in chunks: every rank forwards a chunk as soon as it has it.
  const int n = c.size(), r = c.rank();
  const size_t E = a.elem;
  uint8_t* buf = bytes(a.recv);
  const int pos = (r - a.root + n) % n;
  const int next = pos + 1 < n ? (r + 1) % n : -1;
  const int prev = pos > 0 ? (r + n - 1) % n : -1;
  auto chunks = planChunks(Segment{0, a.count}, c.chunkElems(E));
  std::vector<RequestPtr> recvs, sends;
  if (prev >= 0) {
    for (const auto& ch : chunks) recvs.push_back(c.recv(prev, buf + ch.offset * E, ch.count * E));
  }
  // The root sends straight from its send buffer, and copies it to its receive buffer (out of
  // place) while the chunks are on their way, instead of before.
  const uint8_t* from = prev < 0 ? cbytes(a.send) : buf;
  for (size_t k = 0; k < chunks.size(); ++k) {
    if (prev >= 0) c.wait(recvs[k]);
    if (next >= 0) sends.push_back(c.send(next, from + chunks[k].offset * E, chunks[k].count * E));
  }
  if (prev < 0) copyIfDistinct(buf, a.send, a.count * E);
  c.waitAll(sends);
}

}  // namespace coll
}  // namespace loom
