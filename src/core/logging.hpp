// Logging to stderr, levelled by LOOM_DEBUG=WARN|INFO|TRACE (default WARN; "NONE" silences).
// Each line: "host:pid:rank LOOM LEVEL message". The rank shown is the calling thread's, set by
// LogRankScope (communicator threads and API entry points set it).
#pragma once

#include <string>

#include "core/format.hpp"

namespace loom {

enum class LogLevel : int { None = 0, Warn = 1, Info = 2, Trace = 3 };

/// The level from LOOM_DEBUG (read once).
LogLevel logLevel();
/// Writes one line if `level` is enabled.
void logLine(LogLevel level, const std::string& message);
/// The rank this thread logs as (-1: none).
int logRank();

/// Sets the calling thread's log rank for the scope's lifetime.
class LogRankScope {
 public:
  explicit LogRankScope(int rank);
  ~LogRankScope();
  LogRankScope(const LogRankScope&) = delete;
  LogRankScope& operator=(const LogRankScope&) = delete;

 private:
  int previous_;
};

/// Sets the calling thread's log rank permanently (for threads a communicator owns).
void setThreadLogRank(int rank);

}  // namespace loom

#define LOOM_LOG(level, ...)                                                                     \
  do {                                                                                           \
    if (::loom::logLevel() >= (level)) ::loom::logLine((level), ::loom::strFormat(__VA_ARGS__)); \
  } while (0)
#define LOOM_WARN(...) LOOM_LOG(::loom::LogLevel::Warn, __VA_ARGS__)
#define LOOM_INFO(...) LOOM_LOG(::loom::LogLevel::Info, __VA_ARGS__)
#define LOOM_TRACE(...) LOOM_LOG(::loom::LogLevel::Trace, __VA_ARGS__)
