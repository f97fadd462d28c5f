#include "comm/split_meeting.hpp"

#include <algorithm>
#include <cstdint>
#include <cstring>

#include "collectives/context.hpp"
#include "collectives/select.hpp"
#include "comm/comm_impl.hpp"
#include "comm/flight_recorder.hpp"
#include "core/format.hpp"
#include "core/signature.hpp"
#include "core/status.hpp"

namespace loom {
namespace detail {

namespace {

// Whether the parent's ranks all share one node's arena (coll::Selector::direct, alike on every
// rank): then each step is one step on the arena's counters, which links no one, where a step
// among each group's members over the parent's links made the links it used.
bool throughArena(const CommImpl& c) { return c.selector() != nullptr && c.selector()->direct(); }

// Runs `body` as one collective of the parent `c`: every rank of the parent takes its sequence
// number, in order with its other collectives, those of no new communicator too. Over the links
// (`arena` false) the body's messages stay among `members` (a Context restricted to them), so that
// the groups of a split meet at once, apart, each in log2 of its own size rounds, and a rank of no
// group sends nothing; through the arena every rank of the parent takes the step.
template <typename Body>
void inGroup(CommImpl& c, const std::vector<int>& members, bool arena, uint64_t sig, Body&& body) {
  c.run(
      "split",
      [&](int64_t seq) {
        c.diagnostics().enterCall(seq, sig, arena ? "direct" : "bruck");
        if (members.empty() && !arena) return;  // kSplitNoColor: the sequence number only
        coll::Context whole(c, seq, "split", arena ? "direct" : "bruck", sig);
        body(whole);
      },
      sig);
}

// An all-gather of `bytes` from each member, on `channel` of the call (members' order).
void gather(const coll::Context& whole, const std::vector<int>& members, int channel, const void* send, void* recv,
            size_t bytes) {
  coll::Context group(whole, members, channel, 1);
  coll::Args a;
  a.send = send;
  a.recv = recv;
  a.count = bytes;
  a.type = DataType::Uint8;
  a.elem = 1;
  coll::allGatherBruck(group, a);
}

}  // namespace

std::vector<Bytes> SplitMeeting::swap(const Bytes& mine, const std::string& failed, const Deadline&, bool linksAtInit) {
  // A failed rank sends the mark in place of its record (not a conditional of the two, which would
  // copy `mine` into a temporary).
  Bytes marked;
  if (!failed.empty()) {
    const std::string mark = failedMark(failed);
    marked.assign(mark.begin(), mark.end());
  }
  const Bytes& record = failed.empty() ? mine : marked;
  const size_t n = members_.size();
  CommImpl& parent = *parent_.impl();
  const bool arena = throughArena(parent);
  // Slots of kSlot bytes, each a length, whether the rank links at init, and as much of the
  // record as fits (a record is about two hundred bytes); a second round, on the next channel of
  // the same call, of the longest record, only where one did not fit: the group's longest over the
  // links, the parent's through the arena, where every rank takes every step. A rank of no group
  // stages an empty slot there.
  constexpr size_t kLength = sizeof(uint32_t), kHead = kLength + 1, kSlot = 512;
  std::vector<uint8_t> slot(kSlot, 0);
  const auto length = static_cast<uint32_t>(record.size());
  std::memcpy(slot.data(), &length, kLength);
  slot[kLength] = linksAtInit ? 1 : 0;
  if (!record.empty()) std::memcpy(slot.data() + kHead, record.data(), std::min(record.size(), kSlot - kHead));
  std::vector<uint8_t> all(kSlot * n);
  std::vector<uint32_t> lengths(n);
  size_t stride = kSlot, skip = kHead;
  const uint64_t sig = makeSignature(SigKind::AllGather, DataType::Uint8, ReduceOp::Sum, 0, kSlot);
  std::vector<int> memberIndex(arena ? static_cast<size_t>(parent.size()) : 0, -1);
  for (size_t i = 0; i < n && arena; ++i) memberIndex[static_cast<size_t>(members_[i])] = static_cast<int>(i);
  inGroup(parent, members_, arena, sig, [&](coll::Context& whole) {
    size_t longest = 0;
    anyLinksAtInit_ = false;
    if (arena) {
      coll::exchangeDirect(whole, slot.data(), kSlot, [&](int r, const uint8_t* at) {
        uint32_t len = 0;
        std::memcpy(&len, at, kLength);
        longest = std::max<size_t>(longest, len);
        anyLinksAtInit_ = anyLinksAtInit_ || at[kLength] != 0;
        const int i = memberIndex[static_cast<size_t>(r)];
        if (i >= 0) std::memcpy(all.data() + static_cast<size_t>(i) * kSlot, at, kSlot);
      });
      for (size_t i = 0; i < n; ++i) std::memcpy(&lengths[i], all.data() + i * kSlot, kLength);
    } else {
      gather(whole, members_, 0, slot.data(), all.data(), kSlot);
      for (size_t i = 0; i < n; ++i) {
        std::memcpy(&lengths[i], all.data() + i * kSlot, kLength);
        anyLinksAtInit_ = anyLinksAtInit_ || all[i * kSlot + kLength] != 0;
        longest = std::max<size_t>(longest, lengths[i]);
      }
    }
    if (longest <= kSlot - kHead) return;
    std::vector<uint8_t> padded(longest, 0);
    if (!record.empty()) std::memcpy(padded.data(), record.data(), record.size());
    if (arena) {
      // Rare (a record of more than 507 bytes): every rank's, of which this one keeps its members'.
      std::vector<uint8_t> every(longest * static_cast<size_t>(parent.size()));
      coll::Args a;
      a.send = padded.data();
      a.recv = every.data();
      a.count = longest;
      a.type = DataType::Uint8;
      a.elem = 1;
      coll::allGatherDirect(whole, a);
      all.assign(longest * n, 0);
      for (size_t i = 0; i < n; ++i)
        std::memcpy(all.data() + i * longest, every.data() + static_cast<size_t>(members_[i]) * longest, longest);
    } else {
      all.assign(longest * n, 0);
      gather(whole, members_, 1, padded.data(), all.data(), longest);
    }
    stride = longest;
    skip = 0;
  });
  std::vector<Bytes> out;
  for (size_t i = 0; i < n; ++i) {
    const uint8_t* at = all.data() + i * stride + skip;
    out.emplace_back(at, at + lengths[i]);
  }
  return out;
}

void SplitMeeting::done(const std::string& failed, const Deadline&) {
  // A group whose ranks all link on first use (its records say so, alike on each of them) asks
  // nothing more; through the arena, a split none of whose ranks links at init (all say so, alike
  // on every rank of the parent). The call is still one collective of the parent on every rank.
  const int32_t ok = failed.empty() ? 1 : 0;
  std::vector<int32_t> all(members_.size(), 1);
  const bool meet = anyLinksAtInit_;
  CommImpl& parent = *parent_.impl();
  const bool arena = throughArena(parent);
  const uint64_t sig = makeSignature(SigKind::AllGather, DataType::Int32, ReduceOp::Sum, 0, 1);
  std::vector<int> memberIndex(arena ? static_cast<size_t>(parent.size()) : 0, -1);
  for (size_t i = 0; i < members_.size() && arena; ++i)
    memberIndex[static_cast<size_t>(members_[i])] = static_cast<int>(i);
  if (arena) {
    // Every rank of the parent takes the step, or none does (the sequence number only).
    inGroup(parent, meet ? members_ : std::vector<int>(), meet, sig, [&](coll::Context& whole) {
      coll::exchangeDirect(whole, &ok, sizeof(ok), [&](int r, const uint8_t* at) {
        const int i = memberIndex[static_cast<size_t>(r)];
        if (i >= 0) std::memcpy(&all[static_cast<size_t>(i)], at, sizeof(ok));
      });
    });
  } else {
    inGroup(parent, meet ? members_ : std::vector<int>(), false, sig,
            [&](coll::Context& whole) { gather(whole, members_, 0, &ok, all.data(), sizeof(ok)); });
  }
  if (!failed.empty()) return;  // the caller throws its own error
  std::vector<int> bad, badHere;
  for (size_t i = 0; i < members_.size(); ++i) {
    if (all[i] != 0) continue;
    bad.push_back(static_cast<int>(i));
    badHere.push_back(members_[i]);
  }
  if (bad.empty()) return;
  LOOM_THROW_PEER(ErrorCode::Remote, parent_.rank(), badHere.front(),
                  strFormat("split: rank(s) %s of the new communicator (%s in the one split) could not set up "
                            "their links; their own errors say why",
                            rankList(bad).c_str(), rankList(badHere).c_str()));
}

}  // namespace detail
}  // namespace loom
