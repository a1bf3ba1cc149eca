// Minimal leveled logging to stderr (Debian's Abseil 20220623 has no absl/log).
//
//   RL_LOG(INFO) << "loaded " << n << " layers";
//   RL_LOG(FATAL) << "unreachable";  // writes the line, then aborts
//
// Each line looks like
//   I2024-05-01 12:00:00.123456 worker/r0 model.cc:42] loaded 8 layers
// with the severity letter, local time with microseconds, the process's
// component tag (SetLogComponent) and the call site.
//
// Thread-safe: every line is formatted in the calling thread and written with a
// single write under a mutex, so lines from different threads never interleave.
// Messages below the minimum severity are not formatted at all.
#ifndef RINGLANE_SERVICES_LOG_H_
#define RINGLANE_SERVICES_LOG_H_

#include <sstream>
#include <string>
#include <string_view>

#include "absl/status/statusor.h"

namespace ringlane::services {

enum class Severity : int { kDebug = 0, kInfo = 1, kWarning = 2, kError = 3, kFatal = 4 };

// Lines below `min` are dropped. The default is kInfo. kFatal is always logged.
void SetMinLogSeverity(Severity min);
Severity MinLogSeverity();
inline bool ShouldLog(Severity s);

// Parses "debug", "info", "warning" (or "warn"), "error", "fatal", any case,
// for a --log_level flag. Other names are InvalidArgument.
absl::StatusOr<Severity> ParseSeverity(std::string_view name);

// The tag printed on every line, e.g. "router" or "worker/r1". Set once by
// main(); empty by default.
void SetLogComponent(std::string_view component);

// Logs one message. `file` may be empty (no call site is printed). A kFatal
// message aborts the process after it is written.
void Log(Severity severity, std::string_view message, std::string_view file = {}, int line = 0);

// Sends log lines to `sink` instead of stderr; nullptr restores stderr. The
// sink is called under the logging mutex with one complete line (ending in
// '\n'). For tests.
using LogSinkForTesting = void (*)(std::string_view line);
void SetLogSinkForTesting(LogSinkForTesting sink);

namespace internal {

inline constexpr Severity kRlLogDEBUG = Severity::kDebug;
inline constexpr Severity kRlLogINFO = Severity::kInfo;
inline constexpr Severity kRlLogWARNING = Severity::kWarning;
inline constexpr Severity kRlLogERROR = Severity::kError;
inline constexpr Severity kRlLogFATAL = Severity::kFatal;

int MinLogSeverityRaw();

// Collects one message and logs it when destroyed (at the end of the
// full expression).
class LogMessage {
 public:
  LogMessage(Severity severity, const char* file, int line)
      : severity_(severity), file_(file), line_(line) {}
  LogMessage(const LogMessage&) = delete;
  LogMessage& operator=(const LogMessage&) = delete;
  ~LogMessage();

  std::ostream& stream() { return stream_; }

 private:
  const Severity severity_;
  const char* const file_;
  const int line_;
  std::ostringstream stream_;
};

// Lets RL_LOG be an expression of type void in both branches of ?:.
struct LogVoidify {
  void operator&(std::ostream&) {}
};

}  // namespace internal

inline bool ShouldLog(Severity s) {
  return static_cast<int>(s) >= internal::MinLogSeverityRaw() || s == Severity::kFatal;
}

}  // namespace ringlane::services

// RL_LOG(DEBUG|INFO|WARNING|ERROR|FATAL) << ...;
#define RL_LOG(severity)                                                              \
  !::ringlane::services::ShouldLog(::ringlane::services::internal::kRlLog##severity)  \
      ? (void)0                                                                       \
      : ::ringlane::services::internal::LogVoidify() &                                \
            ::ringlane::services::internal::LogMessage(                               \
                ::ringlane::services::internal::kRlLog##severity, __FILE__, __LINE__) \
                .stream()

#endif  // RINGLANE_SERVICES_LOG_H_
