#include "router/sched/applier.h"

#include <algorithm>
#include <utility>
#include <vector>

#include "absl/container/inlined_vector.h"
#include "absl/strings/str_cat.h"
#include "router/client/round_builder.h"
#include "services/log.h"

namespace ringlane::router {

namespace v1 = ringlane::v1;

void ReleaseLane(SchedState& state, KvBlockManager& kv, Lane& lane) {
  kv.Release(lane.id).IgnoreError();
  state.pending_release.push_back(lane.id);
  lane.gone = true;
}

namespace {

// Registers the lane's full blocks up to `fed` positions. `accepted` are
// drafts the workers just accepted, inputs past lane.seq's end.
void Commit(KvBlockManager& kv, Lane& lane, int64_t fed, absl::Span<const int32_t> accepted) {
  const int64_t full = fed / kv.block_size_tokens();
  if (full <= lane.committed_blocks) {
    if (!kv.reuses_partial_blocks()) return;
    // The positions of the partly filled block, for a resend to reuse once
    // the lane is released: at most a block of tokens, so no copy of seq.
    absl::InlinedVector<int32_t, 64> tail;
    const int64_t seq_len = static_cast<int64_t>(lane.seq.size());
    for (int64_t p = lane.committed_blocks * kv.block_size_tokens(); p < fed; ++p) {
      if (p < seq_len) {
        tail.push_back(lane.seq[static_cast<size_t>(p)]);
      } else if (p - seq_len < static_cast<int64_t>(accepted.size())) {
        tail.push_back(accepted[static_cast<size_t>(p - seq_len)]);
      } else {
        return;  // not every token is known (cannot happen; see below)
      }
    }
    if (absl::Status st = kv.CommitTail(lane.id, tail); !st.ok()) {
      RL_LOG(ERROR) << "tail commit of lane " << lane.id << ": " << st;
    }
    return;
  }
  std::vector<int32_t> tokens;
  absl::Span<const int32_t> fed_tokens = lane.seq;
  if (!accepted.empty()) {
    tokens = lane.seq;
    tokens.insert(tokens.end(), accepted.begin(), accepted.end());
    fed_tokens = tokens;
  }
  if (static_cast<int64_t>(fed_tokens.size()) < fed) {
    // Results arrive in plan order, so every token fed is known by now.
    RL_LOG(ERROR) << "lane " << lane.id << " fed " << fed << " positions but knows "
                  << fed_tokens.size() << " tokens; not committing";
    return;
  }
  absl::Status st = kv.CommitFullBlocks(lane.id, fed_tokens.subspan(0, static_cast<size_t>(fed)));
  if (!st.ok()) RL_LOG(ERROR) << "commit of lane " << lane.id << ": " << st;
  lane.committed_blocks = full;
}

}  // namespace

AppliedRound ApplyRoundResult(const PlannedRound& round, const v1::RoundResult& result,
                              SchedState& state, KvBlockManager& kv, ResultSink& sink,
                              absl::Span<PlannedRound* const> later) {
  AppliedRound applied;
  for (const PlannedRow& row : round.rows) {
    if (Lane* lane = state.Find(row.lane)) {
      --lane->rows_in_flight;
      if (row.voided) {
        --lane->void_rows;
      } else if (row.drafts > 0) {
        --lane->verify_rows_in_flight;
      }
    }
  }
  if (result.error().code() != 0) {
    RL_LOG(ERROR) << "worker group rejected round " << result.round_id() << ": "
                  << result.error().message();
    for (const PlannedRow& row : round.rows) {
      if (Lane* lane = state.Find(row.lane)) {
        lane->req->Fail(absl::InternalError(
            absl::StrCat("the workers rejected a round: ", result.error().message())));
      }
    }
    return applied;
  }
  for (size_t i = 0; i < round.rows.size(); ++i) {
    if (round.rows[i].voided) continue;  // the workers fed none of it
    const v1::LaneStep& row = round.plan.rows(round.rows[i].plan_row);
    const int64_t n = RowTokens(row);
    applied.tokens += n;
    applied.attended += AttendedPairs(row.start_position(), n);
  }
  // Verify rows: how many drafts each lane kept.
  std::vector<int64_t> accepted(round.rows.size(), 0);
  for (size_t i = 0; i < round.rows.size(); ++i) {
    const PlannedRow& row = round.rows[i];
    if (row.drafts == 0 || row.voided) continue;
    for (const v1::LaneOutput& o : result.outputs()) {
      if (o.lane_id() == row.lane)
        accepted[i] = std::min<int64_t>(o.accepted_draft_count(), row.drafts);
    }
  }
  applied.sampling_rows = result.outputs_size();
  sink.OnSamplingRows(applied.sampling_rows);
  sink.OnVerified(accepted);
  // Roll back and commit before the tokens can finish and release a lane, so
  // a finished request's blocks stay cached for a resend.
  for (size_t i = 0; i < round.rows.size(); ++i) {
    const PlannedRow& row = round.rows[i];
    Lane* lane = state.Find(row.lane);
    if (lane == nullptr || row.voided) continue;
    int64_t written = row.fed_after;
    absl::Span<const int32_t> kept;
    if (row.drafts > 0) {
      // Positions past the last accepted draft hold garbage KV: the lane
      // continues right after it, and their blocks go back.
      written = row.start + 1 + accepted[i];
      if (accepted[i] < row.drafts) {
        // Every later row of the lane in flight was planned assuming these
        // drafts accepted: the workers skip them (assume_accepted).
        lane->fed = written;
        for (PlannedRound* r : later) {
          for (PlannedRow& next : r->rows) {
            if (next.lane != lane->id || next.voided) continue;
            next.voided = true;
            ++lane->void_rows;
            if (next.drafts > 0) --lane->verify_rows_in_flight;
          }
        }
        if (lane->void_rows != lane->rows_in_flight) {
          RL_LOG(ERROR) << "lane " << lane->id << " has " << lane->rows_in_flight
                        << " rows in flight but " << lane->void_rows << " voided";
        }
      }
      if (absl::Status st = kv.TrimSlots(lane->id, lane->fed); !st.ok()) {
        RL_LOG(ERROR) << "rollback of lane " << lane->id << ": " << st;
      }
    }
    if (accepted[i] > 0) {
      const v1::LaneStep& step = round.plan.rows(row.plan_row);
      kept = absl::MakeConstSpan(step.token_ids().data(), static_cast<size_t>(accepted[i]));
    }
    Commit(kv, *lane, written, kept);
  }
  for (const v1::LaneOutput& o : result.outputs()) {
    // A lane that finished or was dropped while this round was in flight:
    // what it sampled is past its end.
    Lane* lane = state.Find(o.lane_id());
    if (lane == nullptr) continue;
    if (std::any_of(round.rows.begin(), round.rows.end(),
                    [&](const PlannedRow& r) { return r.lane == o.lane_id() && r.voided; })) {
      RL_LOG(ERROR) << "the workers ran a row of lane " << o.lane_id()
                    << " that a rejected draft voided; its tokens are dropped";
      continue;
    }
    if (o.tokens_size() > 0) sink.OnLaneTokens(*lane, o.tokens_size());
    for (const v1::SampledToken& t : o.tokens()) {
      lane->seq.push_back(t.token_id());
      if (sink.OnToken(*lane, t)) {
        ReleaseLane(state, kv, *lane);
        break;
      }
    }
  }
  state.Compact();
  applied.accepted_by_row = std::move(accepted);
  return applied;
}

}  // namespace ringlane::router
