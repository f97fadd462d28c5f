// Synchronisation of the ranks of one node through their shared arena (transport.hpp's
// LocalArena): a barrier on the ranks' step counters, used by the algorithms that read their
// peers' memory in place (direct.cc on host buffers, device_ipc.cc on device buffers).
#pragma once

#include <cstdint>

#include "collectives/context.hpp"
#include "transport/arena.hpp"

namespace loom {
namespace coll {

/// Publishes this rank's step `target` and waits until every other rank of the arena has made
/// `target` steps. Never waits forever: a failed or departed local rank, a local rank in another
/// collective under this sequence number, and the communicator's timeout each fail the
/// communicator with an error naming the rank; dump requests are answered meanwhile. A wait past
/// 50 ms naps (up to 1 ms at a time) instead of spinning.
void barrier(const Context& c, const LocalArena& ar, uint64_t target);

}  // namespace coll
}  // namespace loom
