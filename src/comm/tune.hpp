// Measuring the links at init (LOOM_TUNE=1): the cost model's latency (α) and bandwidth (β) are
// then what this job's links do, not the configured LOOM_TCP_LATENCY_US / LOOM_TCP_MBPS.
//
// Ranks pair up (0-1, 2-3, ...; an odd last rank sits out). Each pair times 8-byte round trips
// (α: the median one-way time) and 4 MiB one-way transfers (β: the best rate), and an all-reduce
// (max of α, max of seconds per byte) gives every rank the same, most pessimistic figures, so
// that every rank picks the same algorithm for every call. Costs a few milliseconds per
// communicator; off by default so that algorithm choices stay reproducible between runs.
#pragma once

#include "comm/comm_impl.hpp"

namespace loom {
namespace detail {

/// Measures α and β when LOOM_TUNE is set and stores them in the communicator (CommImpl::link),
/// then gives it its algorithm selector (cost model of its slowest kind of link, or the measured
/// figures; LOOM_ALGO). Collective: every rank calls it right after joining.
void tuneLinksIfAsked(detail::CommImpl& comm);
/// The measuring part alone.
void measureLinksIfAsked(detail::CommImpl& comm);

}  // namespace detail
}  // namespace loom
