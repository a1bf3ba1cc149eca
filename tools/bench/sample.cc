#include "tools/bench/sample.h"

#include <cmath>
#include <string>

#include "absl/strings/str_cat.h"
#include "nlohmann/json.hpp"

namespace ringlane::bench {
namespace {

using json = nlohmann::json;

int64_t IntOr(const json& obj, const char* key, int64_t def) {
  if (!obj.is_object() || !obj.contains(key) || !obj.at(key).is_number_integer()) return def;
  return obj.at(key).get<int64_t>();
}

// Logprob entries of one choice, with their token texts; -1 when the choice
// has no logprobs. Completions: logprobs.tokens[]; chat:
// logprobs.content[].token.
int ReadLogprobs(const json& choice, Endpoint endpoint, std::vector<std::string>* tokens) {
  if (!choice.contains("logprobs") || !choice.at("logprobs").is_object()) return -1;
  const json& lp = choice.at("logprobs");
  if (endpoint == Endpoint::kChat) {
    if (!lp.contains("content") || !lp.at("content").is_array()) return -1;
    for (const json& e : lp.at("content")) {
      tokens->push_back(e.is_object() && e.contains("token") && e.at("token").is_string()
                            ? e.at("token").get<std::string>()
                            : std::string());
    }
    return static_cast<int>(lp.at("content").size());
  }
  const char* key = lp.contains("tokens") ? "tokens" : "token_logprobs";
  if (!lp.contains(key) || !lp.at(key).is_array()) return -1;
  for (const json& t : lp.at(key)) {
    tokens->push_back(t.is_string() ? t.get<std::string>() : std::string());
  }
  return static_cast<int>(lp.at(key).size());
}

}  // namespace

const char* TokenCheckName(TokenCheck check) {
  switch (check) {
    case TokenCheck::kVerified:
      return "verified";
    case TokenCheck::kMismatch:
      return "MISMATCH";
    case TokenCheck::kUnverified:
      return "unverified";
    case TokenCheck::kNoUsage:
      return "no-usage";
  }
  return "?";
}

void StreamAccumulator::OnEvent(std::string_view data, double t_ms) {
  sample_->streamed = true;
  std::string_view trimmed = data;
  while (!trimmed.empty() &&
         (trimmed.back() == ' ' || trimmed.back() == '\r' || trimmed.back() == '\n')) {
    trimmed.remove_suffix(1);
  }
  if (trimmed == "[DONE]") {
    sample_->done_marker = true;
    return;
  }
  OnObject(data, t_ms, /*whole=*/false);
}

void StreamAccumulator::OnWholeBody(std::string_view body, double t_ms) {
  OnObject(body, t_ms, /*whole=*/true);
}

void StreamAccumulator::OnObject(std::string_view data, double t_ms, bool whole) {
  json j = json::parse(data.begin(), data.end(), nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.is_object()) {
    if (sample_->error.empty()) {
      sample_->error = absl::StrCat("unparsable ", whole ? "body" : "event", ": ",
                                    std::string(data.substr(0, 200)));
    }
    return;
  }
  if (j.contains("error") && !j.at("error").is_null()) {
    const json& e = j.at("error");
    std::string message = e.is_object() && e.contains("message") && e.at("message").is_string()
                              ? e.at("message").get<std::string>()
                              : e.dump();
    if (sample_->error.empty()) sample_->error = "server error: " + message;
    return;
  }
  if (j.contains("usage") && j.at("usage").is_object()) {
    const json& u = j.at("usage");
    sample_->usage_prompt_tokens = IntOr(u, "prompt_tokens", sample_->usage_prompt_tokens);
    sample_->usage_completion_tokens =
        IntOr(u, "completion_tokens", sample_->usage_completion_tokens);
    if (u.contains("prompt_tokens_details") && u.at("prompt_tokens_details").is_object()) {
      sample_->usage_cached_tokens =
          IntOr(u.at("prompt_tokens_details"), "cached_tokens", sample_->usage_cached_tokens);
    }
  }
  if (!j.contains("choices") || !j.at("choices").is_array()) return;
  for (const json& choice : j.at("choices")) {
    // n = 1 only: a second choice would make chunk timing ambiguous.
    if (IntOr(choice, "index", 0) != 0) continue;
    std::string text;
    const char* holder = endpoint_ == Endpoint::kChat ? (whole ? "message" : "delta") : nullptr;
    const json* src = &choice;
    if (holder != nullptr) {
      src = choice.contains(holder) && choice.at(holder).is_object() ? &choice.at(holder) : nullptr;
    }
    const char* text_key = endpoint_ == Endpoint::kChat ? "content" : "text";
    if (src != nullptr && src->contains(text_key) && src->at(text_key).is_string()) {
      text = src->at(text_key).get<std::string>();
    }
    const int entries = ReadLogprobs(choice, endpoint_, &sample_->token_texts);
    if (!text.empty() || entries > 0) {
      sample_->text += text;
      sample_->chunks.push_back({t_ms, entries});
      if (std::isnan(sample_->ttft_ms)) sample_->ttft_ms = t_ms;
    }
    if (choice.contains("finish_reason") && choice.at("finish_reason").is_string()) {
      sample_->finish_reason = choice.at("finish_reason").get<std::string>();
    }
  }
}

void StreamAccumulator::Finish(double t_ms) {
  sample_->e2e_ms = t_ms;
  if (sample_->error.empty() && sample_->streamed && !sample_->done_marker &&
      sample_->finish_reason.empty()) {
    // Neither [DONE] nor a finish reason: the stream was cut off.
    sample_->error = "stream ended before a finish_reason or [DONE]";
  }
  FinalizeSample(sample_);
}

void FinalizeSample(RequestSample* s) {
  bool all_logprobs = !s->chunks.empty();
  int64_t counted = 0;
  for (const ChunkArrival& c : s->chunks) {
    all_logprobs = all_logprobs && c.logprob_tokens > 0;
    counted += c.logprob_tokens > 0 ? c.logprob_tokens : 0;
  }
  s->logprob_tokens = all_logprobs ? counted : -1;
  const bool has_usage = s->usage_completion_tokens >= 0;
  if (all_logprobs) {
    s->output_tokens = counted;
    s->check = !has_usage                              ? TokenCheck::kNoUsage
               : s->usage_completion_tokens == counted ? TokenCheck::kVerified
                                                       : TokenCheck::kMismatch;
  } else if (has_usage) {
    s->output_tokens = s->usage_completion_tokens;
    s->check = TokenCheck::kUnverified;
  } else {
    s->output_tokens = static_cast<int64_t>(s->chunks.size());
    s->check = TokenCheck::kNoUsage;
  }

  s->itl_ms.clear();
  for (size_t i = 1; i < s->chunks.size(); ++i) {
    const double gap = s->chunks[i].t_ms - s->chunks[i - 1].t_ms;
    const int k = all_logprobs ? s->chunks[i].logprob_tokens : 1;
    for (int t = 0; t < k; ++t) s->itl_ms.push_back(gap / k);
  }
  s->tpot_ms = kNaN;
  if (s->output_tokens >= 2 && !std::isnan(s->ttft_ms) && !std::isnan(s->e2e_ms)) {
    s->tpot_ms = (s->e2e_ms - s->ttft_ms) / static_cast<double>(s->output_tokens - 1);
  }
}

}  // namespace ringlane::bench
