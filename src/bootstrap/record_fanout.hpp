// Handing one value (a new communicator's records) from rank to rank down a tree, over short-lived
// TCP connections, so that the store's host sends it to one rank instead of to all N: without it
// N ranks each read the N records from one process, O(N²) bytes there.
//
// Each rank listens on the first interface LOOM_SOCKET_IFNAME selects (any port, or one of
// LOOM_PORT_RANGE) and puts the address in its record. A sender dials and sends, in one message,
// the value and its proof of the job key over the communicator, the two ranks and the value's
// SHA-256: a stranger, another job or another communicator is turned away, and a recorded message
// replayed can only bring the same value to the same rank again. Delivery is best effort: a rank
// that gets nothing in time reads the value from the store instead (comm/meeting.hpp).
#pragma once

#include <optional>
#include <utility>
#include <vector>

#include "bootstrap/auth.hpp"
#include "bootstrap/store.hpp"
#include "core/deadline.hpp"
#include "net/socket.hpp"

namespace loom {

/// Where one rank receives the value.
class FanOutListener {
 public:
  /// Listens; throws Error(System) when no interface is selected or no port is free.
  FanOutListener(const JobKey& key, const Nonce& commId, int rank);

  /// The listening address.
  const SockAddr& address() const { return address_; }
  /// The value, once a rank of this communicator has sent it (proved with the job key), or
  /// nullopt when `until` passes first. Connections that do not prove the key are closed and
  /// counted (rejected()); one that stalls does not hold up the others.
  std::optional<Bytes> receive(const Deadline& until);
  int rejected() const { return rejected_; }

 private:
  JobKey key_;
  Nonce commId_;
  int rank_;
  Socket listener_;
  SockAddr address_;
  int rejected_ = 0;
};

/// Sends `value` from rank `from` to every (rank, address) of `targets` at once, each proved as
/// above. Returns the ranks it did not reach by `until` (refused, stalled, gone).
std::vector<int> fanOut(const JobKey& key, const Nonce& commId, int from, const Bytes& value,
                        const std::vector<std::pair<int, SockAddr>>& targets, const Deadline& until);

}  // namespace loom
