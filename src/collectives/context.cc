// Context: tagged sends and receives of one collective, mismatch detection, and the tunables
// that shape every algorithm's pipeline (chunk sizes, ring channels).
#include "collectives/context.hpp"

#include <algorithm>
#include <cstdlib>
#include <cstring>

#include "collectives/select.hpp"
#include "core/format.hpp"
#include "core/param.hpp"
#include "kernels/copy.hpp"

namespace loom {
namespace coll {
namespace {

LOOM_PARAM_INT(chunkBytesParam, "LOOM_CHUNK_BYTES", 512 * 1024,
               "bytes per pipelined chunk of the chain and tree algorithms, and of the ring where set "
               "(unset: 512 KiB over shared memory, 2 MiB over TCP)");
LOOM_PARAM_INT(treeChunkBytesParam, "LOOM_TREE_CHUNK_BYTES", 64 * 1024,
               "bytes per pipelined chunk of the double-tree all-reduce");
LOOM_PARAM_INT(ringChannelsParam, "LOOM_RING_CHANNELS", 2,
               "parallel rings of the ring algorithms (1 to 8), alternating in direction (unset: 2 over TCP "
               "within a host, 1 across hosts and over shared memory)");
LOOM_PARAM_INT(channelMinBytesParam, "LOOM_RING_CHANNEL_MIN_BYTES", 256 * 1024,
               "a ring collective adds a channel only while each channel's per-rank segment keeps this many bytes");

}  // namespace

void copyIfDistinct(void* dst, const void* src, size_t n) {
  if (dst != src && n > 0) kernels::copy(dst, src, n);
}

Context::Context(const Context& parent, std::vector<int> members, int channelBase, int channelCount)
    : comm_(parent.comm_),
      seq_(parent.seq_),
      name_(parent.name_),
      algo_(parent.algo_),
      sig_(parent.sig_),
      members_(std::move(members)),
      channelBase_(channelBase),
      channelCount_(channelCount) {
  for (size_t i = 0; i < members_.size(); ++i)
    if (members_[i] == comm_.rank()) groupRank_ = static_cast<int>(i);
}

RequestPtr Context::send(int peer, const void* p, size_t bytes, int channel) {
  peer = global(peer);
  channel += channelBase_;
  detail::Label l;
  l.coll = name_;
  l.algo = algo_;
  l.seq = seq_;
  l.channel = channel;
  l.send = true;
  l.bytes = bytes;
  return comm_.postSend(peer, p, bytes, collectiveTag(seq_, channel), l, sig_);
}

RequestPtr Context::recv(int peer, void* p, size_t bytes, int channel) {
  return recv(peer, p, bytes, channel, nullptr);
}

RequestPtr Context::recv(int peer, void* p, size_t bytes, int channel, std::shared_ptr<ReceiveConsumer> consumer) {
  peer = global(peer);
  channel += channelBase_;
  detail::Label l;
  l.coll = name_;
  l.algo = algo_;
  l.seq = seq_;
  l.channel = channel;
  l.bytes = bytes;
  auto r = comm_.postRecv(peer, p, bytes, collectiveTag(seq_, channel), l, sig_, std::move(consumer));
  r->expectBytes = bytes;
  return r;
}

void Context::wait(const RequestPtr& r) {
  try {
    r->wait();
  } catch (const Error& e) {
    if (e.code() != ErrorCode::InvalidUsage) {
      // A link that failed or a peer that left: say in which collective this rank learnt it.
      // The communicator is failed from here (a collective cannot go on without a member): every
      // later call, and the goodbye this rank's peers get, carry this cause.
      const std::string where = strFormat("%s #%lld", name_, static_cast<long long>(seq_));
      Status s = e.message().find(where) != std::string::npos
                     ? Status::error(e.code(), e.message(), e.peer(), seq_)
                     : Status::error(e.code(), strFormat("%s (%s): %s", where.c_str(), algo_, e.message().c_str()),
                                     e.peer(), seq_);
      comm_.failureState()->fail(s);
      throw s.toError(comm_.rank());
    }
    // A message of another call (its signature), or larger than the algorithm's receive: the ranks
    // disagree about this collective.
    const bool named = e.message().find(" called ") != std::string::npos;
    Status s =
        Status::error(ErrorCode::InvalidUsage,
                      strFormat("%s #%lld (%s): %s%s", name_, static_cast<long long>(seq_), algo_, e.message().c_str(),
                                named ? ""
                                      : "; the ranks called this collective with different counts or "
                                        "datatypes"),
                      e.peer(), seq_);
    comm_.failureState()->fail(s);
    throw s.toError(comm_.rank());
  }
  if (r->expectBytes != SIZE_MAX && r->bytes() != r->expectBytes) {
    Status s = Status::error(
        ErrorCode::InvalidUsage,
        strFormat("%s #%lld: rank %d sent %zu bytes where this rank expected %zu: the ranks called this collective "
                  "with different counts or datatypes",
                  name_, static_cast<long long>(seq_), r->peer(), r->bytes(), r->expectBytes),
        r->peer(), seq_);
    comm_.failureState()->fail(s);
    throw s.toError(comm_.rank());
  }
  if (r->consumer && !r->consumed && r->bytes() > 0)
    r->consumer->consume(static_cast<const uint8_t*>(r->consumerBuffer), 0, r->bytes());
}

size_t ringChunkBytes() {
  static const size_t v = static_cast<size_t>(std::max<int64_t>(4096, chunkBytesParam()));
  return v;
}

size_t ringChunkBytesFor(const LinkProperties& link) {
  return chunkBytesParamIsSet() ? ringChunkBytes() : std::max<size_t>(4096, link.ringChunkBytes);
}

size_t treeChunkBytes() {
  static const size_t v = static_cast<size_t>(std::max<int64_t>(4096, treeChunkBytesParam()));
  return v;
}

// Read on every call (like LOOM_ALGO) so that a test can change them between collectives.
bool ringChannelsSet() { return ringChannelsParamIsSet(); }
int maxRingChannels() { return static_cast<int>(std::clamp<int64_t>(ringChannelsParam(), 1, kMaxChannels)); }
size_t ringChannelMinBytes() { return static_cast<size_t>(std::max<int64_t>(0, channelMinBytesParam())); }

size_t Context::chunkElems(size_t elem) const { return std::max<size_t>(1, ringChunkBytes() / elem); }

size_t Context::ringChunkElems(size_t elem) const {
  if (const coll::Selector* sel = comm_.selector()) return std::max<size_t>(1, sel->model().chunkBytes / elem);
  return chunkElems(elem);
}

size_t Context::treeChunkElems(size_t elem) const { return std::max<size_t>(1, treeChunkBytes() / elem); }

int Context::ringChannels(size_t bytes) const {
  // The communicator's model knows its links (one channel over shared memory: a single thread
  // drives them all, so more channels only add messages); without one, the tunables.
  const int most = std::min(channelCount_, kMaxChannels);
  if (const coll::Selector* sel = comm_.selector())
    return planChannelCount(bytes, size(), std::min(most, sel->model().ringChannels), sel->model().channelMinBytes);
  return planChannelCount(bytes, size(), std::min(most, maxRingChannels()), ringChannelMinBytes());
}

}  // namespace coll
}  // namespace loom
