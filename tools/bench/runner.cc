#include "tools/bench/runner.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <map>
#include <memory>
#include <set>
#include <thread>
#include <utility>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "services/progress.h"
#include "tools/bench/prompts.h"

namespace ringlane::bench {
namespace {

using Clock = std::chrono::steady_clock;

double SecondsBetween(Clock::time_point a, Clock::time_point b) {
  return std::chrono::duration<double>(b - a).count();
}

// A salt for one prompt: distinct for every (stage, level, request, part).
uint64_t Salt(uint64_t seed, int stage, int level, int64_t index, int part) {
  uint64_t x = Mix64(seed);
  x = Mix64(x ^ static_cast<uint64_t>(stage));
  x = Mix64(x ^ static_cast<uint64_t>(level));
  x = Mix64(x ^ static_cast<uint64_t>(index));
  return Mix64(x ^ static_cast<uint64_t>(part));
}

// A request's prompt made before its level: the text, or why it could not
// be made (filed as that request's error).
struct PreparedPrompt {
  absl::Status status;
  Prompt prompt;
};

// What one level's threads share. Fixed fields are set before the threads
// start; the rest is guarded by mu or atomic.
struct LevelState {
  // Fixed.
  const Workload* workload = nullptr;
  const Stage* stage = nullptr;
  const RunOptions* options = nullptr;
  const PromptBuilder* prompts = nullptr;
  int stage_index = 0;
  int level_index = 0;
  int concurrency = 0;
  int64_t planned = 0;  // 0: unbounded
  Clock::time_point run_start;
  Clock::time_point deadline = Clock::time_point::max();
  std::atomic<int64_t>* next_id = nullptr;

  // kCopy: the prompt of each request (by index); kAgentic: the pool's
  // prompts (by i % distinct_prompts). Made before the threads start.
  std::vector<PreparedPrompt> prepared;
  // kAgentic: requests in the first pass; the repeats wait for all of them.
  int64_t first_pass = 0;

  std::atomic<int64_t> next_index{0};
  services::ProgressBar* progress = nullptr;

  absl::Mutex mu;
  std::vector<RequestSample> samples ABSL_GUARDED_BY(mu);
  std::vector<std::string> errors_logged ABSL_GUARDED_BY(mu);
  // kAgentic: first-pass requests finished; whether the repeats may start;
  // the counters read in between (has_mid false when unread).
  int64_t first_pass_done ABSL_GUARDED_BY(mu) = 0;
  bool repeats_open ABSL_GUARDED_BY(mu) = false;
  bool has_mid ABSL_GUARDED_BY(mu) = false;
  CounterValues mid ABSL_GUARDED_BY(mu);
};

// Outages: runs of requests that could not reach the server, each ended by a
// request that started later and succeeded. Counted in start order, so a
// request that was already running when the server went away does not end
// one.
int CountOutages(const std::vector<RequestSample>& samples) {
  std::vector<const RequestSample*> by_start;
  for (const RequestSample& s : samples) by_start.push_back(&s);
  std::stable_sort(
      by_start.begin(), by_start.end(),
      [](const RequestSample* a, const RequestSample* b) { return a->start_s < b->start_s; });
  int outages = 0;
  bool down = false;
  for (const RequestSample* s : by_start) {
    if (s->connection_failed) {
      down = true;
    } else if (s->ok() && down) {
      ++outages;
      down = false;
    }
  }
  return outages;
}

absl::StatusOr<CounterValues> Scrape(ApiClient& client) {
  absl::StatusOr<std::string> text = client.ScrapeMetrics();
  if (!text.ok()) return text.status();
  return ReadRinglaneCounters(ParsePrometheusText(*text));
}

// After a level: the server may count a request a moment after its last
// byte left, so read until two scrapes agree (at most about a second).
CounterValues SettledScrape(ApiClient& client) {
  CounterValues last;
  for (int i = 0; i < 10; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    absl::StatusOr<CounterValues> now = Scrape(client);
    if (!now.ok()) continue;
    if (i > 0 && *now == last) return last;
    last = *std::move(now);
  }
  return last;
}

bool ShouldStop(const LevelState& st) {
  return Clock::now() >= st.deadline ||
         (st.options->stop_requested && st.options->stop_requested());
}

void Log(const RunOptions& options, std::string_view line) {
  if (options.log) {
    options.log(line);
  } else {
    std::string s(line);
    s += '\n';
    std::fwrite(s.data(), 1, s.size(), stderr);
  }
}

// Runs one request and files its sample. Returns whether it succeeded;
// `text` (when given) receives the output.
bool RunOne(LevelState& st, ApiClient& client, const RequestSpec& spec, RequestSample sample,
            std::string* text = nullptr) {
  sample.id = st.next_id->fetch_add(1);
  sample.stage = st.stage->name;
  sample.concurrency = st.concurrency;
  sample.start_s = SecondsBetween(st.run_start, Clock::now());
  client.Complete(spec, &sample);
  DetectLoops(st.options->loop, &sample);
  if (text != nullptr) *text = sample.text;
  const bool ok = sample.ok();
  const bool connection_failed = sample.connection_failed;
  {
    absl::MutexLock lock(&st.mu);
    // The first few distinct errors are worth seeing as they happen.
    if (!ok && st.errors_logged.size() < 5 &&
        std::find(st.errors_logged.begin(), st.errors_logged.end(), sample.error) ==
            st.errors_logged.end()) {
      st.errors_logged.push_back(sample.error);
      Log(*st.options, absl::StrCat("ringlane-bench: ", st.stage->name, " c=", st.concurrency,
                                    ": request ", sample.id, " failed: ", sample.error));
    }
    st.samples.push_back(std::move(sample));
  }
  if (connection_failed) {
    // Do not spin against a server that is down (a soak goes on through a
    // restart).
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
  }
  return ok;
}

RequestSpec BaseSpec(const LevelState& st) {
  RequestSpec spec;
  spec.endpoint = st.workload->endpoint;
  spec.max_tokens = st.stage->output_tokens;
  spec.temperature = st.workload->temperature;
  spec.ignore_eos = st.workload->ignore_eos;
  spec.loop_watchdog = st.workload->loop_watchdog;
  return spec;
}

void SetPrompt(RequestSpec* spec, const std::string& text) {
  if (spec->endpoint == Endpoint::kChat) {
    spec->messages = {{"user", text}};
  } else {
    spec->prompt = text;
  }
}

// A prompt for request `index`, or an error sample when the tokenizer
// failed (filed by the caller).
absl::StatusOr<Prompt> MakePrompt(LevelState& st, ApiClient& client, const LengthDist& dist,
                                  int64_t index, int part) {
  const uint64_t salt = Salt(st.options->seed, st.stage_index, st.level_index, index, part);
  const int tokens = dist.Pick(index, UnitFromBits(Mix64(salt ^ 0x5eed)));
  CountTokensFn count = [&client](const std::string& text) { return client.CountTokens(text); };
  const bool can_count =
      st.prompts->calibrated() && st.workload->endpoint == Endpoint::kCompletions;
  return st.prompts->Make(tokens, salt, can_count ? &count : nullptr);
}

// Files a request that failed before it was sent: its prompt could not be
// sized, because the server's tokenizer did not answer.
void FileSetupError(LevelState& st, const absl::Status& status, Clock::time_point began) {
  RequestSample s;
  s.id = st.next_id->fetch_add(1);
  s.stage = st.stage->name;
  s.concurrency = st.concurrency;
  s.start_s = SecondsBetween(st.run_start, began);
  s.error = absl::StrCat("prompt setup: ", std::string(status.message()));
  s.connection_failed = absl::IsUnavailable(status);
  FinalizeSample(&s);
  {
    absl::MutexLock lock(&st.mu);
    st.samples.push_back(std::move(s));
  }
  if (absl::IsUnavailable(status)) {
    // The server is down: do not spin.
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
  }
}

void RunIndependent(LevelState& st, ApiClient& client, int stream, int64_t index) {
  const Clock::time_point began = Clock::now();
  absl::StatusOr<Prompt> p = MakePrompt(st, client, st.stage->prompt_tokens, index, 0);
  if (!p.ok()) return FileSetupError(st, p.status(), began);
  RequestSpec spec = BaseSpec(st);
  SetPrompt(&spec, p->text);
  RequestSample s;
  s.stream = stream;
  s.prompt_tokens_expected = st.workload->endpoint == Endpoint::kChat ? -1 : p->tokens;
  s.prompt_tokens_exact = p->exact && st.workload->endpoint == Endpoint::kCompletions;
  if (st.stage->mode == StageMode::kResend) {
    RequestSample warm = s;
    s.phase = "cold";
    warm.phase = "warm";
    if (!RunOne(st, client, spec, std::move(s))) return;
    RunOne(st, client, spec, std::move(warm));
    return;
  }
  RunOne(st, client, spec, std::move(s));
}

// One session of a conversation stage: the document, then one turn per
// question, each resending the conversation so far.
void RunSession(LevelState& st, ApiClient& client, int stream, int64_t index) {
  const Clock::time_point began = Clock::now();
  absl::StatusOr<Prompt> doc = MakePrompt(st, client, st.stage->prompt_tokens, index, 0);
  if (!doc.ok()) return FileSetupError(st, doc.status(), began);
  RequestSpec spec = BaseSpec(st);
  std::string history = doc->text;
  std::vector<ChatMessage> messages;
  const bool chat = st.workload->endpoint == Endpoint::kChat;
  for (int turn = 0; turn < st.stage->turns; ++turn) {
    if (ShouldStop(st)) return;
    const uint64_t salt = Salt(st.options->seed, st.stage_index, st.level_index, index, turn + 1);
    const int q = st.stage->turn_tokens.Pick(index * st.stage->turns + turn,
                                             UnitFromBits(Mix64(salt ^ 0x5eed)));
    const std::string question =
        absl::StrCat("Question ", turn + 1, ": ", st.prompts->Words(q, salt), "?");
    RequestSample s;
    s.stream = stream;
    s.session = index;
    s.turn = turn;
    if (chat) {
      messages.push_back({"user", turn == 0 ? history + "\n\n" + question : question});
      spec.messages = messages;
    } else {
      history += absl::StrCat("\n\n", question, "\nAnswer:");
      spec.prompt = history;
      if (st.prompts->calibrated()) {
        absl::StatusOr<int64_t> c = client.CountTokens(history);
        if (c.ok()) {
          s.prompt_tokens_expected = *c;
          s.prompt_tokens_exact = true;
        }
      }
    }
    std::string answer;
    const bool ok = RunOne(st, client, spec, std::move(s), &answer);
    if (st.progress != nullptr) st.progress->Add(1);
    // The conversation cannot go on without its answer.
    if (!ok) return;
    if (chat) {
      messages.push_back({"assistant", answer});
    } else {
      history += answer;
    }
  }
}

// A request whose prompt was made before the level: kCopy's (by index) or
// kAgentic's (from the pool, phase "first" or "repeat").
void RunPrepared(LevelState& st, ApiClient& client, int stream, int64_t index) {
  const Clock::time_point began = Clock::now();
  const bool agentic = st.stage->mode == StageMode::kAgentic;
  const size_t slot =
      static_cast<size_t>(agentic ? index % static_cast<int64_t>(st.prepared.size()) : index);
  const PreparedPrompt& p = st.prepared[slot];
  if (!p.status.ok()) return FileSetupError(st, p.status, began);
  RequestSpec spec = BaseSpec(st);
  SetPrompt(&spec, p.prompt.text);
  RequestSample s;
  s.stream = stream;
  if (agentic) s.phase = index < st.first_pass ? "first" : "repeat";
  const bool completions = st.workload->endpoint == Endpoint::kCompletions;
  s.prompt_tokens_expected = completions ? p.prompt.tokens : -1;
  s.prompt_tokens_exact = p.prompt.exact && completions;
  RunOne(st, client, spec, std::move(s));
}

// kAgentic: waits until the first pass has ended (false: the level stopped
// first).
bool AwaitRepeats(LevelState& st) {
  absl::MutexLock lock(&st.mu);
  while (!st.repeats_open) {
    st.mu.AwaitWithTimeout(absl::Condition(&st.repeats_open), absl::Milliseconds(100));
    if (!st.repeats_open && ShouldStop(st)) return false;
  }
  return true;
}

// kAgentic: one first-pass request finished; the last one reads the
// counters that split the phases and lets the repeats start.
void FirstPassRequestDone(LevelState& st, ApiClient& client) {
  {
    absl::MutexLock lock(&st.mu);
    if (++st.first_pass_done < st.first_pass) return;
  }
  CounterValues mid;
  const bool has_mid = !st.options->server.metrics_url.empty();
  if (has_mid) mid = SettledScrape(client);
  absl::MutexLock lock(&st.mu);
  st.has_mid = has_mid && !mid.empty();
  st.mid = std::move(mid);
  st.repeats_open = true;
}

void StreamLoop(LevelState& st, int stream) {
  absl::StatusOr<std::unique_ptr<ApiClient>> client = ApiClient::Create(st.options->server);
  if (!client.ok()) return;  // Create was checked by RunWorkload with the same options.
  for (;;) {
    if (ShouldStop(st)) return;
    const int64_t index = st.next_index.fetch_add(1);
    if (st.planned > 0 && index >= st.planned) return;
    switch (st.stage->mode) {
      case StageMode::kConversation:
        RunSession(st, **client, stream, index);
        continue;  // sessions count their turns
      case StageMode::kCopy:
        RunPrepared(st, **client, stream, index);
        break;
      case StageMode::kAgentic:
        // Every repeat follows the whole first pass, so its output is one
        // the server has finished producing, and the phases do not overlap.
        if (index >= st.first_pass && !AwaitRepeats(st)) return;
        RunPrepared(st, **client, stream, index);
        if (index < st.first_pass) FirstPassRequestDone(st, **client);
        break;
      case StageMode::kIndependent:
      case StageMode::kResend:
        RunIndependent(st, **client, stream, index);
        break;
    }
    if (st.progress != nullptr) st.progress->Add(1);
  }
}

// kCopy: the prompt made of `document` (the document, a newline, its start).
void FinishCopyPrompt(LevelState& st, ApiClient& client, const std::string& document,
                      PreparedPrompt* out) {
  out->prompt.text = CopyPromptText(document, st.stage->copy_prefix_fraction);
  out->prompt.tokens = -1;  // unknown without the server's tokenizer
  if (st.prompts->calibrated()) {
    absl::StatusOr<int64_t> n = client.CountTokens(out->prompt.text);
    if (n.ok()) {
      out->prompt.tokens = *n;
      out->prompt.exact = true;
    }
  }
}

// kCopy, before the level: each request's document, the server's greedy
// completion of a fresh seed, made by `concurrency` threads; the prompts
// land in st.prepared.
void PrepareCopyPrompts(LevelState& st, LevelResult* r) {
  const Stage& stage = *st.stage;
  st.prepared.assign(static_cast<size_t>(st.planned), PreparedPrompt{});
  std::unique_ptr<services::ProgressBar> bar;
  if (st.options->progress) {
    bar = std::make_unique<services::ProgressBar>(
        absl::StrCat(stage.name, " c=", st.concurrency, " documents"), st.planned,
        services::ProgressOptions{.unit = services::ProgressUnit::kCount});
  }
  std::atomic<int64_t> next{0};
  absl::Mutex mu;  // guards r's document counts
  auto work = [&] {
    absl::StatusOr<std::unique_ptr<ApiClient>> client = ApiClient::Create(st.options->server);
    if (!client.ok()) return;
    for (;;) {
      const int64_t index = next.fetch_add(1);
      if (index >= st.planned) return;
      PreparedPrompt& out = st.prepared[static_cast<size_t>(index)];
      if (st.options->stop_requested && st.options->stop_requested()) {
        out.status = absl::CancelledError("the run was interrupted before its document");
        continue;
      }
      if (stage.document_from_words) {
        absl::StatusOr<Prompt> words = MakePrompt(st, **client, stage.document_tokens, index, 0);
        if (!words.ok()) {
          out.status = words.status();
          continue;
        }
        if (bar != nullptr) bar->Add(1);
        FinishCopyPrompt(st, **client, words->text, &out);
        continue;
      }
      absl::StatusOr<Prompt> seed = MakePrompt(st, **client, stage.prompt_tokens, index, 0);
      if (!seed.ok()) {
        out.status = seed.status();
        continue;
      }
      const uint64_t salt = Salt(st.options->seed, st.stage_index, st.level_index, index, 1);
      RequestSpec spec = BaseSpec(st);
      spec.temperature = 0;  // the model's own greedy text
      spec.max_tokens = stage.document_tokens.Pick(index, UnitFromBits(Mix64(salt ^ 0x5eed)));
      SetPrompt(&spec, seed->text);
      RequestSample doc;
      (*client)->Complete(spec, &doc);
      {
        absl::MutexLock lock(&mu);
        ++r->document_requests;
        if (!doc.ok()) ++r->document_errors;
        r->document_prompt_tokens += std::max<int64_t>(0, doc.usage_prompt_tokens);
        r->document_completion_tokens += std::max<int64_t>(0, doc.usage_completion_tokens);
      }
      if (bar != nullptr) bar->Add(1);
      if (!doc.ok()) {
        out.status = absl::Status(
            doc.connection_failed ? absl::StatusCode::kUnavailable : absl::StatusCode::kInternal,
            absl::StrCat("the document: ", doc.error));
        continue;
      }
      if (absl::StripAsciiWhitespace(doc.text).empty()) {
        out.status = absl::InternalError("the document came back empty");
        continue;
      }
      FinishCopyPrompt(st, **client, doc.text, &out);
    }
  };
  std::vector<std::thread> threads;
  for (int i = 0; i < st.concurrency; ++i) threads.emplace_back(work);
  for (std::thread& t : threads) t.join();
  if (bar != nullptr) bar->Finish();
}

// kAgentic, before the level: the pool's prompts, fresh for each level (so
// one level's outputs are not another's repeats).
void PreparePool(LevelState& st, ApiClient& client) {
  const int64_t pool = st.stage->distinct_prompts;
  st.first_pass = st.planned > 0 ? std::min(pool, st.planned) : pool;
  for (int64_t k = 0; k < pool; ++k) {
    PreparedPrompt p;
    absl::StatusOr<Prompt> made = MakePrompt(st, client, st.stage->prompt_tokens, k, 0);
    if (made.ok()) {
      p.prompt = *std::move(made);
    } else {
      p.status = made.status();
    }
    st.prepared.push_back(std::move(p));
  }
}

LevelResult RunLevel(const Workload& workload, int stage_index, int level_index,
                     const RunOptions& options, const PromptBuilder& prompts,
                     ApiClient& main_client, Clock::time_point run_start,
                     std::atomic<int64_t>* next_id, std::vector<RequestSample>* samples) {
  const Stage& stage = workload.stages[static_cast<size_t>(stage_index)];
  const int concurrency = stage.concurrency[static_cast<size_t>(level_index)];
  LevelResult r;
  r.stage = stage.name;
  r.mode = stage.mode;
  r.concurrency = concurrency;
  r.requests_planned = stage.RequestsAt(concurrency);
  r.duration_bound_s = stage.duration_s;
  if (options.duration_cap_s > 0) {
    r.duration_bound_s = r.duration_bound_s > 0
                             ? std::min(r.duration_bound_s, options.duration_cap_s)
                             : options.duration_cap_s;
  }

  LevelState st;
  st.workload = &workload;
  st.stage = &stage;
  st.options = &options;
  st.prompts = &prompts;
  st.stage_index = stage_index;
  st.level_index = level_index;
  st.concurrency = concurrency;
  st.planned = r.requests_planned;
  st.run_start = run_start;
  st.next_id = next_id;

  // Warm-up requests: short, independent, unrecorded, one after another.
  for (int w = 0; w < stage.warmup; ++w) {
    const uint64_t salt = Salt(options.seed, stage_index, level_index, -1 - w, 0);
    std::string text = prompts.Words(std::min(16, stage.prompt_tokens.Largest()), salt);
    RequestSpec spec = BaseSpec(st);
    SetPrompt(&spec, text);
    RequestSample warm;
    main_client.Complete(spec, &warm);
    ++r.warmup_requests;
    if (!warm.ok()) ++r.warmup_errors;
    r.warmup_prompt_tokens += std::max<int64_t>(0, warm.usage_prompt_tokens);
    r.warmup_completion_tokens += std::max<int64_t>(0, warm.usage_completion_tokens);
  }

  // Prompts made before the first scrape, so that the level's counters
  // cover only the recorded requests.
  if (stage.mode == StageMode::kCopy) PrepareCopyPrompts(st, &r);
  if (stage.mode == StageMode::kAgentic) PreparePool(st, main_client);

  if (!options.server.metrics_url.empty()) {
    absl::StatusOr<CounterValues> before = Scrape(main_client);
    if (before.ok()) {
      r.has_metrics = true;
      r.before = *std::move(before);
    } else {
      Log(options, absl::StrCat("ringlane-bench: metrics unreadable before ", stage.name, ": ",
                                std::string(before.status().message())));
    }
  }

  std::unique_ptr<services::ProgressBar> bar;
  if (options.progress) {
    std::string label = absl::StrCat(stage.name, " c=", concurrency);
    if (r.duration_bound_s > 0) absl::StrAppend(&label, " (<=", r.duration_bound_s, " s)");
    bar = std::make_unique<services::ProgressBar>(
        label, r.requests_planned * (stage.mode == StageMode::kConversation ? stage.turns : 1),
        services::ProgressOptions{.unit = services::ProgressUnit::kCount});
    st.progress = bar.get();
  }

  const Clock::time_point start = Clock::now();
  if (r.duration_bound_s > 0) {
    st.deadline = start + std::chrono::duration_cast<Clock::duration>(
                              std::chrono::duration<double>(r.duration_bound_s));
  }

  // The scraper reads the counters every second to see the server restart
  // (its counters going back), which before/after alone would miss.
  absl::Notification done;
  std::thread scraper;
  if (r.has_metrics) {
    scraper = std::thread([&] {
      absl::StatusOr<std::unique_ptr<ApiClient>> client = ApiClient::Create(options.server);
      if (!client.ok()) return;
      CounterValues last = r.before;
      while (!done.WaitForNotificationWithTimeout(absl::Seconds(1))) {
        absl::StatusOr<CounterValues> now = Scrape(**client);
        if (!now.ok()) continue;
        if (CountersWentDown(last, *now)) ++r.counter_resets;
        last = *std::move(now);
      }
    });
  }

  std::vector<std::thread> streams;
  for (int i = 0; i < concurrency; ++i) streams.emplace_back([&st, i] { StreamLoop(st, i); });
  for (std::thread& t : streams) t.join();
  r.wall_s = SecondsBetween(start, Clock::now());
  done.Notify();
  if (scraper.joinable()) scraper.join();
  if (bar != nullptr) bar->Finish();
  r.stopped_early = options.stop_requested && options.stop_requested();
  {
    absl::MutexLock lock(&st.mu);
    std::set<int64_t> sessions;
    for (const RequestSample& s : st.samples) {
      if (s.session >= 0) sessions.insert(s.session);
    }
    r.sessions = static_cast<int64_t>(sessions.size());
    r.outages = CountOutages(st.samples);
  }

  if (r.has_metrics) {
    r.after = SettledScrape(main_client);
    r.delta = CounterDelta(r.before, r.after);
    if (CountersWentDown(r.before, r.after) && r.counter_resets == 0) r.counter_resets = 1;
  }

  absl::MutexLock lock(&st.mu);
  if (r.has_metrics && st.has_mid && r.counter_resets == 0 && !CountersWentDown(r.before, st.mid) &&
      !CountersWentDown(st.mid, r.after)) {
    r.phase_delta["first"] = CounterDelta(r.before, st.mid);
    r.phase_delta["repeat"] = CounterDelta(st.mid, r.after);
  }
  std::sort(st.samples.begin(), st.samples.end(),
            [](const RequestSample& a, const RequestSample& b) { return a.id < b.id; });
  for (RequestSample& s : st.samples) samples->push_back(std::move(s));
  return r;
}

std::string NowRfc3339() {
  return absl::FormatTime("%Y-%m-%dT%H:%M:%SZ", absl::Now(), absl::UTCTimeZone());
}

}  // namespace

std::string CopyPromptText(std::string_view document, double fraction) {
  const absl::string_view doc =
      absl::StripAsciiWhitespace(absl::string_view(document.data(), document.size()));
  // Word ends, in order.
  std::vector<size_t> ends;
  for (size_t i = 0; i < doc.size(); ++i) {
    if (!absl::ascii_isspace(static_cast<unsigned char>(doc[i])) &&
        (i + 1 == doc.size() || absl::ascii_isspace(static_cast<unsigned char>(doc[i + 1])))) {
      ends.push_back(i + 1);
    }
  }
  const size_t words = std::min(
      ends.size(), static_cast<size_t>(std::llround(std::clamp(fraction, 0.0, 1.0) * ends.size())));
  std::string out(doc);
  out += '\n';
  if (words > 0) out.append(doc.data(), ends[words - 1]);
  return out;
}

void DetectLoops(const router::LoopWatchdogOptions& options, RequestSample* sample) {
  absl::StatusOr<router::LoopDetector> detector = router::LoopDetector::Create(options);
  if (!detector.ok()) return;
  // The detector works on token ids; equal strings get equal ids. Without
  // logprob tokens, words stand in for tokens (a looping text repeats its
  // words as well).
  std::map<std::string, int32_t> ids;
  auto feed = [&](const std::string& piece) {
    auto [it, inserted] = ids.emplace(piece, static_cast<int32_t>(ids.size()));
    router::LoopDetector::Verdict v = detector->Feed(it->second);
    if (v.flagged_now) {
      sample->loop_flagged = true;
      sample->loop_period = v.period;
    }
  };
  if (!sample->token_texts.empty()) {
    for (const std::string& t : sample->token_texts) feed(t);
  } else {
    for (absl::string_view w :
         absl::StrSplit(sample->text, absl::ByAnyChar(" \n\t"), absl::SkipEmpty())) {
      feed(std::string(w));
    }
  }
}

absl::StatusOr<RunResult> RunWorkload(const Workload& workload, const RunOptions& options_in) {
  RunOptions options = options_in;
  if (absl::Status s = router::LoopDetector::Create(options.loop).status(); !s.ok()) return s;
  absl::StatusOr<std::unique_ptr<ApiClient>> main_client = ApiClient::Create(options.server);
  if (!main_client.ok()) return main_client.status();

  RunResult result;
  result.workload = workload;
  result.seed = options.seed;
  result.started_at = NowRfc3339();

  if (options.server.model.empty()) {
    absl::StatusOr<std::vector<std::string>> models = (*main_client)->ListModels();
    if (!models.ok()) {
      return absl::Status(models.status().code(),
                          absl::StrCat("no --model given and the model list is unreadable: ",
                                       std::string(models.status().message())));
    }
    options.server.model = models->front();
    result.notes.push_back(
        absl::StrCat("model \"", options.server.model, "\" taken from the server's model list"));
    main_client = ApiClient::Create(options.server);
    if (!main_client.ok()) return main_client.status();
  }
  result.server = options.server;
  result.server.api_key.clear();

  PromptBuilder prompts;
  if (!options.server.tokenize_url.empty()) {
    ApiClient* c = main_client->get();
    absl::Status s = prompts.Calibrate([c](const std::string& t) { return c->CountTokens(t); });
    if (!s.ok()) {
      result.notes.push_back(absl::StrCat("the server's tokenizer failed (",
                                          std::string(s.message()),
                                          "): prompt lengths are approximate (words)"));
      Log(options, "ringlane-bench: " + result.notes.back());
    }
  } else {
    result.notes.push_back(
        "no tokenizer endpoint: prompt lengths are approximate (one token per word); the "
        "server's usage.prompt_tokens is reported");
  }
  if (workload.endpoint == Endpoint::kChat) {
    result.notes.push_back(
        "chat endpoint: prompt lengths count message text only, not the chat template");
  }

  const Clock::time_point run_start = Clock::now();
  std::atomic<int64_t> next_id{0};
  for (size_t si = 0; si < workload.stages.size(); ++si) {
    for (size_t li = 0; li < workload.stages[si].concurrency.size(); ++li) {
      if (options.stop_requested && options.stop_requested()) break;
      result.levels.push_back(RunLevel(workload, static_cast<int>(si), static_cast<int>(li),
                                       options, prompts, **main_client, run_start, &next_id,
                                       &result.samples));
    }
  }
  if (options.stop_requested && options.stop_requested()) {
    result.notes.push_back(
        "the run was interrupted (Ctrl-C): no request started after that, and later levels did not "
        "run");
  }
  return result;
}

}  // namespace ringlane::bench
