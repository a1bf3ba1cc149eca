// What the benchmarks take as one core's memory roofline, shared by
// ringlane-engine-bench and ringlane-kernels-bench so both measure it alike:
// a buffer on 2 MiB pages (as the worker's weights are, --huge_page_weights:
// the roofline is what the memory can stream, not what 4 KiB pages' TLB
// misses leave of it) and a read-only kernel over it.
#ifndef RINGLANE_TOOLS_READ_ROOFLINE_H_
#define RINGLANE_TOOLS_READ_ROOFLINE_H_

#include <sys/mman.h>

#include <cstddef>
#include <cstdlib>

#if defined(__x86_64__)
#include <immintrin.h>
#endif

namespace ringlane::tools {

// `bytes` rounded up to whole 2 MiB pages, advised onto huge pages where the
// kernel offers them; nullptr when out of memory. Free with std::free.
inline void* AllocHuge(size_t bytes) {
  const size_t huge = size_t{2} << 20;
  const size_t alloc = (bytes + huge - 1) / huge * huge;
  void* p = std::aligned_alloc(huge, alloc);
#ifdef MADV_HUGEPAGE
  if (p != nullptr) ::madvise(p, alloc, MADV_HUGEPAGE);
#endif
  return p;
}

// The sum of p[0..n) (n a multiple of 32), read with AVX2 loads: four
// independent chains, so the loads, not the additions, set the pace.
#if defined(__x86_64__)
__attribute__((target("avx2"))) inline float ReadKernel(const float* p, size_t n) {
  __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
  for (size_t i = 0; i + 32 <= n; i += 32) {
    a0 = _mm256_add_ps(a0, _mm256_load_ps(p + i));
    a1 = _mm256_add_ps(a1, _mm256_load_ps(p + i + 8));
    a2 = _mm256_add_ps(a2, _mm256_load_ps(p + i + 16));
    a3 = _mm256_add_ps(a3, _mm256_load_ps(p + i + 24));
  }
  __m256 s = _mm256_add_ps(_mm256_add_ps(a0, a1), _mm256_add_ps(a2, a3));
  alignas(32) float o[8];
  _mm256_store_ps(o, s);
  return o[0] + o[1] + o[2] + o[3] + o[4] + o[5] + o[6] + o[7];
}
#else
inline float ReadKernel(const float* p, size_t n) {
  float s = 0;
  for (size_t i = 0; i < n; ++i) s += p[i];
  return s;
}
#endif

}  // namespace ringlane::tools

#endif  // RINGLANE_TOOLS_READ_ROOFLINE_H_
