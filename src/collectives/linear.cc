// Gather and scatter: the root exchanges each rank's block with it directly, every message in
// flight at once. No rank forwards another's block, so the root links its peers and no one else
// (links made on first use), and every byte crosses one link once. Messages of no bytes still go,
// so that ranks in mismatched calls fail at once whatever the count.
//
// Every rank also receives something, so that a rank in another call is found by the signature of
// what reaches it: in a gather the root sends each peer a word of no bytes as it starts, which the
// peer takes after sending its block (a peer does not wait for it before sending, so a gather
// costs the peers no round trip; a peer in an all-reduce or a scatter instead meets it, or meets
// their message, and fails at once naming both calls). A scatter's peers receive their block.
#include <vector>

#include "collectives/context.hpp"
#include "kernels/copy.hpp"

namespace loom {
namespace coll {
namespace {

// This rank's own block, from its input to its output, unless in place (the same memory).
void copyOwn(void* dst, const void* src, size_t bytes) {
  if (dst != src && bytes > 0) kernels::copy(dst, src, bytes);
}

}  // namespace

void gatherLinear(Context& c, const Args& a) {
  const int n = c.size(), me = c.rank();
  const size_t block = a.count * a.elem;
  if (me != a.root) {
    RequestPtr word = c.recv(a.root, nullptr, 0);
    c.wait(c.send(a.root, a.send, block));
    c.wait(word);
    return;
  }
  uint8_t* out = bytes(a.recv);
  std::vector<RequestPtr> reqs;
  reqs.reserve(2 * static_cast<size_t>(n));
  for (int k = 1; k < n; ++k) reqs.push_back(c.send((me + k) % n, nullptr, 0));
  // From the rank after the root around, so that the peers' first messages are taken in turn.
  for (int k = 1; k < n; ++k) {
    const int from = (me + k) % n;
    reqs.push_back(c.recv(from, out + static_cast<size_t>(from) * block, block));
  }
  copyOwn(out + static_cast<size_t>(me) * block, a.send, block);
  c.waitAll(reqs);
}

void scatterLinear(Context& c, const Args& a) {
  const int n = c.size(), me = c.rank();
  const size_t block = a.count * a.elem;
  if (me != a.root) {
    c.wait(c.recv(a.root, a.recv, block));
    return;
  }
  const uint8_t* in = cbytes(a.send);
  std::vector<RequestPtr> reqs;
  reqs.reserve(static_cast<size_t>(n));
  for (int k = 1; k < n; ++k) {
    const int to = (me + k) % n;
    reqs.push_back(c.send(to, in + static_cast<size_t>(to) * block, block));
  }
  copyOwn(a.recv, in + static_cast<size_t>(me) * block, block);
  c.waitAll(reqs);
}

}  // namespace coll
}  // namespace loom
