// One measured request of ringlane-bench and the reading of its response
// stream. StreamAccumulator turns the server's events, with their arrival
// times, into a RequestSample; FinalizeSample derives the token counts, their
// cross-check, ITL and TPOT. Pure functions of their inputs (no clock, no
// I/O), so tests feed them exact schedules.
//
// Definitions (also in tools/bench/README.md):
// - A content chunk is a streamed event that carries output: non-empty text
//   or at least one logprob entry. Role-only and usage-only chunks are not.
// - TTFT: from sending the request to the first content chunk's arrival.
// - E2E: from sending the request to the end of the response.
// - Tokens per chunk: its logprob entries when the server returned them;
//   otherwise unknown (SSE chunks are not tokens), taken as 1 and marked
//   unverified.
// - ITL: for each content chunk after the first, its gap since the previous
//   content chunk divided by the tokens it carries, once per token.
// - TPOT: (E2E - TTFT) / (n - 1), n the output tokens, for n >= 2.
// - n: the logprob count when every content chunk carried logprobs (each
//   entry is one token the stream really delivered), else the server's
//   usage.completion_tokens, else the content chunk count.
#ifndef RINGLANE_TOOLS_BENCH_SAMPLE_H_
#define RINGLANE_TOOLS_BENCH_SAMPLE_H_

#include <cstdint>
#include <limits>
#include <string>
#include <string_view>
#include <vector>

#include "tools/bench/workload.h"

namespace ringlane::bench {

inline constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();

struct ChunkArrival {
  double t_ms = 0;          // since the request was sent
  int logprob_tokens = -1;  // logprob entries carried; -1: none returned
};

// How a request's output token count was checked.
enum class TokenCheck {
  kVerified,    // usage.completion_tokens equals the logprob entries streamed
  kMismatch,    // it does not: the server's usage is wrong (or the stream is)
  kUnverified,  // no logprobs to count: usage is taken on trust
  kNoUsage,     // the server reported no usage: logprob count, else chunks
};
const char* TokenCheckName(TokenCheck check);

struct RequestSample {
  // Where it belongs.
  int64_t id = 0;
  std::string stage;
  int concurrency = 0;
  std::string phase;  // "" or, for resend, "cold" / "warm"
  int stream = 0;     // which of the level's streams sent it
  int64_t session = -1;
  int turn = -1;

  // What was asked.
  int max_tokens = 0;
  int64_t prompt_tokens_expected = -1;  // our own count (tokenizer or words)
  bool prompt_tokens_exact = false;     // from the server's tokenizer

  // When.
  double start_s = 0;  // since the run started
  double ttft_ms = kNaN;
  double e2e_ms = kNaN;
  std::vector<ChunkArrival> chunks;  // content chunks only

  // What came back.
  int http_status = 0;
  std::string error;  // empty: success
  // The server could not be reached: nothing was sent or nothing came back
  // (for outage counting; error says more).
  bool connection_failed = false;
  // The request went out a second time, on a new connection, because the
  // server closed the kept-alive one under it unanswered
  // (services::HttpClient::retries()); counted in the report.
  bool retried = false;
  bool streamed = false;  // the response was an event stream
  bool done_marker = false;
  std::string finish_reason;
  std::string text;
  std::vector<std::string> token_texts;  // from logprobs, for the loop detector
  int64_t usage_prompt_tokens = -1;
  int64_t usage_completion_tokens = -1;
  int64_t usage_cached_tokens = -1;

  // Derived by FinalizeSample.
  int64_t logprob_tokens = -1;  // sum over content chunks when all carried logprobs
  int64_t output_tokens = 0;    // n, see above
  TokenCheck check = TokenCheck::kUnverified;
  double tpot_ms = kNaN;
  std::vector<double> itl_ms;

  // The client-side loop detector's verdict on the output.
  bool loop_flagged = false;
  int loop_period = 0;

  bool ok() const { return error.empty(); }
};

// Reads one response into a sample. Not thread-safe; one per request.
class StreamAccumulator {
 public:
  StreamAccumulator(Endpoint endpoint, RequestSample* sample)
      : endpoint_(endpoint), sample_(sample) {}

  // One server-sent event's data, complete at `t_ms`.
  void OnEvent(std::string_view data, double t_ms);
  // A response that was not streamed: its whole JSON body, complete at `t_ms`.
  void OnWholeBody(std::string_view body, double t_ms);
  // The response ended at `t_ms`; sets E2E and runs FinalizeSample.
  void Finish(double t_ms);

 private:
  // Reads a completion object (a chunk or a whole response).
  void OnObject(std::string_view data, double t_ms, bool whole);

  const Endpoint endpoint_;
  RequestSample* const sample_;
};

// Derives logprob_tokens, output_tokens, check, ITL and TPOT from the
// sample's chunks, usage and E2E.
void FinalizeSample(RequestSample* sample);

}  // namespace ringlane::bench

#endif  // RINGLANE_TOOLS_BENCH_SAMPLE_H_
