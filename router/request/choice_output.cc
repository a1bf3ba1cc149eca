#include "router/request/choice_output.h"

#include <algorithm>
#include <string>
#include <utility>

#include "services/log.h"

namespace ringlane::router {

namespace v1 = ringlane::v1;

namespace {

// Feeds a sampled token to the choice's loop watchdog: flags it (metric,
// log) and says whether the loop has run long enough to stop the choice.
bool LoopShouldStop(const RequestState& req, Choice& c, int32_t token) {
  if (!c.loop) return false;
  const LoopDetector::Verdict v = c.loop->Feed(token);
  if (v.flagged_now) {
    if (req.metrics) req.metrics->loops_detected->Increment();
    RL_LOG(WARNING) << "request " << req.p.request_id << " choice " << c.index
                    << ": loop detected, a cycle of " << v.period << " tokens repeats (after "
                    << c.generated.size() << " generated tokens)";
  }
  return v.should_stop;
}

void CountFinish(RequestState& req, const Choice& c, v1::FinishReason finish) {
  GroupMetrics* m = req.metrics;
  if (finish == v1::FINISH_REASON_LOOP) {
    RL_LOG(WARNING) << "request " << req.p.request_id << " choice " << c.index
                    << ": the loop watchdog stopped it after " << c.generated.size()
                    << " tokens (finish reason loop)";
  }
  if (m == nullptr) return;
  switch (finish) {
    case v1::FINISH_REASON_STOP:
      m->finish_stop->Increment();
      break;
    case v1::FINISH_REASON_LOOP:
      m->finish_loop->Increment();
      m->loops_stopped->Increment();
      break;
    default:
      m->finish_length->Increment();
  }
  if (c.generated.size() >= 2) {
    m->time_per_output_token_s->Observe(Seconds(c.last_token - c.first_token) /
                                        static_cast<double>(c.generated.size() - 1));
  }
}

}  // namespace

void NoteTokenTimes(RequestState& req, int choice, int count, Clock::time_point now) {
  Choice& c = req.choices[choice];
  if (c.finished || req.dead()) return;
  if (!req.any_token) {
    req.any_token = true;
    if (req.metrics) req.metrics->time_to_first_token_s->Observe(Seconds(now - req.submitted));
  }
  if (c.generated.empty()) {
    c.first_token = now;
    --count;  // the first token has no gap
  } else if (count > 0 && req.metrics) {
    const double gap = Seconds(now - c.last_token) / count;
    for (int i = 0; i < count; ++i) req.metrics->inter_token_latency_s->Observe(gap);
  }
  c.last_token = now;
}

bool OnSampledToken(RequestState& req, int choice, const v1::SampledToken& t,
                    const Tokenizer& tok) {
  Choice& c = req.choices[choice];
  if (c.finished || req.dead()) return false;
  const StopTokens::Kind kind = req.stop_tokens->Check(t.token_id());
  // A constrained choice ends when its grammar does: once no byte may
  // follow, the mask would allow only stop tokens, so the sample is known.
  bool grammar_done = false;
  if (c.grammar && req.masker && kind == StopTokens::Kind::kNone) {
    const bool at_start = req.NextTokenAtTextStart(c);
    if (!req.masker->Advance(&*c.grammar, at_start, t.token_id())) {
      // The workers sampled under this grammar's mask: a refusal here means
      // the masks and the matcher disagree.
      RL_LOG(ERROR) << "request " << req.p.request_id << " choice " << c.index << ": token "
                    << t.token_id() << " was sampled under a mask its grammar refuses";
    }
    grammar_done = c.grammar->Finished();
  }
  c.generated.push_back(t.token_id());
  ++req.completion_tokens;
  if (req.metrics) req.metrics->generation_tokens->Increment();
  const bool loop_stop = LoopShouldStop(req, c, t.token_id());
  v1::GenerateResponse msg;
  msg.set_request_id(req.p.request_id);
  msg.set_index(c.index);
  msg.add_token_ids(t.token_id());
  if (req.p.logprobs) {
    v1::LogprobEntry* e = msg.add_logprobs();
    e->set_token_id(t.token_id());
    if (auto b = tok.TokenBytes(t.token_id()); b.ok()) e->set_token_bytes(*b);
    e->set_logprob(t.logprob());
    for (const v1::TokenLogprob& a : t.top_logprobs()) *e->add_top_logprobs() = a;
  }
  std::string text;
  v1::FinishReason finish = v1::FINISH_REASON_UNSPECIFIED;
  if (kind != StopTokens::Kind::kNone) {
    // The stop token's own text is not returned, but what it completes is.
    text = c.matcher->Feed(c.decoder->Flush()).text;
    if (!c.matcher->stopped()) text += c.matcher->Finish();
    finish = v1::FINISH_REASON_STOP;
    if (c.matcher->stopped()) {
      msg.set_stop_string(c.matcher->stop_strings()[c.matcher->matched_stop()]);
    } else {
      msg.set_stop_token_id(t.token_id());
    }
  } else {
    absl::StatusOr<std::string> piece = c.decoder->Add(t.token_id());
    StopMatcher::Output o = c.matcher->Feed(piece.ok() ? *piece : std::string());
    text = std::move(o.text);
    if (c.matcher->stopped()) {
      finish = v1::FINISH_REASON_STOP;
      msg.set_stop_string(c.matcher->stop_strings()[o.matched_stop]);
    } else if (grammar_done || loop_stop ||
               static_cast<int>(c.generated.size()) >= req.p.max_tokens) {
      StopMatcher::Output rest = c.matcher->Feed(c.decoder->Flush());
      text += rest.text;
      if (c.matcher->stopped()) {
        finish = v1::FINISH_REASON_STOP;
        msg.set_stop_string(c.matcher->stop_strings()[rest.matched_stop]);
      } else {
        text += c.matcher->Finish();
        finish = grammar_done ? v1::FINISH_REASON_STOP
                 : loop_stop  ? v1::FINISH_REASON_LOOP
                              : v1::FINISH_REASON_LENGTH;
      }
    }
  }
  msg.set_text(std::move(text));
  if (finish != v1::FINISH_REASON_UNSPECIFIED) {
    msg.set_finish_reason(finish);
    c.finished = true;
    CountFinish(req, c, finish);
    if (--req.choices_left == 0) {
      v1::Usage* u = msg.mutable_usage();
      u->set_prompt_tokens(static_cast<int32_t>(req.p.prompt.size()));
      u->set_completion_tokens(req.completion_tokens);
      u->set_cached_tokens(static_cast<int32_t>(std::max<int64_t>(0, req.cached_tokens)));
    }
  }
  req.queue->Push(std::move(msg));
  if (finish != v1::FINISH_REASON_UNSPECIFIED && req.choices_left == 0) {
    req.Account(&GroupMetrics::requests_finished);
    req.queue->Finish(absl::OkStatus());
  }
  return finish != v1::FINISH_REASON_UNSPECIFIED;
}

}  // namespace ringlane::router
