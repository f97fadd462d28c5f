// What a *_perf run measured, kept for the end of the run: the one-line summary under the table
// (peak bus bandwidth, the size where it is reached, and the link rate when known, with the peak's
// share of it), and the files --csv and --json write (tools/plot_bench reads either).
//
// The link rate comes from --link-rate, else LOOM_LINK_RATE (tools/vcluster sets it from its
// token bucket), else the speed the kernel reports for the interface Loom's TCP transport uses
// when that is a physical device (/sys/class/net/IF/speed). Rates read like tc's: 10gbit,
// 400mbit, 100g; a plain number is Gbit/s.
#pragma once

#include <cstddef>
#include <string>
#include <vector>

namespace loom {
namespace bench {

struct Row {
  size_t bytes = 0;
  size_t count = 0;
  std::string type, op;
  int root = -1;
  bool inPlace = false;
  double timeUs = 0, algbw = 0, busbw = 0, wrong = 0;
};

struct LinkRate {
  double gbit = 0;     ///< Gbit/s; 0 when unknown
  std::string source;  ///< where it came from, for the summary
};

/// Gbit/s of a rate in tc's syntax ("10gbit", "400mbit", "100g", "1.5"); 0 when unreadable.
double parseRateGbit(const std::string& text);
/// The link rate from the flag's value (may be empty), LOOM_LINK_RATE or the interface.
LinkRate findLinkRate(const std::string& flag);

class Results {
 public:
  Results(std::string collective, int ranks, int nodes, LinkRate link)
      : collective_(std::move(collective)), ranks_(ranks), nodes_(nodes), link_(std::move(link)) {}
  void add(const Row& r) { rows_.push_back(r); }
  /// "# Summary: peak busbw ... at ... bytes; link ... Gbit/s (...): NN% of it".
  std::string summary() const;
  /// Every row; returns false (and says why on stderr) when the file cannot be written.
  bool writeCsv(const std::string& path) const;
  bool writeJson(const std::string& path) const;

 private:
  const Row* peak() const;
  std::string collective_;
  int ranks_, nodes_;
  LinkRate link_;
  std::vector<Row> rows_;
};

}  // namespace bench
}  // namespace loom
