// Signal-driven shutdown for daemons. main() installs the handlers early, then
// blocks in WaitForShutdownSignal() once its servers are up, and drains:
//
//   InstallShutdownSignalHandlers();
//   ... start servers ...
//   const int sig = WaitForShutdownSignal();
//   RL_LOG(INFO) << "signal " << sig << ", draining";
//   server->Shutdown(deadline);
//
// SIGINT and SIGTERM request shutdown. With `second_signal_exits`, a second
// one while the drain is under way exits at once with status 128 + signal
// (so a stuck drain can still be interrupted with Ctrl-C).
//
// The handler only stores to lock-free atomics and write()s one byte to a
// self-pipe, both async-signal-safe. Waiters poll the pipe without draining
// it, so every waiter, present or future, wakes. All functions are
// thread-safe.
#ifndef RINGLANE_SERVICES_SIGNALS_H_
#define RINGLANE_SERVICES_SIGNALS_H_

#include <optional>

#include "absl/time/time.h"

namespace ringlane::services {

// Installs the SIGINT/SIGTERM handlers. Later calls only update
// `second_signal_exits`.
void InstallShutdownSignalHandlers(bool second_signal_exits = true);

// Whether shutdown was requested (by a signal or RequestShutdown()).
bool ShutdownRequested();

// Blocks until shutdown is requested; returns the first signal's number, or 0
// when RequestShutdown() came first. Installs the handlers if needed.
int WaitForShutdownSignal();

// As WaitForShutdownSignal(), but gives up after `timeout` and returns nullopt.
std::optional<int> WaitForShutdownSignalFor(absl::Duration timeout);

// Requests shutdown from inside the process (a component that can no longer
// do its job), waking every waiter as a signal would.
void RequestShutdown();

// Forgets a previous request so that tests can raise signals again. Not safe
// while other threads wait.
void ResetShutdownForTesting();

}  // namespace ringlane::services

#endif  // RINGLANE_SERVICES_SIGNALS_H_
