// FlightRecorder: each communicator's record of its recent collectives (sequence number, the call's
// signature, algorithm, state, when it started and ended), kept in a small ring so that a hang can
// be explained after the fact: which rank has not entered the collective the others wait in, and
// what each rank did last. hangReport turns every rank's record into one readable report.
//
// Records cross processes (through the rendezvous store) as text, one entry per line; times are
// ages in seconds at the moment of publishing, so that ranks' clocks need not agree.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

namespace loom {

struct FlightEntry {
  enum class State { Queued, Running, Done, Failed };
  int64_t seq = -1;
  uint64_t sig = 0;  ///< core/signature.hpp
  std::string algo;
  State state = State::Queued;
  double startAge = -1;  ///< seconds before the record was taken; -1 while queued
  double endAge = -1;    ///< seconds before the record was taken; -1 while not finished
};

class FlightRecorder {
 public:
  explicit FlightRecorder(size_t capacity = 64) : capacity_(capacity) {}
  void queued(int64_t seq, uint64_t sig);
  /// `algo` must be a static string (coll::algoName).
  void running(int64_t seq, uint64_t sig, const char* algo);
  void finished(int64_t seq, bool ok);
  /// The entries, oldest first, with ages as of now.
  std::vector<FlightEntry> snapshot() const;
  /// snapshot() as text (parseFlight reads it back).
  std::string serialize() const;

 private:
  // Entries as recorded on the hot path: no string (the algorithm names are static), no search
  // past the most recent entries, a coarse clock (ages are printed to a tenth of a second).
  struct Slot {
    int64_t seq = -1;
    uint64_t sig = 0;
    const char* algo = "";
    FlightEntry::State state = FlightEntry::State::Queued;
    double start = 0, end = 0;  // seconds on a steady clock
  };
  Slot* findLocked(int64_t seq);
  const size_t capacity_;
  mutable std::mutex mu_;
  std::vector<Slot> slots_;  // a ring once full
  size_t next_ = 0;
};

std::vector<FlightEntry> parseFlight(const std::string& text);

// Publishing records through the rendezvous store. Whoever wants the records (a rank that timed
// out, `loom-info --dump`) adds 1 to the counter at kDumpRequestKey; each rank answers by setting
// flightKey(rank) to publishedFlight(n, record), n being the counter it saw: an answer to request
// n answers every request up to n.

/// The store counter of dump requests.
inline constexpr const char* kDumpRequestKey = "dump/request";

/// The store key of a rank's published record: "flight/<rank>".
std::string flightKey(int rank);

/// A record as published: "<the last request it answers>\n<serialize()'s text>".
std::string publishedFlight(int64_t answers, const std::string& record);

/// The entries of a published record if it answers request `request` (or a later one), else
/// nothing: an older answer may be stale.
std::optional<std::vector<FlightEntry>> readPublishedFlight(const std::string& text, int64_t request);

/// The report for collective `seq` from each answering rank's record (ranks missing from
/// `byRank` did not answer), e.g.
///   "rank 3 has not entered all_reduce #1042; ranks 0-2,4-7 are waiting
///    in it since 31.2 s; rank 3's last completed op is broadcast #1041".
std::string hangReport(int size, const std::map<int, std::vector<FlightEntry>>& byRank, int64_t seq);

/// The last `last` entries, one line each: "  #42     done     all_reduce of 1024 float32 (sum)  ring
/// started 3.1 s ago, ended 3.0 s ago".
std::string formatFlight(const std::vector<FlightEntry>& entries, size_t last);

/// "0-2,5,7-8".
std::string rankList(const std::vector<int>& ranks);

}  // namespace loom
