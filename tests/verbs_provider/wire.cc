// The data path of the tests' verbs provider (provider.hpp): what an adapter does between posting
// and completion, done by one thread per process ("the adapter") over TCP between processes.
//
// A queue pair's work goes one request at a time (the adapter waits for the answer before it
// starts the next): SEND and RDMA WRITE carry their payload, gathered from the sender's memory
// regions; the responder checks it is addressed right (LID or GID of its port, the connected
// queue pair) and answers ACK, a NAK (receive not ready, access, invalid request) or, for an RDMA
// READ, the bytes. Checks are a real adapter's: local keys and bounds at the requester, remote key,
// bounds and access at the responder (the responder's queue pair goes to error too), a posted
// receive for a SEND or a WRITE with immediate data (else the requester retries, rnr_retry times,
// 7 for ever), an answer within the queue pair's timeout and retry count. Completions are queued
// per queue pair in order; an unsignaled work request holds its send-queue slot until a later
// signaled one completes, as on real adapters.
#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <map>
#include <memory>
#include <thread>

#include "provider.hpp"

namespace vp {
namespace {

const bool kDebug = std::getenv("LOOM_TEST_VERBS_DEBUG") != nullptr;
#define VP_DEBUG(...)                                     \
  do {                                                    \
    if (kDebug) {                                         \
      std::fprintf(stderr, "[verbs %d] ", (int)getpid()); \
      std::fprintf(stderr, __VA_ARGS__);                  \
      std::fprintf(stderr, "\n");                         \
    }                                                     \
  } while (0)

using Clock = std::chrono::steady_clock;

// The adapter's DMA into and out of registered memory. A real adapter keeps a region's pages
// pinned, so memory an application freed while work on it was in flight is read or written
// without harm; here the pages may be gone, so the copy goes through process_vm_readv/writev on
// this process, which report a fault instead of raising SIGSEGV (the bytes are then lost, as
// they would be). Counted, for tests that want none.
bool dma(void* to, const void* from, size_t n, bool write) {
  if (n == 0) return true;
  iovec local{write ? const_cast<void*>(from) : to, n};
  iovec remote{write ? to : const_cast<void*>(from), n};
  const ssize_t r = write ? process_vm_writev(getpid(), &local, 1, &remote, 1, 0)
                          : process_vm_readv(getpid(), &local, 1, &remote, 1, 0);
  if (r == static_cast<ssize_t>(n)) return true;
  if (r < 0 && (errno == EPERM || errno == ENOSYS)) {  // forbidden (seccomp): a plain copy
    std::memcpy(to, from, n);
    return true;
  }
  counters().unmappedAccesses++;
  VP_DEBUG("DMA %s %zu bytes at %p: memory gone", write ? "write of" : "read of", n, write ? to : from);
  return false;
}

enum Kind : uint8_t { kRequest = 1, kAck, kNak, kReadResponse };
enum NakCode : uint8_t { kRnr = 1, kAccess, kInvalid, kRemoteOp };

struct Packet {
  uint32_t magic = 0x4c565031;  // "LVP1"
  uint8_t kind = 0;
  uint8_t opcode = 0;  // ibv_wr_opcode of a request
  uint8_t nak = 0;
  uint8_t withImm = 0;
  uint32_t srcQpn = 0, dstQpn = 0;
  uint64_t seq = 0;
  uint32_t imm = 0, rkey = 0;
  uint64_t raddr = 0;
  uint64_t length = 0;   // the message's bytes (a READ's: asked for)
  uint64_t payload = 0;  // bytes that follow the header
  uint16_t dlid = 0;
  uint8_t dgid[16] = {};
};

struct Conn {
  int fd = -1;
  std::string key;  // "ip port" for connections we made
  std::vector<uint8_t> in;
  std::vector<uint8_t> out;
  size_t outDone = 0;
  bool connected = false;
};

// A queue pair's requester state (wire mutex).
struct Sender {
  bool inflight = false;
  uint64_t seq = 0;
  Clock::time_point deadline{};
  Clock::time_point resendAt{};  // after a receiver-not-ready answer
  int rnrLeft = 0;
  int triesLeft = 0;       // sends again after a timeout
  bool retrying = false;   // the front request is being sent again (same sequence number)
  int used = 0;            // send-queue slots held (unsignaled done work included)
  int unsignaledDone = 0;  // of those, completed without a completion entry
  std::shared_ptr<Conn> conn;
};

class Wire {
 public:
  static Wire& get() {
    static Wire* w = new Wire();
    return *w;
  }

  void add(Qp* q) {
    std::lock_guard<std::mutex> lock(mu_);
    start();
    qps_[q->qp.qp_num] = q;
    senders_[q->qp.qp_num] = Sender{};
    std::ofstream f(routeFile(q->qp.qp_num));
    f << ip_ << " " << port_ << "\n";
  }

  void remove(Qp* q) {
    std::lock_guard<std::mutex> lock(mu_);
    qps_.erase(q->qp.qp_num);
    senders_.erase(q->qp.qp_num);
    ::unlink(routeFile(q->qp.qp_num).c_str());
  }

  /// Slots a post may take: ENOMEM when the send queue is full.
  int reserve(Qp* q, int n) {
    std::lock_guard<std::mutex> lock(mu_);
    Sender& s = senders_[q->qp.qp_num];
    if (s.used + n > static_cast<int>(q->cap.max_send_wr)) return ENOMEM;
    s.used += n;
    return 0;
  }

  void kick() {
    uint64_t one = 1;
    (void)!write(wake_, &one, sizeof one);
  }

 private:
  Wire() = default;

  static std::string routeFile(uint32_t qpn) { return stateDir() + "/qp-" + std::to_string(qpn); }

  void start() {
    if (started_) return;
    started_ = true;
    // Listen on the address this host's RoCE GIDs carry, which peers on other (virtual) nodes reach.
    const in_addr addr = hostIpv4();
    listen_ = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    sockaddr_in sa{};
    sa.sin_family = AF_INET;
    sa.sin_addr = addr;
    if (bind(listen_, reinterpret_cast<sockaddr*>(&sa), sizeof sa) != 0) {
      sa.sin_addr.s_addr = htonl(INADDR_ANY);
      bind(listen_, reinterpret_cast<sockaddr*>(&sa), sizeof sa);
    }
    ::listen(listen_, 128);
    socklen_t len = sizeof sa;
    getsockname(listen_, reinterpret_cast<sockaddr*>(&sa), &len);
    char buf[INET_ADDRSTRLEN];
    inet_ntop(AF_INET, &addr, buf, sizeof buf);
    ip_ = buf;
    port_ = ntohs(sa.sin_port);
    epoll_ = epoll_create1(EPOLL_CLOEXEC);
    wake_ = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    watch(listen_, nullptr);
    watch(wake_, nullptr);
    thread_ = std::thread([this] { run(); });
    thread_.detach();  // the adapter lives as long as the process
  }

  void watch(int fd, Conn* c) {
    epoll_event ev{};
    ev.events = EPOLLIN | EPOLLOUT | EPOLLET;
    ev.data.ptr = c;
    if (fd == listen_ || fd == wake_) {
      ev.events = EPOLLIN;
      ev.data.u64 = static_cast<uint64_t>(fd) | (1ULL << 63);
    }
    epoll_ctl(epoll_, EPOLL_CTL_ADD, fd, &ev);
  }

  void run() {
    epoll_event events[64];
    for (;;) {
      // Timers (an answer's deadline, a resend after "not ready") need a look every millisecond.
      int n = epoll_wait(epoll_, events, 64, timersPending_ ? 1 : 100);
      std::lock_guard<std::mutex> lock(mu_);
      for (int i = 0; i < n; ++i) {
        if (events[i].data.u64 & (1ULL << 63)) {
          const int fd = static_cast<int>(events[i].data.u64 & 0xffffffff);
          if (fd == wake_) {
            uint64_t v;
            (void)!read(wake_, &v, sizeof v);
          } else {
            acceptAll();
          }
          continue;
        }
        auto* c = static_cast<Conn*>(events[i].data.ptr);
        if (events[i].events & EPOLLOUT) c->connected = true;
        if (events[i].events & (EPOLLIN | EPOLLHUP | EPOLLERR)) readFrom(c);
      }
      for (auto& c : conns_) flushOut(c.get());
      step();
      conns_.erase(std::remove_if(conns_.begin(), conns_.end(), [](const auto& c) { return c->fd < 0; }), conns_.end());
    }
  }

  void acceptAll() {
    for (;;) {
      int fd = accept4(listen_, nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC);
      if (fd < 0) return;
      int one = 1;
      setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
      auto c = std::make_shared<Conn>();
      c->fd = fd;
      c->connected = true;
      conns_.push_back(c);
      watch(fd, c.get());
    }
  }

  std::shared_ptr<Conn> connectTo(const std::string& key) {
    for (auto& c : conns_)
      if (c->key == key && c->fd >= 0) return c;
    char ip[64];
    int port = 0;
    if (std::sscanf(key.c_str(), "%63s %d", ip, &port) != 2) return nullptr;
    sockaddr_in sa{};
    sa.sin_family = AF_INET;
    sa.sin_port = htons(static_cast<uint16_t>(port));
    if (inet_pton(AF_INET, ip, &sa.sin_addr) != 1) return nullptr;
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    int one = 1;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    if (::connect(fd, reinterpret_cast<sockaddr*>(&sa), sizeof sa) != 0 && errno != EINPROGRESS) {
      close(fd);
      return nullptr;
    }
    auto c = std::make_shared<Conn>();
    c->fd = fd;
    c->key = key;
    conns_.push_back(c);
    watch(fd, c.get());
    return c;
  }

  void drop(Conn* c) {
    if (c->fd < 0) return;
    epoll_ctl(epoll_, EPOLL_CTL_DEL, c->fd, nullptr);
    close(c->fd);
    c->fd = -1;
    c->in.clear();
    c->out.clear();
    c->outDone = 0;
  }

  void flushOut(Conn* c) {
    while (c->fd >= 0 && c->outDone < c->out.size()) {
      ssize_t k = ::send(c->fd, c->out.data() + c->outDone, c->out.size() - c->outDone, MSG_NOSIGNAL);
      if (k < 0) {
        if (errno == EAGAIN || errno == EWOULDBLOCK || errno == ENOTCONN) return;
        drop(c);
        return;
      }
      c->outDone += static_cast<size_t>(k);
    }
    if (c->outDone == c->out.size()) {
      c->out.clear();
      c->outDone = 0;
    }
  }

  static void append(Conn* c, const Packet& p, const uint8_t* payload, size_t n) {
    const auto* h = reinterpret_cast<const uint8_t*>(&p);
    c->out.insert(c->out.end(), h, h + sizeof p);
    if (n > 0) c->out.insert(c->out.end(), payload, payload + n);
  }

  void readFrom(Conn* c) {
    uint8_t buf[1 << 16];
    for (;;) {
      if (c->fd < 0) return;
      ssize_t k = ::recv(c->fd, buf, sizeof buf, 0);
      if (k > 0) {
        c->in.insert(c->in.end(), buf, buf + k);
        continue;
      }
      if (k == 0 || (errno != EAGAIN && errno != EWOULDBLOCK)) drop(c);
      break;
    }
    size_t at = 0;
    while (c->in.size() - at >= sizeof(Packet)) {
      Packet p;
      std::memcpy(&p, c->in.data() + at, sizeof p);
      if (p.magic != Packet{}.magic) {
        drop(c);
        return;
      }
      if (c->in.size() - at - sizeof p < p.payload) break;
      const uint8_t* payload = c->in.data() + at + sizeof p;
      if (p.kind == kRequest)
        respond(c, p, payload);
      else
        answered(p, payload);
      at += sizeof p + p.payload;
    }
    if (c->fd >= 0) c->in.erase(c->in.begin(), c->in.begin() + static_cast<std::ptrdiff_t>(at));
  }

  // ---- Responder. ----

  bool addressedHere(const Qp* q, const Packet& p) {
    const Device* d = q->owner->device;
    if (q->port < 1) return false;
    const PortConfig& port = d->ports[static_cast<size_t>(q->port - 1)];
    if (!port.active) return false;
    return d->roce ? std::memcmp(p.dgid, port.gid, 16) == 0 : p.dlid == port.lid;
  }

  // Places `n` bytes into a receive's scatter list; false for a bad key or too little room.
  static bool scatter(Qp* q, const Work& w, const uint8_t* data, uint64_t n, ibv_wc_status* why) {
    uint64_t room = 0;
    for (const auto& s : w.sges) {
      Mr* mr = findMr(q->owner, s.lkey, false);
      if (mr == nullptr || mr->mr.pd != q->qp.pd || (mr->access & IBV_ACCESS_LOCAL_WRITE) == 0 ||
          s.addr < reinterpret_cast<uint64_t>(mr->mr.addr) ||
          s.addr + s.length > reinterpret_cast<uint64_t>(mr->mr.addr) + mr->mr.length) {
        *why = IBV_WC_LOC_PROT_ERR;
        return false;
      }
      room += s.length;
    }
    if (room < n) {
      *why = IBV_WC_LOC_LEN_ERR;
      return false;
    }
    uint64_t done = 0;
    for (const auto& s : w.sges) {
      if (done == n) break;
      const uint64_t k = std::min<uint64_t>(s.length, n - done);
      dma(hostAddress(q->owner, s.lkey, false, s.addr), data + done, k, true);
      done += k;
    }
    return true;
  }

  void reply(Conn* c, const Packet& req, Kind kind, NakCode nak, const uint8_t* payload = nullptr, size_t n = 0) {
    Packet a;
    a.kind = kind;
    a.nak = nak;
    a.srcQpn = req.dstQpn;
    a.dstQpn = req.srcQpn;
    a.seq = req.seq;
    a.length = req.length;
    a.payload = n;
    append(c, a, payload, n);
  }

  // Answers an RDMA READ with the bytes it asked for (checked against the region already).
  void readResponse(Conn* c, Qp* q, const Packet& p) {
    std::vector<uint8_t> bytes(p.length);
    if (p.length > 0) dma(bytes.data(), hostAddress(q->owner, p.rkey, true, p.raddr), p.length, false);
    reply(c, p, kReadResponse, kRnr, bytes.data(), bytes.size());
  }

  void respond(Conn* c, const Packet& p, const uint8_t* payload) {
    VP_DEBUG("request op %d seq %llu from qp %u to qp %u, %llu bytes", p.opcode, (unsigned long long)p.seq, p.srcQpn,
             p.dstQpn, (unsigned long long)p.length);
    auto it = qps_.find(p.dstQpn);
    if (it == qps_.end()) return;  // no such queue pair: nothing answers, the requester times out
    Qp* q = it->second;
    std::unique_lock<std::mutex> qlock(q->mu);
    const ibv_qp_state st = q->qp.state;
    // Only a queue pair ready to receive, addressed at its port, from the queue pair it is
    // connected to, answers.
    if ((st != IBV_QPS_RTR && st != IBV_QPS_RTS) || p.srcQpn != q->destQpn || !addressedHere(q, p)) return;
    // A request carried out already was sent again (its answer came late): answer it again.
    if (q->lastSeq != 0 && p.seq <= q->lastSeq) {
      if (p.seq < q->lastSeq) return;
      if (q->lastAnswer == kReadResponse)
        readResponse(c, q, p);
      else
        reply(c, p, kAck, kRnr);
      return;
    }
    // What is carried out below is answered once; a receiver-not-ready answer carries nothing out.
    auto done = [&](Kind kind) {
      q->lastSeq = p.seq;
      q->lastAnswer = kind;
    };
    const auto op = static_cast<ibv_wr_opcode>(p.opcode);
    const bool needsRecv = op == IBV_WR_SEND || op == IBV_WR_SEND_WITH_IMM || op == IBV_WR_RDMA_WRITE_WITH_IMM;
    if (needsRecv && q->recvQueue.empty()) {
      reply(c, p, kNak, kRnr);
      return;
    }
    if (op == IBV_WR_RDMA_WRITE || op == IBV_WR_RDMA_WRITE_WITH_IMM || op == IBV_WR_RDMA_READ) {
      const bool write = op != IBV_WR_RDMA_READ;
      const int need = write ? IBV_ACCESS_REMOTE_WRITE : IBV_ACCESS_REMOTE_READ;
      Mr* mr = p.length > 0 ? findMr(q->owner, p.rkey, true) : nullptr;
      const bool ok = p.length == 0 || (mr != nullptr && mr->mr.pd == q->qp.pd && (mr->access & need) != 0 &&
                                        (q->access & need) != 0 && p.raddr >= reinterpret_cast<uint64_t>(mr->mr.addr) &&
                                        p.raddr + p.length <= reinterpret_cast<uint64_t>(mr->mr.addr) + mr->mr.length);
      if (!ok) {
        counters().remoteAccessErrors++;
        done(kNak);
        reply(c, p, kNak, kAccess);
        qlock.unlock();
        toError(q, true, IBV_EVENT_QP_ACCESS_ERR);
        return;
      }
      if (!write) {
        done(kReadResponse);
        readResponse(c, q, p);
        return;
      }
      if (p.length > 0) dma(hostAddress(mr, p.raddr), payload, p.length, true);
      counters().writeBytes += p.length;
      if (p.length > 0) Counters::widen(counters().writeTargetBegin, counters().writeTargetEnd, p.raddr, p.length);
      if (op == IBV_WR_RDMA_WRITE) {
        done(kAck);
        reply(c, p, kAck, kRnr);
        return;
      }
    }
    // A receive completes: a SEND's payload lands in it, a WRITE with immediate data consumes it.
    Work w = q->recvQueue.front();
    ibv_wc wc{};
    wc.wr_id = w.wrId;
    wc.qp_num = q->qp.qp_num;
    wc.src_qp = p.srcQpn;
    wc.byte_len = static_cast<uint32_t>(p.length);
    if (op == IBV_WR_RDMA_WRITE_WITH_IMM) {
      wc.opcode = IBV_WC_RECV_RDMA_WITH_IMM;
      counters().writeWithImm++;
    } else {
      wc.opcode = IBV_WC_RECV;
      ibv_wc_status why = IBV_WC_SUCCESS;
      if (!scatter(q, w, payload, p.length, &why)) {
        q->recvQueue.pop_front();
        qlock.unlock();
        wc.status = why;
        pushCompletion(reinterpret_cast<Cq*>(q->qp.recv_cq), wc);
        done(kNak);
        reply(c, p, kNak, why == IBV_WC_LOC_LEN_ERR ? kInvalid : kRemoteOp);
        toError(q, true, IBV_EVENT_QP_FATAL);
        return;
      }
      counters().sends++;
    }
    if (p.withImm) {
      wc.wc_flags |= IBV_WC_WITH_IMM;
      wc.imm_data = p.imm;
    }
    wc.status = IBV_WC_SUCCESS;
    q->recvQueue.pop_front();
    done(kAck);
    qlock.unlock();
    pushCompletion(reinterpret_cast<Cq*>(q->qp.recv_cq), wc);
    reply(c, p, kAck, kRnr);
  }

  // ---- Requester. ----

  // Completes the front work request of `q`'s send queue with `status` (an error moves the queue
  // pair to error and flushes the rest).
  void finish(Qp* q, Sender& s, ibv_wc_status status, uint64_t readBytes = 0) {
    Work w;
    {
      std::lock_guard<std::mutex> lock(q->mu);
      if (q->sendQueue.empty()) return;
      w = q->sendQueue.front();
      q->sendQueue.pop_front();
    }
    s.inflight = false;
    s.conn.reset();
    const bool signaled = q->sqSigAll || (w.flags & IBV_SEND_SIGNALED) != 0 || status != IBV_WC_SUCCESS;
    if (!signaled) {
      ++s.unsignaledDone;
      return;
    }
    s.used -= 1 + s.unsignaledDone;
    s.unsignaledDone = 0;
    ibv_wc wc{};
    wc.wr_id = w.wrId;
    wc.status = status;
    wc.qp_num = q->qp.qp_num;
    switch (w.opcode) {
      case IBV_WR_RDMA_WRITE:
      case IBV_WR_RDMA_WRITE_WITH_IMM:
        wc.opcode = IBV_WC_RDMA_WRITE;
        break;
      case IBV_WR_RDMA_READ:
        wc.opcode = IBV_WC_RDMA_READ;
        wc.byte_len = static_cast<uint32_t>(readBytes);
        break;
      default:
        wc.opcode = IBV_WC_SEND;
    }
    pushCompletion(reinterpret_cast<Cq*>(q->qp.send_cq), wc);
    if (status != IBV_WC_SUCCESS) {
      s.used = 0;
      s.unsignaledDone = 0;
      toError(q, false);
    }
  }

  void answered(const Packet& a, const uint8_t* payload) {
    VP_DEBUG("answer kind %d nak %d seq %llu to qp %u", a.kind, a.nak, (unsigned long long)a.seq, a.dstQpn);
    auto it = qps_.find(a.dstQpn);
    if (it == qps_.end()) return;
    Qp* q = it->second;
    Sender& s = senders_[a.dstQpn];
    if (!s.inflight || a.seq != s.seq) return;
    if (a.kind == kAck) {
      finish(q, s, IBV_WC_SUCCESS);
    } else if (a.kind == kReadResponse) {
      uint64_t done = 0;
      {
        // Written under the lock, as the request's gather is read (step).
        std::lock_guard<std::mutex> lock(q->mu);
        if (q->sendQueue.empty() || q->qp.state == IBV_QPS_ERR) return;
        for (const auto& g : q->sendQueue.front().sges) {
          const uint64_t k = std::min<uint64_t>(g.length, a.payload - done);
          dma(hostAddress(q->owner, g.lkey, false, g.addr), payload + done, k, true);
          done += k;
        }
      }
      counters().readBytes += done;
      finish(q, s, IBV_WC_SUCCESS, done);
    } else if (a.nak == kRnr) {
      counters().rnrNaks++;
      if (q->rnrRetry != 7 && s.rnrLeft-- <= 0) {
        finish(q, s, IBV_WC_RNR_RETRY_EXC_ERR);
        return;
      }
      s.inflight = false;
      s.retrying = true;
      s.resendAt = Clock::now() + std::chrono::microseconds(200);
    } else if (a.nak == kAccess) {
      counters().remoteAccessErrors++;
      finish(q, s, IBV_WC_REM_ACCESS_ERR);
    } else if (a.nak == kInvalid) {
      finish(q, s, IBV_WC_REM_INV_REQ_ERR);
    } else {
      finish(q, s, IBV_WC_REM_OP_ERR);
    }
  }

  // Local checks of a gather list: every key a region of this queue pair's domain, every piece
  // inside it (for a READ, writable).
  static bool gatherOk(Qp* q, const Work& w) {
    if ((w.flags & IBV_SEND_INLINE) != 0) return true;
    for (const auto& s : w.sges) {
      if (s.length == 0) continue;
      Mr* mr = findMr(q->owner, s.lkey, false);
      if (mr == nullptr || mr->mr.pd != q->qp.pd || s.addr < reinterpret_cast<uint64_t>(mr->mr.addr) ||
          s.addr + s.length > reinterpret_cast<uint64_t>(mr->mr.addr) + mr->mr.length)
        return false;
      if (w.opcode == IBV_WR_RDMA_READ && (mr->access & IBV_ACCESS_LOCAL_WRITE) == 0) return false;
    }
    return true;
  }

  std::string routeOf(uint32_t qpn) {
    std::ifstream f(routeFile(qpn));
    std::string line;
    std::getline(f, line);
    return line;
  }

  void step() {
    const auto now = Clock::now();
    bool pending = false;
    for (auto& [qpn, q] : qps_) {
      Sender& s = senders_[qpn];
      pending = pending || s.inflight || s.retrying;
      if (s.inflight) {
        if (now <= s.deadline) continue;
        // No answer within the timeout: send again, retry_cnt times, then give up.
        if (s.triesLeft-- <= 0) {
          finish(q, s, IBV_WC_RETRY_EXC_ERR);
          continue;
        }
        s.inflight = false;
        s.retrying = true;
      }
      if (now < s.resendAt) continue;
      Work w;
      std::vector<uint8_t> payload;
      bool gathered = true;
      {
        // Read from memory under the queue pair's lock, as a real adapter stops reading once the
        // queue pair is in error: its owner may free the buffers as soon as that returns.
        std::lock_guard<std::mutex> lock(q->mu);
        if (q->qp.state != IBV_QPS_RTS || q->sendQueue.empty()) continue;
        w = q->sendQueue.front();
        gathered = gatherOk(q, w);
        if (gathered && w.opcode != IBV_WR_RDMA_READ) {
          payload.reserve(w.bytes());
          for (const auto& g : w.sges) {
            const size_t at = payload.size();
            payload.resize(at + g.length);
            if ((w.flags & IBV_SEND_INLINE) != 0)
              std::memcpy(payload.data() + at, w.inlineData.data() + at, g.length);
            else
              dma(payload.data() + at, hostAddress(q->owner, g.lkey, false, g.addr), g.length, false);
          }
        }
      }
      if (!gathered) {
        finish(q, s, IBV_WC_LOC_PROT_ERR);
        continue;
      }
      if (!s.retrying) {
        s.rnrLeft = q->rnrRetry;
        s.triesLeft = q->retryCnt;
        ++s.seq;
      }
      s.retrying = false;
      Packet p;
      p.kind = kRequest;
      p.opcode = static_cast<uint8_t>(w.opcode);
      p.withImm = w.opcode == IBV_WR_SEND_WITH_IMM || w.opcode == IBV_WR_RDMA_WRITE_WITH_IMM;
      p.imm = w.imm;
      p.srcQpn = qpn;
      p.dstQpn = q->destQpn;
      p.seq = s.seq;
      p.rkey = w.rkey;
      p.raddr = w.remoteAddr;
      p.length = w.bytes();
      p.dlid = q->dlid;
      std::memcpy(p.dgid, q->dgid, 16);
      // The adapter's ack timeout: 4.096 us * 2^timeout per try (at least 1 ms here), tries
      // 1 + retry_cnt.
      const double tryUs = 4.096 * static_cast<double>(1ULL << std::min<int>(q->timeout, 31));
      const auto perTry = std::chrono::microseconds(static_cast<int64_t>(std::max(1000.0, tryUs)));
      s.deadline = now + perTry;
      s.inflight = true;
      s.resendAt = {};
      pending = true;
      s.conn = connectTo(routeOf(q->destQpn));
      VP_DEBUG("qp %u sends op %d seq %llu to qp %u via \"%s\" (%s)", qpn, p.opcode, (unsigned long long)p.seq,
               q->destQpn, routeOf(q->destQpn).c_str(), s.conn ? "connected" : "unreachable");
      if (!s.conn) continue;  // unreachable: the deadline fails it
      const bool send = w.opcode == IBV_WR_SEND || w.opcode == IBV_WR_SEND_WITH_IMM;
      if (send && (w.flags & IBV_SEND_INLINE) == 0) counters().sendBytes += payload.size();
      if ((w.opcode == IBV_WR_RDMA_WRITE || w.opcode == IBV_WR_RDMA_WRITE_WITH_IMM) && (w.flags & IBV_SEND_INLINE) == 0)
        for (const auto& g : w.sges)
          if (g.length > 0) Counters::widen(counters().writeSourceBegin, counters().writeSourceEnd, g.addr, g.length);
      p.payload = payload.size();
      append(s.conn.get(), p, payload.data(), payload.size());
      flushOut(s.conn.get());
    }
    timersPending_ = pending;
  }

  std::mutex mu_;
  std::atomic<bool> timersPending_{false};
  bool started_ = false;
  std::thread thread_;
  int listen_ = -1, epoll_ = -1, wake_ = -1;
  std::string ip_;
  int port_ = 0;
  std::map<uint32_t, Qp*> qps_;
  std::map<uint32_t, Sender> senders_;
  std::vector<std::shared_ptr<Conn>> conns_;
};

}  // namespace

void wireRegister(Qp* q) { Wire::get().add(q); }
void wireUnregister(Qp* q) { Wire::get().remove(q); }

namespace {

// A fault LOOM_TEST_VERBS_FAULT plants in this process: "qp-fatal:N" (the queue pair of the N-th
// send work request posted goes to the error state, with IBV_EVENT_QP_FATAL), "port-down:N" (its
// port goes down then, with IBV_EVENT_PORT_ERR), "bad-rkey:N" (the N-th RDMA write carries a key
// the target never gave: a remote access error at both ends).
struct Fault {
  enum Kind { None, QpFatal, PortDown, BadRkey } kind = None;
  uint64_t at = 0;
  std::atomic<uint64_t> seen{0};
};

Fault& fault() {
  static Fault* f = [] {
    auto* out = new Fault();
    const char* spec = std::getenv("LOOM_TEST_VERBS_FAULT");
    if (spec == nullptr || *spec == '\0') return out;
    const std::string text(spec);
    const size_t colon = text.find(':');
    const std::string kind = text.substr(0, colon);
    out->at = colon == std::string::npos ? 1 : std::strtoull(text.c_str() + colon + 1, nullptr, 10);
    if (kind == "qp-fatal") out->kind = Fault::QpFatal;
    if (kind == "port-down") out->kind = Fault::PortDown;
    if (kind == "bad-rkey") out->kind = Fault::BadRkey;
    if (out->kind == Fault::None) std::fprintf(stderr, "verbs provider: LOOM_TEST_VERBS_FAULT=%s: unknown\n", spec);
    return out;
  }();
  return *f;
}

// Whether the fault strikes at this work request (counted among those of its kind).
bool strikes(Fault::Kind kind, const Work& w) {
  Fault& f = fault();
  if (f.kind != kind) return false;
  const bool counted =
      kind != Fault::BadRkey || w.opcode == IBV_WR_RDMA_WRITE || w.opcode == IBV_WR_RDMA_WRITE_WITH_IMM;
  return counted && f.seen.fetch_add(1) + 1 == f.at;
}

void portDown(Qp* q) {
  Device* d = q->owner->device;
  if (q->port >= 1 && q->port <= static_cast<int>(d->ports.size()))
    d->ports[static_cast<size_t>(q->port - 1)].active = false;
  ibv_async_event e{};
  e.event_type = IBV_EVENT_PORT_ERR;
  e.element.port_num = q->port;
  postAsyncEvent(q->owner, e);
  VP_DEBUG("planted: port %d of %s down", q->port, d->name.c_str());
}

}  // namespace

int postSend(ibv_qp* qp, ibv_send_wr* wr, ibv_send_wr** bad) {
  auto* q = reinterpret_cast<Qp*>(qp);
  int posted = 0;
  for (; wr != nullptr; wr = wr->next) {
    int err = 0;
    const bool known = wr->opcode == IBV_WR_SEND || wr->opcode == IBV_WR_SEND_WITH_IMM ||
                       wr->opcode == IBV_WR_RDMA_WRITE || wr->opcode == IBV_WR_RDMA_WRITE_WITH_IMM ||
                       wr->opcode == IBV_WR_RDMA_READ;
    Work w;
    w.wrId = wr->wr_id;
    w.opcode = wr->opcode;
    w.flags = wr->send_flags;
    w.imm = wr->imm_data;
    w.remoteAddr = wr->wr.rdma.remote_addr;
    w.rkey = wr->wr.rdma.rkey;
    w.sges.assign(wr->sg_list, wr->sg_list + std::max(0, wr->num_sge));
    ibv_qp_state state;
    {
      std::lock_guard<std::mutex> lock(q->mu);  // the adapter's thread may move it to error
      state = qp->state;
    }
    if (state != IBV_QPS_RTS || !known || wr->num_sge < 0 || wr->num_sge > static_cast<int>(q->cap.max_send_sge)) {
      err = EINVAL;
    } else if ((w.flags & IBV_SEND_INLINE) != 0) {
      // Inline data is copied at post time, so the caller may reuse the buffer at once.
      if (w.opcode == IBV_WR_RDMA_READ || w.bytes() > q->cap.max_inline_data) {
        err = EINVAL;
      } else {
        for (const auto& g : w.sges) {
          const auto* p = reinterpret_cast<const uint8_t*>(g.addr);
          w.inlineData.insert(w.inlineData.end(), p, p + g.length);
        }
      }
    } else if (w.bytes() > (1ULL << 30)) {
      err = EINVAL;  // past the port's max_msg_sz
    }
    if (err == 0) err = Wire::get().reserve(q, 1);
    if (err != 0) {
      if (bad != nullptr) *bad = wr;
      if (posted > 0) Wire::get().kick();
      return err;
    }
    if (strikes(Fault::BadRkey, w)) {
      VP_DEBUG("planted: a wrong rkey on queue pair %u", q->qp.qp_num);
      w.rkey ^= 0x5a5a5a5au;
    }
    const bool fatal = strikes(Fault::QpFatal, w), down = strikes(Fault::PortDown, w);
    {
      std::lock_guard<std::mutex> lock(q->mu);
      q->sendQueue.push_back(std::move(w));
    }
    ++posted;
    if (fatal) {
      VP_DEBUG("planted: queue pair %u in error", q->qp.qp_num);
      toError(q, true, IBV_EVENT_QP_FATAL);
    }
    if (down) portDown(q);
  }
  Wire::get().kick();
  return 0;
}

int postRecv(ibv_qp* qp, ibv_recv_wr* wr, ibv_recv_wr** bad) {
  auto* q = reinterpret_cast<Qp*>(qp);
  for (; wr != nullptr; wr = wr->next) {
    std::unique_lock<std::mutex> lock(q->mu);
    int err = 0;
    if (qp->state == IBV_QPS_RESET || wr->num_sge < 0 || wr->num_sge > static_cast<int>(q->cap.max_recv_sge))
      err = EINVAL;
    else if (q->recvQueue.size() >= q->cap.max_recv_wr)
      err = ENOMEM;
    if (err != 0) {
      if (bad != nullptr) *bad = wr;
      return err;
    }
    Work w;
    w.wrId = wr->wr_id;
    w.sges.assign(wr->sg_list, wr->sg_list + wr->num_sge);
    if (qp->state == IBV_QPS_ERR) {
      // Posted to a queue pair in error: flushed at once.
      lock.unlock();
      ibv_wc wc{};
      wc.wr_id = w.wrId;
      wc.status = IBV_WC_WR_FLUSH_ERR;
      wc.qp_num = qp->qp_num;
      pushCompletion(reinterpret_cast<Cq*>(qp->recv_cq), wc);
      continue;
    }
    q->recvQueue.push_back(std::move(w));
  }
  return 0;
}

}  // namespace vp
