// A request once it is queued on a worker group: its prepared form, the
// queue its messages go to, and the output state of each choice (detokenizer,
// stop matcher, loop watchdog). Touched only under the group's mutex once
// submitted; the ResponseQueue is the one thread-safe part.
#ifndef RINGLANE_ROUTER_REQUEST_REQUEST_STATE_H_
#define RINGLANE_ROUTER_REQUEST_REQUEST_STATE_H_

#include <atomic>
#include <chrono>
#include <cstdint>
#include <deque>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "ringlane/v1/generate.pb.h"
#include "router/grammar/grammar.h"
#include "router/request/loop_watchdog.h"
#include "router/request/stop_matcher.h"
#include "router/router_metrics.h"
#include "router/tokenizer/incremental_decoder.h"

namespace ringlane::router {

// A GenerateRequest after validation, tokenization and sampling policy.
struct PreparedRequest {
  std::string request_id;
  std::vector<int32_t> prompt;
  // Resolved: temperature and seed always set; logprobs/top_logprobs as asked.
  ringlane::v1::SamplingParams sampling;
  int n = 1;
  // Most tokens per choice, already capped by the context.
  int max_tokens = 1;
  bool ignore_eos = false;
  bool logprobs = false;
  bool echo = false;
  std::vector<std::string> stop;
  std::vector<int32_t> stop_token_ids;
  std::string session_id;
  // The request gave no temperature (counted in metrics).
  bool default_temperature = false;
  bool loop_watchdog = true;
  // Speculative decoding for this request, and its drafts per step at most
  // (-1 = the router's limit).
  bool speculative = true;
  int max_drafts = -1;
  // Grammar-constrained decoding (response_format, tool_choice); null = free
  // text.
  std::shared_ptr<const grammar::Grammar> grammar;
};

// Wakes one consumer that waits on several ResponseQueues at once (the
// gateway's n-prompt requests). Thread-safe.
class ResponseNotifier {
 public:
  void Notify() {
    absl::MutexLock l(&mu_);
    ++events_;
  }
  // Waits until an event newer than `*seen` or `timeout`; updates `*seen`.
  void Wait(uint64_t* seen, absl::Duration timeout) {
    absl::MutexLock l(&mu_);
    const uint64_t before = *seen;
    auto newer = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return events_ != before; };
    mu_.AwaitWithTimeout(absl::Condition(&newer), timeout);
    *seen = events_;
  }
  uint64_t events() const {
    absl::MutexLock l(&mu_);
    return events_;
  }

 private:
  mutable absl::Mutex mu_;
  uint64_t events_ ABSL_GUARDED_BY(mu_) = 0;
};

// The messages of one Generate call, from the scheduler thread to the RPC
// handler or the gateway. Thread-safe. A consumer blocks in Take until a
// message or the end arrives; one that serves several queues gives them a
// shared ResponseNotifier instead of polling each.
class ResponseQueue {
 public:
  ResponseQueue() = default;
  explicit ResponseQueue(std::shared_ptr<ResponseNotifier> notifier)
      : notifier_(std::move(notifier)) {}

  void Push(ringlane::v1::GenerateResponse msg);
  // The call is over: `status` OK after the last message, else why it failed.
  void Finish(absl::Status status);
  // Waits up to `timeout` for messages or the end; moves the messages out.
  // True when the call is over (then *status is its outcome and every
  // message has been taken).
  bool Take(absl::Duration timeout, std::vector<ringlane::v1::GenerateResponse>* out,
            absl::Status* status);
  // The client went away: the scheduler drops the request's lanes.
  void Cancel() { cancelled_.store(true); }
  bool cancelled() const { return cancelled_.load(); }
  bool finished() const;

 private:
  mutable absl::Mutex mu_;
  std::deque<ringlane::v1::GenerateResponse> msgs_ ABSL_GUARDED_BY(mu_);
  bool done_ ABSL_GUARDED_BY(mu_) = false;
  absl::Status status_ ABSL_GUARDED_BY(mu_);
  std::atomic<bool> cancelled_{false};
  const std::shared_ptr<ResponseNotifier> notifier_;
};

using Clock = std::chrono::steady_clock;

inline double Seconds(Clock::duration d) { return std::chrono::duration<double>(d).count(); }

// The output side of one choice.
struct Choice {
  int index = 0;
  std::vector<int32_t> generated;
  std::unique_ptr<IncrementalDecoder> decoder;
  std::optional<StopMatcher> matcher;
  // Absent when the watchdog is off for the request.
  std::optional<LoopDetector> loop;
  // Where the output stands in the request's grammar (constrained requests
  // only): advanced by every sampled token, read by the planner for masks.
  std::optional<grammar::Matcher> grammar;
  bool finished = false;
  Clock::time_point first_token;
  Clock::time_point last_token;
};

struct RequestState {
  PreparedRequest p;
  std::shared_ptr<ResponseQueue> queue;
  std::optional<StopTokens> stop_tokens;
  // Constrained requests: the model's masker, the bytes of a mask the
  // workers take (their vocabulary may be larger than the tokenizer's), and
  // whether the output's first token renders as the start of a text (a
  // prompt of BOS alone) rather than after the prompt.
  std::shared_ptr<const grammar::TokenMasker> masker;
  size_t mask_bytes = 0;
  bool output_at_text_start = false;
  // Whether choice `c`'s next token is the output's first at the start of
  // a text (the masker's at_start).
  bool NextTokenAtTextStart(const Choice& c) const {
    return c.generated.empty() && output_at_text_start;
  }
  std::vector<Choice> choices;
  int choices_left = 0;
  int completion_tokens = 0;
  int64_t cached_tokens = -1;  // of choice 0's first lane
  bool failed = false;
  // Set when the request is queued on a group: its series, and when.
  GroupMetrics* metrics = nullptr;
  Clock::time_point submitted;
  bool any_token = false;
  // Its end (finished, failed or cancelled) was counted.
  bool accounted = false;

  bool dead() const { return failed || queue->cancelled(); }
  void Fail(absl::Status status);
  // Counts the request's end once, in `outcome` and the end-to-end latency.
  void Account(prometheus::Counter* GroupMetrics::*outcome);
};

}  // namespace ringlane::router

#endif  // RINGLANE_ROUTER_REQUEST_REQUEST_STATE_H_
