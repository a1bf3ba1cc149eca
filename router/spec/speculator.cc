#include "router/spec/speculator.h"

#include <algorithm>
#include <cmath>
#include <utility>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"
#include "router/request/prepare.h"

namespace ringlane::router {

namespace {

// Decay per verify row of a lane's acceptance and of a source's group-wide
// one: a lane follows its text within a few rows, the group its workload.
constexpr double kLaneDecay = 0.8;
constexpr double kGlobalDecay = 0.98;
// Weight of the group-wide rate in a lane's estimate, in verify rows.
constexpr double kPriorRows = 2;
// Per-token over fixed round cost until the cost model has a fit (decode of
// a memory-bound model: a row costs a few percent of the weight reads).
constexpr double kDefaultTokenCostRatio = 0.05;
constexpr double kRoundDecay = 0.9;
constexpr int kProbeMin = 8;
constexpr int kProbeMax = 1024;
constexpr int kProbeDepth = 2;

}  // namespace

absl::StatusOr<std::unique_ptr<Speculator>> Speculator::Create(SpeculatorOptions options,
                                                               std::shared_ptr<SuffixCache> cache) {
  if (options.sources.empty()) return absl::InvalidArgumentError("no draft source named");
  if (options.max_drafts < 1 || options.max_drafts > kMaxDraftsPerStep) {
    return absl::InvalidArgumentError(absl::StrCat("max_drafts must be in [1, ", kMaxDraftsPerStep,
                                                   "], got ", options.max_drafts));
  }
  const DraftSourceOptions& so = options.source_options;
  if (so.ngram_min < 1 || so.ngram_max < so.ngram_min) {
    return absl::InvalidArgumentError("ngram sizes must satisfy 1 <= min <= max");
  }
  if (so.suffix_depth < 2 || so.suffix_max_pattern < 1 || so.suffix_window <= so.suffix_depth) {
    return absl::InvalidArgumentError("suffix trie: depth >= 2, pattern >= 1, window > depth");
  }
  std::vector<std::unique_ptr<DraftSource>> sources;
  for (const std::string& name : options.sources) {
    for (const auto& s : sources) {
      if (name == s->name()) return absl::InvalidArgumentError("draft source '" + name + "' twice");
    }
    if (name == "random" && so.vocab_size <= 0) {
      return absl::InvalidArgumentError("the random drafter needs the vocabulary size");
    }
    auto s = MakeDraftSource(name, so, cache);
    if (!s) {
      std::string known;
      for (const std::string& n : DraftSourceNames())
        absl::StrAppend(&known, known.empty() ? "" : ", ", n);
      return absl::InvalidArgumentError(
          absl::StrCat("unknown draft source '", name, "' (known: ", known, ")"));
    }
    sources.push_back(std::move(s));
  }
  return std::unique_ptr<Speculator>(new Speculator(std::move(options), std::move(sources)));
}

Speculator::Speculator(SpeculatorOptions options, std::vector<std::unique_ptr<DraftSource>> sources)
    : o_(std::move(options)),
      sources_(std::move(sources)),
      global_(sources_.size() * kMatchClasses) {
  for (const auto& s : sources_) {
    if (s->worker_proposed()) model_source_ = static_cast<int>(names_.size());
    names_.push_back(s->name());
  }
}

double Speculator::GlobalAcceptance(int rate) const {
  const Rate& g = global_[rate];
  // Half until the source has been seen: drafting starts, then learns.
  return (g.accepted + 1) / (g.accepted + g.rejections + 2);
}

double Speculator::SourceAcceptance(int source) const {
  Rate sum;
  for (int c = 0; c < kMatchClasses; ++c) {
    sum.accepted += global_[source * kMatchClasses + c].accepted;
    sum.rejections += global_[source * kMatchClasses + c].rejections;
  }
  return (sum.accepted + 1) / (sum.accepted + sum.rejections + 2);
}

double Speculator::Acceptance(const LaneSpec& lane, int rate) const {
  const Rate& r = lane.rates[rate];
  return (r.accepted + kPriorRows * GlobalAcceptance(rate)) /
         (r.accepted + r.rejections + kPriorRows);
}

double Speculator::AcceptanceAfterFull(const LaneSpec& lane, int rate) const {
  const Rate& r = lane.rates_after_full[rate];
  return (r.accepted + kPriorRows * Acceptance(lane, rate)) /
         (r.accepted + r.rejections + kPriorRows);
}

double Speculator::DraftUsPerToken() const {
  return draft_tokens_ > 0 ? draft_us_ / draft_tokens_ : 0;
}

void Speculator::ObserveDraftCost(double propose_us, int64_t tokens) {
  if (tokens <= 0 || propose_us < 0) return;
  draft_us_ = kRoundDecay * draft_us_ + propose_us;
  draft_tokens_ = kRoundDecay * draft_tokens_ + static_cast<double>(tokens);
}

void Speculator::BeginRound(int64_t decoding_lanes) {
  round_lanes_ = decoding_lanes;
  round_open_ = !o_.adaptive || !o_.gate || gate_.IsOpen(decoding_lanes);
  round_wanted_ = false;
  round_drafts_ = 0;
  round_expected_ = 0;
  round_draft_cost_ = 0;
}

DraftRoundTag Speculator::EndRound() {
  DraftRoundTag t;
  t.drafting_allowed = round_open_;
  if (!o_.adaptive || !o_.gate) return t;
  auto regime = DraftGate::Regime::kPlain;
  for (const auto& [id, ls] : lanes_) {
    if (ls.in_draft) {
      regime = DraftGate::Regime::kDrafting;
      break;
    }
    if (ls.probing) regime = DraftGate::Regime::kNeither;
  }
  t.tag = gate_.Tag(round_lanes_, regime, round_wanted_);
  return t;
}

double Speculator::LatencyRatio() const {
  return std::clamp(unpipelined_ratio_ / pipelined_ratio_, 1.0, 8.0);
}

DraftDecision Speculator::Plan(const Lane& lane, const DraftContext& ctx) {
  DraftDecision d;
  const PreparedRequest& p = lane.req->p;
  if (!p.speculative) return d;
  int cap = std::min(ctx.max_drafts, o_.max_drafts);
  if (p.max_drafts >= 0) cap = std::min(cap, p.max_drafts);
  if (cap <= 0) return d;
  LaneSpec& ls = lanes_[lane.id];
  if (ls.rates.empty()) {
    ls.rates.resize(sources_.size() * kMatchClasses);
    ls.rates_after_full.resize(sources_.size() * kMatchClasses);
  }
  if (ls.probe_interval == 0) ls.probe_interval = probe_start_;

  // The round's time with `tokens` tokens: measured per size where the
  // group has seen rounds of about that size (a verify row's cost is not
  // linear on a CPU), else fixed + per_token * tokens, in units of the fixed
  // part until the model is ready. A draft of the workers' draft model also
  // costs its proposal.
  const bool measured = ctx.cost != nullptr && ctx.cost->ready();
  auto round_cost = [&](int64_t tokens) {
    return measured ? ctx.cost->SmallRoundUs(tokens)
                    : 1.0 + kDefaultTokenCostRatio * static_cast<double>(tokens);
  };
  const double draft_cost = measured ? DraftUsPerToken() : 0.0;
  const int64_t lanes = std::max<int64_t>(1, ctx.decoding_lanes);
  const double n = static_cast<double>(lanes);

  // A lone lane drafts pipelined: its row may be rejected, and then its
  // next row, already planned behind it assuming every draft accepted, is
  // void, and the lane loses the trip its row after that waits for (the
  // measured unpipelined over pipelined period, less one).
  // Alone in the group, not only in the round (another lane may be waiting
  // for its verify result).
  const bool alone = round_lanes_ <= 1;
  const double void_cost = std::max(0.0, LatencyRatio() - 1.0);
  // A source that can draft only after the row in flight returns (the
  // workers' draft model) makes the lane wait: a row per unpipelined
  // period, or every other round while other lanes keep the pipeline.
  double rho = LatencyRatio();
  if (ctx.row_in_flight && ctx.decoding_lanes > 1) rho = std::max(rho, 2.0);

  int best = -1, best_k = 0, best_class = 0;
  bool best_waits = false;
  double best_value = -1e9, best_expect = 0, best_per_draft = 0;
  // What the best source's acceptance would give at full depth: the same
  // yardstick whether or not the gate lets the lane draft (a closed gate's
  // draft model proposes nothing to measure depth by).
  double potential = 0;
  std::vector<int32_t> best_tokens;
  for (size_t s = 0; s < sources_.size(); ++s) {
    const bool model = static_cast<int>(s) == model_source_;
    // Behind a row in flight, a source that drafts here continues the
    // assumed drafts, its first token standing for the row's last sample.
    const bool guess = ctx.row_in_flight && !model && alone;
    Proposal prop = guess ? sources_[s]->ProposeAfter(lane.id, lane.seq, ctx.assumed, cap + 1)
                          : sources_[s]->Propose(lane.id, lane.seq, cap);
    if (model && ctx.row_in_flight && !prop.pending) {
      // What it proposed follows the known sequence, which the row in
      // flight continues: the next proposal comes with its result.
      std::fill(prop.tokens.begin(), prop.tokens.end(), -1);
      prop.pending = true;
    }
    // While the gate is closed the draft model proposes nothing: what it
    // would be worth is judged from its acceptance at full depth.
    if (!round_open_ && model) {
      prop.tokens.assign(static_cast<size_t>(cap), 0);
      prop.pending = ctx.row_in_flight;
    }
    if (guess) {
      if (prop.tokens.size() < 2) continue;
      prop.tokens.erase(prop.tokens.begin());
    }
    if (prop.tokens.empty()) continue;
    // Placeholders count only for deciding whether to wait for them.
    if (prop.pending && !ctx.row_in_flight) continue;
    const int cls = MatchClass(prop.match_length);
    // Behind a row in flight drafts count only when that row is accepted
    // whole: their acceptance (and the guess's) is the one after such rows.
    const int rate_index = static_cast<int>(s) * kMatchClasses + cls;
    const double a_all = Acceptance(ls, rate_index);
    const double a_behind = guess ? AcceptanceAfterFull(ls, rate_index) : a_all;
    // The guessed sample is right about as often as a draft.
    const double g = guess ? a_behind : 1.0;
    double full = 0;
    for (int j = 0; j < cap; ++j) full = a_all * (1 + full);
    potential = std::max(potential, full);
    const double per_draft = model ? draft_cost : 0.0;
    // The depth that gives the round the most expected tokens per unit of
    // time: its N lanes' plain tokens plus what this lane gains over a
    // plain row, over the round's cost with the drafts' positions (and
    // proposals) added. Without adaptive depth, all the source proposes.
    // The lanes planned before this one in the round drafted too: their
    // positions are already in the round's size, their expected tokens in
    // its yield, so five lanes that each could draft 4 do not all draft 4
    // into a round that costs 4x at 25 positions.
    //
    // Two ways to draft behind a row in flight: now, continuing its drafts
    // (1 + g sum p^i tokens per row, and a void row whenever a draft is
    // rejected, all being accepted with chance g p^j), or after its result
    // (1 + sum p^i per rho), the only way for the workers' draft model.
    const double yield = n + round_expected_;
    const int64_t size = lanes + round_drafts_;
    const double base_rate = yield / std::max(1e-9, round_cost(size) + round_draft_cost_);
    const int len = static_cast<int>(prop.tokens.size());
    // Valued pipelined (a lone lane: drafts now, behind the row in flight
    // if any) or the way drafting was valued before rows were planned
    // behind verify rows: 1 + sum p^i per rho, waiting for the row in
    // flight, and always with other lanes decoding (their rows keep the
    // workers busy while this lane waits, and a round without its drafts
    // is cheaper for them: the gain of pipelining there was measured
    // negative, see README).
    const bool can_pipeline = alone && !prop.pending;
    const bool can_wait = !can_pipeline || (ctx.row_in_flight && o_.adaptive);
    for (const bool pipelined : {true, false}) {
      if (pipelined ? !can_pipeline : !can_wait) continue;
      const double a = pipelined ? a_behind : a_all;
      int k = 0;
      double expect = 0, term = 1, sum = 0, best_rate = base_rate;
      for (int j = 1; j <= len; ++j) {
        term *= a;
        sum += term;
        const double gain = pipelined ? (1 + g * sum) / (1 + (1 - g * term) * void_cost) - 1 : sum;
        const double rate =
            (yield + gain) / std::max(1e-9, round_cost(size + j) + round_draft_cost_ +
                                                per_draft * static_cast<double>(j));
        if (!o_.adaptive || rate > best_rate) {
          best_rate = rate;
          k = j;
          expect = gain;
        }
      }
      // In units of a plain row's tokens, above it when drafting pays.
      const double score = pipelined ? expect : (1 + expect) / rho - 1;
      if (score > best_value) {
        best = static_cast<int>(s);
        best_k = k;
        best_class = cls;
        best_waits = !pipelined && ctx.row_in_flight;
        best_value = score;
        best_expect = expect;
        best_per_draft = per_draft;
        best_tokens = prop.tokens;
      }
    }
  }
  ls.model_chosen = false;
  ls.in_draft = false;
  if (best < 0) {
    ++ls.rows_since_draft;
    return d;
  }
  const bool pays = !o_.adaptive || (best_k > 0 && best_value > 0);
  if (pays && o_.adaptive) {
    round_wanted_ = true;
    gate_.NoteWanted(round_lanes_, 1 + potential);
  }
  // The gate closed: no drafts, no probes, no proposals asked for.
  if (!round_open_) {
    ++ls.rows_since_draft;
    return d;
  }
  bool probe = false;
  if (!pays) {
    if (ls.rows_since_draft < ls.probe_interval) {
      ++ls.rows_since_draft;
      return d;
    }
    probe = true;
    best_k = std::min<int>(kProbeDepth, static_cast<int>(best_tokens.size()));
  }
  ls.model_chosen = best == model_source_;
  ls.model_depth = best_k;
  ls.in_draft = !probe;
  if (best_waits) {
    d.wait = true;
    return d;
  }
  ls.rows_since_draft = 0;
  ls.probing = probe;
  ls.drafted_class = best_class;
  round_drafts_ += best_k;
  round_expected_ += probe ? 0.0 : std::max(0.0, best_expect);
  round_draft_cost_ += best_per_draft * static_cast<double>(best_k);
  best_tokens.resize(best_k);
  d.tokens = std::move(best_tokens);
  d.source = best;
  return d;
}

int Speculator::ModelDraftCap(const Lane& lane, int max_drafts) const {
  const PreparedRequest& p = lane.req->p;
  if (model_source_ < 0 || !p.speculative) return 0;
  int cap = std::min(max_drafts, o_.max_drafts);
  if (p.max_drafts >= 0) cap = std::min(cap, p.max_drafts);
  return std::max(cap, 0);
}

int Speculator::ProposeDepth(const Lane& lane, int max_drafts) {
  const int cap = ModelDraftCap(lane, max_drafts);
  if (cap <= 0) return 0;
  if (o_.adaptive && !round_open_) return 0;
  auto it = lanes_.find(lane.id);
  // A new lane gets a full proposal: its first decision learns from it.
  if (!o_.adaptive || it == lanes_.end()) return cap;
  const LaneSpec& ls = it->second;
  // Proposals cost the workers draft passes: ask only where the lane's next
  // decision may use them (it chose the model, or a probe is due), one
  // deeper than it last used so that depth can grow.
  if (ls.model_chosen) return std::clamp(ls.model_depth + 1, std::min(kProbeDepth, cap), cap);
  if (ls.rows_since_draft >= ls.probe_interval) return std::min(kProbeDepth, cap);
  return 0;
}

bool Speculator::WantsPrefixTokens(const Lane& lane) {
  // Whether the draft model may ever be asked for this lane.
  return ModelDraftCap(lane, o_.max_drafts) > 0;
}

void Speculator::OnProposed(LaneId lane, int64_t seq_len, absl::Span<const int32_t> tokens) {
  if (model_source_ >= 0) sources_[model_source_]->OnProposed(lane, seq_len, tokens);
}

void Speculator::OnVerified(LaneId lane, int source, int drafted, int accepted) {
  if (source < 0 || source >= static_cast<int>(sources_.size()) || drafted <= 0) return;
  const double rejected = accepted < drafted ? 1 : 0;
  auto it = lanes_.find(lane);
  const int cls = it == lanes_.end() ? 0 : it->second.drafted_class;
  Rate& g = global_[source * kMatchClasses + cls];
  g.accepted = g.accepted * kGlobalDecay + accepted;
  g.rejections = g.rejections * kGlobalDecay + rejected;
  if (it == lanes_.end()) return;
  LaneSpec& ls = it->second;
  Rate& r = ls.rates[source * kMatchClasses + cls];
  r.accepted = r.accepted * kLaneDecay + accepted;
  r.rejections = r.rejections * kLaneDecay + rejected;
  if (ls.last_full) {
    Rate& f = ls.rates_after_full[source * kMatchClasses + cls];
    f.accepted = f.accepted * kLaneDecay + accepted;
    f.rejections = f.rejections * kLaneDecay + rejected;
  }
  ls.last_full = accepted == drafted;
  ls.in_draft = false;
  if (ls.probing) {
    ls.probe_interval = accepted > 0 ? kProbeMin : std::min(2 * ls.probe_interval, kProbeMax);
    probe_start_ = accepted > 0 ? kProbeMin : std::min(2 * probe_start_, kProbeMax);
    ls.probing = false;
  }
}

void Speculator::OnFinished(absl::Span<const int32_t> seq, int64_t prompt_len) {
  for (auto& s : sources_) s->Finished(seq, prompt_len);
}

void Speculator::Sweep(const SchedState& state) {
  if (lanes_.empty()) return;
  absl::flat_hash_set<LaneId> live;
  for (const auto& l : state.lanes) {
    if (!l->gone) live.insert(l->id);
  }
  for (auto it = lanes_.begin(); it != lanes_.end();) {
    if (live.contains(it->first)) {
      ++it;
      continue;
    }
    for (auto& s : sources_) s->Forget(it->first);
    lanes_.erase(it++);
  }
}

void Speculator::ObserveRound(const RoundObservation& round) {
  if (round.draft_tag >= 0 && round.prefilled_tokens == 0) {
    gate_.Observe(round.draft_tag, round.tokens, round.period_us);
  }
  // A round of void rows only (behind a rejected draft) enters with almost
  // no worker time and pulls the ratio toward 1; leaving it out measured
  // slower on copying, since the valuation is then too pessimistic (README,
  // "Pipelined verify rows"). Kept until the valuation follows runs of
  // acceptance.
  if (round.worker_us <= 0 || round.period_us <= 0) return;
  const double r = round.period_us / round.worker_us;
  double& mean = round.pipelined ? pipelined_ratio_ : unpipelined_ratio_;
  mean = kRoundDecay * mean + (1 - kRoundDecay) * r;
}

}  // namespace ringlane::router
