// EnvGuard: sets an environment variable for a scope and restores what was there (or its absence).
// Loom reads its LOOM_ settings when a communicator is made, so a guard around the making of the
// test's communicators sets them for that test alone.
#pragma once

#include <cstdlib>
#include <string>

namespace loomtest {

class EnvGuard {
 public:
  EnvGuard(const char* name, const std::string& value) : name_(name) {
    const char* old = std::getenv(name);
    had_ = old != nullptr;
    if (had_) old_ = old;
    setenv(name, value.c_str(), 1);
  }
  ~EnvGuard() {
    if (had_)
      setenv(name_, old_.c_str(), 1);
    else
      unsetenv(name_);
  }
  EnvGuard(const EnvGuard&) = delete;
  EnvGuard& operator=(const EnvGuard&) = delete;

 private:
  const char* name_;
  bool had_ = false;
  std::string old_;
};

}  // namespace loomtest
