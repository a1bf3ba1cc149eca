#include "services/signals.h"

#include <csignal>
#include <optional>
#include <thread>

#include "absl/time/clock.h"
#include "gtest/gtest.h"

namespace ringlane::services {
namespace {

class SignalsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    InstallShutdownSignalHandlers(/*second_signal_exits=*/false);
    ResetShutdownForTesting();
  }
  void TearDown() override { ResetShutdownForTesting(); }
};

TEST_F(SignalsTest, TimesOutWithoutSignal) {
  EXPECT_FALSE(ShutdownRequested());
  EXPECT_EQ(WaitForShutdownSignalFor(absl::Milliseconds(20)), std::nullopt);
}

TEST_F(SignalsTest, SigtermWakesWaiter) {
  std::optional<int> got;
  std::thread waiter([&got] { got = WaitForShutdownSignalFor(absl::Seconds(30)); });
  absl::SleepFor(absl::Milliseconds(20));
  ASSERT_EQ(std::raise(SIGTERM), 0);
  waiter.join();
  EXPECT_EQ(got, SIGTERM);
  EXPECT_TRUE(ShutdownRequested());
  // Later waiters return at once with the first signal.
  EXPECT_EQ(WaitForShutdownSignal(), SIGTERM);
}

TEST_F(SignalsTest, FirstSignalIsReported) {
  ASSERT_EQ(std::raise(SIGINT), 0);
  ASSERT_EQ(std::raise(SIGTERM), 0);  // second_signal_exits is off here.
  EXPECT_EQ(WaitForShutdownSignal(), SIGINT);
}

TEST_F(SignalsTest, RequestShutdownWakesEveryWaiter) {
  std::optional<int> a;
  std::optional<int> b;
  std::thread wa([&a] { a = WaitForShutdownSignalFor(absl::Seconds(30)); });
  std::thread wb([&b] { b = WaitForShutdownSignalFor(absl::Seconds(30)); });
  absl::SleepFor(absl::Milliseconds(20));
  RequestShutdown();
  wa.join();
  wb.join();
  EXPECT_EQ(a, 0);
  EXPECT_EQ(b, 0);
}

TEST(SignalsDeathTest, SecondSignalExits) {
  EXPECT_EXIT(
      {
        InstallShutdownSignalHandlers(/*second_signal_exits=*/true);
        ResetShutdownForTesting();
        std::raise(SIGINT);
        std::raise(SIGINT);
        std::_Exit(0);  // Not reached.
      },
      ::testing::ExitedWithCode(128 + SIGINT), "");
}

}  // namespace
}  // namespace ringlane::services
