// What every model graph does around its layers: number the round's rows
// (RoundRows) at the start, and at the end compute the logits of the rows the
// round asks for through the vocabulary-parallel head. One per graph, driven
// by its backend's step thread; not thread-safe. Keeps its arrays between
// rounds so that a round allocates nothing once they are large enough.
#ifndef RINGLANE_WORKER_GRAPH_ROUND_INDEX_H_
#define RINGLANE_WORKER_GRAPH_ROUND_INDEX_H_

#include <cstdint>
#include <vector>

#include "absl/status/status.h"
#include "worker/backend/ops.h"
#include "worker/model/model.h"
#include "worker/round.h"

namespace ringlane::worker {

class RoundIndex {
 public:
  // Numbers the rows of `round` (its sequences' new tokens back to back) and
  // starts the round on `ops`. Returns the number of rows.
  int64_t Begin(const RoundInput& round, ComputeOps* ops);

  // First row of each sequence, in the round's order.
  const std::vector<int64_t>& seq_row0() const { return seq_row0_; }

  // The logits of the rows the round's logit_offsets name, into out->logits,
  // from the residual stream x ([rows][hidden]): final norm, then lm_head,
  // vocabulary-parallel over the group when `model` is a shard. Uses scratch
  // slots first_slot .. first_slot + 4. Errors: the group's all-gather's.
  absl::Status Head(const ModelWeights& model, const RoundInput& round, const float* x,
                    int first_slot, ComputeOps* ops, RoundOutput* out);

 private:
  std::vector<int32_t> tokens_;
  std::vector<int64_t> positions_;
  std::vector<int> row_seq_;
  std::vector<int64_t> seq_row0_;
  std::vector<int64_t> want_;  // rows whose logits are asked for
};

}  // namespace ringlane::worker

#endif  // RINGLANE_WORKER_GRAPH_ROUND_INDEX_H_
