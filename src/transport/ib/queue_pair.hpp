// QueuePair: one reliable-connected (RC) queue pair of the ib transport, and its way from RESET
// through INIT, RTR and RTS to the peer's queue pair. What the peer must know to connect to it is
// a QpAddress, passed through the rendezvous store as text: the queue pair number, its first
// packet sequence number, and the port's LID (InfiniBand) or GID (RoCE, which routes by GID) and
// active MTU (the path MTU is the smaller of the two ports').
#pragma once

#include <cstdint>
#include <string>

#include "transport/ib/ib_device.hpp"
#include "transport/ib/ib_select.hpp"
#include "transport/ib/verbs.hpp"

namespace loom {
namespace ib {

/// The most a send carries inline (the bytes in the work request, no read of memory by the
/// adapter): a header and a small payload.
constexpr uint32_t kInlineBytes = 256;

struct QpAddress {
  uint32_t qpn = 0;
  uint32_t psn = 0;
  uint16_t lid = 0;
  bool global = false;  ///< route by GID (RoCE)
  uint8_t gid[16] = {};
  int mtu = 0;  ///< enum ibv_mtu of the port
  /// "qpn psn lid mtu gid-hex" (gid-hex "-" when not global).
  std::string encode() const;
  /// False for text encode() did not make.
  static bool decode(const std::string& text, QpAddress* out);
};

/// What the queue pairs of one opened port share.
struct PortContext {
  const Verbs* verbs = nullptr;
  ibv_context* context = nullptr;
  ibv_pd* pd = nullptr;
  PortInfo port;
  int gidIndex = -1;  ///< RoCE: the GID queue pairs send from
  IbSettings settings;
};

class QueuePair {
 public:
  /// Creates the queue pair (RESET) for the link from `rank` to `peer` (named in errors), with
  /// room for `sendWr` send and `recvWr` receive work requests. Throws Error(System) with the
  /// provider's reason.
  QueuePair(const PortContext& pc, ibv_cq* sendCq, ibv_cq* recvCq, uint32_t sendWr, uint32_t recvWr, int rank,
            int peer);
  ~QueuePair();
  QueuePair(const QueuePair&) = delete;
  QueuePair& operator=(const QueuePair&) = delete;

  /// This queue pair's address, for the peer.
  QpAddress address() const;
  /// RESET to INIT (receives may be posted from then on).
  void init();
  /// INIT to RTR and RTS, connected to `remote`. Throws Error(Remote) naming the peer and the step
  /// that failed.
  void connect(const QpAddress& remote);
  ibv_qp* get() const { return qp_; }
  /// What one send may carry inline here (the adapter's limit, at most kInlineBytes).
  uint32_t maxInline() const { return maxInline_ < kInlineBytes ? maxInline_ : kInlineBytes; }

 private:
  [[noreturn]] void fail(const char* step, int err) const;

  const PortContext& pc_;
  int rank_, peer_;
  ibv_qp* qp_ = nullptr;
  uint32_t psn_ = 0;
  uint32_t maxInline_ = 0;
};

}  // namespace ib
}  // namespace loom
