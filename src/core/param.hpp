// Tunables. Each is declared once, next to the code that uses it, with its environment variable
// in that one line (in the manner of NCCL_PARAM):
//
//   LOOM_PARAM_INT(socketsPerPeer, "LOOM_SOCKETS_PER_PEER", 2, "TCP sockets striped per peer");
//
// defines `int64_t socketsPerPeer()` reading the variable (each call reads the environment, so
// read it at init, not on a hot path) and registers it for `loom-info --env`.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace loom {

struct ParamInfo {
  const char* env;
  std::string defaultText;
  const char* help;
};

/// Every tunable registered so far, sorted by name.
std::vector<ParamInfo> allParams();

/// Registers a tunable at static-initialisation time.
struct ParamRegistrar {
  ParamRegistrar(const char* env, std::string defaultText, const char* help);
};

/// The variable's integer value, or `def` when unset or empty; a malformed value is warned about
/// and ignored.
int64_t envInt(const char* env, int64_t def);
/// The variable's value, or `def` when unset.
std::string envStr(const char* env, const char* def);

}  // namespace loom

#define LOOM_PARAM_INT(fn, env, def, help)                                      \
  static ::loom::ParamRegistrar fn##Registrar_(env, std::to_string(def), help); \
  static inline int64_t fn() { return ::loom::envInt(env, def); }
#define LOOM_PARAM_STR(fn, env, def, help)                      \
  static ::loom::ParamRegistrar fn##Registrar_(env, def, help); \
  static inline std::string fn() { return ::loom::envStr(env, def); }
