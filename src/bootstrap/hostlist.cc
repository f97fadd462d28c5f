#include "bootstrap/hostlist.hpp"

#include <cctype>

#include "core/format.hpp"
#include "core/status.hpp"

namespace loom {
namespace {

[[noreturn]] void malformed(const std::string& list, const std::string& why) {
  LOOM_THROW(ErrorCode::InvalidArgument, -1,
             strFormat("malformed Slurm host list \"%s\": %s", list.c_str(), why.c_str()));
}

// Splits at commas that are outside brackets.
std::vector<std::string> splitTopLevel(const std::string& list) {
  std::vector<std::string> items;
  std::string cur;
  int depth = 0;
  for (char c : list) {
    if (c == '[') {
      if (depth++ != 0) malformed(list, "nested '['");
    } else if (c == ']') {
      if (--depth < 0) malformed(list, "']' without '['");
    }
    if (c == ',' && depth == 0) {
      items.push_back(cur);
      cur.clear();
    } else {
      cur += c;
    }
  }
  if (depth != 0) malformed(list, "'[' without ']'");
  items.push_back(cur);
  return items;
}

bool allDigits(const std::string& s) {
  if (s.empty() || s.size() > 18) return false;
  for (char c : s)
    if (!std::isdigit(static_cast<unsigned char>(c))) return false;
  return true;
}

// Expands the inside of one bracket group: "01-04,07" -> 01 02 03 04 07 (`firstOnly`: checks it
// all but keeps only 01).
std::vector<std::string> expandRanges(const std::string& list, const std::string& body, size_t maxHosts,
                                      bool firstOnly) {
  std::vector<std::string> out;
  size_t start = 0;
  while (start <= body.size()) {
    size_t comma = body.find(',', start);
    std::string part = body.substr(start, comma == std::string::npos ? std::string::npos : comma - start);
    size_t dash = part.find('-');
    if (dash == std::string::npos) {
      if (!allDigits(part)) malformed(list, "\"" + part + "\" is not a number");
      if (!firstOnly || out.empty()) out.push_back(part);
    } else {
      std::string lo = part.substr(0, dash), hi = part.substr(dash + 1);
      if (!allDigits(lo) || !allDigits(hi)) malformed(list, "\"" + part + "\" is not a range");
      unsigned long long a = std::stoull(lo), b = std::stoull(hi);
      if (b < a) malformed(list, "range \"" + part + "\" runs backwards");
      if (!firstOnly && (b - a + 1 > maxHosts || out.size() + (b - a + 1) > maxHosts))
        malformed(list, "too many hosts");
      for (unsigned long long v = a; v <= b && (!firstOnly || out.empty()); ++v) {
        std::string digits = std::to_string(v);
        if (digits.size() < lo.size()) digits.insert(0, lo.size() - digits.size(), '0');
        out.push_back(digits);
      }
    }
    if (comma == std::string::npos) break;
    start = comma + 1;
  }
  return out;
}

void expandItem(const std::string& list, const std::string& item, size_t maxHosts, std::vector<std::string>& out,
                bool firstOnly = false) {
  if (item.empty()) malformed(list, "empty host name");
  std::vector<std::string> names{""};
  size_t pos = 0;
  while (pos < item.size()) {
    size_t open = item.find('[', pos);
    std::string literal = item.substr(pos, open == std::string::npos ? std::string::npos : open - pos);
    for (auto& n : names) n += literal;
    if (open == std::string::npos) break;
    size_t close = item.find(']', open);
    std::vector<std::string> values = expandRanges(list, item.substr(open + 1, close - open - 1), maxHosts, firstOnly);
    if (names.size() * values.size() + out.size() > maxHosts) malformed(list, "too many hosts");
    std::vector<std::string> next;
    next.reserve(names.size() * values.size());
    for (const auto& n : names)
      for (const auto& v : values) next.push_back(n + v);
    names.swap(next);
    pos = close + 1;
  }
  if (out.size() + names.size() > maxHosts) malformed(list, "too many hosts");
  for (auto& n : names) out.push_back(std::move(n));
}

}  // namespace

std::vector<std::string> expandHostList(const std::string& list, size_t maxHosts) {
  std::vector<std::string> out;
  for (const auto& item : splitTopLevel(list)) expandItem(list, item, maxHosts, out);
  return out;
}

std::string firstHost(const std::string& list) {
  auto items = splitTopLevel(list);
  std::vector<std::string> out;
  // The first value of each bracket group of the first item makes the first host (the rest of the
  // item is checked, not expanded).
  expandItem(list, items.front(), 1, out, true);
  return out.front();
}

}  // namespace loom
