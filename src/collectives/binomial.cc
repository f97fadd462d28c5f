// Pipelined binomial-tree broadcast and reduce (planBinomialTree): log2(n) levels working on
// different chunks at once.
#include "collectives/context.hpp"
#include "kernels/reduce.hpp"

namespace loom {
namespace coll {

void broadcastBinomial(Context& c, const Args& a) {
  // Down a binomial tree in chunks: a node forwards each chunk to its children as soon as it has
  // it, so the tree's levels work on different chunks at once.
  const size_t E = a.elem;
  uint8_t* buf = bytes(a.recv);
  if (c.rank() == a.root) copyIfDistinct(buf, a.send, a.count * E);
  TreeNode node = planBinomialTree(c.rank(), c.size(), a.root);
  auto chunks = planChunks(Segment{0, a.count}, c.chunkElems(E));
  std::vector<RequestPtr> recvs, sends;
  if (node.parent >= 0)
    for (const auto& ch : chunks) recvs.push_back(c.recv(node.parent, buf + ch.offset * E, ch.count * E));
  for (size_t k = 0; k < chunks.size(); ++k) {
    if (node.parent >= 0) c.wait(recvs[k]);
    for (int child : node.children) sends.push_back(c.send(child, buf + chunks[k].offset * E, chunks[k].count * E));
  }
  c.waitAll(sends);
}

void reduceBinomial(Context& c, const Args& a) {
  // Up a binomial tree in chunks: a node adds its children's chunk to its own and passes the sum
  // up at once, so the tree's levels work on different chunks at once.
  const int r = c.rank();
  const size_t E = a.elem, total = a.count * E;
  TreeNode node = planBinomialTree(r, c.size(), a.root);
  uint8_t* acc = r == a.root ? bytes(a.recv) : c.scratch(total, 0);
  copyIfDistinct(acc, a.send, total);
  auto chunks = planChunks(Segment{0, a.count}, c.chunkElems(E));
  const size_t kids = node.children.size();
  uint8_t* staging = c.scratch(std::max<size_t>(1, kids) * total, 1);
  // Receives for every child and chunk, posted up front into a region per child.
  std::vector<std::vector<RequestPtr>> fromChild(kids);
  for (size_t k = 0; k < kids; ++k)
    for (const auto& ch : chunks)
      fromChild[k].push_back(c.recv(node.children[k], staging + k * total + ch.offset * E, ch.count * E));
  std::vector<RequestPtr> sends;
  for (size_t i = 0; i < chunks.size(); ++i) {
    const Segment& ch = chunks[i];
    // Nearest child last: the order is fixed, so the root's result does not depend on timing.
    for (size_t k = 0; k < kids; ++k) {
      c.wait(fromChild[k][i]);
      kernels::reduce(acc + ch.offset * E, acc + ch.offset * E, staging + k * total + ch.offset * E, ch.count, a.type,
                      a.op);
    }
    if (node.parent >= 0) {
      sends.push_back(c.send(node.parent, acc + ch.offset * E, ch.count * E));
    } else if (a.op == ReduceOp::Avg) {
      kernels::divide(acc + ch.offset * E, ch.count, a.type, c.size());
    }
  }
  c.waitAll(sends);
}

}  // namespace coll
}  // namespace loom
