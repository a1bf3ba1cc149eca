#include "worker/model/resident.h"

#include <sys/mman.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <map>
#include <string>
#include <tuple>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace ringlane::worker {
namespace {

constexpr int64_t kHugePage = int64_t{2} << 20;

template <class W, class M, class F>
void VisitLayer(W& l, F& fn) {
  for (M* m : {&l.attn.wq,
               &l.attn.wk,
               &l.attn.wv,
               &l.attn.wo,
               &l.mlp.w_gate,
               &l.mlp.w_up,
               &l.mlp.w_down,
               &l.mla.wq_a,
               &l.mla.wq_b,
               &l.mla.wkv_a,
               &l.mla.wkv_b,
               &l.mla.wo,
               &l.indexer.wq_b,
               &l.indexer.wk,
               &l.indexer.weights_proj,
               &l.indexer.kpool_gate,
               &l.kda.wq,
               &l.kda.wk,
               &l.kda.wv,
               &l.kda.f_a,
               &l.kda.f_b,
               &l.kda.b,
               &l.kda.g_a,
               &l.kda.g_b,
               &l.kda.wo,
               &l.moe.router,
               &l.moe.shared.w_gate,
               &l.moe.shared.w_up,
               &l.moe.shared.w_down,
               &l.hc_attn.fn,
               &l.hc_ffn.fn}) {
    if (m->data != nullptr) fn(*m);
  }
  for (auto& e : l.moe.experts) {
    for (M* m : {&e.w_gate, &e.w_up, &e.w_down}) {
      if (m->data != nullptr) fn(*m);
    }
  }
}

// The MTP layer to visit: a private copy in a model being edited (drafter
// views share the original), the shared one in a model only read.
MtpWeights* VisitedMtp(ModelWeights& model) {
  if (model.mtp == nullptr) return nullptr;
  auto mtp = std::make_shared<MtpWeights>(*model.mtp);
  MtpWeights* edited = mtp.get();
  model.mtp = std::move(mtp);
  return edited;
}
const MtpWeights* VisitedMtp(const ModelWeights& model) { return model.mtp.get(); }

// ForEachMatrix's order, for a model being edited (W = ModelWeights) or read.
template <class W, class L, class M, class F>
void VisitModel(W& model, const F& fn) {
  auto visit = [&](M& m) {
    if (m.data != nullptr) fn(m);
  };
  visit(model.embed);
  for (L& l : model.layers) VisitLayer<L, M>(l, visit);
  visit(model.lm_head);
  visit(model.hc_head.fn);
  if (auto* mtp = VisitedMtp(model); mtp != nullptr) {
    VisitLayer<L, M>(mtp->layer, visit);
    visit(mtp->eh_proj);
    visit(mtp->head);
  }
}

// True unless the kernel turned transparent huge pages off ("[never]").
bool HugePagesAvailable() {
  std::ifstream f("/sys/kernel/mm/transparent_hugepage/enabled");
  std::string s;
  if (!std::getline(f, s)) return false;
  return s.find("[never]") == std::string::npos;
}

// AnonHugePages of the mappings overlapping [begin, end), from
// /proc/self/smaps (at most end - begin: a neighbour merged into the same
// mapping is not ours).
int64_t HugePageBytes(uintptr_t begin, uintptr_t end) {
  std::ifstream f("/proc/self/smaps");
  std::string line;
  bool inside = false;
  int64_t total = 0;
  while (std::getline(f, line)) {
    unsigned long lo = 0, hi = 0;
    char dash = 0;
    if (std::sscanf(line.c_str(), "%lx%c%lx", &lo, &dash, &hi) == 3 && dash == '-') {
      inside = lo < end && hi > begin;
      continue;
    }
    long kb = 0;
    if (inside && std::sscanf(line.c_str(), "AnonHugePages: %ld kB", &kb) == 1) total += kb * 1024;
  }
  return std::min<int64_t>(total, static_cast<int64_t>(end - begin));
}

// FP8 matrices whose rows are whole groups, with room for a column view's
// halves (the MTP layer's eh_proj) to be whole groups too, and whose block
// scales change only on group edges.
bool Interleavable(const Matrix& m) {
  return m.dtype == DType::kFP8E4M3 && !m.interleaved && m.cols % 128 == 0 &&
         m.col_offset % 64 == 0;
}

}  // namespace

void InterleaveFp8Row(const uint8_t* src, int64_t cols, uint8_t* dst) {
  const int64_t whole = cols & ~int64_t{63};
  for (int64_t g = 0; g < whole; g += 64) {
    for (int64_t j = 0; j < 64; ++j) dst[g + Matrix::InterleavedByte(j)] = src[g + j];
  }
  std::memcpy(dst + whole, src + whole, static_cast<size_t>(cols - whole));
}

void WriteFp8Tiles(const Matrix& src, int64_t row_tile, uint8_t* dst) {
  const int64_t cols = src.cols;
  std::vector<uint8_t> row(static_cast<size_t>(cols));
  for (int64_t i = 0; i < src.rows; ++i) {
    InterleaveFp8Row(src.Row(i), cols, row.data());
    uint8_t* tile = dst + (i / row_tile) * row_tile * cols + (i % row_tile) * 64;
    for (int64_t g = 0; g < cols; g += 64) std::memcpy(tile + g * row_tile, row.data() + g, 64);
  }
}

void ForEachMatrix(ModelWeights& model, const std::function<void(Matrix&)>& fn) {
  VisitModel<ModelWeights, LayerWeights, Matrix>(model, fn);
}

void ForEachMatrix(const ModelWeights& model, const std::function<void(const Matrix&)>& fn) {
  VisitModel<const ModelWeights, const LayerWeights, const Matrix>(model, fn);
}

absl::StatusOr<std::shared_ptr<const ModelWeights>> MakeResident(
    std::shared_ptr<const ModelWeights> model, ResidentReport* report, bool interleave_fp8,
    bool tile_rows) {
  ResidentReport local;
  ResidentReport& r = report != nullptr ? *report : local;
  r = ResidentReport{};
  if (model == nullptr) return absl::InvalidArgumentError("no model");
  if (!HugePagesAvailable()) return model;

  // Views of the same memory (a drafter's head that is the target's, a tied
  // head) get one copy: keyed by where and what they view.
  using Key = std::tuple<const void*, int64_t, int64_t, int64_t, int>;
  struct Slot {
    int64_t offset = 0;
    bool copied = false;
  };
  std::map<Key, Slot> slots;
  // Interleaved matrices go in tiles of the decode kernel's 4 rows, the last
  // tile padded with zero rows.
  auto row_tile = [&](const Matrix& m) -> int64_t {
    return interleave_fp8 && tile_rows && Interleavable(m) ? kResidentRowTile : 1;
  };
  int64_t total = 0;
  ForEachMatrix(*model, [&](const Matrix& m) {
    if (&m == &model->embed) return;
    const Key key{m.data, m.rows, m.cols, m.row_stride_bytes, static_cast<int>(m.dtype)};
    if (slots.count(key) != 0) return;
    slots[key].offset = total;
    const int64_t tile = row_tile(m);
    const int64_t bytes =
        (m.rows + tile - 1) / tile * tile * m.cols * static_cast<int64_t>(DTypeSize(m.dtype));
    total += (bytes + 63) & ~int64_t{63};  // each matrix on a cache line of its own
  });
  if (total == 0) return model;

  // A region aligned to 2 MiB, so its pages can be huge from the first byte.
  // Whole huge pages, so a small model's last (or only) page can be one too.
  const int64_t span = (total + kHugePage - 1) / kHugePage * kHugePage;
  const int64_t mapped = span + kHugePage;
  void* p = ::mmap(nullptr, static_cast<size_t>(mapped), PROT_READ | PROT_WRITE,
                   MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (p == MAP_FAILED) {
    return absl::ResourceExhaustedError(
        absl::StrCat("cannot allocate ", total, " bytes for the weights: ", std::strerror(errno)));
  }
  auto region = std::shared_ptr<const void>(
      p, [mapped](const void* q) { ::munmap(const_cast<void*>(q), static_cast<size_t>(mapped)); });
  uint8_t* base = reinterpret_cast<uint8_t*>((reinterpret_cast<uintptr_t>(p) + kHugePage - 1) &
                                             ~static_cast<uintptr_t>(kHugePage - 1));
  if (::madvise(base, static_cast<size_t>(span), MADV_HUGEPAGE) != 0) return model;

  auto out = std::make_shared<ModelWeights>(*model);
  out->keep_alive = model;
  out->resident = region;
  ForEachMatrix(*out, [&](Matrix& m) {
    if (&m == &out->embed) return;
    Slot& slot =
        slots.at(Key{m.data, m.rows, m.cols, m.row_stride_bytes, static_cast<int>(m.dtype)});
    uint8_t* dst = base + slot.offset;
    const int64_t row_bytes = m.cols * static_cast<int64_t>(DTypeSize(m.dtype));
    const bool interleave = interleave_fp8 && Interleavable(m);
    const int64_t tile = row_tile(m);
    if (!slot.copied) {
      slot.copied = true;
      ++r.matrices;
      r.bytes += m.rows * row_bytes;
      if (interleave) ++r.interleaved;
      if (tile > 1) {
        ++r.row_tiled;
        WriteFp8Tiles(m, tile, dst);
      } else {
        for (int64_t i = 0; i < m.rows; ++i) {
          if (interleave) {
            InterleaveFp8Row(m.Row(i), m.cols, dst + i * row_bytes);
          } else {
            std::memcpy(dst + i * row_bytes, m.Row(i), row_bytes);
          }
        }
      }
    }
    m.data = dst;
    m.row_stride_bytes = row_bytes;
    m.interleaved = interleave;
    m.row_tile = tile;
    m.row_phase = 0;
  });
  // Read-only from here: a stray write faults instead of changing a weight.
  ::mprotect(base, static_cast<size_t>(span), PROT_READ);
  r.huge_pages = true;
  r.huge_page_bytes =
      HugePageBytes(reinterpret_cast<uintptr_t>(base), reinterpret_cast<uintptr_t>(base) + total);
  return std::shared_ptr<const ModelWeights>(std::move(out));
}

}  // namespace ringlane::worker
