#include "router/client/round_builder.h"

#include <algorithm>

namespace ringlane::router {

namespace v1 = ringlane::v1;

namespace {

void AddBlocks(v1::LaneStep* row, int64_t end, absl::Span<const int32_t> table,
               int32_t block_size) {
  const int64_t blocks =
      std::min<int64_t>(static_cast<int64_t>(table.size()), (end + block_size - 1) / block_size);
  row->mutable_block_ids()->Add(table.begin(), table.begin() + blocks);
}

}  // namespace

v1::LaneStep* AddPrefillRow(v1::RoundPlan* plan, uint64_t lane_id, int64_t start,
                            absl::Span<const int32_t> tokens, bool sample_last,
                            absl::Span<const int32_t> block_table, int32_t block_size) {
  v1::LaneStep* row = plan->add_rows();
  row->set_lane_id(lane_id);
  row->set_start_position(start);
  row->mutable_token_ids()->Add(tokens.begin(), tokens.end());
  row->set_sample_last(sample_last);
  AddBlocks(row, start + static_cast<int64_t>(tokens.size()), block_table, block_size);
  return row;
}

v1::LaneStep* AddDecodeRow(v1::RoundPlan* plan, uint64_t lane_id, int64_t start,
                           absl::Span<const int32_t> drafts, absl::Span<const int32_t> block_table,
                           int32_t block_size) {
  v1::LaneStep* row = plan->add_rows();
  row->set_lane_id(lane_id);
  row->set_start_position(start);
  row->set_use_last_sampled(true);
  if (drafts.empty()) {
    row->set_sample_last(true);
  } else {
    row->mutable_token_ids()->Add(drafts.begin(), drafts.end());
    for (int32_t o = 0; o <= static_cast<int32_t>(drafts.size()); ++o) row->add_verify_offsets(o);
  }
  AddBlocks(row, start + 1 + static_cast<int64_t>(drafts.size()), block_table, block_size);
  return row;
}

v1::LaneStep* AddReleaseRow(v1::RoundPlan* plan, uint64_t lane_id) {
  v1::LaneStep* row = plan->add_rows();
  row->set_lane_id(lane_id);
  row->set_release_lane(true);
  return row;
}

void SetLaneParams(v1::LaneStep* row, const v1::SamplingParams& sampling, int32_t choice_index,
                   absl::Span<const int32_t> earlier_output) {
  *row->mutable_sampling() = sampling;
  row->set_choice_index(choice_index);
  row->mutable_earlier_output_token_ids()->Add(earlier_output.begin(), earlier_output.end());
}

int64_t RowTokens(const v1::LaneStep& row) {
  return (row.use_last_sampled() ? 1 : 0) + row.token_ids_size();
}

int64_t RowDrafts(const v1::LaneStep& row) {
  return row.use_last_sampled() ? row.token_ids_size() : 0;
}

int64_t RowMaxSamples(const v1::LaneStep& row) {
  if (row.verify_offsets_size() > 0) return row.verify_offsets_size();
  return row.sample_last() ? 1 : 0;
}

}  // namespace ringlane::router
