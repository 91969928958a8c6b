// Errors: one exception type inside modules, Expected<T> at module edges.
//
// Messages name the file, tensor or field and, where a value was checked, both the expected and
// the actual value ("model.gguf: tensor 'blk.0.attn_q.weight': expected type Q8_0, got Q4_K").
#pragma once

#include <fmt/format.h>

#include <optional>
#include <stdexcept>
#include <string>
#include <utility>
#include <variant>

namespace qwenrt {

class Error : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

template <class... Args>
[[noreturn]] void fail(fmt::format_string<Args...> format, Args&&... args) {
  throw Error(fmt::format(format, std::forward<Args>(args)...));
}

// A value or the message of the error that prevented it.
template <class T>
class Expected {
 public:
  Expected(T value) : state_(std::move(value)) {}  // NOLINT: implicit by design
  static Expected failure(std::string message) { return Expected(Failure{std::move(message)}); }

  bool ok() const { return std::holds_alternative<T>(state_); }
  explicit operator bool() const { return ok(); }
  const std::string& error() const { return std::get<Failure>(state_).message; }

  // Returns the value or throws Error with the stored message.
  T& value() & {
    if (!ok()) throw Error(error());
    return std::get<T>(state_);
  }
  T&& value() && {
    if (!ok()) throw Error(error());
    return std::get<T>(std::move(state_));
  }
  T* operator->() { return &value(); }
  T& operator*() & { return value(); }

 private:
  struct Failure {
    std::string message;
  };
  explicit Expected(Failure failure) : state_(std::move(failure)) {}
  std::variant<T, Failure> state_;
};

// Runs fn() and turns a thrown Error into a failed Expected.
template <class Fn>
auto catch_error(Fn&& fn) -> Expected<decltype(fn())> {
  using T = decltype(fn());
  try {
    return Expected<T>(fn());
  } catch (const Error& e) {
    return Expected<T>::failure(e.what());
  }
}

}  // namespace qwenrt
