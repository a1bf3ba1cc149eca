// Helpers the communicator tests share (test-only, header-only).
#ifndef RINGLANE_WORKER_COLLECTIVES_COLLECTIVES_TESTING_H_
#define RINGLANE_WORKER_COLLECTIVES_COLLECTIVES_TESTING_H_

#include <unistd.h>

#include <cstddef>
#include <filesystem>
#include <string>

#include "gtest/gtest.h"

namespace ringlane::testing {

// An empty directory for a group's file-store rendezvous, unique to this
// process and `name`.
inline std::string FreshDir(const std::string& name) {
  std::string dir = ::testing::TempDir() + "/rl_gloo_" + name + "_" + std::to_string(getpid());
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  return dir;
}

// Rank `rank`'s element i: values whose float sum depends on the order of
// addition, so a sum taken in any order but rank order shows.
inline float Value(int rank, size_t i) {
  const float big[4] = {1e8f, 1.0f, -1e8f, 3.0f};
  return big[(rank + i) % 4] * (1.0f + 0.001f * static_cast<float>(i % 13)) + 0.37f * rank;
}

}  // namespace ringlane::testing

#endif  // RINGLANE_WORKER_COLLECTIVES_COLLECTIVES_TESTING_H_
