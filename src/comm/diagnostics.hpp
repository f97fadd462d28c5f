// Diagnostics: what a communicator knows and tells about where its ranks are, for errors that name
// the rank at fault instead of timing out in silence.
//
// - the flight recorder of its recent collectives, and the call this rank is in, published to
//   the node's peers through the shared arena so that a peer in another call is named at once
//   (localCallMismatch, check);
// - dump requests: any rank (a wait that timed out, `loom-info --dump`, a dump signal) asks every
//   rank for its record through the store, and each answers about once a second while it waits;
//   the records make the hang report;
// - a failing rank's last word (its first error, read by peers whose link to it broke without a
//   word: TransportContext::lastWordOf) and its final record, left in the store as it goes.
//
// Owned by the communicator, which calls in from its waits (check, diagnose) and its collectives
// (enterCall); every store access is bounded in time and a gone store is no error here.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>

#include "bootstrap/store.hpp"
#include "comm/flight_recorder.hpp"
#include "core/request.hpp"
#include "core/status.hpp"
#include "transport/arena.hpp"

namespace loom {
namespace detail {

class Diagnostics {
 public:
  Diagnostics(int rank, int size, std::string name, std::shared_ptr<Store> store,
              std::shared_ptr<FailureState> failure);
  /// The node's shared arena, once the links are up (nullptr where there is none).
  void setArena(const LocalArena* arena) { arena_ = arena; }

  FlightRecorder& flight() { return flight_; }
  const FlightRecorder& flight() const { return flight_; }

  /// A collective starts on this rank: its sequence number and signature, published to the
  /// node's peers. `algo` is a static string (the flight recorder keeps the pointer).
  void enterCall(int64_t seq, uint64_t sig, const char* algo);
  /// The first local peer in collective `seq` with a signature other than `sig`, as an error;
  /// success when there is none (or no shared arena).
  Status localCallMismatch(int64_t seq, uint64_t sig) const;
  /// For a thread that has waited a while (Progressable::check): answers dump requests about once
  /// a second, and fails the communicator when a local peer is in another call.
  void check() noexcept;
  /// The hang report for the collective this rank is in ("" when none): Progressable::diagnose.
  std::string diagnose() noexcept;

  /// Gathers the ranks' records through the store (those waiting in Loom answer within a second
  /// or two) and returns the report for collective `seq` from whatever answered within `waitFor`.
  std::string hangReport(int64_t seq, std::chrono::milliseconds waitFor);
  /// What a dump signal prints (comm/dump_signal.hpp): this rank's recent collectives and, inside
  /// one, the hang report.
  std::string dumpText();
  /// Publishes this rank's record if a dump was requested since it last did (store counter).
  void answerDumpRequests();

  /// Notes this rank's first failure in the store, for peers whose link to it breaks without a
  /// word. Best effort and bounded in time.
  void leaveWord(const Status& status);
  /// Publishes this failed rank's final record as the answer to every dump request, later ones
  /// included (it is going away and will answer no more); best effort.
  void leaveRecord() noexcept;

 private:
  const int rank_;
  const int size_;
  const std::string name_;
  const std::shared_ptr<Store> store_;
  const std::shared_ptr<FailureState> failure_;
  const LocalArena* arena_ = nullptr;
  FlightRecorder flight_;
  std::atomic<int64_t> currentSeq_{-1};  // the collective this rank is in (enterCall)
  std::atomic<uint64_t> currentSig_{0};
  std::atomic<int64_t> lastDumpPoll_{0};  // when check() last looked for a dump request (Clock ticks)
  std::mutex dumpMu_;
  int64_t answeredDump_ = 0;  // the last dump request this rank answered (the store's counter)
};

}  // namespace detail
}  // namespace loom
