// Runs test bodies in forked child processes (one per rank of a group) and
// collects their exit statuses. Header-only so unit tests beside their
// sources can use it without linking tests/support.
#ifndef RINGLANE_TESTS_SUPPORT_PROCESSES_H_
#define RINGLANE_TESTS_SUPPORT_PROCESSES_H_

#include <sys/wait.h>
#include <unistd.h>

#include <functional>
#include <vector>

namespace ringlane::testing {

// Runs body(i) for i in [0, n), each in its own child that exits with the
// returned status; true when every child exits with 0. Fork before the
// calling process starts threads or gRPC.
inline bool RunInChildren(int n, const std::function<int(int)>& body) {
  std::vector<pid_t> kids;
  for (int i = 0; i < n; ++i) {
    pid_t pid = fork();
    if (pid == 0) _exit(body(i));
    kids.push_back(pid);
  }
  bool ok = true;
  for (pid_t pid : kids) {
    int status = 0;
    waitpid(pid, &status, 0);
    ok = ok && WIFEXITED(status) && WEXITSTATUS(status) == 0;
  }
  return ok;
}

}  // namespace ringlane::testing

#endif  // RINGLANE_TESTS_SUPPORT_PROCESSES_H_
