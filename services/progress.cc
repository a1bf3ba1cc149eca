#include "services/progress.h"

#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace ringlane::services {
namespace {

constexpr int kBarWidth = 30;

void WriteStderr(std::string_view data) {
  while (!data.empty()) {
    const ssize_t n = ::write(STDERR_FILENO, data.data(), data.size());
    if (n < 0) {
      if (errno == EINTR) continue;
      return;
    }
    data.remove_prefix(static_cast<size_t>(n));
  }
}

struct Scale {
  double divisor;
  const char* suffix;
};

// The unit used for both `done` and `total`, chosen from the larger one so
// that "0.3/2.9 GB" reads as one unit.
Scale ByteScale(int64_t bytes) {
  if (bytes >= 1000LL * 1000 * 1000 * 1000) return {1e12, "TB"};
  if (bytes >= 1000LL * 1000 * 1000) return {1e9, "GB"};
  if (bytes >= 1000LL * 1000) return {1e6, "MB"};
  if (bytes >= 1000) return {1e3, "kB"};
  return {1, "B"};
}

}  // namespace

std::string FormatBytes(int64_t bytes) {
  const Scale s = ByteScale(bytes);
  if (s.divisor == 1) return absl::StrCat(bytes, " B");
  return absl::StrFormat("%.1f %s", static_cast<double>(bytes) / s.divisor, s.suffix);
}

ProgressBar::ProgressBar(std::string label, int64_t total, ProgressOptions options)
    : label_(std::move(label)),
      total_(total),
      options_(std::move(options)),
      tty_(options_.tty.has_value() ? *options_.tty : ::isatty(STDERR_FILENO) == 1),
      start_(absl::Now()) {}

ProgressBar::~ProgressBar() {
  absl::MutexLock lock(&mu_);
  if (!finished_ && drawn_) Emit("\n");
}

void ProgressBar::Update(int64_t done) {
  absl::MutexLock lock(&mu_);
  if (finished_) return;
  done_ = std::max<int64_t>(done, 0);
  if (total_ > 0) done_ = std::min(done_, total_);
  MaybeDraw(/*force=*/false);
}

void ProgressBar::Add(int64_t delta) {
  absl::MutexLock lock(&mu_);
  if (finished_) return;
  done_ = std::max<int64_t>(done_ + delta, 0);
  if (total_ > 0) done_ = std::min(done_, total_);
  MaybeDraw(/*force=*/false);
}

void ProgressBar::Finish() {
  absl::MutexLock lock(&mu_);
  if (finished_) return;
  if (total_ > 0) done_ = total_;
  MaybeDraw(/*force=*/true);
  finished_ = true;
  if (tty_) Emit("\n");
  drawn_ = false;
}

std::string ProgressBar::RenderForTesting() {
  absl::MutexLock lock(&mu_);
  return Render(absl::Now());
}

void ProgressBar::MaybeDraw(bool force) {
  const absl::Time now = absl::Now();
  if (!force) {
    const absl::Duration interval = tty_ ? options_.tty_interval : options_.plain_interval;
    // The first plain line waits a full interval too, so short work prints
    // only its final line.
    const absl::Time since = last_draw_ == absl::InfinitePast() && !tty_ ? start_ : last_draw_;
    if (now - since < interval) return;
  }
  last_draw_ = now;
  std::string line = Render(now);
  if (tty_) {
    const size_t width = line.size();
    // Pad with spaces to erase the tail of a longer previous line.
    if (width < last_width_) line.append(last_width_ - width, ' ');
    last_width_ = width;
    Emit(absl::StrCat("\r", line));
    drawn_ = true;
  } else {
    Emit(absl::StrCat(line, "\n"));
  }
}

std::string ProgressBar::Render(absl::Time now) const {
  std::string out = label_;
  if (total_ > 0) {
    const double fraction = static_cast<double>(done_) / static_cast<double>(total_);
    const int percent = static_cast<int>(fraction * 100.0);
    if (tty_) {
      const int filled = static_cast<int>(fraction * kBarWidth);
      absl::StrAppend(&out, " [", std::string(filled, '#'), std::string(kBarWidth - filled, '-'),
                      "]");
      absl::StrAppend(&out, absl::StrFormat(" %3d%%", percent));
    } else {
      absl::StrAppend(&out, ": ", percent, "%");
    }
  } else if (!tty_) {
    out.push_back(':');
  }

  if (options_.unit == ProgressUnit::kBytes) {
    if (total_ > 0) {
      const Scale s = ByteScale(std::max(total_, done_));
      if (s.divisor == 1) {
        absl::StrAppend(&out, " ", done_, "/", total_, " B");
      } else {
        absl::StrAppend(&out, absl::StrFormat(" %.1f/%.1f %s", done_ / s.divisor,
                                              total_ / s.divisor, s.suffix));
      }
    } else {
      absl::StrAppend(&out, " ", FormatBytes(done_));
    }
  } else {
    absl::StrAppend(&out, " ", done_);
    if (total_ > 0) absl::StrAppend(&out, "/", total_);
  }
  absl::StrAppend(&out, absl::StrFormat(" %.1f s", absl::ToDoubleSeconds(now - start_)));
  return out;
}

void ProgressBar::Emit(std::string_view text) {
  if (options_.sink) {
    options_.sink(text);
  } else {
    WriteStderr(text);
  }
}

}  // namespace ringlane::services
