// Protection domains, memory regions, completion queues and channels, queue pairs and their state
// machine, and asynchronous events of the tests' verbs provider (provider.hpp). What a real adapter
// refuses is refused here with the same error: a remote-write region without local write, memory
// that is not mapped, a transition without the attributes it needs (or with ones it does not take),
// a queue pair of a type other than RC, limits past the device's, a resource destroyed while in use.
#include <fcntl.h>
#include <sys/file.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <fstream>
#include <map>
#include <random>

#include "counters.h"
#include "provider.hpp"

namespace vp {
namespace {

struct Registry {
  std::mutex mu;
  std::map<uint32_t, Mr*> lkeys, rkeys;  // by key: every live region of every context
  std::map<Pd*, int> pdUsers;            // regions and queue pairs per domain
  std::map<Cq*, int> cqUsers;            // queue pairs per completion queue
  std::map<Channel*, int> channelUsers;  // completion queues per channel
  std::map<Cq*, uint32_t> eventsDelivered;
  uint32_t nextKey = 0;
};

Registry& registry() {
  static Registry* r = [] {
    auto* x = new Registry();
    // Keys differ between processes, so that a key sent to the wrong peer matches nothing there.
    x->nextKey = std::random_device{}() & 0xffff00u;
    return x;
  }();
  return *r;
}

uint32_t allocateQpn() {
  const std::string dir = stateDir();
  const int lock = open((dir + "/qpn.lock").c_str(), O_CREAT | O_RDWR | O_CLOEXEC, 0666);
  flock(lock, LOCK_EX);
  uint32_t next = 0x100;
  {
    std::ifstream in(dir + "/qpn");
    if (in) in >> next;
  }
  {
    std::ofstream out(dir + "/qpn");
    out << next + 1 << "\n";
  }
  flock(lock, LOCK_UN);
  close(lock);
  return next & 0xffffffu;
}

Context* contextOf(ibv_context* c) { return reinterpret_cast<Context*>(c); }

// Which attributes each transition of an RC queue pair needs and which it may take besides.
struct Transition {
  ibv_qp_state from, to;
  int required, optional;
};
constexpr int kRtrOptional = IBV_QP_ALT_PATH | IBV_QP_ACCESS_FLAGS | IBV_QP_PKEY_INDEX;
constexpr int kRtsOptional =
    IBV_QP_CUR_STATE | IBV_QP_ACCESS_FLAGS | IBV_QP_MIN_RNR_TIMER | IBV_QP_ALT_PATH | IBV_QP_PATH_MIG_STATE;
const Transition kTransitions[] = {
    {IBV_QPS_RESET, IBV_QPS_INIT, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS, 0},
    {IBV_QPS_INIT, IBV_QPS_INIT, IBV_QP_STATE, IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS},
    {IBV_QPS_INIT, IBV_QPS_RTR,
     IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN | IBV_QP_RQ_PSN | IBV_QP_MAX_DEST_RD_ATOMIC |
         IBV_QP_MIN_RNR_TIMER,
     kRtrOptional},
    {IBV_QPS_RTR, IBV_QPS_RTS,
     IBV_QP_STATE | IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT | IBV_QP_RNR_RETRY | IBV_QP_SQ_PSN | IBV_QP_MAX_QP_RD_ATOMIC,
     kRtsOptional},
    {IBV_QPS_RTS, IBV_QPS_RTS, IBV_QP_STATE, kRtsOptional},
};

int checkAddress(const Qp* q, const ibv_ah_attr& ah) {
  const Device* d = q->owner->device;
  if (d->roce) {
    // RoCE routes by GID only: the address must be global, from a GID this port has.
    if (!ah.is_global || ah.grh.sgid_index >= 4) return EINVAL;
    bool zero = true;
    for (uint8_t b : ah.grh.dgid.raw) zero = zero && b == 0;
    return zero ? EINVAL : 0;
  }
  return ah.dlid == 0 ? EINVAL : 0;
}

}  // namespace

Counters& counters() {
  static Counters* c = new Counters();
  return *c;
}

void Counters::widen(std::atomic<uint64_t>& begin, std::atomic<uint64_t>& end, uint64_t addr, uint64_t n) {
  uint64_t b = begin.load();
  while (addr < b && !begin.compare_exchange_weak(b, addr)) {
  }
  uint64_t e = end.load();
  while (addr + n > e && !end.compare_exchange_weak(e, addr + n)) {
  }
}

Mr* findMr(Context* ctx, uint32_t key, bool remote) {
  Registry& r = registry();
  std::lock_guard<std::mutex> lock(r.mu);
  auto& m = remote ? r.rkeys : r.lkeys;
  auto it = m.find(key);
  if (it == m.end() || it->second->mr.context != &ctx->ctx) return nullptr;
  return it->second;
}

void addMr(Mr* m) {
  Registry& r = registry();
  std::lock_guard<std::mutex> lock(r.mu);
  r.nextKey += 0x100;
  m->mr.lkey = r.nextKey | 0x11;
  m->mr.rkey = r.nextKey | 0x22;
  r.lkeys[m->mr.lkey] = m;
  r.rkeys[m->mr.rkey] = m;
  r.pdUsers[reinterpret_cast<Pd*>(m->mr.pd)]++;
}

void removeMr(Mr* m) {
  Registry& r = registry();
  std::lock_guard<std::mutex> lock(r.mu);
  r.lkeys.erase(m->mr.lkey);
  r.rkeys.erase(m->mr.rkey);
  r.pdUsers[reinterpret_cast<Pd*>(m->mr.pd)]--;
}

void pushCompletion(Cq* cq, const ibv_wc& wc) {
  Channel* notify = nullptr;
  {
    std::lock_guard<std::mutex> lock(cq->mu);
    if (static_cast<int>(cq->entries.size()) >= cq->cq.cqe) {
      // Overrun: a real adapter puts the CQ in error and says so once.
      if (!cq->overrun) {
        cq->overrun = true;
        ibv_async_event e{};
        e.event_type = IBV_EVENT_CQ_ERR;
        e.element.cq = &cq->cq;
        postAsyncEvent(contextOf(cq->cq.context), e);
      }
      return;
    }
    cq->entries.push_back(wc);
    if (cq->armed && cq->channel != nullptr) {
      cq->armed = false;
      notify = cq->channel;
    }
  }
  if (notify != nullptr) {
    {
      std::lock_guard<std::mutex> lock(notify->mu);
      notify->events.push_back(cq);
    }
    const char b = 1;
    (void)!write(notify->pipe[1], &b, 1);
  }
}

void toError(Qp* q, bool notify, ibv_event_type event) {
  std::deque<Work> sends, recvs;
  {
    std::lock_guard<std::mutex> lock(q->mu);
    if (q->qp.state == IBV_QPS_ERR) return;
    q->qp.state = IBV_QPS_ERR;
    sends.swap(q->sendQueue);
    recvs.swap(q->recvQueue);
    // The event is raised as the queue pair enters the error state, before its work is flushed,
    // and under the lock: a post refused for the state must find the event already there.
    if (notify) {
      ibv_async_event e{};
      e.event_type = event;
      e.element.qp = &q->qp;
      postAsyncEvent(q->owner, e);
    }
  }
  for (const auto& w : sends) {
    ibv_wc wc{};
    wc.wr_id = w.wrId;
    wc.status = IBV_WC_WR_FLUSH_ERR;
    wc.qp_num = q->qp.qp_num;
    pushCompletion(reinterpret_cast<Cq*>(q->qp.send_cq), wc);
  }
  for (const auto& w : recvs) {
    ibv_wc wc{};
    wc.wr_id = w.wrId;
    wc.status = IBV_WC_WR_FLUSH_ERR;
    wc.qp_num = q->qp.qp_num;
    pushCompletion(reinterpret_cast<Cq*>(q->qp.recv_cq), wc);
  }
}

int pollCq(ibv_cq* cq, int n, ibv_wc* wc) {
  auto* c = reinterpret_cast<Cq*>(cq);
  std::lock_guard<std::mutex> lock(c->mu);
  int k = 0;
  while (k < n && !c->entries.empty()) {
    wc[k++] = c->entries.front();
    c->entries.pop_front();
  }
  return k;
}

int reqNotifyCq(ibv_cq* cq, int solicitedOnly) {
  (void)solicitedOnly;
  auto* c = reinterpret_cast<Cq*>(cq);
  std::lock_guard<std::mutex> lock(c->mu);
  if (c->channel == nullptr) return EINVAL;
  // As on a real adapter, only a completion added after this call notifies: entries already
  // queued do not, so a consumer must poll once more after arming.
  c->armed = true;
  return 0;
}

}  // namespace vp

using namespace vp;

extern "C" {

ibv_pd* ibv_alloc_pd(ibv_context* context) {
  auto* p = new Pd();
  p->pd.context = context;
  Registry& r = registry();
  std::lock_guard<std::mutex> lock(r.mu);
  r.pdUsers[p] = 0;
  return &p->pd;
}

int ibv_dealloc_pd(ibv_pd* pd) {
  auto* p = reinterpret_cast<Pd*>(pd);
  Registry& r = registry();
  std::lock_guard<std::mutex> lock(r.mu);
  if (r.pdUsers[p] > 0) return EBUSY;
  r.pdUsers.erase(p);
  delete p;
  return 0;
}

ibv_comp_channel* ibv_create_comp_channel(ibv_context* context) {
  auto* ch = new Channel();
  if (pipe2(ch->pipe, O_CLOEXEC) != 0) {
    delete ch;
    return nullptr;
  }
  ch->ch.context = context;
  ch->ch.fd = ch->pipe[0];
  Registry& r = registry();
  std::lock_guard<std::mutex> lock(r.mu);
  r.channelUsers[ch] = 0;
  return &ch->ch;
}

int ibv_destroy_comp_channel(ibv_comp_channel* channel) {
  auto* ch = reinterpret_cast<Channel*>(channel);
  Registry& r = registry();
  {
    std::lock_guard<std::mutex> lock(r.mu);
    if (r.channelUsers[ch] > 0) return EBUSY;
    r.channelUsers.erase(ch);
  }
  close(ch->pipe[0]);
  close(ch->pipe[1]);
  delete ch;
  return 0;
}

ibv_cq* ibv_create_cq(ibv_context* context, int cqe, void* cqContext, ibv_comp_channel* channel, int vector) {
  if (cqe < 1 || cqe > (1 << 22) - 1 || vector < 0 || vector >= context->num_comp_vectors) {
    errno = EINVAL;
    return nullptr;
  }
  auto* c = new Cq();
  c->cq.context = context;
  c->cq.channel = channel;
  c->cq.cq_context = cqContext;
  c->cq.cqe = cqe;
  c->channel = reinterpret_cast<Channel*>(channel);
  pthread_mutex_init(&c->cq.mutex, nullptr);
  pthread_cond_init(&c->cq.cond, nullptr);
  Registry& r = registry();
  std::lock_guard<std::mutex> lock(r.mu);
  r.cqUsers[c] = 0;
  if (c->channel != nullptr) r.channelUsers[c->channel]++;
  return &c->cq;
}

int ibv_destroy_cq(ibv_cq* cq) {
  auto* c = reinterpret_cast<Cq*>(cq);
  Registry& r = registry();
  {
    std::lock_guard<std::mutex> lock(r.mu);
    // A real adapter's library blocks here until every event is acknowledged; refusing says the
    // same more plainly in a test.
    if (r.cqUsers[c] > 0 || r.eventsDelivered[c] != cq->comp_events_completed) return EBUSY;
    r.cqUsers.erase(c);
    r.eventsDelivered.erase(c);
    if (c->channel != nullptr) r.channelUsers[c->channel]--;
  }
  delete c;
  return 0;
}

int ibv_get_cq_event(ibv_comp_channel* channel, ibv_cq** cq, void** cqContext) {
  auto* ch = reinterpret_cast<Channel*>(channel);
  char b;
  if (read(ch->pipe[0], &b, 1) != 1) return -1;
  Cq* c = nullptr;
  {
    std::lock_guard<std::mutex> lock(ch->mu);
    if (ch->events.empty()) return -1;
    c = ch->events.front();
    ch->events.pop_front();
  }
  {
    Registry& r = registry();
    std::lock_guard<std::mutex> lock(r.mu);
    r.eventsDelivered[c]++;
  }
  *cq = &c->cq;
  *cqContext = c->cq.cq_context;
  return 0;
}

void ibv_ack_cq_events(ibv_cq* cq, unsigned int count) {
  Registry& r = registry();
  std::lock_guard<std::mutex> lock(r.mu);
  cq->comp_events_completed += count;
}

ibv_qp* ibv_create_qp(ibv_pd* pd, ibv_qp_init_attr* attr) {
  const ibv_qp_cap& cap = attr->cap;
  if (attr->qp_type != IBV_QPT_RC || attr->srq != nullptr || attr->send_cq == nullptr || attr->recv_cq == nullptr ||
      attr->send_cq->context != pd->context || attr->recv_cq->context != pd->context || cap.max_send_wr < 1 ||
      cap.max_send_wr > (1u << 15) || cap.max_recv_wr > (1u << 15) || cap.max_send_sge < 1 || cap.max_send_sge > 30 ||
      cap.max_recv_sge > 30 || cap.max_inline_data > 512) {
    errno = EINVAL;
    return nullptr;
  }
  auto* q = new Qp();
  q->owner = contextOf(pd->context);
  q->qp.context = pd->context;
  q->qp.qp_context = attr->qp_context;
  q->qp.pd = pd;
  q->qp.send_cq = attr->send_cq;
  q->qp.recv_cq = attr->recv_cq;
  q->qp.qp_type = IBV_QPT_RC;
  q->qp.state = IBV_QPS_RESET;
  q->qp.qp_num = allocateQpn();
  pthread_mutex_init(&q->qp.mutex, nullptr);
  pthread_cond_init(&q->qp.cond, nullptr);
  q->cap = cap;
  q->cap.max_inline_data = 512;  // what the device gives, reported back as a real one does
  attr->cap.max_inline_data = 512;
  q->sqSigAll = attr->sq_sig_all != 0;
  {
    Registry& r = registry();
    std::lock_guard<std::mutex> lock(r.mu);
    r.pdUsers[reinterpret_cast<Pd*>(pd)]++;
    r.cqUsers[reinterpret_cast<Cq*>(attr->send_cq)]++;
    r.cqUsers[reinterpret_cast<Cq*>(attr->recv_cq)]++;
  }
  wireRegister(q);
  return &q->qp;
}

int ibv_modify_qp(ibv_qp* qp, ibv_qp_attr* attr, int mask) {
  auto* q = reinterpret_cast<Qp*>(qp);
  if ((mask & IBV_QP_STATE) == 0) return EINVAL;
  ibv_qp_state from;
  {
    std::lock_guard<std::mutex> lock(q->mu);  // the adapter's thread may move it to error
    from = qp->state;
  }
  const ibv_qp_state to = attr->qp_state;
  if (to == IBV_QPS_RESET || to == IBV_QPS_ERR) {
    if (mask != IBV_QP_STATE) return EINVAL;
    if (to == IBV_QPS_ERR) {
      toError(q, false);
    } else {
      std::lock_guard<std::mutex> lock(q->mu);
      q->sendQueue.clear();
      q->recvQueue.clear();
      qp->state = IBV_QPS_RESET;
    }
    return 0;
  }
  const Transition* t = nullptr;
  for (const auto& x : kTransitions)
    if (x.from == from && x.to == to) t = &x;
  if (t == nullptr || (mask & t->required) != t->required || (mask & ~(t->required | t->optional)) != 0) return EINVAL;
  const Device* d = q->owner->device;
  if ((mask & IBV_QP_PORT) && (attr->port_num < 1 || attr->port_num > d->ports.size())) return EINVAL;
  if ((mask & IBV_QP_PKEY_INDEX) && attr->pkey_index >= 128) return EINVAL;
  if ((mask & IBV_QP_TIMEOUT) && attr->timeout > 31) return EINVAL;
  if ((mask & IBV_QP_RETRY_CNT) && attr->retry_cnt > 7) return EINVAL;
  if ((mask & IBV_QP_RNR_RETRY) && attr->rnr_retry > 7) return EINVAL;
  if ((mask & IBV_QP_MIN_RNR_TIMER) && attr->min_rnr_timer > 31) return EINVAL;
  if ((mask & IBV_QP_MAX_DEST_RD_ATOMIC) && attr->max_dest_rd_atomic > 16) return EINVAL;
  if ((mask & IBV_QP_MAX_QP_RD_ATOMIC) && attr->max_rd_atomic > 16) return EINVAL;
  if (mask & IBV_QP_PATH_MTU) {
    // No larger than the port's active MTU.
    const int active = d->roce ? IBV_MTU_1024 : IBV_MTU_4096;
    if (attr->path_mtu < IBV_MTU_256 || attr->path_mtu > active) return EINVAL;
  }
  if (mask & IBV_QP_AV) {
    if (int e = checkAddress(q, attr->ah_attr); e != 0) return e;
    if (attr->ah_attr.port_num != 0 && attr->ah_attr.port_num != q->port) return EINVAL;
  }
  std::lock_guard<std::mutex> lock(q->mu);
  if (mask & IBV_QP_PORT) q->port = attr->port_num;
  if (mask & IBV_QP_ACCESS_FLAGS) q->access = attr->qp_access_flags;
  if (mask & IBV_QP_PATH_MTU) q->pathMtu = attr->path_mtu;
  if (mask & IBV_QP_DEST_QPN) q->destQpn = attr->dest_qp_num & 0xffffffu;
  if (mask & IBV_QP_AV) {
    q->dlid = attr->ah_attr.dlid;
    q->global = attr->ah_attr.is_global != 0;
    std::memcpy(q->dgid, attr->ah_attr.grh.dgid.raw, 16);
    q->sgidIndex = attr->ah_attr.grh.sgid_index;
  }
  if (mask & IBV_QP_RQ_PSN) q->rqPsn = attr->rq_psn & 0xffffffu;
  if (mask & IBV_QP_SQ_PSN) q->sqPsn = attr->sq_psn & 0xffffffu;
  if (mask & IBV_QP_TIMEOUT) q->timeout = attr->timeout;
  if (mask & IBV_QP_RETRY_CNT) q->retryCnt = attr->retry_cnt;
  if (mask & IBV_QP_RNR_RETRY) q->rnrRetry = attr->rnr_retry;
  if (mask & IBV_QP_MIN_RNR_TIMER) q->minRnrTimer = attr->min_rnr_timer;
  qp->state = to;
  return 0;
}

int ibv_query_qp(ibv_qp* qp, ibv_qp_attr* attr, int mask, ibv_qp_init_attr* init) {
  (void)mask;
  auto* q = reinterpret_cast<Qp*>(qp);
  std::lock_guard<std::mutex> lock(q->mu);
  std::memset(attr, 0, sizeof *attr);
  attr->qp_state = qp->state;
  attr->cur_qp_state = qp->state;
  attr->path_mtu = q->pathMtu;
  attr->dest_qp_num = q->destQpn;
  attr->qp_access_flags = q->access;
  attr->port_num = static_cast<uint8_t>(q->port);
  attr->timeout = q->timeout;
  attr->retry_cnt = q->retryCnt;
  attr->rnr_retry = q->rnrRetry;
  attr->min_rnr_timer = q->minRnrTimer;
  attr->rq_psn = q->rqPsn;
  attr->sq_psn = q->sqPsn;
  attr->cap = q->cap;
  if (init != nullptr) {
    std::memset(init, 0, sizeof *init);
    init->qp_type = IBV_QPT_RC;
    init->send_cq = qp->send_cq;
    init->recv_cq = qp->recv_cq;
    init->cap = q->cap;
    init->sq_sig_all = q->sqSigAll ? 1 : 0;
  }
  return 0;
}

int ibv_destroy_qp(ibv_qp* qp) {
  auto* q = reinterpret_cast<Qp*>(qp);
  wireUnregister(q);
  {
    Registry& r = registry();
    std::lock_guard<std::mutex> lock(r.mu);
    r.pdUsers[reinterpret_cast<Pd*>(qp->pd)]--;
    r.cqUsers[reinterpret_cast<Cq*>(qp->send_cq)]--;
    r.cqUsers[reinterpret_cast<Cq*>(qp->recv_cq)]--;
  }
  delete q;
  return 0;
}

int ibv_get_async_event(ibv_context* context, ibv_async_event* event) {
  auto* c = contextOf(context);
  char b;
  if (read(c->asyncPipe[0], &b, 1) != 1) return -1;
  std::lock_guard<std::mutex> lock(c->asyncMu);
  if (c->asyncEvents.empty()) return -1;
  *event = c->asyncEvents.front();
  c->asyncEvents.pop_front();
  return 0;
}

void ibv_ack_async_event(ibv_async_event* event) { (void)event; }

const char* ibv_wc_status_str(ibv_wc_status status) {
  switch (status) {
    case IBV_WC_SUCCESS:
      return "success";
    case IBV_WC_LOC_LEN_ERR:
      return "local length error";
    case IBV_WC_LOC_QP_OP_ERR:
      return "local QP operation error";
    case IBV_WC_LOC_PROT_ERR:
      return "local protection error";
    case IBV_WC_WR_FLUSH_ERR:
      return "Work Request Flushed Error";
    case IBV_WC_REM_INV_REQ_ERR:
      return "remote invalid request error";
    case IBV_WC_REM_ACCESS_ERR:
      return "remote access error";
    case IBV_WC_REM_OP_ERR:
      return "remote operation error";
    case IBV_WC_RETRY_EXC_ERR:
      return "transport retry counter exceeded";
    case IBV_WC_RNR_RETRY_EXC_ERR:
      return "RNR retry counter exceeded";
    default:
      return "unknown";
  }
}

const char* ibv_event_type_str(ibv_event_type type) {
  switch (type) {
    case IBV_EVENT_CQ_ERR:
      return "CQ error";
    case IBV_EVENT_QP_FATAL:
      return "local work queue catastrophic error";
    case IBV_EVENT_QP_REQ_ERR:
      return "invalid request local work queue error";
    case IBV_EVENT_QP_ACCESS_ERR:
      return "local access violation work queue error";
    case IBV_EVENT_PORT_ACTIVE:
      return "port active";
    case IBV_EVENT_PORT_ERR:
      return "port error";
    case IBV_EVENT_DEVICE_FATAL:
      return "local catastrophic error";
    default:
      return "unknown";
  }
}

const LoomTestVerbsCounters* loom_test_verbs_counters(void) {
  static thread_local LoomTestVerbsCounters snapshot;  // one per thread: ranks in threads ask at once
  Counters& c = counters();
  snapshot.send_bytes = c.sendBytes;
  snapshot.write_bytes = c.writeBytes;
  snapshot.read_bytes = c.readBytes;
  snapshot.writes_with_imm = c.writeWithImm;
  snapshot.sends = c.sends;
  snapshot.rnr_naks = c.rnrNaks;
  snapshot.remote_access_errors = c.remoteAccessErrors;
  snapshot.registrations = c.registrations;
  snapshot.deregistrations = c.deregistrations;
  snapshot.unmapped_accesses = c.unmappedAccesses;
  snapshot.dmabuf_registrations = c.dmabufRegistrations;
  snapshot.device_registrations = c.deviceRegistrations;
  const bool wrote = c.writeSourceEnd != 0, landed = c.writeTargetEnd != 0;
  snapshot.write_source_begin = wrote ? c.writeSourceBegin.load() : 0;
  snapshot.write_source_end = c.writeSourceEnd;
  snapshot.write_target_begin = landed ? c.writeTargetBegin.load() : 0;
  snapshot.write_target_end = c.writeTargetEnd;
  return &snapshot;
}

void loom_test_verbs_reset_counters(void) {
  Counters& c = counters();
  for (auto* a : {&c.sendBytes, &c.writeBytes, &c.readBytes, &c.writeWithImm, &c.sends, &c.rnrNaks,
                  &c.remoteAccessErrors, &c.registrations, &c.deregistrations, &c.unmappedAccesses, &c.writeSourceEnd,
                  &c.writeTargetEnd, &c.dmabufRegistrations, &c.deviceRegistrations})
    a->store(0);
  c.writeSourceBegin = ~0ULL;
  c.writeTargetBegin = ~0ULL;
}

}  // extern "C"
