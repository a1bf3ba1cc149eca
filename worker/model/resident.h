// The weights a CPU decode step streams, copied out of the file mapping into
// anonymous memory on transparent huge pages.
//
// Single-stream decode reads every weight once per token. From the file
// mapping (4 KiB pages) that walk takes a TLB miss every 4 KiB, and under a
// hypervisor each miss is a two-level page walk; on 2 MiB pages it takes one
// per 2 MiB. Measured on the project's 2-core VM with the 1.1B FP8 model
// (ringlane-engine-bench --huge_page_weights=true|false, alternating): decode
// 1.10-1.30x at one thread and 1.08-1.10x at two. The bytes stay the
// checkpoint's; only where they live changes.
#ifndef RINGLANE_WORKER_MODEL_RESIDENT_H_
#define RINGLANE_WORKER_MODEL_RESIDENT_H_

#include <cstdint>
#include <functional>
#include <memory>

#include "absl/status/statusor.h"
#include "worker/model/model.h"

namespace ringlane::worker {

// Calls fn on every matrix the model holds (the MTP layer's too), the
// embedding first; absent ones (no data) are skipped.
void ForEachMatrix(ModelWeights& model, const std::function<void(Matrix&)>& fn);
void ForEachMatrix(const ModelWeights& model, const std::function<void(const Matrix&)>& fn);

struct ResidentReport {
  int64_t matrices = 0;         // copied (views of the same memory count once)
  int64_t bytes = 0;            // their bytes
  int64_t huge_page_bytes = 0;  // of the region, backed by huge pages right after the copy
  bool huge_pages = false;      // the kernel took the huge-page advice
  int64_t interleaved = 0;      // FP8 matrices stored in interleaved groups
  int64_t row_tiled = 0;        // of those, stored in tiles of kResidentRowTile rows
};

// Rows per tile of the resident FP8 layout (Matrix::row_tile): the decode
// kernel's tile height (NrFor(1) on AVX2 and AVX-512).
inline constexpr int64_t kResidentRowTile = 4;

// Row `src` of `cols` FP8 values into `dst` in the interleaved layout of
// Matrix::interleaved.
void InterleaveFp8Row(const uint8_t* src, int64_t cols, uint8_t* dst);

// The rows of FP8 `src` (stored in order, cols % 64 == 0) into `dst` in the
// layout of Matrix::row_tile: interleaved groups, tiles of `row_tile` rows;
// dst holds ceil(rows / row_tile) * row_tile * cols bytes, the padding rows
// left as they are.
void WriteFp8Tiles(const Matrix& src, int64_t row_tile, uint8_t* dst);

// A model whose matrices, except the embedding (read a row per token), view
// one anonymous region holding a compact copy of each (rows of exactly `cols`
// elements; block scales and offsets unchanged, so every sum is the same).
// FP8 matrices whose width is a multiple of 128 columns are stored
// interleaved (Matrix::interleaved): the same bytes, an order the vector
// kernels convert with fewer instructions.
// The result keeps `model` alive (scales and vectors stay where they are).
// Returns `model` itself, with report->huge_pages false, where the kernel has
// no transparent huge pages (a copy would then only cost memory).
// Those are also stored in tiles of kResidentRowTile rows (Matrix::row_tile),
// so the decode kernel reads one stream per tile.
// `interleave` false keeps every row in order, `tile_rows` false keeps
// interleaved rows apart (both for side-by-side measurements).
absl::StatusOr<std::shared_ptr<const ModelWeights>> MakeResident(
    std::shared_ptr<const ModelWeights> model, ResidentReport* report = nullptr,
    bool interleave = true, bool tile_rows = true);

}  // namespace ringlane::worker

#endif  // RINGLANE_WORKER_MODEL_RESIDENT_H_
