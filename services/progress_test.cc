#include "services/progress.h"

#include <algorithm>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include "gtest/gtest.h"

namespace ringlane::services {
namespace {

ProgressOptions Capture(std::string* out, bool tty, ProgressUnit unit = ProgressUnit::kBytes) {
  ProgressOptions options;
  options.unit = unit;
  options.tty = tty;
  options.sink = [out](std::string_view text) { out->append(text); };
  return options;
}

TEST(ProgressBarTest, PlainOutputHasLabelAndHundredPercent) {
  std::string out;
  {
    ProgressBar bar("writing synthetic model", 2'600'000'000, Capture(&out, /*tty=*/false));
    bar.Update(1'200'000'000);
    bar.Update(2'000'000'000);
    bar.Finish();
  }
  EXPECT_NE(out.find("writing synthetic model"), std::string::npos) << out;
  EXPECT_NE(out.find("100%"), std::string::npos) << out;
  EXPECT_NE(out.find("2.6/2.6 GB"), std::string::npos) << out;
  // Plain mode: whole lines, no carriage returns or bar.
  EXPECT_EQ(out.find('\r'), std::string::npos) << out;
  EXPECT_EQ(out.find('#'), std::string::npos) << out;
  EXPECT_EQ(out.back(), '\n');
}

TEST(ProgressBarTest, PlainOutputIsRateLimited) {
  std::string out;
  ProgressBar bar("bench", 1000, Capture(&out, /*tty=*/false, ProgressUnit::kCount));
  for (int i = 0; i <= 1000; ++i) bar.Update(i);
  // Fast work prints nothing until it finishes, then exactly one line.
  EXPECT_TRUE(out.empty()) << out;
  bar.Finish();
  bar.Finish();
  EXPECT_EQ(std::count(out.begin(), out.end(), '\n'), 1) << out;
  EXPECT_NE(out.find("bench: 100% 1000/1000"), std::string::npos) << out;
}

TEST(ProgressBarTest, PlainOutputPrintsPeriodically) {
  std::string out;
  ProgressOptions options = Capture(&out, /*tty=*/false, ProgressUnit::kCount);
  options.plain_interval = absl::ZeroDuration();
  ProgressBar bar("load", 4, options);
  for (int i = 1; i <= 4; ++i) bar.Update(i);
  bar.Finish();
  EXPECT_EQ(std::count(out.begin(), out.end(), '\n'), 5) << out;
  EXPECT_NE(out.find("load: 50% 2/4"), std::string::npos) << out;
}

TEST(ProgressBarTest, TtyRedrawsInPlace) {
  std::string out;
  ProgressOptions options = Capture(&out, /*tty=*/true);
  options.tty_interval = absl::ZeroDuration();
  {
    ProgressBar bar("load", 2'600'000'000, options);
    bar.Update(1'300'000'000);
    bar.Finish();
  }
  EXPECT_NE(out.find("\rload [###############---------------]  50% 1.3/2.6 GB"), std::string::npos)
      << out;
  EXPECT_NE(out.find("\rload [##############################] 100% 2.6/2.6 GB"), std::string::npos)
      << out;
  EXPECT_EQ(std::count(out.begin(), out.end(), '\n'), 1) << out;
  EXPECT_EQ(out.back(), '\n');
}

TEST(ProgressBarTest, UnfinishedTtyBarEndsItsLineWithoutClaimingCompletion) {
  std::string out;
  ProgressOptions options = Capture(&out, /*tty=*/true, ProgressUnit::kCount);
  options.tty_interval = absl::ZeroDuration();
  {
    ProgressBar bar("load", 10, options);
    bar.Update(3);
  }
  EXPECT_EQ(out.find("100%"), std::string::npos) << out;
  EXPECT_EQ(out.back(), '\n');
}

TEST(ProgressBarTest, UnknownTotalAndClamping) {
  std::string out;
  ProgressBar unknown("scan", 0, Capture(&out, /*tty=*/false));
  unknown.Update(1500);
  EXPECT_EQ(unknown.RenderForTesting().rfind("scan: 1.5 kB ", 0), 0u) << unknown.RenderForTesting();

  ProgressBar clamped("x", 10, Capture(&out, /*tty=*/false, ProgressUnit::kCount));
  clamped.Update(25);
  EXPECT_EQ(clamped.RenderForTesting().rfind("x: 100% 10/10 ", 0), 0u)
      << clamped.RenderForTesting();
  clamped.Update(-5);
  EXPECT_EQ(clamped.RenderForTesting().rfind("x: 0% 0/10 ", 0), 0u) << clamped.RenderForTesting();
}

TEST(ProgressBarTest, ConcurrentAdds) {
  std::string out;
  ProgressOptions options = Capture(&out, /*tty=*/false, ProgressUnit::kCount);
  ProgressBar bar("threads", 4000, options);
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&bar] {
      for (int i = 0; i < 1000; ++i) bar.Add(1);
    });
  }
  for (std::thread& t : threads) t.join();
  EXPECT_EQ(bar.RenderForTesting().rfind("threads: 100% 4000/4000 ", 0), 0u);
}

TEST(FormatBytesTest, Units) {
  EXPECT_EQ(FormatBytes(0), "0 B");
  EXPECT_EQ(FormatBytes(999), "999 B");
  EXPECT_EQ(FormatBytes(1500), "1.5 kB");
  EXPECT_EQ(FormatBytes(2'600'000'000), "2.6 GB");
}

}  // namespace
}  // namespace ringlane::services
