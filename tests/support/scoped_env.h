// A scoped environment variable for tests that switch a kernel path read from the environment
// per call (the tests' process only).
#pragma once

#include <cstdlib>
#include <string>

namespace qwenrt::testing_support {

// Sets an environment variable for one scope, restoring it (or its absence) after.
class ScopedEnv {
 public:
  ScopedEnv(const char* name, const char* value) : name_(name) {
    if (const char* old = std::getenv(name)) old_ = old;
    setenv(name, value, 1);
  }
  ~ScopedEnv() {
    if (old_.empty()) {
      unsetenv(name_);
    } else {
      setenv(name_, old_.c_str(), 1);
    }
  }
  ScopedEnv(const ScopedEnv&) = delete;
  ScopedEnv& operator=(const ScopedEnv&) = delete;

 private:
  const char* name_;
  std::string old_;
};

}  // namespace qwenrt::testing_support
