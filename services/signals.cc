#include "services/signals.h"

#include <fcntl.h>
#include <poll.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <csignal>
#include <cstdio>
#include <cstdlib>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"

namespace ringlane::services {
namespace {

// The handler reads and writes only these; they must not take locks.
static_assert(std::atomic<int>::is_always_lock_free);
static_assert(std::atomic<bool>::is_always_lock_free);
std::atomic<bool> g_requested{false};
std::atomic<int> g_first_signal{0};      // 0 until a signal arrives.
std::atomic<int> g_signals_received{0};  // Counts signals only, not RequestShutdown.
std::atomic<bool> g_second_signal_exits{true};
// Self-pipe: the handler writes to [1]; waiters poll [0]. Set once, before the
// handlers are installed, and never closed.
std::atomic<int> g_pipe_read{-1};
std::atomic<int> g_pipe_write{-1};

absl::Mutex g_install_mu(absl::kConstInit);
bool g_pipe_made ABSL_GUARDED_BY(g_install_mu) = false;
bool g_handlers_installed ABSL_GUARDED_BY(g_install_mu) = false;

void Wake() {
  const int fd = g_pipe_write.load(std::memory_order_acquire);
  if (fd < 0) return;
  const char byte = 1;
  // Non-blocking: a full pipe already wakes every waiter, so a failed write
  // loses nothing.
  [[maybe_unused]] ssize_t n = ::write(fd, &byte, 1);
}

void OnShutdownSignal(int sig) {
  const int saved_errno = errno;
  if (g_signals_received.fetch_add(1) > 0 && g_second_signal_exits.load()) {
    ::_exit(128 + sig);
  }
  int expected = 0;
  g_first_signal.compare_exchange_strong(expected, sig);
  g_requested.store(true);
  Wake();
  errno = saved_errno;
}

void EnsurePipe() ABSL_EXCLUSIVE_LOCKS_REQUIRED(g_install_mu) {
  if (g_pipe_made) return;
  int fds[2];
  if (::pipe2(fds, O_CLOEXEC | O_NONBLOCK) != 0) {
    std::perror("ringlane: pipe2 for shutdown signals");
    std::abort();
  }
  g_pipe_read.store(fds[0], std::memory_order_release);
  g_pipe_write.store(fds[1], std::memory_order_release);
  g_pipe_made = true;
}

void InstallLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(g_install_mu) {
  EnsurePipe();
  if (g_handlers_installed) return;
  struct sigaction sa = {};
  sa.sa_handler = OnShutdownSignal;
  sigemptyset(&sa.sa_mask);
  sa.sa_flags = SA_RESTART;
  for (int sig : {SIGINT, SIGTERM}) {
    if (::sigaction(sig, &sa, nullptr) != 0) {
      std::perror("ringlane: sigaction");
      std::abort();
    }
  }
  g_handlers_installed = true;
}

int RequestedResult() { return g_first_signal.load(); }

}  // namespace

void InstallShutdownSignalHandlers(bool second_signal_exits) {
  g_second_signal_exits.store(second_signal_exits);
  absl::MutexLock lock(&g_install_mu);
  InstallLocked();
}

bool ShutdownRequested() { return g_requested.load(); }

std::optional<int> WaitForShutdownSignalFor(absl::Duration timeout) {
  {
    absl::MutexLock lock(&g_install_mu);
    InstallLocked();
  }
  const absl::Time deadline =
      timeout == absl::InfiniteDuration() ? absl::InfiniteFuture() : absl::Now() + timeout;
  const int fd = g_pipe_read.load(std::memory_order_acquire);
  while (!g_requested.load()) {
    int timeout_ms = -1;
    if (deadline != absl::InfiniteFuture()) {
      const absl::Duration left = deadline - absl::Now();
      if (left <= absl::ZeroDuration()) return std::nullopt;
      // Capped so the conversion to int cannot overflow; the loop re-polls.
      const absl::Duration wait = std::min(left, absl::Hours(1));
      timeout_ms =
          static_cast<int>(absl::ToInt64Milliseconds(absl::Ceil(wait, absl::Milliseconds(1))));
    }
    struct pollfd pfd = {fd, POLLIN, 0};
    // The pipe is never drained, so once readable it stays readable for every
    // waiter; EINTR just loops.
    ::poll(&pfd, 1, timeout_ms);
  }
  return RequestedResult();
}

int WaitForShutdownSignal() { return *WaitForShutdownSignalFor(absl::InfiniteDuration()); }

void RequestShutdown() {
  {
    absl::MutexLock lock(&g_install_mu);
    EnsurePipe();
  }
  g_requested.store(true);
  Wake();
}

void ResetShutdownForTesting() {
  const int fd = g_pipe_read.load(std::memory_order_acquire);
  if (fd >= 0) {
    char buf[64];
    while (::read(fd, buf, sizeof(buf)) > 0) {
    }
  }
  g_signals_received.store(0);
  g_first_signal.store(0);
  g_requested.store(false);
}

}  // namespace ringlane::services
