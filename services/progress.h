// A progress indicator for long work (model load, writing a synthetic model,
// benchmarks).
//
// On a terminal it redraws one line in place, at most about ten times a
// second:
//   loading stories260K [############------------------]  41% 1.2/2.9 GB 3.1 s
// When the output is not a terminal (CI logs, redirected stderr) it prints a
// plain line every few seconds instead, and always a final line at 100%:
//   loading stories260K: 41% 1.2/2.9 GB 3.1 s
//
// Thread-safe: Update/Add may be called from several worker threads; drawing
// happens in whichever caller finds the redraw interval elapsed.
#ifndef RINGLANE_SERVICES_PROGRESS_H_
#define RINGLANE_SERVICES_PROGRESS_H_

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <string_view>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"

namespace ringlane::services {

// How `done` and `total` are shown.
enum class ProgressUnit {
  kBytes,  // "1.2/2.9 GB" (decimal units: B, kB, MB, GB, TB)
  kCount,  // "450/1000"
};

struct ProgressOptions {
  ProgressUnit unit = ProgressUnit::kBytes;
  // Where text goes; the default writes to stderr.
  std::function<void(std::string_view)> sink;
  // Whether to redraw in place. Default: whether stderr is a terminal.
  std::optional<bool> tty;
  // Shortest time between two redraws on a terminal.
  absl::Duration tty_interval = absl::Milliseconds(100);
  // Shortest time between two plain lines when not on a terminal.
  absl::Duration plain_interval = absl::Seconds(5);
};

class ProgressBar {
 public:
  // `total` is the amount of work in `unit`s; 0 or less means unknown (no bar
  // and no percentage are shown).
  ProgressBar(std::string label, int64_t total, ProgressOptions options = {});
  ProgressBar(const ProgressBar&) = delete;
  ProgressBar& operator=(const ProgressBar&) = delete;
  // Ends the line if Finish() was not called (for work that failed midway),
  // without claiming completion.
  ~ProgressBar();

  // Sets the amount done so far (clamped to [0, total] when total is known).
  void Update(int64_t done);
  // Adds `delta` to the amount done.
  void Add(int64_t delta);
  // Marks the work complete and draws the final state (100% when the total is
  // known). Later calls do nothing.
  void Finish();

  // The line that would be drawn now, without the leading '\r' or trailing
  // padding. For tests.
  std::string RenderForTesting();

 private:
  // Draws if `force` or the interval has elapsed.
  void MaybeDraw(bool force) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  std::string Render(absl::Time now) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void Emit(std::string_view text);

  // Fixed at construction.
  const std::string label_;
  const int64_t total_;
  const ProgressOptions options_;
  const bool tty_;
  const absl::Time start_;

  absl::Mutex mu_;
  int64_t done_ ABSL_GUARDED_BY(mu_) = 0;
  bool finished_ ABSL_GUARDED_BY(mu_) = false;
  bool drawn_ ABSL_GUARDED_BY(mu_) = false;  // A TTY line is on screen, unterminated.
  absl::Time last_draw_ ABSL_GUARDED_BY(mu_) = absl::InfinitePast();
  size_t last_width_ ABSL_GUARDED_BY(mu_) = 0;  // Of the last TTY line, to erase leftovers.
};

// "1.2 GB", "512 B", "3.4 MB": decimal units, one decimal place above bytes.
std::string FormatBytes(int64_t bytes);

}  // namespace ringlane::services

#endif  // RINGLANE_SERVICES_PROGRESS_H_
