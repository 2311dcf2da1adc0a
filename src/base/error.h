// Two kinds of error (STYLE.md 9):
//  - a programmer bug is STRATA_CHECK: always on, prints file and line, aborts;
//  - a bad file, a failed read, a budget that cannot fit is an Error returned to the caller, with a
//    message a user can act on.
#pragma once

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <utility>
#include <variant>

namespace strata {

[[noreturn]] inline void check_failed(const char* expr, const char* file, int line, const char* msg) {
  std::fprintf(stderr, "strata: internal error: %s:%d: check failed: %s%s%s\n", file, line, expr,
               msg[0] ? ": " : "", msg);
  std::fflush(stderr);
  std::abort();
}

#define STRATA_CHECK(cond, ...)                                                         \
  do {                                                                                  \
    if (!(cond)) ::strata::check_failed(#cond, __FILE__, __LINE__, "" __VA_ARGS__);     \
  } while (0)

// A user-facing failure. `message` is one line, complete, naming the thing and the numbers.
struct Error {
  std::string message;
};

// Either a value or an Error. Small stand-in for std::expected (C++23).
template <class T>
class [[nodiscard]] Result {
 public:
  Result(T value) : v_(std::move(value)) {}
  Result(Error error) : v_(std::move(error)) {}

  bool ok() const { return v_.index() == 0; }
  explicit operator bool() const { return ok(); }

  T& value() & {
    STRATA_CHECK(ok(), "value() of a failed Result");
    return std::get<0>(v_);
  }
  T&& value() && {
    STRATA_CHECK(ok(), "value() of a failed Result");
    return std::get<0>(std::move(v_));
  }
  const T& value() const& {
    STRATA_CHECK(ok(), "value() of a failed Result");
    return std::get<0>(v_);
  }
  T* operator->() { return &value(); }
  const T* operator->() const { return &value(); }
  T& operator*() & { return value(); }
  const T& operator*() const& { return value(); }

  const Error& error() const {
    STRATA_CHECK(!ok(), "error() of a successful Result");
    return std::get<1>(v_);
  }

 private:
  std::variant<T, Error> v_;
};

// Result<void>: success or an Error.
class [[nodiscard]] Status {
 public:
  Status() = default;
  Status(Error error) : error_(std::move(error)), failed_(true) {}
  static Status success() { return {}; }

  bool ok() const { return !failed_; }
  explicit operator bool() const { return ok(); }
  const Error& error() const {
    STRATA_CHECK(failed_, "error() of a successful Status");
    return error_;
  }

 private:
  Error error_;
  bool failed_ = false;
};

// The first error of a part that turns itself off at its first failure (a GPU device or backend):
// keep(s) is true while s is a success; the first failure's message is kept and logged once, as
// "strata: <who>: <message>; <then>", and later failures are dropped. Not thread-safe: its owner
// serializes the calls.
class StickyError {
 public:
  StickyError(const char* who, const char* then) : who_(who), then_(then) {}
  bool keep(const Status& s);
  bool empty() const { return !failed_; }
  const std::string& message() const { return message_; }

 private:
  const char* who_;
  const char* then_;
  std::string message_;
  bool failed_ = false;
};

// printf-style formatting into a std::string (messages only; not for hot paths).
std::string strfmt(const char* fmt, ...) __attribute__((format(printf, 1, 2)));

// "12.1 GB", "768 KiB"-style sizes for messages: decimal units (what disks and `ls -lh --si` say).
std::string format_bytes(double bytes);
// A size in binary units, "22.0 GiB" (budgets and the like, which users give in GiB).
std::string format_size(uint64_t bytes);

}  // namespace strata

#define STRATA_TRY(expr)                                   \
  do {                                                     \
    auto strata_try_status_ = (expr);                      \
    if (!strata_try_status_.ok()) return strata_try_status_.error(); \
  } while (0)
