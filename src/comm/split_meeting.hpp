// SplitMeeting: the ranks of a communicator split from another meet through the parent
// (Communicator::split), each new group apart: an all-gather among its members swaps their records,
// one more says who set up its links where a member links at init (the records say whether: where
// every link is made on first use, a rank's set-up after the swap asks nothing of its peers, and a
// peer that failed it is named by the first link to it). Each step is one collective of the parent
// on every rank, those that join no new communicator too, so the parent's collectives stay in step
// whatever fails on the way. Over the parent's links the groups' messages stay among their members
// (a rank of no group sends nothing); where the parent's ranks all share one node's arena each step
// is one step on its counters instead, every rank staging its slot and reading its members': the
// split then links no one.
#pragma once

#include <string>
#include <utility>
#include <vector>

#include "comm/meeting.hpp"
#include "loom/loom.hpp"

namespace loom {
namespace detail {

class SplitMeeting : public Meeting {
 public:
  /// `members`: the parent's ranks that form this rank's new communicator, in their new order
  /// (empty on a rank that joins none).
  SplitMeeting(Communicator& parent, std::vector<int> members) : parent_(parent), members_(std::move(members)) {}
  std::vector<Bytes> swap(const Bytes& mine, const std::string& failed, const Deadline& deadline,
                          bool linksAtInit) override;
  void done(const std::string& failed, const Deadline& deadline) override;

 private:
  Communicator& parent_;
  std::vector<int> members_;
  bool anyLinksAtInit_ = true;  // some rank's set-up asks its peers: done() meets (swap says)
};

}  // namespace detail
}  // namespace loom
