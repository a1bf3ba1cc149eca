#include "tests/support/daemon.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <sstream>
#include <thread>

#include "absl/strings/str_cat.h"

extern char** environ;

namespace ringlane::testing {

namespace {

std::string TempPath(const std::string& stem) {
  static int counter = 0;
  const char* dir = std::getenv("TMPDIR");
  return absl::StrCat(dir ? dir : "/tmp", "/ringlane-", stem, "-", getpid(), "-", ++counter,
                      ".log");
}

// Spawns the child with stdout to `out_fd` (or /dev/null when -1) and stderr
// to `err_path`.
absl::StatusOr<pid_t> Spawn(const std::string& binary, const std::vector<std::string>& args,
                            int out_fd, const std::string& err_path) {
  posix_spawn_file_actions_t fa;
  posix_spawn_file_actions_init(&fa);
  if (out_fd >= 0) {
    posix_spawn_file_actions_adddup2(&fa, out_fd, STDOUT_FILENO);
  } else {
    posix_spawn_file_actions_addopen(&fa, STDOUT_FILENO, "/dev/null", O_WRONLY, 0);
  }
  posix_spawn_file_actions_addopen(&fa, STDERR_FILENO, err_path.c_str(),
                                   O_WRONLY | O_CREAT | O_TRUNC, 0644);
  std::vector<std::string> all = {binary};
  all.insert(all.end(), args.begin(), args.end());
  std::vector<char*> argv;
  for (std::string& a : all) argv.push_back(a.data());
  argv.push_back(nullptr);
  pid_t pid = -1;
  int rc = posix_spawn(&pid, binary.c_str(), &fa, nullptr, argv.data(), environ);
  posix_spawn_file_actions_destroy(&fa);
  if (rc != 0) return absl::InternalError(absl::StrCat("posix_spawn ", binary, ": errno ", rc));
  return pid;
}

int DecodeStatus(int status) {
  if (WIFEXITED(status)) return WEXITSTATUS(status);
  if (WIFSIGNALED(status)) return 128 + WTERMSIG(status);
  return -1;
}

std::string ReadFile(const std::string& path) {
  std::ifstream f(path);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

}  // namespace

absl::StatusOr<std::unique_ptr<Daemon>> Daemon::Start(const std::string& binary,
                                                      const std::vector<std::string>& args,
                                                      const std::vector<std::string>& names,
                                                      std::chrono::milliseconds timeout) {
  std::unique_ptr<Daemon> d(new Daemon());
  d->stderr_path_ = TempPath("daemon-err");
  d->stdout_path_ = TempPath("daemon-out");
  // stdout goes to a file that is polled for the LISTENING lines: a pipe
  // left unread would block (or SIGPIPE) the daemon later.
  int out = open(d->stdout_path_.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (out < 0) return absl::InternalError("cannot create " + d->stdout_path_);
  absl::StatusOr<pid_t> pid = Spawn(binary, args, out, d->stderr_path_);
  close(out);
  if (!pid.ok()) return pid.status();
  d->pid_ = *pid;
  const auto end = std::chrono::steady_clock::now() + timeout;
  for (;;) {
    std::istringstream lines(ReadFile(d->stdout_path_));
    std::string line;
    while (std::getline(lines, line)) {
      const std::string prefix = "LISTENING ";
      size_t eq = line.find('=');
      if (line.rfind(prefix, 0) != 0 || eq == std::string::npos) continue;
      d->addresses_[line.substr(prefix.size(), eq - prefix.size())] = line.substr(eq + 1);
    }
    bool all = true;
    for (const std::string& n : names) all = all && d->addresses_.count(n);
    if (all) return d;
    if (std::optional<int> code = d->Wait(std::chrono::milliseconds(0))) {
      return absl::FailedPreconditionError(
          absl::StrCat(binary, " exited (", *code, ") before serving; stderr:\n", d->Stderr()));
    }
    if (std::chrono::steady_clock::now() >= end) {
      return absl::DeadlineExceededError(
          absl::StrCat(binary, " announced no LISTENING line in time; stderr:\n", d->Stderr()));
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
}

Daemon::~Daemon() {
  if (pid_ > 0 && !reaped_) {
    kill(pid_, SIGKILL);
    waitpid(pid_, nullptr, 0);
  }
  if (!stderr_path_.empty()) std::remove(stderr_path_.c_str());
  if (!stdout_path_.empty()) std::remove(stdout_path_.c_str());
}

const std::string& Daemon::address(const std::string& name) const {
  static const std::string kNone;
  auto it = addresses_.find(name);
  return it == addresses_.end() ? kNone : it->second;
}

void Daemon::Signal(int sig) {
  if (pid_ > 0 && !reaped_) kill(pid_, sig);
}

std::optional<int> Daemon::Wait(std::chrono::milliseconds timeout) {
  if (reaped_) return DecodeStatus(status_);
  const auto end = std::chrono::steady_clock::now() + timeout;
  for (;;) {
    pid_t r = waitpid(pid_, &status_, WNOHANG);
    if (r == pid_) {
      reaped_ = true;
      return DecodeStatus(status_);
    }
    if (std::chrono::steady_clock::now() >= end) return std::nullopt;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
}

std::string Daemon::Stderr() const { return ReadFile(stderr_path_); }

bool Daemon::WaitForStderr(const std::string& text, std::chrono::milliseconds timeout) const {
  const auto end = std::chrono::steady_clock::now() + timeout;
  for (;;) {
    if (Stderr().find(text) != std::string::npos) return true;
    if (std::chrono::steady_clock::now() >= end) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
}

RunResult RunToExit(const std::string& binary, const std::vector<std::string>& args,
                    std::chrono::milliseconds timeout) {
  RunResult out;
  const std::string err = TempPath("run");
  absl::StatusOr<pid_t> pid = Spawn(binary, args, -1, err);
  if (!pid.ok()) return out;
  const auto end = std::chrono::steady_clock::now() + timeout;
  int status = 0;
  for (;;) {
    if (waitpid(*pid, &status, WNOHANG) == *pid) {
      out.code = DecodeStatus(status);
      break;
    }
    if (std::chrono::steady_clock::now() >= end) {
      kill(*pid, SIGKILL);
      waitpid(*pid, &status, 0);
      out.code = -1;
      break;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  out.err = ReadFile(err);
  std::remove(err.c_str());
  return out;
}

}  // namespace ringlane::testing
