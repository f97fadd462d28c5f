#include "core/param.hpp"

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <mutex>

#include "core/logging.hpp"

namespace loom {
namespace {

std::mutex& registryMutex() {
  static std::mutex m;
  return m;
}
std::vector<ParamInfo>& registry() {
  static std::vector<ParamInfo> r;
  return r;
}

}  // namespace

ParamRegistrar::ParamRegistrar(const char* env, std::string defaultText, const char* help, const char* file) {
  std::lock_guard<std::mutex> lock(registryMutex());
  for (const auto& p : registry())
    if (std::strcmp(p.env, env) == 0) return;
  registry().push_back(ParamInfo{env, std::move(defaultText), help, file});
}

std::vector<ParamInfo> allParams() {
  std::lock_guard<std::mutex> lock(registryMutex());
  auto out = registry();
  std::sort(out.begin(), out.end(),
            [](const ParamInfo& a, const ParamInfo& b) { return std::strcmp(a.env, b.env) < 0; });
  return out;
}

int64_t envInt(const char* env, int64_t def) {
  const char* v = std::getenv(env);
  if (v == nullptr || *v == '\0') return def;
  errno = 0;
  char* end = nullptr;
  long long x = std::strtoll(v, &end, 0);
  if (errno != 0 || end == v || *end != '\0') {
    LOOM_WARN("ignoring %s=%s: not an integer; using %lld", env, v, static_cast<long long>(def));
    return def;
  }
  return x;
}

bool envIsSet(const char* env) {
  const char* v = std::getenv(env);
  return v != nullptr && *v != '\0';
}

std::string envStr(const char* env, const char* def) {
  const char* v = std::getenv(env);
  return v != nullptr ? std::string(v) : std::string(def);
}

}  // namespace loom
