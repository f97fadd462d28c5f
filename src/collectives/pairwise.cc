// Pairwise all-to-all: every pair of ranks exchanges its block directly, all at once.
#include <cstring>

#include "collectives/context.hpp"
#include "kernels/copy.hpp"

namespace loom {
namespace coll {

void allToAllPairwise(Context& c, const Args& a) {
  const int n = c.size(), r = c.rank();
  const size_t block = a.count * a.elem;
  const uint8_t* in = cbytes(a.send);
  if (a.send == a.recv) {  // in place: keep a copy of what is to be sent
    uint8_t* copy = c.scratch(block * static_cast<size_t>(n), 0);
    if (block > 0) kernels::copy(copy, in, block * static_cast<size_t>(n));
    in = copy;
  }
  uint8_t* out = bytes(a.recv);
  std::vector<RequestPtr> reqs;
  // Each pair exchanges one block; receives first, then sends, each in a rotated order so that
  // not every rank starts with rank 0.
  for (int k = 1; k < n; ++k) {
    int from = (r - k + n) % n;
    reqs.push_back(c.recv(from, out + static_cast<size_t>(from) * block, block));
  }
  for (int k = 1; k < n; ++k) {
    int to = (r + k) % n;
    reqs.push_back(c.send(to, in + static_cast<size_t>(to) * block, block));
  }
  if (block > 0) std::memmove(out + static_cast<size_t>(r) * block, in + static_cast<size_t>(r) * block, block);
  c.waitAll(reqs);
}

void allGatherPairwise(Context& c, const Args& a) {
  const int n = c.size(), r = c.rank();
  const size_t block = a.count * a.elem;
  const uint8_t* in = cbytes(a.send);  // in place it is this rank's block of the output: never received into
  uint8_t* out = bytes(a.recv);
  std::vector<RequestPtr> reqs;
  // Every rank sends its own block to every other, all at once: no block is forwarded, so over
  // shared memory each peer reads it in one copy straight from the sender's buffer.
  for (int k = 1; k < n; ++k) {
    const int from = (r - k + n) % n;
    reqs.push_back(c.recv(from, out + static_cast<size_t>(from) * block, block));
  }
  for (int k = 1; k < n; ++k) reqs.push_back(c.send((r + k) % n, in, block));
  copyIfDistinct(out + static_cast<size_t>(r) * block, in, block);
  c.waitAll(reqs);
}

void allToAllvPairwise(Context& c, const Args& a) {
  const int n = c.size(), r = c.rank();
  const size_t* sendCounts = a.counts->data();
  const size_t* sendDispls = sendCounts + n;
  const size_t* recvCounts = sendDispls + n;
  const size_t* recvDispls = recvCounts + n;
  const uint8_t* in = cbytes(a.send);
  uint8_t* out = bytes(a.recv);
  std::vector<RequestPtr> reqs;
  // Every pair exchanges a message, empty ones too: a rank whose counts disagree with its peer's
  // then fails on the size (Context::wait) instead of waiting for a message that never comes.
  for (int k = 1; k < n; ++k) {
    const int from = (r - k + n) % n;
    reqs.push_back(c.recv(from, out + recvDispls[from] * a.elem, recvCounts[from] * a.elem));
  }
  for (int k = 1; k < n; ++k) {
    const int to = (r + k) % n;
    reqs.push_back(c.send(to, in + sendDispls[to] * a.elem, sendCounts[to] * a.elem));
  }
  if (sendCounts[r] > 0)
    std::memmove(out + recvDispls[r] * a.elem, in + sendDispls[r] * a.elem, sendCounts[r] * a.elem);
  c.waitAll(reqs);
}

}  // namespace coll
}  // namespace loom
