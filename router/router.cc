#include "router/router.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "router/client/worker_group.h"
#include "services/log.h"

namespace ringlane::router {

namespace v1 = ringlane::v1;

Router::Router(RouterOptions options, std::unique_ptr<Tokenizer> tokenizer)
    : options_(std::move(options)),
      tokenizer_(std::move(tokenizer)),
      preparer_({.default_temperature = options_.default_temperature,
                 .seed_policy = options_.seed_policy,
                 .max_choices = options_.max_choices,
                 .max_tokens_default = options_.max_tokens_default,
                 .loop_watchdog = options_.loop_watchdog.enabled,
                 .max_request_id_bytes = options_.max_request_id_bytes,
                 .max_session_id_bytes = options_.max_session_id_bytes,
                 .max_stop_bytes = options_.max_stop_bytes},
                tokenizer_.get(), &options_.chat_template),
      created_unix_s_(absl::ToUnixSeconds(absl::Now())) {}

absl::StatusOr<std::unique_ptr<Router>> Router::Create(RouterOptions options,
                                                       std::unique_ptr<Tokenizer> tokenizer) {
  if (!tokenizer) return absl::InvalidArgumentError("no tokenizer");
  if (options.groups.empty()) return absl::InvalidArgumentError("no worker groups");
  for (const auto& g : options.groups) {
    if (g.empty()) return absl::InvalidArgumentError("a worker group without addresses");
  }
  if (options.max_lanes < 1 || options.max_lanes >= options.round_token_budget) {
    return absl::InvalidArgumentError(absl::StrCat(
        "max_lanes must be in [1, round_token_budget) so that a round holding every decode row "
        "still has room for a prompt chunk; got ",
        options.max_lanes, " with a budget of ", options.round_token_budget));
  }
  if (options.max_waiting < 1) return absl::InvalidArgumentError("max_waiting must be >= 1");
  if (auto loop = LoopDetector::Create(options.loop_watchdog); !loop.ok()) {
    return absl::InvalidArgumentError(absl::StrCat("loop watchdog: ", loop.status().message()));
  }
  if (options.min_prefill_chunk < 1) {
    return absl::InvalidArgumentError("min_prefill_chunk must be >= 1");
  }
  if (options.round_deadline < std::chrono::milliseconds(1)) {
    return absl::InvalidArgumentError("round_deadline must be positive");
  }
  if (options.pipeline_depth < 1 || options.pipeline_depth > 2) {
    return absl::InvalidArgumentError(
        absl::StrCat("pipeline_depth must be 1 or 2, got ", options.pipeline_depth));
  }
  std::unique_ptr<Router> r(new Router(std::move(options), std::move(tokenizer)));
  if (!r->options_.round_log_path.empty()) {
    absl::MutexLock l(&r->log_mu_);
    r->round_log_.open(r->options_.round_log_path, std::ios::out | std::ios::trunc);
    if (!r->round_log_) {
      return absl::InvalidArgumentError(
          absl::StrCat("round_log: cannot write ", r->options_.round_log_path));
    }
  }
  const bool speculative = !r->options_.speculation.sources.empty();
  if (speculative) {
    SpeculatorOptions so = r->options_.speculation;
    so.source_options.vocab_size = r->tokenizer_->vocab_size();
    if (so.source_options.suffix_cache_tokens > 0) {
      r->suffix_cache_ = std::make_shared<SuffixCache>(so.source_options.suffix_depth,
                                                       so.source_options.suffix_cache_tokens);
    }
    for (size_t i = 0; i < r->options_.groups.size(); ++i) {
      auto s = Speculator::Create(so, r->suffix_cache_);
      if (!s.ok()) {
        return absl::InvalidArgumentError(absl::StrCat("speculation: ", s.status().message()));
      }
      r->speculators_.push_back(std::move(*s));
    }
    RL_LOG(INFO) << "speculative decoding: drafters " << absl::StrJoin(so.sources, ",")
                 << ", up to " << so.max_drafts << " drafts per step"
                 << (so.adaptive ? ", adaptive depth" : ", fixed depth");
  }
  if (r->options_.mask_threads > 1) {
    r->mask_pool_ = std::make_unique<TaskPool>(r->options_.mask_threads);
  }
  for (size_t i = 0; i < r->options_.groups.size(); ++i) {
    GroupLoopOptions g;
    g.index = i;
    g.addresses = r->options_.groups[i];
    g.planner = {.round_token_budget = r->options_.round_token_budget,
                 .itl_target_ms = r->options_.itl_target_ms,
                 .min_prefill_chunk = r->options_.min_prefill_chunk,
                 .max_lanes = r->options_.max_lanes,
                 .max_drafts = speculative ? r->options_.speculation.max_drafts : 0,
                 .group_index = i,
                 .mask_pool = r->mask_pool_.get()};
    g.max_waiting = r->options_.max_waiting;
    g.pipeline_depth = r->options_.pipeline_depth;
    g.connect_timeout = r->options_.connect_timeout;
    g.reconnect_pause = r->options_.reconnect_pause;
    g.kv_tiering = r->options_.kv_tiering;
    g.partial_block_reuse = r->options_.partial_block_reuse;
    GroupLoopHooks hooks;
    hooks.connect = r->options_.connect;
    if (!hooks.connect) {
      const WorkerGroupOptions wo{.round_deadline = r->options_.round_deadline};
      hooks.connect =
          [wo](const std::vector<std::string>& addresses,
               std::chrono::milliseconds timeout) -> absl::StatusOr<std::unique_ptr<WorkerGroup>> {
        auto c = WorkerGroupClient::Connect(addresses, timeout, wo);
        if (!c.ok()) return c.status();
        return std::unique_ptr<WorkerGroup>(std::move(*c));
      };
    }
    Router* router = r.get();
    hooks.on_connected = [router, i](const v1::WorkerInfo& info) {
      return router->OnGroupConnected(i, info);
    };
    if (speculative) hooks.drafter = r->speculators_[i].get();
    if (!r->options_.round_log_path.empty()) {
      hooks.round_log = [router](const std::string& line) { router->WriteRoundLog(line); };
    }
    r->groups_.push_back(
        std::make_unique<GroupLoop>(std::move(g), std::move(hooks), r->tokenizer_.get()));
  }
  for (auto& g : r->groups_) g->Start();
  return r;
}

Router::~Router() {
  for (auto& g : groups_) g->Stop();
}

absl::StatusOr<GroupMetrics> Router::OnGroupConnected(size_t index, const v1::WorkerInfo& info) {
  if (info.vocab_size() < tokenizer_->vocab_size()) {
    return absl::FailedPreconditionError(absl::StrCat(
        "the workers' vocabulary (", info.vocab_size(), ") is smaller than the tokenizer's (",
        tokenizer_->vocab_size(), "): wrong --tokenizer?"));
  }
  if (info.limits().max_top_logprobs() <= 0) {
    return absl::FailedPreconditionError(
        "the workers advertise no sampling limits (WorkerInfo.limits): an older worker?");
  }
  if (!speculators_.empty()) {
    const auto& names = speculators_[index]->source_names();
    if (std::find(names.begin(), names.end(), "model") != names.end()) {
      if (info.max_proposed_drafts() <= 0) {
        RL_LOG(WARNING) << "group " << index
                        << ": --spec_drafters names model, but its workers run no draft model "
                           "(start rank 0 with --draft_model); that source stays silent";
      } else {
        RL_LOG(INFO) << "group " << index << ": draft model " << info.draft_model_id()
                     << " proposes up to " << info.max_proposed_drafts() << " tokens";
      }
    }
  }
  absl::MutexLock l(&info_mu_);
  if (!model_) {
    ModelDescription m;
    m.model_id = options_.model_id.empty() ? info.model_id() : options_.model_id;
    m.max_context_tokens = info.max_context_tokens();
    m.vocab_size = info.vocab_size();
    m.eos_ids = tokenizer_->StopIds();
    if (info.eos_token_id() >= 0) m.eos_ids.push_back(info.eos_token_id());
    m.limits = info.limits();
    model_ = std::move(m);
  }
  return metrics_.ForGroup(
      model_->model_id, static_cast<int>(index),
      speculators_.empty() ? std::vector<std::string>{} : speculators_[index]->source_names());
}

std::optional<ModelDescription> Router::model() const {
  absl::MutexLock l(&info_mu_);
  return model_;
}

std::vector<GroupState> Router::groups() const {
  std::vector<GroupState> out;
  for (const auto& g : groups_) out.push_back(g->State());
  return out;
}

bool Router::any_ready() const {
  for (const auto& g : groups_) {
    if (g->State().ready) return true;
  }
  return false;
}

std::string Router::WhyNotReady() const {
  std::vector<std::string> why;
  for (const auto& g : groups_) why.push_back(g->Describe());
  return absl::StrJoin(why, "; ");
}

void Router::WriteRoundLog(const std::string& line) {
  absl::MutexLock l(&log_mu_);
  if (!round_log_.is_open()) return;
  round_log_ << line << '\n';
  round_log_.flush();
}

absl::StatusOr<v1::TokenizeResponse> Router::Tokenize(const v1::TokenizeRequest& request) const {
  std::optional<ModelDescription> m = model();
  return preparer_.Tokenize(request, m ? &*m : nullptr);
}

absl::StatusOr<PreparedRequest> Router::Prepare(const v1::GenerateRequest& request) const {
  std::optional<ModelDescription> m = model();
  if (!m) {
    return absl::UnavailableError(
        absl::StrCat("no worker group has connected yet (", WhyNotReady(), "); retry later"));
  }
  return preparer_.Prepare(request, *m);
}

absl::StatusOr<std::shared_ptr<const grammar::TokenMasker>> Router::Masker(
    const ModelDescription& m) {
  absl::MutexLock l(&masker_mu_);
  if (masker_) return masker_;
  absl::StatusOr<std::shared_ptr<const grammar::TokenVocabulary>> vocab =
      grammar::TokenVocabulary::FromTokenizer(*tokenizer_);
  if (!vocab.ok()) return vocab.status();
  masker_ = std::make_shared<grammar::TokenMasker>(*std::move(vocab), m.eos_ids);
  return masker_;
}

absl::Status Router::Submit(PreparedRequest request, std::shared_ptr<ResponseQueue> queue) {
  std::optional<ModelDescription> m = model();
  if (!m) return absl::UnavailableError("no worker group has connected yet");
  auto req = std::make_shared<RequestState>();
  req->queue = std::move(queue);
  if (request.grammar) {
    absl::StatusOr<std::shared_ptr<const grammar::TokenMasker>> masker = Masker(*m);
    if (!masker.ok()) return masker.status();
    req->masker = *std::move(masker);
    req->mask_bytes = (static_cast<size_t>(m->vocab_size) + 7) / 8;
    // The decoder below is primed with the prompt, so the output's first
    // token renders as it does mid-text unless the prompt is BOS alone.
    req->output_at_text_start =
        request.prompt.size() == 1 && request.prompt[0] == tokenizer_->bos_id();
  }
  auto stops =
      StopTokens::Create(request.stop_token_ids, m->eos_ids, request.ignore_eos, m->vocab_size);
  if (!stops.ok()) {
    return absl::InvalidArgumentError(absl::StrCat("stop_token_ids: ", stops.status().message()));
  }
  req->stop_tokens = std::move(*stops);
  req->choices.resize(request.n);
  req->choices_left = request.n;
  for (int i = 0; i < request.n; ++i) {
    Choice& c = req->choices[i];
    c.index = i;
    c.decoder = std::make_unique<IncrementalDecoder>(*tokenizer_);
    // Decoding the prompt first puts the decoder in the state the completion
    // continues from (llama2.c drops the space of a token after BOS).
    std::string prompt_text;
    for (int32_t id : request.prompt) {
      if (auto piece = c.decoder->Add(id); piece.ok()) prompt_text += *piece;
    }
    auto matcher = StopMatcher::Create(request.stop);
    if (!matcher.ok()) {
      return absl::InvalidArgumentError(absl::StrCat("stop: ", matcher.status().message()));
    }
    c.matcher = std::move(*matcher);
    if (request.grammar) c.grammar.emplace(request.grammar);
    if (request.loop_watchdog) {
      LoopWatchdogOptions lo = options_.loop_watchdog;
      lo.enabled = true;
      auto loop = LoopDetector::Create(lo);
      if (!loop.ok()) return loop.status();
      c.loop = std::move(*loop);
    }
    if (request.echo) {
      v1::GenerateResponse msg;
      msg.set_request_id(request.request_id);
      msg.set_index(i);
      msg.mutable_token_ids()->Add(request.prompt.begin(), request.prompt.end());
      msg.set_text(prompt_text);
      req->queue->Push(std::move(msg));
    }
  }
  req->p = std::move(request);

  absl::MutexLock l(&mu_);
  std::optional<size_t> chosen;
  if (!req->p.session_id.empty()) {
    auto it = sessions_.find(req->p.session_id);
    if (it != sessions_.end() && groups_[it->second]->ProbePrefix({}).ready) chosen = it->second;
  }
  if (!chosen) {
    GroupLoop::Probe best;
    for (size_t i = 0; i < groups_.size(); ++i) {
      GroupLoop::Probe p = groups_[i]->ProbePrefix(req->p.prompt);
      if (!p.ready) continue;
      if (!chosen || p.cached_tokens > best.cached_tokens ||
          (p.cached_tokens == best.cached_tokens && p.load < best.load)) {
        chosen = i;
        best = p;
      }
    }
  }
  if (!chosen) {
    return absl::UnavailableError(
        absl::StrCat("no worker group is ready (", WhyNotReady(), "); retry later"));
  }
  if (absl::Status st = groups_[*chosen]->Enqueue(req); !st.ok()) return st;
  if (!req->p.session_id.empty()) {
    // Forget sessions wholesale rather than track their ends: losing one only
    // costs a cache-aware placement instead of a sticky one.
    if (sessions_.size() >= 100000) sessions_.clear();
    sessions_[req->p.session_id] = *chosen;
  }
  return absl::OkStatus();
}

}  // namespace ringlane::router
