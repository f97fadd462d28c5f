// How the ranks of a communicator being made meet: each rank's record (its host, its machine and
// what its transports publish: addresses, segment names) goes to every other, and the ranks wait
// for one another once their links are set up.
//
// A new communicator meets through its store (StoreMeeting): one write, an arrival count and a wait
// per rank; the last rank in reads every record once and leaves them in the store as one value,
// which the others' wait returns. The store's load is a few requests per rank however long the
// ranks take to come (no rank polls a growing list of keys), and each request asks for one key:
// the store does not look up and copy N keys for each of N ranks. In a large communicator the
// records go down a tree of the ranks instead (RecordTree): the others' wait returns a few bytes,
// and the store's host sends the N records to one rank, not to N. A communicator
// split from another meets through its parent's links (SplitMeeting, comm/communicator.cc): no
// new rendezvous.
//
// JoinStore is the store the joining rank's transports see: what they write while publishing
// becomes the record, and the records, once swapped, answer reads before the store is asked.
#pragma once

#include <chrono>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

#include "bootstrap/auth.hpp"
#include "bootstrap/store.hpp"
#include "core/deadline.hpp"

namespace loom {
class FanOutListener;
namespace detail {

class Meeting {
 public:
  virtual ~Meeting() = default;
  /// Every rank's record, in rank order (this rank's own included). `mine` empty with `failed`
  /// set: this rank failed before it had one (why: `failed`), and takes part so that the others
  /// do not wait for it. `linksAtInit`: this rank's set-up after the swap may ask its peers
  /// for something (false: every link is made on first use). Throws naming the ranks that did not
  /// come or failed.
  virtual std::vector<Bytes> swap(const Bytes& mine, const std::string& failed, const Deadline& deadline,
                                  bool linksAtInit) = 0;
  /// Returns once every rank has set up its links; `failed` non-empty: this rank could not (it
  /// takes part, then its caller throws its own error). Throws naming the ranks that failed or
  /// did not come.
  virtual void done(const std::string& failed, const Deadline& deadline) = 0;
};

/// What a rank that failed before it had a record sends instead (Meeting::swap).
std::string failedMark(const std::string& why);

class JoinStore;
/// Adds the swapped records (taken over) to `store`'s reads; throws naming a rank whose record
/// says it failed or does not decode.
void learnRecords(JoinStore& store, std::vector<Bytes> records, int rank);

/// How StoreMeeting hands out the records. With `on`, a rank that does not share the store host's
/// machine (every rank with `everyRank`) listens for them, and where one does, the last rank in
/// gives them to the store once and to the top of a tree of the ranks (fan-out 4,
/// bootstrap/record_fanout.hpp): each rank passes them on to its children, and reads them from
/// the store where it does not listen or has them from no one within `wait`.
struct RecordTree {
  bool on = false;
  bool everyRank = false;
  JobKey key{};
  Nonce commId{};
  std::chrono::milliseconds wait{2000};
  bool passOn = true;  // false (tests): this rank's children read the records from the store
};

/// Meets through the communicator's store. `hosting`: this rank hosts the store, and waits a
/// little longer, so that the others can still ask it who is missing when their deadline passes.
class StoreMeeting : public Meeting {
 public:
  StoreMeeting(Store& store, int rank, int size, std::string name, std::string endpoint, bool hosting,
               RecordTree tree = {});
  std::vector<Bytes> swap(const Bytes& mine, const std::string& failed, const Deadline& deadline,
                          bool linksAtInit) override;
  /// Every rank says how its set-up went, a failed one too (without waiting); the last one in
  /// hands out the first failure, so that the others name it at once, not at their deadline.
  void done(const std::string& failed, const Deadline& deadline) override;

 private:
  /// Counts this rank in at `counter` and waits for all: the last one in sets counter/all to
  /// `announce()` ("1" without it) and returns that; the others return what it set. Empty on the
  /// deadline, with the ranks whose `marker` key is not set in *missing (none where every rank
  /// came but the last one in did not set counter/all: it failed or died in between). `wait`
  /// false: a rank that is not the last one in returns an empty value at once.
  std::optional<Bytes> arrive(const std::string& counter, const std::string& marker, const Deadline& deadline,
                              std::vector<int>* missing, const std::function<Bytes()>& announce = nullptr,
                              bool wait = true);
  /// The records (packed) of a swap whose last rank in, `root`, sends them down the tree, from
  /// this rank's parent there or else the store; `listener`: this rank's (null: it does not listen).
  Bytes recordsFromTree(int root, FanOutListener* listener, const Deadline& deadline);
  /// Sends the records to this rank's children in the tree from `root`, those that listen.
  void passDown(int root, const Bytes& packed, const std::vector<Bytes>& records, const Deadline& deadline);

  Store& store_;
  int rank_, size_;
  std::string name_, endpoint_;
  bool hosting_;
  RecordTree tree_;
};

/// The store a joining rank's transports publish to and read from.
class JoinStore : public Store {
 public:
  explicit JoinStore(std::shared_ptr<Store> base) : base_(std::move(base)) {}

  /// While recording, writes are kept as this rank's record and not sent.
  void record(bool on) { recording_ = on; }
  /// The record kept (encoded) and forgets it.
  Bytes takeRecord();
  /// Adds the records to what reads find first (a later record's key replaces an earlier one's).
  /// False, with the index of the first that does not decode in *bad and what is wrong with it in
  /// *why, when one does not: then none is learned.
  bool learn(std::vector<Bytes> records, size_t* bad, std::string* why);
  /// A learned value, read in place (valid while this store lives); false when `key` was not
  /// learned. The node map reads two keys of every rank: no copies.
  bool findLearned(std::string_view key, std::string_view* value) const;

  void set(const std::string& key, const Bytes& value) override;
  void setMany(const std::vector<std::pair<std::string, Bytes>>& pairs) override;
  std::optional<Bytes> tryGet(const std::string& key) override;
  std::vector<std::optional<Bytes>> tryGetMany(const std::vector<std::string>& keys) override;
  std::optional<Bytes> get(const std::string& key, const Deadline& deadline) override;
  int64_t add(const std::string& key, int64_t delta) override { return base_->add(key, delta); }
  bool hostedHere() const override { return base_->hostedHere(); }
  bool setBounded(const std::string& key, const Bytes& value, std::chrono::milliseconds limit) override {
    return base_->setBounded(key, value, limit);
  }
  std::optional<Bytes> tryGetBounded(const std::string& key, std::chrono::milliseconds limit) override;

 private:
  std::shared_ptr<Store> base_;
  bool recording_ = false;
  std::vector<std::pair<std::string, Bytes>> kept_;
  // The records swapped, as received (every rank's few keys: N of each kind), and their keys and
  // values as views into them: learning N records allocates no key or value of its own. Hashed:
  // each rank looks up a few keys per peer, and N ranks do so at once on a node. Read-only once
  // the join goes on.
  std::vector<Bytes> records_;
  std::unordered_map<std::string_view, std::string_view> known_;
  /// The learned value of `key` as Bytes, or nullopt.
  std::optional<Bytes> known(const std::string& key) const;
};

}  // namespace detail
}  // namespace loom
