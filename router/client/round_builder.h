// The one place that spells LaneStep rows (proto/ringlane/v1/worker.proto):
// prefill chunks, decode rows with or without drafts to verify, release
// rows. Used by the router's planner, the test drivers and the tools, so
// that every client of a worker group sends rows the same way.
#ifndef RINGLANE_ROUTER_CLIENT_ROUND_BUILDER_H_
#define RINGLANE_ROUTER_CLIENT_ROUND_BUILDER_H_

#include <cstdint>

#include "absl/types/span.h"
#include "ringlane/v1/worker.pb.h"

namespace ringlane::router {

// A prefill chunk: `tokens` at positions [start, start + tokens.size()),
// sampling after the last one when `sample_last` (the prompt's final chunk).
// `block_table` is the lane's whole table; the row gets the blocks covering
// its last position.
ringlane::v1::LaneStep* AddPrefillRow(ringlane::v1::RoundPlan* plan, uint64_t lane_id,
                                      int64_t start, absl::Span<const int32_t> tokens,
                                      bool sample_last, absl::Span<const int32_t> block_table,
                                      int32_t block_size);

// A decode row at `start`: the lane's last sampled token, then `drafts` to
// verify (sampling at every position; none = plain decode).
ringlane::v1::LaneStep* AddDecodeRow(ringlane::v1::RoundPlan* plan, uint64_t lane_id, int64_t start,
                                     absl::Span<const int32_t> drafts,
                                     absl::Span<const int32_t> block_table, int32_t block_size);

// A row that only drops the lane's worker state.
ringlane::v1::LaneStep* AddReleaseRow(ringlane::v1::RoundPlan* plan, uint64_t lane_id);

// The first row of a lane carries its sampling parameters and choice index,
// and, for a choice re-admitted after a preemption, the tokens it generated
// before (the tail of the lane's prompt), which the workers count for
// penalties.
void SetLaneParams(ringlane::v1::LaneStep* row, const ringlane::v1::SamplingParams& sampling,
                   int32_t choice_index, absl::Span<const int32_t> earlier_output = {});

// Positions a row feeds.
int64_t RowTokens(const ringlane::v1::LaneStep& row);
// Draft tokens a decode row carries.
int64_t RowDrafts(const ringlane::v1::LaneStep& row);
// Tokens a row samples at most: 0, 1, or drafts + 1 for a verify row.
int64_t RowMaxSamples(const ringlane::v1::LaneStep& row);

}  // namespace ringlane::router

#endif  // RINGLANE_ROUTER_CLIENT_ROUND_BUILDER_H_
