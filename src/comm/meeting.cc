#include "comm/meeting.hpp"

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <memory>

#include "bootstrap/record_fanout.hpp"
#include "bootstrap/store_protocol.hpp"
#include "comm/flight_recorder.hpp"
#include "core/format.hpp"
#include "core/logging.hpp"
#include "core/status.hpp"

namespace loom {
namespace detail {

namespace {
constexpr char kFailed[] = "failed: ";  // a record or a mark that says why its rank failed
std::string textOf(const Bytes& b) { return std::string(b.begin(), b.end()); }

// What the last rank in hands out: the records themselves, or the rank at the root of their tree.
constexpr uint8_t kRecordsHere = 'R', kRecordsInTree = 'T';
constexpr int kFanOut = 4;  // a tree of 256 ranks is 4 deep; each rank sends the records 4 times at most
std::string fanOutKey(int rank) { return "fanout/" + std::to_string(rank); }

std::chrono::milliseconds atMost(std::chrono::milliseconds wait, const Deadline& deadline) {
  return std::min(wait, std::chrono::milliseconds(deadline.remainingMs()));
}

// `record` with the pair (key, value) added; false where it does not decode.
bool addPair(Bytes* record, const std::string& key, const Bytes& value) {
  std::vector<std::pair<std::string, Bytes>> pairs;
  std::string why;
  if (!storewire::decodePairs(*record, &pairs, &why)) return false;
  pairs.emplace_back(key, value);
  *record = storewire::encodePairs(pairs);
  return true;
}

// Where `rank`'s record says it listens for the records, if it does.
std::optional<SockAddr> fanOutAddress(const Bytes& record, int rank) {
  const std::string key = fanOutKey(rank);
  std::optional<SockAddr> out;
  std::string why;
  storewire::walkPairs(
      record,
      [&](std::string_view k, std::string_view v) {
        SockAddr a;
        if (k == key && v.size() == SockAddr::kWireBytes &&
            SockAddr::fromWire(reinterpret_cast<const uint8_t*>(v.data()), &a))
          out = a;
      },
      &why);
  return out;
}

// The records as one value: per rank, a u32 length and the record.
Bytes packRecords(const std::vector<Bytes>& records) {
  size_t bytes = 0;
  for (const Bytes& r : records) bytes += 4 + r.size();
  Bytes out(bytes);
  size_t at = 0;
  for (const Bytes& r : records) {
    storewire::putU32(out.data() + at, static_cast<uint32_t>(r.size()));
    if (!r.empty()) std::memcpy(out.data() + at + 4, r.data(), r.size());
    at += 4 + r.size();
  }
  return out;
}

bool unpackRecords(const Bytes& packed, size_t count, std::vector<Bytes>* records) {
  records->clear();
  size_t at = 0;
  for (size_t i = 0; i < count; ++i) {
    if (packed.size() - at < 4) return false;
    const size_t len = storewire::getU32(packed.data() + at);
    if (packed.size() - at - 4 < len) return false;
    const auto from = packed.begin() + static_cast<std::ptrdiff_t>(at + 4);
    records->emplace_back(from, from + static_cast<std::ptrdiff_t>(len));
    at += 4 + len;
  }
  return at == packed.size();
}
}  // namespace

StoreMeeting::StoreMeeting(Store& store, int rank, int size, std::string name, std::string endpoint, bool hosting,
                           RecordTree tree)
    : store_(store),
      rank_(rank),
      size_(size),
      name_(std::move(name)),
      endpoint_(std::move(endpoint)),
      hosting_(hosting),
      tree_(tree) {}

std::optional<Bytes> StoreMeeting::arrive(const std::string& counter, const std::string& marker,
                                          const Deadline& deadline, std::vector<int>* missing,
                                          const std::function<Bytes()>& announce, bool wait) {
  const std::string all = counter + "/all";
  if (store_.add(counter, 1) == size_) {
    Bytes value = announce ? announce() : Bytes{'1'};
    store_.set(all, value);
    return value;
  }
  if (!wait) return Bytes{};
  if (auto value = store_.get(all, deadline)) return value;
  // Who is missing: asked once, on the way to an error.
  std::vector<std::string> keys;
  for (int r = 0; r < size_; ++r) keys.push_back(marker + std::to_string(r));
  const auto got = store_.tryGetMany(keys);
  missing->clear();
  for (int r = 0; r < size_; ++r)
    if (!got[static_cast<size_t>(r)]) missing->push_back(r);
  if (missing->empty()) return store_.tryGet(all);  // all came just now
  return std::nullopt;
}

std::vector<Bytes> StoreMeeting::swap(const Bytes& mine, const std::string& failed, const Deadline& deadline, bool) {
  const std::string me = std::to_string(rank_);
  const std::string mark = failed.empty() ? std::string() : failedMark(failed);
  Bytes record = failed.empty() ? mine : Bytes(mark.begin(), mark.end());
  // In a tree, this rank listens for the records and says where in its record; where it cannot,
  // it reads them from the store, and its children get them from it all the same. On the store
  // host's machine the store is as near as any rank.
  std::unique_ptr<FanOutListener> listener;
  if (tree_.on && failed.empty() && (tree_.everyRank || !store_.hostedHere())) {
    try {
      listener = std::make_unique<FanOutListener>(tree_.key, tree_.commId, rank_);
      Bytes where(SockAddr::kWireBytes);
      listener->address().toWire(where.data());
      if (!addPair(&record, fanOutKey(rank_), where)) listener.reset();
    } catch (const std::exception& e) {
      LOOM_INFO("rank %d reads the records of communicator \"%s\" from the store: %s", rank_, name_.c_str(), e.what());
    }
  }
  store_.set("record/" + me, record);
  // The rank hosting the store waits a little longer than the others, so that they can still ask
  // the store who is missing when their own deadline passes.
  const Deadline joinBy(std::chrono::milliseconds(deadline.remainingMs()) +
                        (hosting_ ? std::chrono::milliseconds(2000) : std::chrono::milliseconds(0)));
  // The last rank in reads the records (all there: each rank writes its own before it counts
  // itself in) and hands them to the others in the value they wait for, or, in a tree, leaves
  // them in the store for those that get them from no one and hands out only where the tree
  // starts: itself. Where no rank listens (all share the store's machine), the tree gains nothing.
  std::vector<std::string> keys;
  for (int r = 0; r < size_; ++r) keys.push_back("record/" + std::to_string(r));
  Bytes atRoot;
  auto gather = [&] {
    std::vector<Bytes> records;
    std::vector<std::string> missing;
    if (!store_.getAll(keys, deadline, &records, &missing))
      LOOM_THROW(ErrorCode::Timeout, rank_, strFormat("%s did not arrive in time", missing.front().c_str()));
    Bytes packed = packRecords(records);
    bool listening = false;
    for (int r = 0; tree_.on && r < size_ && !listening; ++r)
      listening = fanOutAddress(records[static_cast<size_t>(r)], r).has_value();
    if (!listening) {
      packed.insert(packed.begin(), kRecordsHere);
      return packed;
    }
    store_.set("joined/records", packed);
    atRoot = std::move(packed);
    Bytes root(5);
    root[0] = kRecordsInTree;
    storewire::putU32(root.data() + 1, static_cast<uint32_t>(rank_));
    return root;
  };
  std::vector<int> absent;
  std::optional<Bytes> said = arrive("joined", "record/", joinBy, &absent, gather);
  if (!said && absent.empty()) {
    LOOM_THROW(ErrorCode::Timeout, rank_,
               strFormat("all %d ranks joined communicator \"%s\" at %s, but the last one in did not hand out "
                         "their records within %.0f s: it failed or died while reading them (its own error says why)",
                         size_, name_.c_str(), endpoint_.c_str(), deadline.totalSeconds()));
  }
  if (!said) {
    LOOM_THROW(ErrorCode::Timeout, rank_,
               strFormat("only %d of %d ranks joined communicator \"%s\" at %s within %.0f s; missing rank(s) %s. "
                         "Did they start, with the same world size and MASTER_ADDR/MASTER_PORT? (LOOM_INIT_TIMEOUT "
                         "sets the wait)",
                         size_ - static_cast<int>(absent.size()), size_, name_.c_str(), endpoint_.c_str(),
                         deadline.totalSeconds(), rankList(absent).c_str()));
  }
  Bytes packed;
  int root = -1;
  bool readable = false;
  if (!said->empty() && (*said)[0] == kRecordsHere) {
    packed = std::move(*said);
    packed.erase(packed.begin());
    readable = true;
  } else if (said->size() == 5 && (*said)[0] == kRecordsInTree &&
             storewire::getU32(said->data() + 1) < static_cast<uint32_t>(size_)) {
    root = static_cast<int>(storewire::getU32(said->data() + 1));
    packed = rank_ == root ? std::move(atRoot) : recordsFromTree(root, listener.get(), deadline);
    readable = true;
  }
  std::vector<Bytes> records;
  if (!readable || !unpackRecords(packed, static_cast<size_t>(size_), &records)) {
    LOOM_THROW(ErrorCode::Remote, rank_,
               strFormat("the records of communicator \"%s\" in the store at %s do not decode (another job "
                         "using the same store and name?)",
                         name_.c_str(), endpoint_.c_str()));
  }
  if (root >= 0 && tree_.passOn) passDown(root, packed, records, deadline);
  return records;
}

Bytes StoreMeeting::recordsFromTree(int root, FanOutListener* listener, const Deadline& deadline) {
  const int parent = ((((rank_ - root + size_) % size_) - 1) / kFanOut + root) % size_;
  const auto wait = atMost(tree_.wait, deadline);
  if (listener != nullptr) {
    std::optional<Bytes> got = listener->receive(Deadline(wait));
    if (listener->rejected() > 0) {
      LOOM_WARN(
          "rank %d turned away %d connection(s) to its records port %s that did not prove this job's key "
          "(another job, or a port scanner)",
          rank_, listener->rejected(), listener->address().toString().c_str());
    }
    if (got) {
      LOOM_INFO("rank %d has the records of communicator \"%s\" from its parent in their tree, rank %d", rank_,
                name_.c_str(), parent);
      return std::move(*got);
    }
    LOOM_INFO(
        "rank %d: the records of communicator \"%s\" did not come from rank %d (its parent in their tree) "
        "within %lld ms; reading them from the store",
        rank_, name_.c_str(), parent, static_cast<long long>(wait.count()));
  }
  // Where this rank does not listen (or nothing came): from the store.
  if (auto got = store_.get("joined/records", deadline)) return std::move(*got);
  LOOM_THROW_PEER(ErrorCode::Timeout, rank_, parent,
                  strFormat("the records of communicator \"%s\" came neither from rank %d (its parent in their "
                            "tree) nor from the store at %s within %.0f s",
                            name_.c_str(), parent, endpoint_.c_str(), deadline.totalSeconds()));
}

void StoreMeeting::passDown(int root, const Bytes& packed, const std::vector<Bytes>& records,
                            const Deadline& deadline) {
  const int position = (rank_ - root + size_) % size_;
  std::vector<std::pair<int, SockAddr>> children;
  for (int c = kFanOut * position + 1; c <= kFanOut * position + kFanOut && c < size_; ++c) {
    const int child = (c + root) % size_;
    // A child that does not listen (it could not, or failed before) reads them from the store.
    if (auto at = fanOutAddress(records[static_cast<size_t>(child)], child)) children.emplace_back(child, *at);
  }
  if (children.empty()) return;
  const std::vector<int> missed =
      fanOut(tree_.key, tree_.commId, rank_, packed, children, Deadline(atMost(tree_.wait, deadline)));
  if (!missed.empty()) {
    LOOM_INFO("rank %d could not send the records to rank(s) %s: they read them from the store", rank_,
              rankList(missed).c_str());
  }
}

void StoreMeeting::done(const std::string& failed, const Deadline& deadline) {
  const std::string me = std::to_string(rank_);
  auto say = [&] {
    store_.setString("ready/" + me, failed.empty() ? std::string("1") : failedMark(failed));
    if (!failed.empty()) store_.add("ready-failed", 1);
  };
  // The last one in (each rank said its word before it counted in) hands out "1", or, where some
  // rank failed, the first one's word: "failed: <rank>\n<why>".
  auto verdict = [&] {
    if (store_.add("ready-failed", 0) == 0) return Bytes{'1'};
    std::vector<std::string> keys;
    for (int r = 0; r < size_; ++r) keys.push_back("ready/" + std::to_string(r));
    std::vector<Bytes> words;
    std::vector<std::string> missing;
    store_.getAll(keys, deadline, &words, &missing);
    std::vector<int> bad;
    std::string why;
    for (size_t r = 0; r < words.size(); ++r) {
      const std::string w = textOf(words[r]);
      if (w.rfind(kFailed, 0) != 0) continue;
      bad.push_back(static_cast<int>(r));
      if (why.empty()) why = w.substr(std::strlen(kFailed));
    }
    const std::string v = bad.empty()
                              ? std::string("1")
                              : strFormat("%s%d\nrank(s) %s failed setting up their links; rank %d: %s", kFailed,
                                          bad.front(), rankList(bad).c_str(), bad.front(), why.c_str());
    return Bytes(v.begin(), v.end());
  };
  std::vector<int> absent;
  if (!failed.empty()) {
    // Counts itself in and goes to throw its own error, which a store gone too must not replace.
    try {
      say();
      arrive("ready", "ready/", deadline, &absent, verdict, /*wait=*/false);
    } catch (const std::exception&) {
      // The others then wait for this rank's word until their deadline, as they would have.
    }
    return;
  }
  // The others wait, even where every link is made on first use: ranks that went on at once would
  // take the cores of the ranks still setting up (on a crowded machine their polling made init
  // slower, not faster).
  say();
  const std::optional<Bytes> said = arrive("ready", "ready/", deadline, &absent, verdict);
  if (!said) {
    if (absent.empty()) {
      LOOM_THROW(ErrorCode::Timeout, rank_,
                 strFormat("every rank set up its links, but the last one to finish did not say so within %.0f s: it "
                           "failed or died just then",
                           deadline.totalSeconds()));
    }
    LOOM_THROW(ErrorCode::Timeout, rank_,
               strFormat("rank(s) %s did not finish connecting within %.0f s", rankList(absent).c_str(),
                         deadline.totalSeconds()));
  }
  const std::string text = textOf(*said);
  if (text.rfind(kFailed, 0) != 0) return;
  const size_t nl = text.find('\n');
  const int peer = std::atoi(text.c_str() + std::strlen(kFailed));
  LOOM_THROW_PEER(ErrorCode::Remote, rank_, peer, nl == std::string::npos ? text : text.substr(nl + 1));
}

Bytes JoinStore::takeRecord() {
  Bytes out = storewire::encodePairs(kept_);
  kept_.clear();
  return out;
}

bool JoinStore::learn(std::vector<Bytes> records, size_t* bad, std::string* why) {
  // Every record is checked whole (and its pairs counted) before any key is learned.
  size_t pairs = known_.size();
  for (size_t i = 0; i < records.size(); ++i) {
    if (!storewire::walkPairs(
            records[i], [&](std::string_view, std::string_view) { ++pairs; }, why)) {
      *bad = i;
      return false;
    }
  }
  known_.reserve(pairs);
  records_.reserve(records_.size() + records.size());
  for (Bytes& r : records) {
    // Moved, a record keeps its bytes where they are: the views stay valid.
    records_.push_back(std::move(r));
    storewire::walkPairs(
        records_.back(), [&](std::string_view k, std::string_view v) { known_.insert_or_assign(k, v); }, why);
  }
  return true;
}

bool JoinStore::findLearned(std::string_view key, std::string_view* value) const {
  const auto it = known_.find(key);
  if (it == known_.end()) return false;
  *value = it->second;
  return true;
}

std::optional<Bytes> JoinStore::known(const std::string& key) const {
  std::string_view v;
  if (!findLearned(key, &v)) return std::nullopt;
  return Bytes(v.begin(), v.end());
}

void JoinStore::set(const std::string& key, const Bytes& value) {
  if (recording_) {
    kept_.emplace_back(key, value);
    return;
  }
  base_->set(key, value);
}

void JoinStore::setMany(const std::vector<std::pair<std::string, Bytes>>& pairs) {
  if (recording_) {
    kept_.insert(kept_.end(), pairs.begin(), pairs.end());
    return;
  }
  base_->setMany(pairs);
}

std::optional<Bytes> JoinStore::tryGet(const std::string& key) {
  if (auto v = known(key)) return v;
  return base_->tryGet(key);
}

std::vector<std::optional<Bytes>> JoinStore::tryGetMany(const std::vector<std::string>& keys) {
  std::vector<std::optional<Bytes>> out(keys.size());
  std::vector<std::string> ask;
  std::vector<size_t> where;
  for (size_t i = 0; i < keys.size(); ++i) {
    if (auto v = known(keys[i])) {
      out[i] = std::move(v);
    } else {
      ask.push_back(keys[i]);
      where.push_back(i);
    }
  }
  if (!ask.empty()) {
    auto got = base_->tryGetMany(ask);
    for (size_t j = 0; j < where.size(); ++j) out[where[j]] = std::move(got[j]);
  }
  return out;
}

std::optional<Bytes> JoinStore::get(const std::string& key, const Deadline& deadline) {
  if (auto v = known(key)) return v;
  return base_->get(key, deadline);
}

std::optional<Bytes> JoinStore::tryGetBounded(const std::string& key, std::chrono::milliseconds limit) {
  if (auto v = known(key)) return v;
  return base_->tryGetBounded(key, limit);
}

/// Decodes the swapped records into `store`; a rank whose record says it failed is named.
void learnRecords(JoinStore& store, std::vector<Bytes> records, int rank) {
  const size_t failedLength = std::strlen(kFailed);
  for (size_t r = 0; r < records.size(); ++r) {
    const Bytes& b = records[r];
    if (b.size() >= failedLength && std::memcmp(b.data(), kFailed, failedLength) == 0) {
      const std::string text = textOf(b);
      LOOM_THROW_PEER(ErrorCode::Remote, rank, static_cast<int>(r),
                      strFormat("rank %zu could not join: %s", r, text.substr(failedLength).c_str()));
    }
  }
  size_t bad = 0;
  std::string why;
  if (!store.learn(std::move(records), &bad, &why)) {
    LOOM_THROW_PEER(
        ErrorCode::Remote, rank, static_cast<int>(bad),
        strFormat("rank %zu sent a record this rank cannot read (%s; mixed Loom versions?)", bad, why.c_str()));
  }
}

std::string failedMark(const std::string& why) { return kFailed + why; }

}  // namespace detail
}  // namespace loom
