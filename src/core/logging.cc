#include "core/logging.hpp"

#include <strings.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <mutex>

#include "core/param.hpp"

namespace loom {
namespace {

LOOM_PARAM_STR(debugLevelParam, "LOOM_DEBUG", "WARN",
               "log level on stderr: NONE, WARN, INFO (at init: the launch found, the transport and interface of "
               "each link, the cost model's inputs) or TRACE");

thread_local int tlsRank = -1;

LogLevel parseLevel(const std::string& s) {
  if (strcasecmp(s.c_str(), "NONE") == 0) return LogLevel::None;
  if (strcasecmp(s.c_str(), "INFO") == 0) return LogLevel::Info;
  if (strcasecmp(s.c_str(), "TRACE") == 0) return LogLevel::Trace;
  return LogLevel::Warn;
}

const char* levelName(LogLevel l) {
  switch (l) {
    case LogLevel::Warn:
      return "WARN";
    case LogLevel::Info:
      return "INFO";
    case LogLevel::Trace:
      return "TRACE";
    default:
      return "";
  }
}

}  // namespace

LogLevel logLevel() {
  static const LogLevel level = parseLevel(debugLevelParam());
  return level;
}

int logRank() { return tlsRank; }

void setThreadLogRank(int rank) { tlsRank = rank; }

LogRankScope::LogRankScope(int rank) : previous_(tlsRank) { tlsRank = rank; }
LogRankScope::~LogRankScope() { tlsRank = previous_; }

void logLine(LogLevel level, const std::string& message) {
  static const std::string host = [] {
    char buf[256] = {0};
    gethostname(buf, sizeof(buf) - 1);
    return std::string(buf);
  }();
  std::string rank = tlsRank >= 0 ? std::to_string(tlsRank) : std::string("-");
  std::string line = strFormat("%s:%d:%s LOOM %s %s\n", host.c_str(), static_cast<int>(getpid()), rank.c_str(),
                               levelName(level), message.c_str());
  // One write per line so that lines from several threads and processes do not interleave.
  fwrite(line.data(), 1, line.size(), stderr);
}

}  // namespace loom
