// Tunables. Each is declared once, next to the code that uses it, with its environment variable
// in that one line (in the manner of NCCL_PARAM):
//
//   LOOM_PARAM_INT(socketsPerPeer, "LOOM_SOCKETS_PER_PEER", 2, "TCP sockets striped per peer");
//
// defines `int64_t socketsPerPeer()` reading the variable (each call reads the environment, so
// read it at init, not on a hot path) and `bool socketsPerPeerIsSet()`, and registers the setting
// for `loom-info --env` and docs/settings.md (`loom-info --env --markdown`, checked in CI). A
// variable read some other way (the launcher variables, through an injectable lookup) is declared
// with LOOM_SETTING so that it is listed all the same. The registry keeps the declaring file: the
// manual groups the settings by the folder they live in.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace loom {

struct ParamInfo {
  const char* env;
  std::string defaultText;
  const char* help;
  const char* file;  ///< the declaring source file (__FILE__)
};

/// Every setting registered so far, sorted by name.
std::vector<ParamInfo> allParams();

/// Registers a setting at static-initialisation time.
struct ParamRegistrar {
  ParamRegistrar(const char* env, std::string defaultText, const char* help, const char* file);
};

/// The variable's integer value, or `def` when unset or empty; a malformed value is warned about
/// and ignored.
int64_t envInt(const char* env, int64_t def);
/// The variable's value, or `def` when unset.
std::string envStr(const char* env, const char* def);
/// Whether the variable is set to something non-empty (the user chose a value).
bool envIsSet(const char* env);

}  // namespace loom

#define LOOM_PARAM_INT(fn, env, def, help)                                                \
  static ::loom::ParamRegistrar fn##Registrar_(env, std::to_string(def), help, __FILE__); \
  [[maybe_unused]] static inline int64_t fn() { return ::loom::envInt(env, def); }        \
  [[maybe_unused]] static inline bool fn##IsSet() { return ::loom::envIsSet(env); }
#define LOOM_PARAM_STR(fn, env, def, help)                                             \
  static ::loom::ParamRegistrar fn##Registrar_(env, def, help, __FILE__);              \
  [[maybe_unused]] static inline std::string fn() { return ::loom::envStr(env, def); } \
  [[maybe_unused]] static inline bool fn##IsSet() { return ::loom::envIsSet(env); }
/// A setting read by other means than the accessors above; `defaultText` is what applies when unset.
#define LOOM_SETTING(tag, env, defaultText, help) \
  static ::loom::ParamRegistrar tag##Registrar_(env, defaultText, help, __FILE__)
