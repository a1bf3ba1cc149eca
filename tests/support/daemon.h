// Starts ringlane daemons as real child processes for end-to-end tests:
// posix_spawn (safe after gRPC started threads in the test), stdout polled
// for the `LISTENING name=host:port` lines, stderr kept in a file for
// assertions about log lines.
#ifndef RINGLANE_TESTS_SUPPORT_DAEMON_H_
#define RINGLANE_TESTS_SUPPORT_DAEMON_H_

#include <sys/types.h>

#include <chrono>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace ringlane::testing {

class Daemon {
 public:
  // Runs `binary args...` and waits up to `timeout` for a LISTENING line for
  // each of `names`. Fails (killing the child) when it exits first.
  static absl::StatusOr<std::unique_ptr<Daemon>> Start(
      const std::string& binary, const std::vector<std::string>& args,
      const std::vector<std::string>& names = {"worker"},
      std::chrono::milliseconds timeout = std::chrono::seconds(60));
  ~Daemon();  // SIGKILLs the child if it still runs

  const std::string& address(const std::string& name = "worker") const;
  pid_t pid() const { return pid_; }

  void Signal(int sig);
  // The exit status (WEXITSTATUS, or 128 + signal) once the child ends, or
  // nullopt when it still runs after `timeout`.
  std::optional<int> Wait(std::chrono::milliseconds timeout);
  // Everything the child wrote to stderr so far.
  std::string Stderr() const;
  // Waits up to `timeout` for `text` to appear in stderr.
  bool WaitForStderr(const std::string& text, std::chrono::milliseconds timeout) const;

 private:
  Daemon() = default;
  pid_t pid_ = -1;
  bool reaped_ = false;
  int status_ = 0;
  std::string stderr_path_;
  std::string stdout_path_;
  std::map<std::string, std::string> addresses_;
};

// Runs `binary args...` to completion (for flag validation tests): exit code
// (or 128 + signal) and stderr.
struct RunResult {
  int code = -1;
  std::string err;
};
RunResult RunToExit(const std::string& binary, const std::vector<std::string>& args,
                    std::chrono::milliseconds timeout = std::chrono::seconds(60));

}  // namespace ringlane::testing

#endif  // RINGLANE_TESTS_SUPPORT_DAEMON_H_
