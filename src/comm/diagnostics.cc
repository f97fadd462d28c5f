// Diagnostics (comm/diagnostics.hpp): the call each rank is in, dump requests and hang reports,
// a failing rank's last word and final record.
#include "comm/diagnostics.hpp"

#include <map>
#include <thread>
#include <vector>

#include "comm/store_keys.hpp"
#include "core/format.hpp"
#include "core/logging.hpp"
#include "core/signature.hpp"

namespace loom {
namespace detail {

Diagnostics::Diagnostics(int rank, int size, std::string name, std::shared_ptr<Store> store,
                         std::shared_ptr<FailureState> failure)
    : rank_(rank), size_(size), name_(std::move(name)), store_(std::move(store)), failure_(std::move(failure)) {}

void Diagnostics::leaveWord(const Status& status) {
  // Before the links close: a peer that sees one break without a word looks here (lastWordOf).
  if (size_ == 1) return;
  const std::string word = status.message.substr(0, kMaxWordBytes);
  if (!store_->setBounded(lastWordKey(rank_), Bytes(word.begin(), word.end()), kStoreNoteLimit))
    LOOM_INFO("could not leave this rank's word in the rendezvous store");
}

void Diagnostics::leaveRecord() noexcept {
  // A failed rank's record no longer changes: it answers every dump request, those made after it
  // left too (a peer whose hang report is still gathering when this rank's wait failed because
  // another rank went, and this rank leaves before it looked for the request again).
  if (size_ == 1) return;
  try {
    std::lock_guard<std::mutex> lock(dumpMu_);
    const std::string text = publishedFlight(kFinalRecord, flight_.serialize());
    if (store_->setBounded(flightKey(rank_), Bytes(text.begin(), text.end()), kStoreNoteLimit))
      answeredDump_ = kFinalRecord;
  } catch (...) {
    // The store is gone (rank 0 left): nobody can ask.
  }
}

void Diagnostics::enterCall(int64_t seq, uint64_t sig, const char* algo) {
  flight_.running(seq, sig, algo);
  currentSig_.store(sig, std::memory_order_relaxed);
  currentSeq_.store(seq, std::memory_order_release);
  if (const LocalArena* a = arena_)
    publishCall(a->current[static_cast<size_t>(a->me)], static_cast<uint64_t>(seq), sig);
}

Status Diagnostics::localCallMismatch(int64_t seq, uint64_t sig) const {
  const LocalArena* a = arena_;
  if (a == nullptr || sig == 0) return Status::success();
  for (size_t i = 0; i < a->current.size(); ++i) {
    if (static_cast<int>(i) == a->me) continue;
    uint64_t theirSeq = 0, theirSig = 0;
    if (!readCall(a->current[i], &theirSeq, &theirSig)) continue;
    if (theirSeq == static_cast<uint64_t>(seq) && !signaturesAgree(sig, theirSig)) {
      Status s = signatureMismatch(a->ranks[i], theirSig, rank_, sig);
      s.seq = seq;
      return s;
    }
  }
  return Status::success();
}

void Diagnostics::check() noexcept {
  // About once a second of sleeping: answer a dump request (a timed-out peer, or loom-info --dump)
  // with this rank's flight record.
  const int64_t now = Clock::now().time_since_epoch().count();
  int64_t last = lastDumpPoll_.load(std::memory_order_relaxed);
  if (now - last >= std::chrono::duration_cast<Clock::duration>(std::chrono::seconds(1)).count() &&
      lastDumpPoll_.compare_exchange_strong(last, now)) {
    try {
      answerDumpRequests();
    } catch (...) {
      // The store is gone (rank 0 left): nothing to answer.
    }
  }
  const int64_t seq = currentSeq_.load(std::memory_order_acquire);
  if (seq < 0 || failure_->failed()) return;
  Status s = localCallMismatch(seq, currentSig_.load(std::memory_order_relaxed));
  if (s.ok) return;
  failure_->fail(s);  // (s.seq names the collective)
}

std::string Diagnostics::diagnose() noexcept {
  const int64_t seq = currentSeq_.load(std::memory_order_acquire);
  if (seq < 0) return "";
  try {
    return hangReport(seq, std::chrono::milliseconds(2500));
  } catch (const std::exception& e) {
    return std::string("no hang report: ") + e.what();
  }
}

std::string Diagnostics::dumpText() {
  std::string out = strFormat("loom: rank %d of %d, communicator \"%s\": its last collectives, oldest first\n", rank_,
                              size_, name_.c_str());
  const std::vector<FlightEntry> entries = flight_.snapshot();
  out += formatFlight(entries, 16);
  int64_t seq = -1;  // the oldest collective this rank is in
  for (const FlightEntry& e : entries)
    if (e.state == FlightEntry::State::Running && (seq < 0 || e.seq < seq)) seq = e.seq;
  if (seq >= 0 && !failure_->failed()) {
    try {
      out += hangReport(seq, std::chrono::milliseconds(2500)) + "\n";
    } catch (const std::exception& e) {
      out += strFormat("  no hang report: %s\n", e.what());
    }
  } else {
    out += "  not inside a collective now\n";
  }
  return out;
}

void Diagnostics::answerDumpRequests() {
  // Requests are numbered by the store's counter; a record answers every request up to its number.
  const int64_t wanted = store_->add(kDumpRequestKey, 0);
  std::lock_guard<std::mutex> lock(dumpMu_);
  if (wanted <= answeredDump_) return;
  store_->setString(flightKey(rank_), publishedFlight(wanted, flight_.serialize()));
  answeredDump_ = wanted;
}

std::string Diagnostics::hangReport(int64_t seq, std::chrono::milliseconds waitFor) {
  // Ask every rank for its record (sleeping waiters look about once a second, and ranks that are
  // asking too answer here), then take what has come when the time is up.
  const int64_t request = store_->add(kDumpRequestKey, 1);
  std::map<int, std::vector<FlightEntry>> records;
  std::string cut;
  const Deadline deadline(waitFor);
  for (;;) {
    try {
      answerDumpRequests();
      for (int r = 0; r < size_; ++r) {
        if (records.count(r) != 0) continue;
        if (auto v = store_->tryGet(flightKey(r))) {
          if (auto entries = readPublishedFlight(std::string(v->begin(), v->end()), request))
            records[r] = std::move(*entries);
        }
      }
    } catch (const std::exception& e) {
      // The store went away meanwhile (its host, rank 0, exited): report what had come.
      cut = strFormat("\n  (the rendezvous store closed before every rank could answer: %s)", e.what());
      break;
    }
    if (static_cast<int>(records.size()) == size_ || deadline.expired()) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  if (records.count(rank_) == 0) records[rank_] = parseFlight(flight_.serialize());
  return loom::hangReport(size_, records, seq) + cut;
}

}  // namespace detail
}  // namespace loom
