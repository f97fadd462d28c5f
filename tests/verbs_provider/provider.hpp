// The tests' verbs provider: a user-space stand-in for an RDMA adapter, loaded by Loom instead of
// libibverbs when LOOM_IBVERBS_LIBRARY names it, so that the ib transport runs unchanged on
// machines without an HCA. It exports the verbs calls Loom makes and fills each context's ops
// table (the data path verbs.h inlines), and it is strict where a real adapter is: keys, bounds
// and access flags are checked, the queue pair state machine wants the attributes a real one
// wants, queue limits hold, and completions come per queue pair in order.
//
// Devices come from LOOM_TEST_VERBS_DEVICES (devices.cc). Queue pairs of processes on one host
// and on the virtual cluster's nodes reach each other over a wire (wire.cc): TCP between the
// processes, found through a directory every process shares (LOOM_TEST_VERBS_DIR), where each
// port's LID and each queue pair's address are written.
#pragma once

#include <infiniband/verbs.h>
#include <netinet/in.h>

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <mutex>
#include <string>
#include <vector>

namespace vp {

struct PortConfig {
  bool active = true;
  bool assigned = false;  // its LID or GID is set (assignAddress)
  uint16_t lid = 0;       // InfiniBand: assigned on first open, per host, device and port
  uint8_t gid[16] = {};
};

struct Device {
  ibv_device dev;  // first: the library's callers hold ibv_device*
  std::string name;
  bool roce = false;
  int numaNode = 0;
  std::vector<PortConfig> ports;  // [0] is port 1
  uint64_t guid = 0;
};

struct Context;

struct Pd {
  ibv_pd pd;
};

struct Mr {
  ibv_mr mr;
  int access = 0;
  // A dma-buf region (ibv_reg_dmabuf_mr): mr.addr is its I/O virtual address, not this process's;
  // the adapter reaches the bytes through the buffer's own mapping, view.
  uint8_t* view = nullptr;
  void* mapBase = nullptr;  // what munmap takes
  size_t mapBytes = 0;
};

struct Channel {
  ibv_comp_channel ch;
  int pipe[2] = {-1, -1};  // a byte per completion event; the read end is ch.fd
  std::mutex mu;
  std::deque<struct Cq*> events;
};

struct Cq {
  ibv_cq cq;
  std::mutex mu;
  std::deque<ibv_wc> entries;
  bool armed = false;
  bool overrun = false;
  Channel* channel = nullptr;
};

/// A work request as the provider keeps it: its gather or scatter list copied (the caller's may
/// go once posted).
struct Work {
  uint64_t wrId = 0;
  ibv_wr_opcode opcode = IBV_WR_SEND;
  unsigned flags = 0;
  uint32_t imm = 0;
  uint64_t remoteAddr = 0;
  uint32_t rkey = 0;
  std::vector<ibv_sge> sges;
  std::vector<uint8_t> inlineData;  // IBV_SEND_INLINE: the bytes, copied at post time
  uint64_t bytes() const {
    uint64_t n = 0;
    for (const auto& s : sges) n += s.length;
    return n;
  }
};

struct Qp {
  ibv_qp qp;
  Context* owner = nullptr;
  ibv_qp_cap cap{};
  bool sqSigAll = false;
  // Set by modify (INIT, RTR, RTS).
  int port = 0;
  int access = 0;
  ibv_mtu pathMtu = IBV_MTU_256;
  uint32_t destQpn = 0;
  uint16_t dlid = 0;
  bool global = false;
  uint8_t dgid[16] = {};
  uint8_t sgidIndex = 0;
  uint8_t timeout = 0;
  uint8_t retryCnt = 0;
  uint8_t rnrRetry = 0;
  uint8_t minRnrTimer = 0;
  uint32_t rqPsn = 0;
  uint32_t sqPsn = 0;
  // As a responder (the wire's lock): the last request carried out and how it was answered, so
  // that a request sent again (its answer was late) is answered again, not carried out twice.
  uint64_t lastSeq = 0;
  uint8_t lastAnswer = 0;
  // Queues (mu): posted and not yet completed.
  std::mutex mu;
  std::deque<Work> sendQueue;
  std::deque<Work> recvQueue;
};

struct Context {
  ibv_context ctx;  // first: callers hold ibv_context*
  Device* device = nullptr;
  int asyncPipe[2] = {-1, -1};  // events for ibv_get_async_event; the read end is ctx.async_fd
  std::mutex asyncMu;
  std::deque<ibv_async_event> asyncEvents;
};

/// Every device of LOOM_TEST_VERBS_DEVICES, made at the first call.
std::vector<Device*>& devices();
/// The directory the processes share (LOOM_TEST_VERBS_DIR), created if need be.
const std::string& stateDir();
/// This port's LID (InfiniBand) or GID (RoCE), assigned on first use and shared by every process
/// on this host (network namespace) that opens it.
void assignAddress(Device* d, int port);
/// This host's IPv4 address: what its RoCE GIDs carry and where its wire listens
/// (LOOM_TEST_VERBS_IP, else the first interface up that is not loopback, else 127.0.0.1).
in_addr hostIpv4();
/// The host this process runs on, as the wire tells hosts apart: the boot and network namespace.
const std::string& hostKey();

/// Posts an asynchronous event on `ctx` (a queue pair gone to error, a port down).
void postAsyncEvent(Context* ctx, const ibv_async_event& event);
/// Adds a completion to `cq` and signals its channel if armed. Overrun puts the CQ in error.
void pushCompletion(Cq* cq, const ibv_wc& wc);
/// Looks up a memory region of `pd`'s context by key: local (lkey) or remote (rkey). Null when no
/// region has the key.
Mr* findMr(Context* ctx, uint32_t key, bool remote);
/// Gives `m` its keys and makes it findable; removeMr undoes it.
void addMr(Mr* m);
void removeMr(Mr* m);
/// Where the adapter reaches address `addr` of region `m` (inside it): the address itself, or for
/// a dma-buf region the same byte in the buffer's mapping.
uint8_t* hostAddress(const Mr* m, uint64_t addr);
/// hostAddress through the region named by `key` (an lkey, or an rkey when `remote`); the address
/// itself where no region has the key (the checks before a DMA have refused that already).
uint8_t* hostAddress(Context* ctx, uint32_t key, bool remote, uint64_t addr);
/// Moves `qp` to the error state: its posted work completes with IBV_WC_WR_FLUSH_ERR, and an
/// asynchronous QP_FATAL (or `event`) is posted when `notify`.
void toError(Qp* qp, bool notify, ibv_event_type event = IBV_EVENT_QP_FATAL);

// The completion queue's ops (resources.cc), installed in every context's ops.
int pollCq(ibv_cq* cq, int n, ibv_wc* wc);
int reqNotifyCq(ibv_cq* cq, int solicitedOnly);

// The data path (wire.cc), installed in every context's ops.
int postSend(ibv_qp* qp, ibv_send_wr* wr, ibv_send_wr** bad);
int postRecv(ibv_qp* qp, ibv_recv_wr* wr, ibv_recv_wr** bad);
/// Starts this process's wire if it is not running, so that `qp` can be reached; called when a
/// queue pair is created.
void wireRegister(Qp* qp);
void wireUnregister(Qp* qp);

/// Bytes the provider moved for the tests to check (a real adapter's DMA): see counters.h.
struct Counters {
  std::atomic<uint64_t> sendBytes{0};     // SEND payload read from the sender's memory
  std::atomic<uint64_t> writeBytes{0};    // RDMA WRITE payload placed in the target's memory
  std::atomic<uint64_t> readBytes{0};     // RDMA READ payload placed in the reader's memory
  std::atomic<uint64_t> writeWithImm{0};  // RDMA WRITEs with immediate data
  std::atomic<uint64_t> sends{0};         // SENDs delivered
  std::atomic<uint64_t> rnrNaks{0};       // receives not ready, retried
  std::atomic<uint64_t> remoteAccessErrors{0};
  std::atomic<uint64_t> registrations{0};  // ibv_reg_mr calls that succeeded
  std::atomic<uint64_t> deregistrations{0};
  std::atomic<uint64_t> unmappedAccesses{0};     // DMA into or out of memory no longer mapped
  std::atomic<uint64_t> dmabufRegistrations{0};  // the emulated device's memory, by its dma-buf
  std::atomic<uint64_t> deviceRegistrations{0};  // the emulated device's memory, by its pointer
  // The span RDMA WRITEs read from and wrote into ([begin, end); begin ~0 before the first).
  std::atomic<uint64_t> writeSourceBegin{~0ULL}, writeSourceEnd{0};
  std::atomic<uint64_t> writeTargetBegin{~0ULL}, writeTargetEnd{0};
  /// Widens a span to hold [addr, addr + n).
  static void widen(std::atomic<uint64_t>& begin, std::atomic<uint64_t>& end, uint64_t addr, uint64_t n);
};
Counters& counters();

}  // namespace vp
