#include "transport/ib/queue_pair.hpp"

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <random>

#include "core/format.hpp"
#include "core/status.hpp"

namespace loom {
namespace ib {
namespace {

// Inline sends save the adapter a read of small messages (a header and a small payload); a
// provider that allows less says so at creation, and one that allows none refuses it.
constexpr uint32_t kWantInline = kInlineBytes;

uint32_t randomPsn() {
  static thread_local std::mt19937 gen{std::random_device{}()};
  return gen() & 0xffffffu;
}

}  // namespace

std::string QpAddress::encode() const {
  std::string g = "-";
  if (global) {
    g.clear();
    for (uint8_t b : gid) g += strFormat("%02x", b);
  }
  return strFormat("%u %u %u %d %s", qpn, psn, static_cast<unsigned>(lid), mtu, g.c_str());
}

bool QpAddress::decode(const std::string& text, QpAddress* out) {
  unsigned qpn = 0, psn = 0, lid = 0;
  int mtu = 0;
  char g[40] = {0};
  if (std::sscanf(text.c_str(), "%u %u %u %d %39s", &qpn, &psn, &lid, &mtu, g) != 5) return false;
  QpAddress a;
  a.qpn = qpn & 0xffffffu;
  a.psn = psn & 0xffffffu;
  a.lid = static_cast<uint16_t>(lid);
  a.mtu = mtu;
  if (std::strcmp(g, "-") != 0) {
    if (std::strlen(g) != 32) return false;
    a.global = true;
    for (int i = 0; i < 16; ++i) {
      unsigned b = 0;
      if (std::sscanf(g + 2 * i, "%2x", &b) != 1) return false;
      a.gid[i] = static_cast<uint8_t>(b);
    }
  }
  *out = a;
  return true;
}

QueuePair::QueuePair(const PortContext& pc, ibv_cq* sendCq, ibv_cq* recvCq, uint32_t sendWr, uint32_t recvWr, int rank,
                     int peer)
    : pc_(pc), rank_(rank), peer_(peer), psn_(randomPsn()) {
  ibv_qp_init_attr a;
  std::memset(&a, 0, sizeof a);
  a.send_cq = sendCq;
  a.recv_cq = recvCq;
  a.qp_type = IBV_QPT_RC;
  a.cap.max_send_wr = sendWr;
  a.cap.max_recv_wr = recvWr;
  a.cap.max_send_sge = 1;
  a.cap.max_recv_sge = 1;
  a.cap.max_inline_data = kWantInline;
  qp_ = pc.verbs->createQp(pc.pd, &a);
  if (qp_ == nullptr) {
    // Some providers refuse inline data altogether: try once without.
    a.cap.max_inline_data = 0;
    qp_ = pc.verbs->createQp(pc.pd, &a);
  }
  if (qp_ == nullptr) fail("create", errno);
  maxInline_ = a.cap.max_inline_data;
}

QueuePair::~QueuePair() {
  if (qp_ != nullptr) pc_.verbs->destroyQp(qp_);
}

QpAddress QueuePair::address() const {
  QpAddress a;
  a.qpn = qp_->qp_num;
  a.psn = psn_;
  a.lid = pc_.port.lid;
  a.mtu = pc_.port.activeMtu;
  if (pc_.port.ethernet) {
    a.global = true;
    for (const auto& g : pc_.port.gids)
      if (g.index == pc_.gidIndex) std::memcpy(a.gid, g.raw, 16);
  }
  return a;
}

void QueuePair::init() {
  ibv_qp_attr a;
  std::memset(&a, 0, sizeof a);
  a.qp_state = IBV_QPS_INIT;
  a.pkey_index = 0;
  a.port_num = static_cast<uint8_t>(pc_.port.port);
  a.qp_access_flags = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ;
  if (int e = pc_.verbs->modifyQp(qp_, &a, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS))
    fail("INIT", e);
}

void QueuePair::connect(const QpAddress& remote) {
  const IbSettings& s = pc_.settings;
  ibv_qp_attr a;
  std::memset(&a, 0, sizeof a);
  a.qp_state = IBV_QPS_RTR;
  a.path_mtu = static_cast<ibv_mtu>(std::min(pc_.port.activeMtu, remote.mtu));
  a.dest_qp_num = remote.qpn;
  a.rq_psn = remote.psn;
  a.max_dest_rd_atomic = 1;
  a.min_rnr_timer = 12;  // 0.64 ms
  a.ah_attr.port_num = static_cast<uint8_t>(pc_.port.port);
  a.ah_attr.sl = static_cast<uint8_t>(s.serviceLevel);
  a.ah_attr.dlid = remote.lid;
  if (remote.global || pc_.port.ethernet) {
    a.ah_attr.is_global = 1;
    std::memcpy(a.ah_attr.grh.dgid.raw, remote.gid, 16);
    a.ah_attr.grh.sgid_index = static_cast<uint8_t>(std::max(0, pc_.gidIndex));
    a.ah_attr.grh.hop_limit = 255;
    a.ah_attr.grh.traffic_class = static_cast<uint8_t>(s.trafficClass);
  }
  if (int e = pc_.verbs->modifyQp(qp_, &a,
                                  IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN | IBV_QP_RQ_PSN |
                                      IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER))
    fail("RTR", e);
  std::memset(&a, 0, sizeof a);
  a.qp_state = IBV_QPS_RTS;
  a.timeout = static_cast<uint8_t>(s.timeout);
  a.retry_cnt = static_cast<uint8_t>(s.retryCnt);
  a.rnr_retry = 7;  // flow control keeps receives posted; a late one must not fail the link
  a.sq_psn = psn_;
  a.max_rd_atomic = 1;
  if (int e = pc_.verbs->modifyQp(qp_, &a,
                                  IBV_QP_STATE | IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT | IBV_QP_RNR_RETRY | IBV_QP_SQ_PSN |
                                      IBV_QP_MAX_QP_RD_ATOMIC))
    fail("RTS", e);
}

void QueuePair::fail(const char* step, int err) const {
  LOOM_THROW_PEER(ErrorCode::Remote, rank_, peer_,
                  strFormat("ib: the queue pair to rank %d on %s port %d did not come up (%s: %s)", peer_,
                            pc_.port.device.c_str(), pc_.port.port, step, std::strerror(err)));
}

}  // namespace ib
}  // namespace loom
