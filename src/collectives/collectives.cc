// Entry points of the data collectives. Argument checking is final; the ring, tree and
// recursive-doubling algorithms and the reduction kernels they call arrive with the collectives
// work (issue 3). Until then each call reports, with ErrorCode::InvalidUsage, that the algorithm
// is not in this build, after validating its arguments as the final version will.
#include "core/comm_impl.hpp"
#include "core/format.hpp"

namespace loom {
namespace {

void checkOp(ReduceOp op, int rank) {
  int o = static_cast<int>(op);
  if (o < 0 || o > static_cast<int>(ReduceOp::Avg)) {
    LOOM_THROW(ErrorCode::InvalidArgument, rank, strFormat("unknown reduction op %d", o));
  }
}

[[noreturn]] void unavailable(const detail::CommImpl& c, const char* what) {
  LOOM_THROW(ErrorCode::InvalidUsage, c.rank(),
             strFormat("%s is not available in this build of Loom yet (send/recv and barrier are); its algorithms "
                       "arrive with the collectives release",
                       what));
}

detail::CommImpl& implOf(const Communicator& c) {
  if (c.impl() == nullptr) LOOM_THROW(ErrorCode::InvalidUsage, -1, "the communicator was moved from");
  return *c.impl();
}

}  // namespace

Work Communicator::iallReduce(const void* sendbuf, void* recvbuf, size_t count, DataType type, ReduceOp op) {
  auto& c = implOf(*this);
  c.checkOk();
  c.checkBuffer(sendbuf, count, type, "all-reduce");
  c.checkBuffer(recvbuf, count, type, "all-reduce");
  checkOp(op, c.rank());
  unavailable(c, "all-reduce");
}
void Communicator::allReduce(const void* s, void* r, size_t n, DataType t, ReduceOp op) {
  iallReduce(s, r, n, t, op).wait();
}

Work Communicator::ibroadcast(const void* sendbuf, void* recvbuf, size_t count, DataType type, int root) {
  auto& c = implOf(*this);
  c.checkOk();
  c.checkPeer(root, "broadcast root");
  if (c.rank() == root) c.checkBuffer(sendbuf, count, type, "broadcast");
  c.checkBuffer(recvbuf, count, type, "broadcast");
  unavailable(c, "broadcast");
}
void Communicator::broadcast(const void* s, void* r, size_t n, DataType t, int root) {
  ibroadcast(s, r, n, t, root).wait();
}

Work Communicator::ireduce(const void* sendbuf, void* recvbuf, size_t count, DataType type, ReduceOp op, int root) {
  auto& c = implOf(*this);
  c.checkOk();
  c.checkPeer(root, "reduce root");
  c.checkBuffer(sendbuf, count, type, "reduce");
  if (c.rank() == root) c.checkBuffer(recvbuf, count, type, "reduce");
  checkOp(op, c.rank());
  unavailable(c, "reduce");
}
void Communicator::reduce(const void* s, void* r, size_t n, DataType t, ReduceOp op, int root) {
  ireduce(s, r, n, t, op, root).wait();
}

Work Communicator::iallGather(const void* sendbuf, void* recvbuf, size_t sendcount, DataType type) {
  auto& c = implOf(*this);
  c.checkOk();
  c.checkBuffer(sendbuf, sendcount, type, "all-gather");
  if (sendcount > SIZE_MAX / static_cast<size_t>(c.size()))
    LOOM_THROW(ErrorCode::InvalidArgument, c.rank(), "all-gather: count overflows");
  c.checkBuffer(recvbuf, sendcount * static_cast<size_t>(c.size()), type, "all-gather");
  unavailable(c, "all-gather");
}
void Communicator::allGather(const void* s, void* r, size_t n, DataType t) { iallGather(s, r, n, t).wait(); }

Work Communicator::ireduceScatter(const void* sendbuf, void* recvbuf, size_t recvcount, DataType type, ReduceOp op) {
  auto& c = implOf(*this);
  c.checkOk();
  if (recvcount > SIZE_MAX / static_cast<size_t>(c.size()))
    LOOM_THROW(ErrorCode::InvalidArgument, c.rank(), "reduce-scatter: count overflows");
  c.checkBuffer(sendbuf, recvcount * static_cast<size_t>(c.size()), type, "reduce-scatter");
  c.checkBuffer(recvbuf, recvcount, type, "reduce-scatter");
  checkOp(op, c.rank());
  unavailable(c, "reduce-scatter");
}
void Communicator::reduceScatter(const void* s, void* r, size_t n, DataType t, ReduceOp op) {
  ireduceScatter(s, r, n, t, op).wait();
}

Work Communicator::iallToAll(const void* sendbuf, void* recvbuf, size_t count, DataType type) {
  auto& c = implOf(*this);
  c.checkOk();
  if (count > SIZE_MAX / static_cast<size_t>(c.size()))
    LOOM_THROW(ErrorCode::InvalidArgument, c.rank(), "all-to-all: count overflows");
  c.checkBuffer(sendbuf, count * static_cast<size_t>(c.size()), type, "all-to-all");
  c.checkBuffer(recvbuf, count * static_cast<size_t>(c.size()), type, "all-to-all");
  unavailable(c, "all-to-all");
}
void Communicator::allToAll(const void* s, void* r, size_t n, DataType t) { iallToAll(s, r, n, t).wait(); }

}  // namespace loom
