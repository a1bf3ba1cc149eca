// Speculative decoding's decisions for one worker group: which source
// drafts for a lane, how deep, and whether drafting pays at all. The planner
// asks it per decode row (Drafter::Plan); the group loop tells it what the
// workers accepted and how long rounds took.
//
// Exactness does not depend on anything here: the workers sample every
// verify position with that position's own counter-based random number and
// accept a draft only when it equals the sample, so output is what plain
// decode gives whatever is drafted. What depends on it is speed.
//
// Depth. For each source, a lane's acceptance p is the chance that a draft
// is accepted given the ones before it were: accepted drafts / (accepted +
// rejection events), decayed, over the lane's recent verify rows, with the
// source's group-wide rate as its prior. The j-th draft then adds p^j
// expected tokens and one position to a round shared by N decoding lanes
// (and by the drafts of the lanes planned before it in the round);
// by the round-cost model (fixed + per_token * tokens) it raises the
// round's tokens per microsecond while p^j > per_token * N / (fixed +
// per_token * N). So a lone memory-bound lane drafts deep, a full round
// shallow, and a source that is rarely right not at all. A draft the
// workers' draft model proposes costs its passes besides its verify
// position: measured per proposed token (RoundResult.draft_propose_time_us),
// the model source's j-th draft pays while p^j > (per_token + per_draft) *
// N / (fixed + per_token * N), so a draft model that is as dear as a round
// of the target drafts shallow or not at all, however often it is right.
// The linear cost model is right where decode is memory-bound; where it is
// compute-bound (a CPU worker with several lanes) a verify position costs
// a full token and drafting loses though every draft is accepted. So over
// all of this, a DraftGate measures per number of decoding lanes whether
// rounds with drafting give more tokens per second than rounds without,
// and where they do not, no lane drafts or asks the draft model for
// proposals (see draft_gate.h).
//
// Whether to draft. A lone decoding lane keeps its pipeline while it
// drafts: its next row is planned behind the verify row in flight, assuming
// every draft accepted, with drafts that continue the assumed ones (the
// first proposed token stands for the row's last sample, and is right with
// chance g = p; p here is the lane's acceptance over rows right after a row
// accepted whole, since these count only then, and acceptance comes in
// runs: a copied stretch, then the model wanders). When a draft is rejected
// that next row is void, and the lane loses the trip the row after it waits
// for: the measured ratio of unpipelined to pipelined round periods, less
// one (result-to-result time over the workers' own time, rounds that fed
// nothing left out). A row of j drafts gives (1 + g sum p^i) / (1 + (1 - g
// p^j) * loss) tokens per round against plain decode's one, and the depth
// is chosen on that. It may also wait for the row in flight and draft after
// it, 1 + sum p^i per unpipelined period, the only way for the workers'
// draft model. With other lanes decoding, a drafting lane waits for its
// verify result (it gets a row every other round: 1 + sum p^i against 2
// rounds) and drafts only where that beats it: their rows keep the workers
// busy meanwhile, and rounds without its drafts are cheaper for them
// (drafting pipelined there ran slower, see README). A lane that stopped
// drafting probes with two drafts after probe_interval decode rows, the
// interval doubling (to 1024) while probes fail, and a new lane starting
// from where the group's probes left it, so a source that becomes right
// again is noticed and one that never is costs almost nothing.
//
// Not thread-safe: the group's thread only.
#ifndef RINGLANE_ROUTER_SPEC_SPECULATOR_H_
#define RINGLANE_ROUTER_SPEC_SPECULATOR_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "router/sched/planner.h"
#include "router/spec/draft_gate.h"
#include "router/spec/draft_sources.h"

namespace ringlane::router {

struct SpeculatorOptions {
  // Source names (DraftSourceNames()), in order of preference on ties.
  std::vector<std::string> sources;
  int max_drafts = 8;
  // false: every decode row drafts as deep as its source proposes (up to
  // max_drafts), waiting for its row in flight; for tests that must see
  // drafts on every row.
  bool adaptive = true;
  // With adaptive depth: whether the measured gate (draft_gate.h) may stop
  // drafting at a lane count where it does not pay.
  bool gate = true;
  DraftSourceOptions source_options;
};

class Speculator final : public Drafter {
 public:
  // InvalidArgument for an unknown source or limits that cannot work.
  static absl::StatusOr<std::unique_ptr<Speculator>> Create(SpeculatorOptions options,
                                                            std::shared_ptr<SuffixCache> cache);

  DraftDecision Plan(const Lane& lane, const DraftContext& context) override;
  int ProposeDepth(const Lane& lane, int max_drafts) override;
  bool WantsPrefixTokens(const Lane& lane) override;
  void OnProposed(LaneId lane, int64_t seq_len, absl::Span<const int32_t> tokens) override;
  void OnVerified(LaneId lane, int source, int drafted, int accepted) override;
  void OnFinished(absl::Span<const int32_t> seq, int64_t prompt_len) override;
  void Sweep(const SchedState& state) override;
  void BeginRound(int64_t decoding_lanes) override;
  DraftRoundTag EndRound() override;
  void ObserveRound(const RoundObservation& round) override;
  void ObserveDraftCost(double propose_us, int64_t tokens) override;

  const std::vector<std::string>& source_names() const { return names_; }
  // The group-wide acceptance estimate of a source (the lanes' prior).
  double SourceAcceptance(int source) const;
  // Unpipelined over pipelined round period, as measured (>= 1).
  double LatencyRatio() const;
  // The workers' measured microseconds per proposed draft token (0 until
  // measured).
  double DraftUsPerToken() const;
  const DraftGate& gate() const { return gate_; }
  size_t lanes() const { return lanes_.size(); }

 private:
  struct Rate {
    double accepted = 0;
    double rejections = 0;
  };
  // Acceptance is kept per source and per match-length class: a 12-token
  // match in the outputs cache (a resend) is right far more often than a
  // 2-token one, and a lane must not inherit the short matches' rate.
  static constexpr int kMatchClasses = 3;
  static int MatchClass(int match_length) {
    return match_length >= 8 ? 2 : match_length >= 4 ? 1 : 0;
  }
  struct LaneSpec {
    std::vector<Rate> rates;  // per source and match class
    // The same, of verify rows right after one whose drafts were all
    // accepted: acceptance comes in runs (a copied stretch, then the model
    // wanders), and a row planned behind a verify row in flight counts only
    // when that row was accepted whole.
    std::vector<Rate> rates_after_full;
    bool last_full = false;  // the last verified row accepted every draft
    int rows_since_draft = 0;
    int drafted_class = 0;   // of the row in flight
    int probe_interval = 0;  // 0 until the lane's first decision
    bool probing = false;
    // The workers' draft model was the lane's choice at its last decision
    // (to draft or to wait for drafts), with this many drafts.
    bool model_chosen = false;
    int model_depth = 0;
    // Drafted at the depth chosen (not a probe), or waits to: until its
    // verify result is in, the group's rounds are drafting rounds.
    bool in_draft = false;
  };
  Speculator(SpeculatorOptions options, std::vector<std::unique_ptr<DraftSource>> sources);
  double Acceptance(const LaneSpec& lane, int rate) const;
  // Acceptance after a row accepted whole, with Acceptance as its prior.
  double AcceptanceAfterFull(const LaneSpec& lane, int rate) const;
  // The most drafts the workers' draft model may propose for `lane` under
  // `max_drafts`: the flag's and the request's limits; 0 without a model
  // source or where the request does not speculate.
  int ModelDraftCap(const Lane& lane, int max_drafts) const;
  double GlobalAcceptance(int rate) const;

  const SpeculatorOptions o_;
  std::vector<std::unique_ptr<DraftSource>> sources_;
  std::vector<std::string> names_;
  // The source the workers draft for ("model"), or -1.
  int model_source_ = -1;
  std::vector<Rate> global_;
  absl::flat_hash_map<LaneId, LaneSpec> lanes_;
  // Decayed means of result-to-result period over worker time.
  // Where a new lane's probe interval starts: doubled by every failed probe
  // of the group, back to the minimum on a successful one, so a source that
  // is wrong for every lane is not re-probed by each new request.
  int probe_start_ = 8;
  double unpipelined_ratio_ = 1.5;
  double pipelined_ratio_ = 1.0;
  // Decayed sums of the draft model's proposing time and proposed tokens.
  double draft_us_ = 0;
  double draft_tokens_ = 0;
  DraftGate gate_;
  // The round being planned: its decoding lanes, whether the gate lets it
  // draft, and whether a lane wanted to.
  int64_t round_lanes_ = 1;
  bool round_open_ = true;
  bool round_wanted_ = false;
  // What the lanes planned so far in the round drafted: positions, expected
  // accepted drafts, and the draft model's proposing time for them (from
  // BeginRound, which the planner calls before every round's Plan calls).
  int64_t round_drafts_ = 0;
  double round_expected_ = 0;
  double round_draft_cost_ = 0;
};

}  // namespace ringlane::router

#endif  // RINGLANE_ROUTER_SPEC_SPECULATOR_H_
