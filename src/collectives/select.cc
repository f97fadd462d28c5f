#include "collectives/select.hpp"

#include <mutex>
#include <vector>

#include "core/logging.hpp"
#include "core/param.hpp"

namespace loom {
namespace coll {
namespace {

LOOM_PARAM_STR(algoParam, "LOOM_ALGO", "",
               "force algorithms: ring, rd, hd, dbtree, tree, chain, pairwise, linear, dissemination, hier "
               "(node-aware), direct (one node only), or per collective, e.g. allreduce:rd,broadcast:chain,"
               "barrier:dissemination (default: the cost model's choice; loom-info --algos prints the table)");

// LOOM_ALGO's items: a bare name applies to every collective with a row of that name,
// "collective:name" to one.
struct OverrideItem {
  std::string key;  // "" for every collective
  std::string name;
};

std::vector<OverrideItem> parseOverride(const std::string& text) {
  std::vector<OverrideItem> items;
  size_t pos = 0;
  while (!text.empty() && pos <= text.size()) {
    const size_t comma = text.find(',', pos);
    const std::string item = text.substr(pos, comma == std::string::npos ? std::string::npos : comma - pos);
    const size_t colon = item.find(':');
    if (colon == std::string::npos)
      items.push_back({"", item});
    else
      items.push_back({item.substr(0, colon), item.substr(colon + 1)});
    if (comma == std::string::npos) break;
    pos = comma + 1;
  }
  return items;
}

// Says once per process which of LOOM_ALGO's items name no row: a typo would otherwise be ignored.
void warnUnknownItems(const std::string& text) {
  static std::once_flag once;
  std::call_once(once, [&text] {
    for (const OverrideItem& item : parseOverride(text)) {
      bool known = false;
      for (int c = 0; c < kCollCount && !known; ++c)
        known = (item.key.empty() || item.key == collKey(static_cast<Coll>(c))) &&
                findRow(static_cast<Coll>(c), item.name) != nullptr;
      if (!known && !item.name.empty())
        LOOM_WARN("LOOM_ALGO: \"%s%s%s\" names no algorithm (loom-info --algos lists them); ignored", item.key.c_str(),
                  item.key.empty() ? "" : ":", item.name.c_str());
    }
  });
}

}  // namespace

const AlgoRow* forcedRow(Coll c, const std::string& override) {
  for (const OverrideItem& item : parseOverride(override)) {
    if (!item.key.empty() && item.key != collKey(c)) continue;
    if (const AlgoRow* row = findRow(c, item.name)) return row;
  }
  return nullptr;
}

double modelUs(Coll c, Algo a, size_t bytes, int ranks, const CostModel& m) {
  const AlgoRow* row = rowOf(c, a);
  const Call call = Call::flat(c, bytes, ranks, m);
  return row != nullptr && canRun(*row, call) ? row->cost(call) : kNever;
}

Algo selectAlgo(Coll c, size_t bytes, int ranks, const CostModel& m, const std::string& override) {
  return chooseRow(Call::flat(c, bytes, ranks, m), Mode::Default, forcedRow(c, override)).algo;
}

const char* algoName(Algo a) {
  for (const AlgoRow& row : algorithmTable())
    if (row.algo == a) return row.name;
  return "?";
}

std::string algoOverrideFromEnv() { return algoParam(); }

Selector::Selector(const CostModel& m, const std::string& override, const NodeShape& shape) : m_(m), shape_(shape) {
  if (!override.empty()) warnUnknownItems(override);
  for (int c = 0; c < kCollCount; ++c) forced_[c] = forcedRow(static_cast<Coll>(c), override);
}

double Selector::hierarchicalUs(Coll c, size_t bytes) const {
  Call call = Call::flat(c, bytes, shape_.nodes * shape_.maxLocal, m_);
  call.shape = &shape_;
  return coll::hierarchicalUs(call);
}

const AlgoRow& Selector::pick(Coll c, size_t bytes, int ranks) const {
  const auto k = static_cast<size_t>(c);
  // One communicator, one world size: the memo needs only the size.
  auto& memo = last_[k];
  const uint64_t seen = memo.load(std::memory_order_relaxed);
  const auto& table = algorithmTable();
  if (seen != 0 && (seen >> 8) == bytes) return table[(seen & 0xff) - 1];
  Call call = Call::flat(c, bytes, ranks, m_);
  call.shape = &shape_;
  const AlgoRow& row = chooseRow(call, Mode::Default, forced_[k]);
  if (bytes < (uint64_t{1} << 56))
    memo.store(static_cast<uint64_t>(bytes) << 8 | static_cast<uint64_t>(&row - table.data() + 1),
               std::memory_order_relaxed);
  return row;
}

const AlgoRow& Selector::pickIntra(Coll c, size_t bytes, int ranks) const {
  return chooseRow(Call::flat(c, bytes, ranks, shape_.intra), Mode::Default);
}

const AlgoRow& Selector::pickInter(Coll c, size_t bytes, int ranks) const {
  return chooseRow(Call::flat(c, bytes, ranks, m_), Mode::Default);
}

}  // namespace coll
}  // namespace loom
