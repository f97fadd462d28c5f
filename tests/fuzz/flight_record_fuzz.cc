// Flight records read back from the store (another rank's text, bare or as published) and the hang report built from
// them (flight_recorder.hpp).
#include <cstddef>
#include <cstdint>
#include <map>
#include <string>

#include "comm/flight_recorder.hpp"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string text(reinterpret_cast<const char*>(data), size);
  std::map<int, std::vector<loom::FlightEntry>> byRank;
  byRank[0] = loom::parseFlight(text);
  if (auto published = loom::readPublishedFlight(text, 1)) byRank[1] = std::move(*published);
  byRank[2] = loom::parseFlight(text.substr(text.size() / 2));
  const int64_t seq = byRank[0].empty() ? 0 : byRank[0].back().seq;
  (void)loom::hangReport(4, byRank, seq);
  return 0;
}
