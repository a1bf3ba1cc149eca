// Workloads of ringlane-bench: what to send, how many at once, and for how
// long. A workload is a JSON file (format in tools/bench/README.md); the
// shipped ones (decode, prefill, sweep, resend, soak, copy, agentic) live in
// tools/bench/workloads/ and are compiled into the binary, so
// `--workload=decode` works from any directory.
//
// Plain data; parsed once by main() and only read afterwards, so it may be
// shared between the runner's threads without locking.
#ifndef RINGLANE_TOOLS_BENCH_WORKLOAD_H_
#define RINGLANE_TOOLS_BENCH_WORKLOAD_H_

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"

namespace ringlane::bench {

enum class Endpoint {
  kCompletions,  // POST {base}/completions with "prompt"
  kChat,         // POST {base}/chat/completions with "messages"
};

// A length in tokens drawn per request. Either the listed values in turn
// (request i gets values[i % size], so a short run still covers every value
// evenly) or uniform in [min, max] from the run's seeded generator.
struct LengthDist {
  std::vector<int> values;  // non-empty: cycle through these
  int min = 0;              // values empty: uniform in [min, max]
  int max = 0;

  // `u` is a uniform draw in [0, 1), used only by the uniform form.
  int Pick(int64_t index, double u) const;
  // Every length scaled by `factor` (rounded, at least 1).
  LengthDist Scaled(double factor) const;
  int Largest() const;
};

enum class StageMode {
  // Each request is a fresh prompt (a unique word sequence, so no two share
  // a cached prefix).
  kIndependent,
  // Each request sends the same fresh prompt twice in a row: phase "cold",
  // then "warm" (the kept-prefix case).
  kResend,
  // Each stream runs sessions: a document, then `turns` questions, each turn
  // resending the whole conversation so far (document-processing soak).
  kConversation,
  // Copy/rewrite: before the level, each request's document D is made as
  // the server's own greedy completion (document_tokens long) of a fresh
  // seed prompt (prompt_tokens long); those calls are not recorded. The
  // recorded request's prompt is D, a newline, and the first
  // copy_prefix_fraction of D's words, so an output that goes on copying D
  // repeats the prompt (what n-gram drafting exploits).
  kCopy,
  // Agentic repeat: a pool of distinct_prompts fresh prompts; request i
  // sends prompt i % distinct_prompts. The first pass (phase "first") ends
  // before any repeat starts (phase "repeat"), so at temperature 0 every
  // repeat's output equals an output the server has already produced, as
  // agent loops resend the same step across turns.
  kAgentic,
};

struct Stage {
  std::string name;
  StageMode mode = StageMode::kIndependent;
  // One run of the stage per level, in order; a sweep lists several.
  std::vector<int> concurrency = {1};
  // Prompt length (kIndependent, kResend, kAgentic), document length
  // (kConversation) or the seed's length (kCopy), in tokens.
  LengthDist prompt_tokens;
  // kCopy: the document's length (max_tokens of its call), and the share of
  // its words repeated after it in the prompt, in [0, 1].
  LengthDist document_tokens;
  double copy_prefix_fraction = 0.25;
  // kCopy, "document": "words": D is fresh words of document_tokens tokens
  // (a text the model did not write, as a pasted document is) instead of the
  // server's completion; prompt_tokens is then unused.
  bool document_from_words = false;
  // kAgentic: the pool of prompts the requests cycle through.
  int distinct_prompts = 4;
  // kConversation: words of each turn's question.
  LengthDist turn_tokens;
  int turns = 1;
  // max_tokens of every request (the fixed output length with ignore_eos).
  int output_tokens = 16;
  // Requests per level; with requests_per_stream instead, that many per
  // stream (concurrency * requests_per_stream). A resend pair and a whole
  // session count as one. 0 for both: until duration_s.
  int requests = 0;
  int requests_per_stream = 0;
  // Bound on a level's time: no request (or turn) starts after it. 0: none.
  double duration_s = 0;
  // Unrecorded requests before each level (first-request costs: connection
  // setup, the server's lazy initialization).
  int warmup = 0;

  // The number of requests a level of `concurrency` streams runs, 0 when
  // only the duration bounds it.
  int64_t RequestsAt(int concurrency) const;
};

struct Workload {
  std::string name;
  std::string description;
  Endpoint endpoint = Endpoint::kCompletions;
  double temperature = 0;
  // Ringlane extensions (sent only with --server=ringlane): generate past
  // EOS, and opt out of the router's loop watchdog, so every request
  // produces exactly output_tokens tokens.
  bool ignore_eos = true;
  bool loop_watchdog = false;
  std::vector<Stage> stages;
};

// Parses a workload file's text. InvalidArgument naming the field for
// malformed JSON, unknown fields, or values out of range.
absl::StatusOr<Workload> ParseWorkload(std::string_view json_text);

// `name_or_path` is a shipped workload's name or a file path. NotFound when
// it is neither.
absl::StatusOr<Workload> LoadWorkload(const std::string& name_or_path);

// Names of the shipped workloads, in a fixed order.
std::vector<std::string> ShippedWorkloadNames();
// The JSON text of a shipped workload; NotFound for another name.
absl::StatusOr<std::string> ShippedWorkloadText(std::string_view name);

// Every length and output length multiplied by `factor` (to run the small
// shipped workloads against a model with a longer context).
Workload ScaleLengths(const Workload& workload, double factor);

const char* StageModeName(StageMode mode);
const char* EndpointName(Endpoint endpoint);

}  // namespace ringlane::bench

#endif  // RINGLANE_TOOLS_BENCH_WORKLOAD_H_
