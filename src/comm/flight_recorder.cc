#include "comm/flight_recorder.hpp"

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <sstream>

#include "core/format.hpp"
#include "core/signature.hpp"

namespace loom {
namespace {

// A coarse monotonic clock (a few milliseconds of resolution) costs a fraction of the precise one,
// and the recorder stamps every call twice.
double nowSeconds() {
  timespec t{};
  clock_gettime(CLOCK_MONOTONIC_COARSE, &t);
  return static_cast<double>(t.tv_sec) + static_cast<double>(t.tv_nsec) * 1e-9;
}

const char* stateName(FlightEntry::State s) {
  switch (s) {
    case FlightEntry::State::Queued:
      return "queued";
    case FlightEntry::State::Running:
      return "running";
    case FlightEntry::State::Done:
      return "done";
    case FlightEntry::State::Failed:
      return "failed";
  }
  return "?";
}

// "all_reduce #1042 of 4194304 float32 (sum)" from a signature's description.
std::string callText(uint64_t sig, int64_t seq) {
  std::string d = describeSignature(sig);  // "all_reduce of 4194304 float32 (sum)"
  const size_t of = d.find(" of ");
  if (of == std::string::npos) return strFormat("%s #%lld", d.c_str(), static_cast<long long>(seq));
  return strFormat("%s #%lld%s", d.substr(0, of).c_str(), static_cast<long long>(seq), d.substr(of).c_str());
}

std::string kindText(uint64_t sig, int64_t seq) {
  std::string d = describeSignature(sig);
  return strFormat("%s #%lld", d.substr(0, d.find(" of ")).c_str(), static_cast<long long>(seq));
}

}  // namespace

FlightRecorder::Slot* FlightRecorder::findLocked(int64_t seq) {
  // Newest first: the call looked for is nearly always the last one queued.
  const size_t n = slots_.size();
  for (size_t i = 0; i < n; ++i) {
    Slot& s = slots_[(next_ + n - 1 - i) % n];
    if (s.seq == seq) return &s;
  }
  return nullptr;
}

void FlightRecorder::queued(int64_t seq, uint64_t sig) {
  std::lock_guard<std::mutex> lock(mu_);
  Slot s;
  s.seq = seq;
  s.sig = sig;
  if (slots_.size() < capacity_) {
    slots_.push_back(s);
    next_ = slots_.size() % capacity_;
  } else {
    slots_[next_] = s;
    next_ = (next_ + 1) % capacity_;
  }
}

void FlightRecorder::running(int64_t seq, uint64_t sig, const char* algo) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (Slot* s = findLocked(seq)) {
      s->state = FlightEntry::State::Running;
      s->sig = sig;
      s->algo = algo;
      s->start = nowSeconds();
      return;
    }
  }
  queued(seq, sig);
  running(seq, sig, algo);
}

void FlightRecorder::finished(int64_t seq, bool ok) {
  std::lock_guard<std::mutex> lock(mu_);
  if (Slot* s = findLocked(seq)) {
    s->state = ok ? FlightEntry::State::Done : FlightEntry::State::Failed;
    s->end = nowSeconds();
  }
}

std::vector<FlightEntry> FlightRecorder::snapshot() const {
  std::lock_guard<std::mutex> lock(mu_);
  const double now = nowSeconds();
  std::vector<FlightEntry> out;
  for (size_t i = 0; i < slots_.size(); ++i) {
    const Slot& s = slots_[(next_ + i) % slots_.size()];
    FlightEntry e;
    e.seq = s.seq;
    e.sig = s.sig;
    e.algo = s.algo;
    e.state = s.state;
    if (e.state != FlightEntry::State::Queued) e.startAge = now - s.start;
    if (e.state == FlightEntry::State::Done || e.state == FlightEntry::State::Failed) e.endAge = now - s.end;
    out.push_back(e);
  }
  std::sort(out.begin(), out.end(), [](const FlightEntry& a, const FlightEntry& b) { return a.seq < b.seq; });
  return out;
}

std::string FlightRecorder::serialize() const {
  std::string out;
  for (const auto& e : snapshot())
    out +=
        strFormat("%lld %llu %s %s %.6f %.6f\n", static_cast<long long>(e.seq), static_cast<unsigned long long>(e.sig),
                  stateName(e.state), e.algo.empty() ? "-" : e.algo.c_str(), e.startAge, e.endAge);
  return out;
}

std::vector<FlightEntry> parseFlight(const std::string& text) {
  std::vector<FlightEntry> out;
  std::istringstream in(text);
  std::string line;
  while (std::getline(in, line)) {
    std::istringstream f(line);
    FlightEntry e;
    std::string state;
    unsigned long long sig = 0;
    if (!(f >> e.seq >> sig >> state >> e.algo >> e.startAge >> e.endAge)) continue;
    e.sig = sig;
    if (e.algo == "-") e.algo.clear();
    e.state = state == "running"  ? FlightEntry::State::Running
              : state == "done"   ? FlightEntry::State::Done
              : state == "failed" ? FlightEntry::State::Failed
                                  : FlightEntry::State::Queued;
    out.push_back(e);
  }
  return out;
}

std::string flightKey(int rank) { return "flight/" + std::to_string(rank); }

std::string publishedFlight(int64_t answers, const std::string& record) {
  return std::to_string(answers) + "\n" + record;
}

std::optional<std::vector<FlightEntry>> readPublishedFlight(const std::string& text, int64_t request) {
  const size_t nl = text.find('\n');
  if (nl == std::string::npos || nl == 0) return std::nullopt;
  char* end = nullptr;
  const long long answers = std::strtoll(text.c_str(), &end, 10);
  if (end != text.c_str() + nl || answers < request) return std::nullopt;
  return parseFlight(text.substr(nl + 1));
}

std::string rankList(const std::vector<int>& ranks) {
  std::string out;
  for (size_t i = 0; i < ranks.size();) {
    size_t j = i;
    while (j + 1 < ranks.size() && ranks[j + 1] == ranks[j] + 1) ++j;
    out += (out.empty() ? "" : ",") + std::to_string(ranks[i]);
    if (j > i) out += "-" + std::to_string(ranks[j]);
    i = j + 1;
  }
  return out;
}

std::string formatFlight(const std::vector<FlightEntry>& entries, size_t last) {
  std::string out;
  const size_t from = entries.size() > last ? entries.size() - last : 0;
  for (size_t i = from; i < entries.size(); ++i) {
    const FlightEntry& e = entries[i];
    const char* state = e.state == FlightEntry::State::Running  ? "running"
                        : e.state == FlightEntry::State::Done   ? "done"
                        : e.state == FlightEntry::State::Failed ? "failed"
                                                                : "queued";
    out += strFormat("  #%-6lld %-8s %-40s %-8s", static_cast<long long>(e.seq), state,
                     describeSignature(e.sig).c_str(), e.algo.c_str());
    if (e.startAge >= 0) out += strFormat(" started %.1f s ago", e.startAge);
    if (e.endAge >= 0) out += strFormat(", ended %.1f s ago", e.endAge);
    out += "\n";
  }
  return out;
}

std::string hangReport(int size, const std::map<int, std::vector<FlightEntry>>& byRank, int64_t seq) {
  // What the collective is, from whoever is in it.
  uint64_t sig = 0;
  for (const auto& [r, entries] : byRank)
    for (const auto& e : entries)
      if (e.seq == seq && e.state != FlightEntry::State::Queued && sig == 0) sig = e.sig;
  std::vector<int> waiting, silent;
  double longest = 0;
  std::vector<std::string> lines;
  int64_t lastCommon = -1;
  uint64_t lastCommonSig = 0;
  bool first = true;
  for (int r = 0; r < size; ++r) {
    auto it = byRank.find(r);
    if (it == byRank.end()) {
      silent.push_back(r);
      continue;
    }
    const FlightEntry* in = nullptr;
    const FlightEntry* lastDone = nullptr;
    for (const auto& e : it->second) {
      if (e.seq == seq) in = &e;
      if (e.state == FlightEntry::State::Done && (lastDone == nullptr || e.seq > lastDone->seq)) lastDone = &e;
    }
    // The last collective every answering rank finished.
    const int64_t done = lastDone != nullptr ? lastDone->seq : -1;
    if (first || done < lastCommon) {
      lastCommon = done;
      lastCommonSig = lastDone != nullptr ? lastDone->sig : 0;
    }
    first = false;
    if (in != nullptr && in->state == FlightEntry::State::Running) {
      if (sig != 0 && in->sig != sig) {
        lines.push_back(
            strFormat("rank %d is in %s, not %s", r, callText(in->sig, seq).c_str(), describeSignature(sig).c_str()));
      } else {
        waiting.push_back(r);
        longest = std::max(longest, in->startAge);
      }
      continue;
    }
    if (in != nullptr && in->state != FlightEntry::State::Queued) {
      lines.push_back(
          strFormat("rank %d has %s it", r, in->state == FlightEntry::State::Done ? "finished" : "failed in"));
      continue;
    }
    std::string what =
        strFormat("rank %d has not entered %s", r,
                  sig != 0 ? kindText(sig, seq).c_str() : strFormat("#%lld", static_cast<long long>(seq)).c_str());
    if (lastDone != nullptr)
      what += strFormat("; its last completed op is %s, %.1f s ago", kindText(lastDone->sig, lastDone->seq).c_str(),
                        lastDone->endAge);
    lines.push_back(what);
  }
  std::string head = sig != 0 ? callText(sig, seq) : strFormat("collective #%lld", static_cast<long long>(seq));
  std::string out = "hang report for " + head + ":";
  for (const auto& l : lines) out += "\n  " + l;
  if (!silent.empty()) {
    out += strFormat(
        "\n  rank%s %s did not answer (stopped, dead, or busy outside Loom: not in a Loom wait), so %s "
        "not in %s",
        silent.size() == 1 ? "" : "s", rankList(silent).c_str(), silent.size() == 1 ? "it is" : "they are",
        sig != 0 ? kindText(sig, seq).c_str() : "it");
  }
  if (!waiting.empty())
    out += strFormat("\n  rank%s %s %s waiting in it since %.1f s", waiting.size() == 1 ? "" : "s",
                     rankList(waiting).c_str(), waiting.size() == 1 ? "is" : "are", longest);
  if (lastCommon >= 0)
    out +=
        strFormat("\n  the last op every answering rank completed is %s", kindText(lastCommonSig, lastCommon).c_str());
  return out;
}

}  // namespace loom
