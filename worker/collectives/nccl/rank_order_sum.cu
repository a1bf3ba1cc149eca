// Built by nvcc with --fmad=false -ftz=false (worker/CMakeLists.txt): the
// sum must round exactly as the host's SumInRankOrder does.
#include <algorithm>

#include "worker/collectives/nccl/rank_order_sum.h"

namespace ringlane::worker {
namespace {

// One thread per element at a time; the loop over ranks is the reduction
// order and never depends on count or the launch shape.
__global__ void RankOrderSumKernel(const float* __restrict__ parts, int ranks, size_t count,
                                   float* __restrict__ out) {
  const size_t stride = static_cast<size_t>(gridDim.x) * blockDim.x;
  for (size_t i = static_cast<size_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < count;
       i += stride) {
    float acc = parts[i];
    // __fadd_rn: round-to-nearest and never merged into anything else.
    for (int r = 1; r < ranks; ++r) acc = __fadd_rn(acc, parts[static_cast<size_t>(r) * count + i]);
    out[i] = acc;
  }
}

}  // namespace

cudaError_t LaunchRankOrderSum(const float* parts, int ranks, size_t count, float* out,
                               cudaStream_t stream) {
  if (count == 0) return cudaSuccess;
  constexpr int kThreads = 256;
  // Enough blocks to fill a GPU; bigger messages loop in the grid stride.
  const size_t blocks = std::min<size_t>((count + kThreads - 1) / kThreads, 4096);
  RankOrderSumKernel<<<static_cast<unsigned>(blocks), kThreads, 0, stream>>>(parts, ranks, count,
                                                                             out);
  return cudaGetLastError();
}

}  // namespace ringlane::worker
