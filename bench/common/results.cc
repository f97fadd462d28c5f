#include "results.hpp"

#include <cctype>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>

#include "net/interfaces.hpp"

namespace loom {
namespace bench {

double parseRateGbit(const std::string& text) {
  std::string t;
  for (char ch : text) t += static_cast<char>(std::tolower(static_cast<unsigned char>(ch)));
  char* end = nullptr;
  const double v = std::strtod(t.c_str(), &end);
  if (end == t.c_str() || v <= 0) return 0;
  std::string unit = end;
  if (unit.size() >= 3 && unit.compare(unit.size() - 3, 3, "bit") == 0) unit.resize(unit.size() - 3);
  if (unit.empty() || unit == "g") return v;
  if (unit == "t") return v * 1000;
  if (unit == "m") return v / 1000;
  if (unit == "k") return v / 1e6;
  return 0;
}

LinkRate findLinkRate(const std::string& flag) {
  if (!flag.empty()) return {parseRateGbit(flag), "--link-rate " + flag};
  if (const std::string env = loom::linkRateSetting(); !env.empty())
    return {parseRateGbit(env), "LOOM_LINK_RATE=" + env};
  // The interface Loom's TCP transport uses, if it is a real device that knows its speed.
  try {
    const std::string name = selectedInterfaces().front().name;
    const std::string sys = "/sys/class/net/" + name;
    std::ifstream device(sys + "/device/uevent"), speed(sys + "/speed");
    long mbps = 0;
    if (device && speed >> mbps && mbps > 0) return {static_cast<double>(mbps) / 1000, name + "'s speed"};
  } catch (...) {
  }
  return {};
}

const Row* Results::peak() const {
  const Row* best = nullptr;
  for (const auto& r : rows_)
    if (best == nullptr || r.busbw > best->busbw) best = &r;
  return best;
}

std::string Results::summary() const {
  const Row* p = peak();
  char buf[512];
  if (p == nullptr) return "# Summary: nothing measured";
  int n = std::snprintf(buf, sizeof buf, "# Summary: peak busbw %.4f GB/s at %zu bytes (%s, %d ranks on %d node%s)",
                        p->busbw, p->bytes, p->inPlace ? "in place" : "out of place", ranks_, nodes_,
                        nodes_ == 1 ? "" : "s");
  if (link_.gbit > 0 && nodes_ == 1) {
    std::snprintf(buf + n, sizeof buf - static_cast<size_t>(n),
                  "; link %.3f Gbit/s (%s), not crossed: every rank is on one node", link_.gbit, link_.source.c_str());
  } else if (link_.gbit > 0) {
    std::snprintf(buf + n, sizeof buf - static_cast<size_t>(n), "; link %.3f Gbit/s = %.4f GB/s (%s): %.0f%% of it",
                  link_.gbit, link_.gbit / 8, link_.source.c_str(), 100 * p->busbw / (link_.gbit / 8));
  } else {
    std::snprintf(buf + n, sizeof buf - static_cast<size_t>(n),
                  "; link rate unknown (--link-rate or LOOM_LINK_RATE, e.g. 100gbit)");
  }
  return buf;
}

bool Results::writeCsv(const std::string& path) const {
  FILE* f = std::fopen(path.c_str(), "w");
  if (f == nullptr) {
    std::fprintf(stderr, "cannot write %s: %s\n", path.c_str(), std::strerror(errno));
    return false;
  }
  std::fprintf(f, "collective,ranks,bytes,count,type,op,root,inplace,time_us,algbw_gbs,busbw_gbs,wrong\n");
  for (const auto& r : rows_)
    std::fprintf(f, "%s,%d,%zu,%zu,%s,%s,%d,%d,%.3f,%.6f,%.6f,%.0f\n", collective_.c_str(), ranks_, r.bytes, r.count,
                 r.type.c_str(), r.op.c_str(), r.root, r.inPlace ? 1 : 0, r.timeUs, r.algbw, r.busbw, r.wrong);
  return std::fclose(f) == 0;
}

bool Results::writeJson(const std::string& path) const {
  FILE* f = std::fopen(path.c_str(), "w");
  if (f == nullptr) {
    std::fprintf(stderr, "cannot write %s: %s\n", path.c_str(), std::strerror(errno));
    return false;
  }
  std::fprintf(f, "{\n \"collective\": \"%s\",\n \"ranks\": %d,\n \"nodes\": %d,\n", collective_.c_str(), ranks_,
               nodes_);
  if (link_.gbit > 0)
    std::fprintf(f, " \"link_gbit\": %.6f,\n \"link_source\": \"%s\",\n", link_.gbit, link_.source.c_str());
  else
    std::fprintf(f, " \"link_gbit\": null,\n");
  if (const Row* p = peak()) std::fprintf(f, " \"peak\": {\"bytes\": %zu, \"busbw_gbs\": %.6f},\n", p->bytes, p->busbw);
  std::fprintf(f, " \"rows\": [");
  for (size_t i = 0; i < rows_.size(); ++i) {
    const Row& r = rows_[i];
    std::fprintf(f,
                 "%s\n  {\"bytes\": %zu, \"count\": %zu, \"type\": \"%s\", \"op\": \"%s\", \"root\": %d, \"inplace\": "
                 "%s, \"time_us\": %.3f, \"algbw_gbs\": %.6f, \"busbw_gbs\": %.6f, \"wrong\": %.0f}",
                 i == 0 ? "" : ",", r.bytes, r.count, r.type.c_str(), r.op.c_str(), r.root,
                 r.inPlace ? "true" : "false", r.timeUs, r.algbw, r.busbw, r.wrong);
  }
  std::fprintf(f, "\n ]\n}\n");
  return std::fclose(f) == 0;
}

}  // namespace bench
}  // namespace loom
