// The C API. Every extern "C" function goes through guard(), which maps loom::Error codes to
// loomResult_t and keeps the message for loomGetLastError().
//
// Handles: a loomComm_t is looked up in a registry of live communicators on every call, so a
// destroyed or bogus handle is an error rather than a crash. Each call holds a reference for its
// duration, so loomCommAbort from another thread unblocks the call and the memory goes only when
// the call has returned.
#include <algorithm>
#include <cstddef>
#include <cstring>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>
#include <vector>

#include "comm/comm_impl.hpp"
#include "core/format.hpp"
#include "core/logging.hpp"
#include "loom/loom.h"
#include "loom/loom.hpp"

struct loomComm {
  std::unique_ptr<loom::Communicator> comm;
};

namespace {

using loom::ErrorCode;

thread_local std::string tlsLastError;

std::mutex& registryMutex() {
  static std::mutex m;
  return m;
}
std::unordered_map<loomComm*, std::shared_ptr<loomComm>>& registry() {
  static auto* r = new std::unordered_map<loomComm*, std::shared_ptr<loomComm>>();
  return *r;
}

std::shared_ptr<loomComm> lookup(loomComm_t handle) {
  if (handle == nullptr) LOOM_THROW(ErrorCode::InvalidArgument, -1, "comm is NULL");
  std::lock_guard<std::mutex> lock(registryMutex());
  auto it = registry().find(handle);
  if (it == registry().end()) {
    LOOM_THROW(ErrorCode::InvalidArgument, -1, "comm is not a live communicator (destroyed already, or never created)");
  }
  return it->second;
}

std::shared_ptr<loomComm> unregister(loomComm_t handle) {
  std::lock_guard<std::mutex> lock(registryMutex());
  auto it = registry().find(handle);
  if (it == registry().end()) return nullptr;
  auto c = it->second;
  registry().erase(it);
  return c;
}

loomResult_t toResult(ErrorCode code) {
  switch (code) {
    case ErrorCode::InvalidArgument:
      return loomInvalidArgument;
    case ErrorCode::InvalidUsage:
      return loomInvalidUsage;
    case ErrorCode::System:
      return loomSystemError;
    case ErrorCode::Remote:
      return loomRemoteError;
    case ErrorCode::Timeout:
      return loomTimeout;
    case ErrorCode::Aborted:
      return loomAborted;
    case ErrorCode::Internal:
      return loomInternalError;
    case ErrorCode::Cuda:
      return loomUnhandledCudaError;
  }
  return loomInternalError;
}

template <typename F>
loomResult_t guard(F&& f) {
  try {
    f();
    return loomSuccess;
  } catch (const loom::Error& e) {
    tlsLastError = e.what();
    LOOM_INFO("%s", e.what());
    return toResult(e.code());
  } catch (const std::bad_alloc&) {
    tlsLastError = "loom system error: out of memory";
    return loomSystemError;
  } catch (const std::exception& e) {
    tlsLastError = std::string("loom internal error: ") + e.what();
    return loomInternalError;
  } catch (...) {
    tlsLastError = "loom internal error: unknown exception";
    return loomInternalError;
  }
}

// The barrier synchronises hosts: it takes no stream (collectives and point-to-point do).
void checkHostStream(loomStream_t stream, const char* what) {
  if (stream != nullptr) {
    LOOM_THROW(ErrorCode::InvalidArgument, -1,
               loom::strFormat(
                   "%s: a stream was given, but %s synchronises hosts and takes no stream in this version: pass NULL "
                   "and host buffers",
                   what, what));
  }
}

// A C enum argument may hold any int a caller put there; read as an enum value outside the
// enumerators' range it would be undefined behaviour, so its bits are read as an int.
template <typename E>
int rawValue(const E& e) {
  static_assert(sizeof(E) == sizeof(int), "C enums are int-sized here");
  int v = 0;
  std::memcpy(&v, &e, sizeof v);
  return v;
}

loom::DataType toType(const loomDataType_t& t) {
  const int v = rawValue(t);
  if (v < 0 || v >= loomNumTypes) {
    LOOM_THROW(ErrorCode::InvalidArgument, -1, loom::strFormat("unknown datatype %d", v));
  }
  return static_cast<loom::DataType>(v);
}

loom::ReduceOp toOp(const loomRedOp_t& op) {
  const int v = rawValue(op);
  if (v < 0 || v >= loomNumOps) {
    LOOM_THROW(ErrorCode::InvalidArgument, -1, loom::strFormat("unknown reduction op %d", v));
  }
  return static_cast<loom::ReduceOp>(v);
}

loom::Options toOptions(const loomConfig_t* config) {
  loom::Options o;
  if (config == nullptr) return o;
  // A caller compiled before `reproducible` was added passes the shorter struct.
  const size_t before = offsetof(loomConfig_t, reproducible);
  if (config->magic != LOOM_CONFIG_MAGIC || (config->size != sizeof(loomConfig_t) && config->size != before)) {
    LOOM_THROW(ErrorCode::InvalidArgument, -1,
               "config was not initialised with LOOM_CONFIG_INITIALIZER (or comes from another Loom version)");
  }
  if (config->timeoutMs > 0) o.timeout = std::chrono::milliseconds(config->timeoutMs);
  if (config->initTimeoutMs > 0) o.initTimeout = std::chrono::milliseconds(config->initTimeoutMs);
  if (config->name != nullptr) o.name = config->name;
  if (config->transports != nullptr) o.transports = config->transports;
  if (config->socketsPerPeer > 0) o.socketsPerPeer = config->socketsPerPeer;
  if (config->size > before && config->reproducible >= 0) o.reproducible = config->reproducible != 0 ? 1 : 0;
  return o;
}

loomComm_t registerComm(loom::Communicator&& c) {
  auto h = std::make_shared<loomComm>();
  h->comm = std::make_unique<loom::Communicator>(std::move(c));
  std::lock_guard<std::mutex> lock(registryMutex());
  registry()[h.get()] = h;
  return h.get();
}

// Grouped point-to-point: recorded per thread, posted together at the outermost loomGroupEnd.
struct GroupOp {
  std::shared_ptr<loomComm> comm;
  bool send;
  void* buf;
  size_t count;
  loom::DataType type;
  int peer;
  loomStream_t stream;
};
struct GroupState {
  int depth = 0;
  std::vector<GroupOp> ops;
};
thread_local GroupState tlsGroup;

loomResult_t p2p(bool send, const void* buf, size_t count, loomDataType_t datatype, int peer, loomComm_t comm,
                 loomStream_t stream) {
  return guard([&] {
    auto c = lookup(comm);
    const char* what = send ? "send" : "recv";
    loom::DataType type = toType(datatype);
    loom::LogRankScope scope(c->comm->rank());
    // Validate now, so that a bad argument is reported by the call that made it.
    if (send || peer != LOOM_ANY_SOURCE) c->comm->impl()->checkPeer(peer, what);
    c->comm->impl()->checkBuffer(buf, count, type, what);
    if (tlsGroup.depth > 0) {
      tlsGroup.ops.push_back(GroupOp{c, send, const_cast<void*>(buf), count, type, peer, stream});
      return;
    }
    if (send)
      c->comm->send(buf, count, type, peer, 0, stream);
    else
      c->comm->recv(const_cast<void*>(buf), count, type, peer, 0, stream);
  });
}

}  // namespace

extern "C" {

loomResult_t loomGetVersion(int* version) {
  return guard([&] {
    if (version == nullptr) LOOM_THROW(ErrorCode::InvalidArgument, -1, "version is NULL");
    *version = LOOM_VERSION_CODE;
  });
}

loomResult_t loomGetUniqueId(loomUniqueId* uniqueId) {
  return guard([&] {
    if (uniqueId == nullptr) LOOM_THROW(ErrorCode::InvalidArgument, -1, "uniqueId is NULL");
    auto id = loom::UniqueId::create();
    std::memcpy(uniqueId->internal, id.bytes().data(), LOOM_UNIQUE_ID_BYTES);
  });
}

loomResult_t loomCommInitRankConfig(loomComm_t* comm, int nranks, loomUniqueId commId, int rank,
                                    const loomConfig_t* config) {
  return guard([&] {
    if (comm == nullptr) LOOM_THROW(ErrorCode::InvalidArgument, rank, "comm is NULL");
    *comm = nullptr;
    auto id = loom::UniqueId::fromBytes(commId.internal, LOOM_UNIQUE_ID_BYTES);
    *comm = registerComm(loom::Communicator(rank, nranks, id, toOptions(config)));
  });
}

loomResult_t loomCommInitRank(loomComm_t* comm, int nranks, loomUniqueId commId, int rank) {
  return loomCommInitRankConfig(comm, nranks, commId, rank, nullptr);
}

loomResult_t loomCommInitFromEnv(loomComm_t* comm, const loomConfig_t* config) {
  return guard([&] {
    if (comm == nullptr) LOOM_THROW(ErrorCode::InvalidArgument, -1, "comm is NULL");
    *comm = nullptr;
    *comm = registerComm(loom::Communicator::fromEnv(toOptions(config)));
  });
}

loomResult_t loomCommSplit(loomComm_t comm, int color, int key, loomComm_t* newcomm) {
  return guard([&] {
    if (newcomm == nullptr) LOOM_THROW(ErrorCode::InvalidArgument, -1, "newcomm is NULL");
    *newcomm = nullptr;
    loom::Communicator part = lookup(comm)->comm->split(color, key);
    if (part.valid()) *newcomm = registerComm(std::move(part));
  });
}

loomResult_t loomCommFinalize(loomComm_t comm) {
  return guard([&] {
    auto c = lookup(comm);
    c->comm->finalize();
  });
}

loomResult_t loomCommDestroy(loomComm_t comm) {
  return guard([&] {
    if (unregister(comm) == nullptr) lookup(comm);  // throws the right message
    // The communicator is freed when the last call still using it returns.
  });
}

loomResult_t loomCommAbort(loomComm_t comm) {
  return guard([&] {
    auto c = unregister(comm);
    if (c == nullptr) lookup(comm);
    c->comm->abort();
  });
}

loomResult_t loomCommGetAsyncError(loomComm_t comm, loomResult_t* asyncError) {
  return guard([&] {
    if (asyncError == nullptr) LOOM_THROW(ErrorCode::InvalidArgument, -1, "asyncError is NULL");
    auto c = lookup(comm);
    *asyncError = loomSuccess;
    try {
      c->comm->checkError();
    } catch (const loom::Error& e) {
      *asyncError = toResult(e.code());
    }
  });
}

loomResult_t loomCommCount(const loomComm_t comm, int* count) {
  return guard([&] {
    if (count == nullptr) LOOM_THROW(ErrorCode::InvalidArgument, -1, "count is NULL");
    *count = lookup(comm)->comm->size();
  });
}

loomResult_t loomCommLocalRank(const loomComm_t comm, int* localRank, int* localSize) {
  return guard([&] {
    if (localRank == nullptr || localSize == nullptr)
      LOOM_THROW(ErrorCode::InvalidArgument, -1, "localRank or localSize is NULL");
    const auto& c = *lookup(comm)->comm;
    *localRank = c.localRank();
    *localSize = c.localSize();
  });
}

loomResult_t loomCommNodeCount(const loomComm_t comm, int* nodes) {
  return guard([&] {
    if (nodes == nullptr) LOOM_THROW(ErrorCode::InvalidArgument, -1, "nodes is NULL");
    *nodes = lookup(comm)->comm->nodeCount();
  });
}

loomResult_t loomCommUserRank(const loomComm_t comm, int* rank) {
  return guard([&] {
    if (rank == nullptr) LOOM_THROW(ErrorCode::InvalidArgument, -1, "rank is NULL");
    *rank = lookup(comm)->comm->rank();
  });
}

const char* loomGetErrorString(loomResult_t result) {
  switch (result) {
    case loomSuccess:
      return "no error";
    case loomUnhandledCudaError:
      return "unhandled CUDA error";
    case loomSystemError:
      return "system error (socket, memory or file)";
    case loomInternalError:
      return "internal error (a bug in Loom)";
    case loomInvalidArgument:
      return "invalid argument";
    case loomInvalidUsage:
      return "invalid usage";
    case loomRemoteError:
      return "remote process exited or a network error occurred";
    case loomInProgress:
      return "operation in progress";
    case loomTimeout:
      return "timeout";
    case loomAborted:
      return "communicator aborted";
    default:
      return "unknown result code";
  }
}

const char* loomGetLastError(loomComm_t comm) {
  if (comm != nullptr) {
    std::shared_ptr<loomComm> c;
    {
      std::lock_guard<std::mutex> lock(registryMutex());
      auto it = registry().find(comm);
      if (it != registry().end()) c = it->second;
    }
    if (c) {
      try {
        c->comm->checkError();
      } catch (const loom::Error& e) {
        tlsLastError = e.what();
      }
    }
  }
  return tlsLastError.c_str();
}

loomResult_t loomSend(const void* sendbuff, size_t count, loomDataType_t datatype, int peer, loomComm_t comm,
                      loomStream_t stream) {
  return p2p(true, sendbuff, count, datatype, peer, comm, stream);
}

loomResult_t loomRecv(void* recvbuff, size_t count, loomDataType_t datatype, int peer, loomComm_t comm,
                      loomStream_t stream) {
  return p2p(false, recvbuff, count, datatype, peer, comm, stream);
}

loomResult_t loomRecvAny(void* recvbuff, size_t count, loomDataType_t datatype, loomComm_t comm, int* source,
                         size_t* received) {
  return guard([&] {
    if (tlsGroup.depth > 0) LOOM_THROW(ErrorCode::InvalidUsage, -1, "loomRecvAny inside a group: use loomRecv");
    auto c = lookup(comm);
    loom::DataType type = toType(datatype);
    loom::LogRankScope scope(c->comm->rank());
    loom::Work w = c->comm->irecv(recvbuff, count, type, loom::kAnySource, 0);
    w.wait();
    if (source != nullptr) *source = w.source();
    if (received != nullptr) *received = w.bytes() / loom::sizeOf(type);
  });
}

loomResult_t loomGroupStart(void) {
  ++tlsGroup.depth;
  return loomSuccess;
}

loomResult_t loomGroupEnd(void) {
  if (tlsGroup.depth == 0) {
    return guard([] { LOOM_THROW(ErrorCode::InvalidUsage, -1, "loomGroupEnd without loomGroupStart"); });
  }
  if (--tlsGroup.depth > 0) return loomSuccess;
  std::vector<GroupOp> ops;
  ops.swap(tlsGroup.ops);
  std::vector<loom::Work> works;
  loomResult_t first = guard([&] {
    // Device buffers (or a stream): each communicator's ops go as one stream-ordered group, which
    // returns once queued. All ops of one communicator in a group share one stream.
    std::vector<loomComm*> deviceComms;
    for (auto& op : ops) {
      const bool dev = op.stream != nullptr || (op.count > 0 && loom::Communicator::deviceOf(op.buf) >= 0);
      if (dev && std::find(deviceComms.begin(), deviceComms.end(), op.comm.get()) == deviceComms.end())
        deviceComms.push_back(op.comm.get());
    }
    for (loomComm* dc : deviceComms) {
      std::vector<loom::PointToPoint> batch;
      loomStream_t stream = nullptr;
      bool first = true;
      for (auto& op : ops) {
        if (op.comm.get() != dc) continue;
        if (!first && op.stream != stream) {
          LOOM_THROW(ErrorCode::InvalidArgument, dc->comm->rank(),
                     "loomGroupEnd: sends and receives of one communicator on different streams in one group; use one "
                     "stream per communicator in a group");
        }
        stream = op.stream;
        first = false;
        batch.push_back(loom::PointToPoint{op.send, op.buf, op.count, op.type, op.peer, 0});
      }
      dc->comm->igroup(batch, stream);
    }
    // Host buffers: receives first, then sends, across communicators; waited for below.
    for (int pass = 0; pass < 2; ++pass)
      for (auto& op : ops) {
        if (op.send != (pass == 1)) continue;
        if (std::find(deviceComms.begin(), deviceComms.end(), op.comm.get()) != deviceComms.end()) continue;
        works.push_back(op.send ? op.comm->comm->isend(op.buf, op.count, op.type, op.peer)
                                : op.comm->comm->irecv(op.buf, op.count, op.type, op.peer));
      }
  });
  for (auto& w : works) {
    loomResult_t r = guard([&] { w.wait(); });
    if (first == loomSuccess) first = r;
  }
  return first;
}

loomResult_t loomBarrier(loomComm_t comm, loomStream_t stream) {
  return guard([&] {
    auto c = lookup(comm);
    checkHostStream(stream, "barrier");
    loom::LogRankScope scope(c->comm->rank());
    c->comm->barrier();
  });
}

loomResult_t loomAllReduce(const void* sendbuff, void* recvbuff, size_t count, loomDataType_t datatype, loomRedOp_t op,
                           loomComm_t comm, loomStream_t stream) {
  return guard([&] {
    auto c = lookup(comm);
    c->comm->allReduce(sendbuff, recvbuff, count, toType(datatype), toOp(op), stream);
  });
}

loomResult_t loomBroadcast(const void* sendbuff, void* recvbuff, size_t count, loomDataType_t datatype, int root,
                           loomComm_t comm, loomStream_t stream) {
  return guard([&] {
    auto c = lookup(comm);
    c->comm->broadcast(sendbuff, recvbuff, count, toType(datatype), root, stream);
  });
}

loomResult_t loomReduce(const void* sendbuff, void* recvbuff, size_t count, loomDataType_t datatype, loomRedOp_t op,
                        int root, loomComm_t comm, loomStream_t stream) {
  return guard([&] {
    auto c = lookup(comm);
    c->comm->reduce(sendbuff, recvbuff, count, toType(datatype), toOp(op), root, stream);
  });
}

loomResult_t loomAllGather(const void* sendbuff, void* recvbuff, size_t sendcount, loomDataType_t datatype,
                           loomComm_t comm, loomStream_t stream) {
  return guard([&] {
    auto c = lookup(comm);
    c->comm->allGather(sendbuff, recvbuff, sendcount, toType(datatype), stream);
  });
}

loomResult_t loomReduceScatter(const void* sendbuff, void* recvbuff, size_t recvcount, loomDataType_t datatype,
                               loomRedOp_t op, loomComm_t comm, loomStream_t stream) {
  return guard([&] {
    auto c = lookup(comm);
    c->comm->reduceScatter(sendbuff, recvbuff, recvcount, toType(datatype), toOp(op), stream);
  });
}

loomResult_t loomAllToAll(const void* sendbuff, void* recvbuff, size_t count, loomDataType_t datatype, loomComm_t comm,
                          loomStream_t stream) {
  return guard([&] {
    auto c = lookup(comm);
    c->comm->allToAll(sendbuff, recvbuff, count, toType(datatype), stream);
  });
}

loomResult_t loomGather(const void* sendbuff, void* recvbuff, size_t count, loomDataType_t datatype, int root,
                        loomComm_t comm, loomStream_t stream) {
  return guard([&] {
    auto c = lookup(comm);
    c->comm->gather(sendbuff, recvbuff, count, toType(datatype), root, stream);
  });
}

loomResult_t loomScatter(const void* sendbuff, void* recvbuff, size_t count, loomDataType_t datatype, int root,
                         loomComm_t comm, loomStream_t stream) {
  return guard([&] {
    auto c = lookup(comm);
    c->comm->scatter(sendbuff, recvbuff, count, toType(datatype), root, stream);
  });
}

}  // extern "C"
