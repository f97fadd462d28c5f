// Context: what an algorithm sees of the communicator while it runs one collective (on the op
// queue, one collective at a time): its rank and size, byte-level sends and receives on this
// collective's private tag, scratch memory, and a reducer. Algorithms are plain functions over it.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "collectives/plan.hpp"
#include "core/comm_impl.hpp"
#include "core/request.hpp"

namespace loom {
namespace coll {

/// The arguments of one collective, already validated.
struct Args {
  const void* send = nullptr;
  void* recv = nullptr;
  size_t count = 0;  ///< elements (per rank block for all-gather, reduce-scatter, all-to-all)
  DataType type = DataType::Float32;
  ReduceOp op = ReduceOp::Sum;
  int root = 0;
  size_t elem = 4;  ///< bytes per element
};

class Context {
 public:
  /// `name` ("all_reduce") and `algo` ("ring") appear in timeout and error messages.
  Context(detail::CommImpl& comm, int64_t seq, const char* name, const char* algo)
      : comm_(comm), seq_(seq), name_(name), algo_(algo), tag_(detail::collectiveTag(seq)) {}

  int rank() const { return comm_.rank(); }
  int size() const { return comm_.size(); }
  int64_t seq() const { return seq_; }

  RequestPtr send(int peer, const void* p, size_t bytes);
  RequestPtr recv(int peer, void* p, size_t bytes);
  /// Waits for a request of this collective (the communicator's timeout applies). A receive that
  /// got fewer bytes than the algorithm expects means the ranks called mismatched collectives:
  /// that fails the communicator with a message naming the collective and the peer.
  void wait(const RequestPtr& r);
  void waitAll(std::vector<RequestPtr>& rs) {
    for (auto& r : rs) r->wait();
    rs.clear();
  }
  /// Scratch memory for this collective; slots are separate buffers.
  uint8_t* scratch(size_t bytes, int slot = 0) { return comm_.scratch(bytes, slot); }
  /// Elements per pipelined chunk for this datatype (LOOM_CHUNK_BYTES).
  size_t chunkElems(size_t elem) const;

 private:
  detail::CommImpl& comm_;
  const int64_t seq_;
  const char* name_;
  const char* algo_;
  const uint32_t tag_;
};

// ---- Algorithms (algorithms.cc). Each leaves the result where the collective's contract says. ----

void allReduceRing(Context& c, const Args& a);
void allReduceRecursiveDoubling(Context& c, const Args& a);
void allReduceDoubleTree(Context& c, const Args& a);
void broadcastBinomial(Context& c, const Args& a);
void broadcastChain(Context& c, const Args& a);
void reduceBinomial(Context& c, const Args& a);
void reduceRing(Context& c, const Args& a);
void allGatherRing(Context& c, const Args& a);
void reduceScatterRing(Context& c, const Args& a);
void allToAllPairwise(Context& c, const Args& a);

}  // namespace coll
}  // namespace loom
