// The device half of NcclCommunicator::AllReduceSum, in its own .cu file so
// that only it goes through nvcc.
#ifndef RINGLANE_WORKER_COLLECTIVES_NCCL_RANK_ORDER_SUM_H_
#define RINGLANE_WORKER_COLLECTIVES_NCCL_RANK_ORDER_SUM_H_

#include <cuda_runtime.h>

#include <cstddef>

namespace ringlane::worker {

// Queues out[i] = ((parts[i] + parts[count + i]) + ...) over `ranks` parts
// on `stream`: the order of SumInRankOrder, with the same IEEE single
// additions, so the bits equal the host's (no contraction, no flush to zero).
// `out` must not overlap `parts`. Returns the launch error, if any.
cudaError_t LaunchRankOrderSum(const float* parts, int ranks, size_t count, float* out,
                               cudaStream_t stream);

}  // namespace ringlane::worker

#endif  // RINGLANE_WORKER_COLLECTIVES_NCCL_RANK_ORDER_SUM_H_
