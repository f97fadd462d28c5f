// CommImpl, diagnostics: the call each rank is in (published to the node's peers, so that one in
// another call is named), the flight records gathered into a hang report, dump requests, and a
// failing rank's last word and final record in the store.
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <limits>
#include <map>
#include <thread>

#include "bootstrap/auth.hpp"
#include "collectives/plan.hpp"
#include "comm/comm_impl.hpp"
#include "comm/dump_signal.hpp"
#include "comm/store_keys.hpp"
#include "core/format.hpp"
#include "core/logging.hpp"
#include "core/param.hpp"
#include "core/signature.hpp"
#include "core/topology.hpp"
#include "transport/registry.hpp"
#include "transport/self_connection.hpp"

namespace loom {
namespace detail {

void CommImpl::leaveWord(const Status& status) {
  // Before the links close: a peer that sees one break without a word looks here (lastWordOf).
  if (size_ == 1) return;
  const std::string word = status.message.substr(0, kMaxWordBytes);
  if (!access_.store->setBounded(lastWordKey(rank_), Bytes(word.begin(), word.end()), kStoreNoteLimit))
    LOOM_INFO("could not leave this rank's word in the rendezvous store");
}

void CommImpl::leaveRecord() noexcept {
  // A failed rank's record no longer changes: it answers every dump request, those made after it
  // left too (a peer whose hang report is still gathering when this rank's wait failed because
  // another rank went, and this rank leaves before it looked for the request again).
  if (size_ == 1) return;
  try {
    std::lock_guard<std::mutex> lock(dumpMu_);
    const std::string text = publishedFlight(kFinalRecord, flight_.serialize());
    if (access_.store->setBounded(flightKey(rank_), Bytes(text.begin(), text.end()), kStoreNoteLimit))
      answeredDump_ = kFinalRecord;
  } catch (...) {
    // The store is gone (rank 0 left): nobody can ask.
  }
}

void CommImpl::enterCall(int64_t seq, uint64_t sig, const char* algo) {
  flight_.running(seq, sig, algo);
  currentSig_.store(sig, std::memory_order_relaxed);
  currentSeq_.store(seq, std::memory_order_release);
  if (const LocalArena* a = arena())
    publishCall(a->current[static_cast<size_t>(a->me)], static_cast<uint64_t>(seq), sig);
}

Status CommImpl::localCallMismatch(int64_t seq, uint64_t sig) const {
  const LocalArena* a = arena();
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

void CommImpl::check() noexcept {
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

std::string CommImpl::diagnose() noexcept {
  const int64_t seq = currentSeq_.load(std::memory_order_acquire);
  if (seq < 0) return "";
  try {
    return hangReport(seq, std::chrono::milliseconds(2500));
  } catch (const std::exception& e) {
    return std::string("no hang report: ") + e.what();
  }
}

std::string CommImpl::dumpText() {
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

void CommImpl::answerDumpRequests() {
  // Requests are numbered by the store's counter; a record answers every request up to its number.
  const int64_t wanted = access_.store->add(kDumpRequestKey, 0);
  std::lock_guard<std::mutex> lock(dumpMu_);
  if (wanted <= answeredDump_) return;
  access_.store->setString(flightKey(rank_), publishedFlight(wanted, flight_.serialize()));
  answeredDump_ = wanted;
}

std::string CommImpl::hangReport(int64_t seq, std::chrono::milliseconds waitFor) {
  // Ask every rank for its record (sleeping waiters look about once a second, and ranks that are
  // asking too answer here), then take what has come when the time is up.
  const int64_t request = access_.store->add(kDumpRequestKey, 1);
  std::map<int, std::vector<FlightEntry>> records;
  std::string cut;
  const Deadline deadline(waitFor);
  for (;;) {
    try {
      answerDumpRequests();
      for (int r = 0; r < size_; ++r) {
        if (records.count(r) != 0) continue;
        if (auto v = access_.store->tryGet(flightKey(r))) {
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
