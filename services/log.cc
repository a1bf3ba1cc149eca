#include "services/log.h"

#include <sys/time.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"

namespace ringlane::services {
namespace {

// Debian's Abseil is built with its own absl::string_view (not an alias of
// std::string_view), so views cross into absl::StrCat through this.
absl::string_view AbslView(std::string_view s) { return absl::string_view(s.data(), s.size()); }

std::atomic<int> g_min_severity{static_cast<int>(Severity::kInfo)};

// Guards the component tag, the sink and the write itself.
absl::Mutex g_log_mu(absl::kConstInit);
std::string* g_component ABSL_GUARDED_BY(g_log_mu) = nullptr;
LogSinkForTesting g_sink ABSL_GUARDED_BY(g_log_mu) = nullptr;

char SeverityLetter(Severity s) {
  switch (s) {
    case Severity::kDebug:
      return 'D';
    case Severity::kInfo:
      return 'I';
    case Severity::kWarning:
      return 'W';
    case Severity::kError:
      return 'E';
    case Severity::kFatal:
      return 'F';
  }
  return '?';
}

std::string_view Basename(std::string_view path) {
  const size_t slash = path.rfind('/');
  return slash == std::string_view::npos ? path : path.substr(slash + 1);
}

// Writes all of `data` to stderr, retrying short writes and EINTR.
void WriteStderr(std::string_view data) {
  while (!data.empty()) {
    const ssize_t n = ::write(STDERR_FILENO, data.data(), data.size());
    if (n < 0) {
      if (errno == EINTR) continue;
      return;  // Nowhere left to report a failing stderr.
    }
    data.remove_prefix(static_cast<size_t>(n));
  }
}

}  // namespace

void SetMinLogSeverity(Severity min) {
  g_min_severity.store(static_cast<int>(min), std::memory_order_relaxed);
}

Severity MinLogSeverity() {
  return static_cast<Severity>(g_min_severity.load(std::memory_order_relaxed));
}

absl::StatusOr<Severity> ParseSeverity(std::string_view name) {
  const std::string lower = absl::AsciiStrToLower(AbslView(name));
  if (lower == "debug") return Severity::kDebug;
  if (lower == "info") return Severity::kInfo;
  if (lower == "warning" || lower == "warn") return Severity::kWarning;
  if (lower == "error") return Severity::kError;
  if (lower == "fatal") return Severity::kFatal;
  return absl::InvalidArgumentError(absl::StrCat("unknown log level '", AbslView(name),
                                                 "' (want debug, info, warning, error or fatal)"));
}

void SetLogComponent(std::string_view component) {
  absl::MutexLock lock(&g_log_mu);
  if (g_component == nullptr) {
    g_component = new std::string(component);  // Never freed: logging outlives statics.
  } else {
    g_component->assign(component);
  }
}

void SetLogSinkForTesting(LogSinkForTesting sink) {
  absl::MutexLock lock(&g_log_mu);
  g_sink = sink;
}

void Log(Severity severity, std::string_view message, std::string_view file, int line) {
  if (!ShouldLog(severity)) return;

  struct timeval tv;
  ::gettimeofday(&tv, nullptr);
  struct tm tm;
  ::localtime_r(&tv.tv_sec, &tm);
  char time_buf[64];
  std::snprintf(time_buf, sizeof(time_buf), "%04d-%02d-%02d %02d:%02d:%02d.%06ld",
                tm.tm_year + 1900, tm.tm_mon + 1, tm.tm_mday, tm.tm_hour, tm.tm_min, tm.tm_sec,
                static_cast<long>(tv.tv_usec));

  std::string text;
  text.reserve(message.size() + 64);
  text.push_back(SeverityLetter(severity));
  text.append(time_buf);
  {
    absl::MutexLock lock(&g_log_mu);
    if (g_component != nullptr && !g_component->empty()) {
      absl::StrAppend(&text, " ", *g_component);
    }
    if (!file.empty()) absl::StrAppend(&text, " ", AbslView(Basename(file)), ":", line);
    absl::StrAppend(&text, "] ", AbslView(message));
    if (text.back() != '\n') text.push_back('\n');
    if (g_sink != nullptr) {
      g_sink(text);
    } else {
      WriteStderr(text);
    }
  }
  if (severity == Severity::kFatal) std::abort();
}

namespace internal {

int MinLogSeverityRaw() { return g_min_severity.load(std::memory_order_relaxed); }

LogMessage::~LogMessage() { Log(severity_, stream_.view(), file_, line_); }

}  // namespace internal
}  // namespace ringlane::services
