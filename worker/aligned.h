// Cache-line aligned float buffers. A 512-bit load from an address that is not
// 64-byte aligned touches two cache lines; the panel kernels load two vectors
// per FMA pair, so an unaligned buffer halves their throughput.
#ifndef RINGLANE_WORKER_ALIGNED_H_
#define RINGLANE_WORKER_ALIGNED_H_

#include <cstddef>
#include <new>
#include <vector>

namespace ringlane::worker {

template <typename T, std::size_t kAlign = 64>
struct AlignedAllocator {
  using value_type = T;
  AlignedAllocator() = default;
  template <typename U>
  AlignedAllocator(const AlignedAllocator<U, kAlign>&) {}
  template <typename U>
  struct rebind {
    using other = AlignedAllocator<U, kAlign>;
  };
  T* allocate(std::size_t n) {
    return static_cast<T*>(::operator new (n * sizeof(T), std::align_val_t{kAlign}));
  }
  void deallocate(T* p, std::size_t) { ::operator delete (p, std::align_val_t{kAlign}); }
  bool operator==(const AlignedAllocator&) const { return true; }
  bool operator!=(const AlignedAllocator&) const { return false; }
};

using AlignedFloats = std::vector<float, AlignedAllocator<float>>;

}  // namespace ringlane::worker

#endif  // RINGLANE_WORKER_ALIGNED_H_
