#include "comm/meeting.hpp"

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <exception>

#include "bootstrap/store_protocol.hpp"
#include "comm/flight_recorder.hpp"
#include "core/format.hpp"
#include "core/status.hpp"

namespace loom {
namespace detail {

namespace {
constexpr char kFailed[] = "failed: ";  // a record or a mark that says why its rank failed
std::string textOf(const Bytes& b) { return std::string(b.begin(), b.end()); }

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

StoreMeeting::StoreMeeting(Store& store, int rank, int size, std::string name, std::string endpoint, bool hosting)
    : store_(store),
      rank_(rank),
      size_(size),
      name_(std::move(name)),
      endpoint_(std::move(endpoint)),
      hosting_(hosting) {}

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
  store_.set("record/" + me, failed.empty() ? mine : Bytes(mark.begin(), mark.end()));
  // The rank hosting the store waits a little longer than the others, so that they can still ask
  // the store who is missing when their own deadline passes.
  const Deadline joinBy(std::chrono::milliseconds(deadline.remainingMs()) +
                        (hosting_ ? std::chrono::milliseconds(2000) : std::chrono::milliseconds(0)));
  // The last rank in reads the records (all there: each rank writes its own before it counts
  // itself in) and hands them to the others in the value they wait for.
  std::vector<std::string> keys;
  for (int r = 0; r < size_; ++r) keys.push_back("record/" + std::to_string(r));
  auto gather = [&] {
    std::vector<Bytes> records;
    std::vector<std::string> missing;
    if (!store_.getAll(keys, deadline, &records, &missing))
      LOOM_THROW(ErrorCode::Timeout, rank_, strFormat("%s did not arrive in time", missing.front().c_str()));
    return packRecords(records);
  };
  std::vector<int> absent;
  const std::optional<Bytes> packed = arrive("joined", "record/", joinBy, &absent, gather);
  if (!packed && absent.empty()) {
    LOOM_THROW(ErrorCode::Timeout, rank_,
               strFormat("all %d ranks joined communicator \"%s\" at %s, but the last one in did not hand out "
                         "their records within %.0f s: it failed or died while reading them (its own error says why)",
                         size_, name_.c_str(), endpoint_.c_str(), deadline.totalSeconds()));
  }
  if (!packed) {
    LOOM_THROW(ErrorCode::Timeout, rank_,
               strFormat("only %d of %d ranks joined communicator \"%s\" at %s within %.0f s; missing rank(s) %s. "
                         "Did they start, with the same world size and MASTER_ADDR/MASTER_PORT? (LOOM_INIT_TIMEOUT "
                         "sets the wait)",
                         size_ - static_cast<int>(absent.size()), size_, name_.c_str(), endpoint_.c_str(),
                         deadline.totalSeconds(), rankList(absent).c_str()));
  }
  std::vector<Bytes> records;
  if (!unpackRecords(*packed, static_cast<size_t>(size_), &records)) {
    LOOM_THROW(ErrorCode::Remote, rank_,
               strFormat("the records of communicator \"%s\" in the store at %s do not decode (another job "
                         "using the same store and name?)",
                         name_.c_str(), endpoint_.c_str()));
  }
  return records;
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
