#include "comm/split_meeting.hpp"

#include <algorithm>
#include <cstdint>
#include <cstring>

#include "comm/flight_recorder.hpp"
#include "core/format.hpp"
#include "core/status.hpp"

namespace loom {
namespace detail {

std::vector<Bytes> SplitMeeting::swap(const Bytes& mine, const std::string& failed, const Deadline&, bool linksAtInit) {
  const std::string mark = failed.empty() ? std::string() : failedMark(failed);
  const Bytes& record = failed.empty() ? mine : Bytes(mark.begin(), mark.end());
  const auto parentSize = static_cast<size_t>(parent_.size());
  // One all-gather of slots of kSlot bytes, each a length, whether the rank links at init, and as
  // much of the record as fits (a record is about two hundred bytes); a second, of the longest
  // record, only where one did not fit.
  constexpr size_t kLength = sizeof(uint32_t), kHead = kLength + 1, kSlot = 512;
  std::vector<uint8_t> slot(kSlot, 0);
  const auto length = static_cast<uint32_t>(record.size());
  std::memcpy(slot.data(), &length, kLength);
  slot[kLength] = linksAtInit ? 1 : 0;
  if (!record.empty()) std::memcpy(slot.data() + kHead, record.data(), std::min(record.size(), kSlot - kHead));
  std::vector<uint8_t> all(kSlot * parentSize);
  parent_.allGather(slot.data(), all.data(), kSlot, DataType::Uint8);
  std::vector<uint32_t> lengths(parentSize);
  anyLinksAtInit_ = false;
  for (size_t r = 0; r < parentSize; ++r) {
    std::memcpy(&lengths[r], all.data() + r * kSlot, kLength);
    anyLinksAtInit_ = anyLinksAtInit_ || all[r * kSlot + kLength] != 0;
  }
  const size_t longest = *std::max_element(lengths.begin(), lengths.end());
  size_t stride = kSlot, skip = kHead;
  if (longest > kSlot - kHead) {
    std::vector<uint8_t> padded(longest, 0);
    if (!record.empty()) std::memcpy(padded.data(), record.data(), record.size());
    all.assign(longest * parentSize, 0);
    parent_.allGather(padded.data(), all.data(), longest, DataType::Uint8);
    stride = longest;
    skip = 0;
  }
  std::vector<Bytes> out;
  for (int r : members_) {
    const uint8_t* at = all.data() + static_cast<size_t>(r) * stride + skip;
    out.emplace_back(at, at + lengths[static_cast<size_t>(r)]);
  }
  return out;
}

void SplitMeeting::done(const std::string& failed, const Deadline&) {
  if (!anyLinksAtInit_) return;  // the same on every rank of the parent: from the swap
  const int32_t ok = failed.empty() ? 1 : 0;
  std::vector<int32_t> all(static_cast<size_t>(parent_.size()));
  parent_.allGather(&ok, all.data(), 1, DataType::Int32);
  if (!failed.empty()) return;  // the caller throws its own error
  std::vector<int> bad, badHere;
  for (size_t i = 0; i < members_.size(); ++i) {
    if (all[static_cast<size_t>(members_[i])] != 0) continue;
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
