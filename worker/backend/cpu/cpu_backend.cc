// The CPU backend: the model's graph (graph/factory.h) over CpuOps, the
// kernels of kernels.h on a persistent thread pool, and the paged KV pool.
#include <cstring>
#include <set>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "worker/backend/backend.h"
#include "worker/backend/cpu/cpu_ops.h"
#include "worker/backend/cpu/kernels.h"
#include "worker/collectives/communicator.h"
#include "worker/graph/factory.h"
#include "worker/thread_pool.h"

namespace ringlane::worker {
namespace {

using cpu::Isa;

// The KvCache geometry that holds every paged layer's cache: one pool, so
// its layers must agree; paged K/V has two planes, a latent cache one plane
// of latent_dim + rope_dim values. Recurrent layers have no rows in it (their
// state is in slots), so `layers` counts the others, in layer order.
struct PoolShape {
  int kv_heads = 0, head_dim = 0, planes = 0;
  LatentSplit split;  // latent caches: the parts of a row
  int layers = 0;
};
absl::StatusOr<PoolShape> PoolShapeOf(std::vector<LayerCacheSpec> caches) {
  std::erase_if(caches,
                [](const LayerCacheSpec& c) { return c.kind == CacheKind::kRecurrentState; });
  if (caches.empty()) return absl::FailedPreconditionError("the model has no attention layers");
  auto shape = [](const LayerCacheSpec& c) -> absl::StatusOr<PoolShape> {
    switch (c.kind) {
      case CacheKind::kPagedKv:
        return PoolShape{c.kv_heads, c.head_dim, 2};
      case CacheKind::kLatentKv:
        return PoolShape{1, c.latent_dim + c.rope_dim + c.index_dim, 1,
                         LatentSplit{c.latent_dim, c.rope_dim, c.index_dim}};
      default:
        return absl::UnimplementedError(absl::StrCat("cache kind ", static_cast<int>(c.kind),
                                                     " has no CPU pool; only paged and latent "
                                                     "KV do"));
    }
  };
  absl::StatusOr<PoolShape> first = shape(caches[0]);
  if (!first.ok()) return first.status();
  for (const LayerCacheSpec& c : caches) {
    absl::StatusOr<PoolShape> s = shape(c);
    if (!s.ok()) return s.status();
    if (s->kv_heads != first->kv_heads || s->head_dim != first->head_dim ||
        s->planes != first->planes) {
      return absl::UnimplementedError("layers with different KV geometry share no pool");
    }
  }
  first->layers = static_cast<int>(caches.size());
  return *first;
}

// Floats of one state slot (every recurrent layer's state, in layer order)
// and where each layer's part starts (-1: not recurrent).
int64_t StateLayout(const std::vector<LayerCacheSpec>& caches, std::vector<int64_t>* offsets) {
  int64_t total = 0;
  offsets->assign(caches.size(), -1);
  for (size_t l = 0; l < caches.size(); ++l) {
    if (caches[l].kind != CacheKind::kRecurrentState) continue;
    (*offsets)[l] = total;
    total += caches[l].state_floats;
  }
  return total;
}

class CpuBackend final : public Backend {
 public:
  CpuBackend(std::shared_ptr<const ModelWeights> model, std::unique_ptr<ModelGraph> graph,
             const CpuBackendOptions& options)
      : model_(std::move(model)),
        cfg_(model_->config),
        shard_(model_->shard),
        comm_(options.comm),
        isa_(options.force_scalar ? Isa::kScalar : cpu::DetectIsa(options.allow_avx512)),
        pool_(options.threads, options.spin_us),
        // The graph meets the group only when the model is sharded over one.
        ops_(&pool_, isa_, comm_ != nullptr && shard_.world > 1 ? comm_ : nullptr),
        graph_(std::move(graph)),
        caches_(graph_->LayerCaches()),
        dcp_(options.context_parallel && comm_ != nullptr && shard_.world > 1 ? shard_.world : 1) {
    ops_.set_context_parallel(dcp_ > 1 ? shard_.rank : 0, dcp_);
  }

  std::string name() const override {
    return absl::StrCat("cpu(", cpu::IsaName(isa_), ", ", pool_.num_threads(), " threads",
                        shard_.world > 1
                            ? absl::StrCat(", TP rank ", shard_.rank, "/", shard_.world)
                            : std::string(),
                        ")");
  }
  const ModelConfig& config() const override { return cfg_; }
  std::vector<LayerCacheSpec> layer_caches() const override { return caches_; }
  const KvPoolSpec& kv_pool() const override { return kv_spec_; }
  int block_tokens() const override { return kv_spec_.block_size * dcp_; }
  int context_parallel() const override { return dcp_; }

  absl::Status AllocateKvPool(const KvPoolSpec& spec) override {
    ops_.set_kv_cache(nullptr);
    kv_.reset();
    absl::StatusOr<PoolShape> shape = PoolShapeOf(caches_);
    if (!shape.ok()) return shape.status();
    auto kv = KvCache::Create(shape->layers, shape->kv_heads, shape->head_dim, spec, shape->planes,
                              shape->split);
    if (!kv.ok()) return kv.status();
    std::vector<int64_t> offsets;
    const int64_t slot_floats = StateLayout(caches_, &offsets);
    if (slot_floats > 0) {
      if (spec.state_slots <= 0 || spec.state_checkpoints < 0) {
        return absl::InvalidArgumentError(
            "the model has recurrent layers: the pool needs state slots (one per sequence)");
      }
      state_.assign(static_cast<size_t>(slot_floats) * spec.state_slots, 0.0f);
      checkpoints_.assign(static_cast<size_t>(slot_floats) * spec.state_checkpoints, 0.0f);
      checkpoint_position_.assign(static_cast<size_t>(spec.state_checkpoints), -1);
    } else {
      state_.clear();
      checkpoints_.clear();
      checkpoint_position_.clear();
    }
    ops_.set_state_pool(state_.data(), slot_floats, std::move(offsets), checkpoints_.data());
    slot_floats_ = slot_floats;
    kv_ = std::move(*kv);
    ops_.set_kv_cache(kv_.get());
    kv_spec_ = spec;
    if (slot_floats == 0) kv_spec_.state_slots = kv_spec_.state_checkpoints = 0;
    return absl::OkStatus();
  }

  int64_t kv_block_bytes() const override { return kv_ ? kv_->block_bytes() : 0; }

  absl::Status ExportKvBlock(int32_t block, std::vector<uint8_t>* out) const override {
    if (!kv_) return absl::FailedPreconditionError("KV pool not allocated");
    if (block < 0 || block >= kv_spec_.num_blocks) {
      return absl::InvalidArgumentError(
          absl::StrCat("KV block ", block, " out of range [0, ", kv_spec_.num_blocks, ")"));
    }
    const uint8_t* p = kv_->BlockData(block);
    out->assign(p, p + kv_->block_bytes());
    return absl::OkStatus();
  }

  absl::Status ImportKvBlock(int32_t block, absl::Span<const uint8_t> data) override {
    if (!kv_) return absl::FailedPreconditionError("KV pool not allocated");
    if (block < 0 || block >= kv_spec_.num_blocks) {
      return absl::InvalidArgumentError(
          absl::StrCat("KV block ", block, " out of range [0, ", kv_spec_.num_blocks, ")"));
    }
    if (static_cast<int64_t>(data.size()) != kv_->block_bytes()) {
      return absl::InvalidArgumentError(absl::StrCat("KV block payload is ", data.size(),
                                                     " bytes, expected ", kv_->block_bytes()));
    }
    std::memcpy(kv_->BlockData(block), data.data(), data.size());
    return absl::OkStatus();
  }

  absl::StatusOr<RoundOutput> Step(const RoundInput& round) override;

  absl::Status SaveStateSlot(int32_t slot, std::vector<float>* out) const override {
    if (slot < 0 || slot >= kv_spec_.state_slots) {
      return absl::InvalidArgumentError(
          absl::StrCat("state slot ", slot, " outside [0, ", kv_spec_.state_slots, ")"));
    }
    const float* p = state_.data() + slot * slot_floats_;
    out->assign(p, p + slot_floats_);
    return absl::OkStatus();
  }
  absl::Status RestoreStateSlot(int32_t slot, absl::Span<const float> data) override {
    if (slot < 0 || slot >= kv_spec_.state_slots) {
      return absl::InvalidArgumentError(
          absl::StrCat("state slot ", slot, " outside [0, ", kv_spec_.state_slots, ")"));
    }
    if (static_cast<int64_t>(data.size()) != slot_floats_) {
      return absl::InvalidArgumentError(
          absl::StrCat("a state of ", data.size(), " floats, the slot holds ", slot_floats_));
    }
    std::memcpy(state_.data() + slot * slot_floats_, data.data(), data.size() * sizeof(float));
    return absl::OkStatus();
  }

  absl::Status ExportStateCheckpoint(int32_t checkpoint, int64_t position,
                                     std::vector<uint8_t>* out) const override {
    if (absl::Status st = CheckCheckpoint(checkpoint, position); !st.ok()) return st;
    if (checkpoint_position_[checkpoint] != position) {
      return absl::FailedPreconditionError(absl::StrCat("state checkpoint ", checkpoint, " holds ",
                                                        checkpoint_position_[checkpoint],
                                                        " positions, not ", position));
    }
    const auto* p =
        reinterpret_cast<const uint8_t*>(checkpoints_.data() + checkpoint * slot_floats_);
    out->assign(p, p + slot_floats_ * static_cast<int64_t>(sizeof(float)));
    return absl::OkStatus();
  }
  absl::Status ImportStateCheckpoint(int32_t checkpoint, int64_t position,
                                     absl::Span<const uint8_t> data) override {
    if (absl::Status st = CheckCheckpoint(checkpoint, position); !st.ok()) return st;
    if (static_cast<int64_t>(data.size()) != slot_floats_ * static_cast<int64_t>(sizeof(float))) {
      return absl::InvalidArgumentError(absl::StrCat("a state checkpoint of ", data.size(),
                                                     " bytes, a checkpoint holds ",
                                                     slot_floats_ * sizeof(float)));
    }
    std::memcpy(checkpoints_.data() + checkpoint * slot_floats_, data.data(), data.size());
    checkpoint_position_[checkpoint] = position;
    return absl::OkStatus();
  }

 private:
  absl::Status CheckCheckpoint(int32_t checkpoint, int64_t position) const {
    if (checkpoint < 0 || checkpoint >= kv_spec_.state_checkpoints) {
      return absl::InvalidArgumentError(absl::StrCat(
          "state checkpoint ", checkpoint, " outside [0, ", kv_spec_.state_checkpoints, ")"));
    }
    if (position <= 0) {
      return absl::InvalidArgumentError(absl::StrCat("state checkpoint position ", position));
    }
    return absl::OkStatus();
  }
  absl::Status Validate(const RoundInput& round) const;

  const std::shared_ptr<const ModelWeights> model_;
  const ModelConfig& cfg_;
  const TpShard shard_;       // this rank's heads, MLP columns and vocabulary rows
  Communicator* const comm_;  // null when not sharded
  const Isa isa_;
  ThreadPool pool_;
  KvPoolSpec kv_spec_;
  std::unique_ptr<KvCache> kv_;
  std::vector<float> state_;                  // [state_slots][every recurrent layer's state]
  std::vector<float> checkpoints_;            // [state_checkpoints][the same]
  std::vector<int64_t> checkpoint_position_;  // positions each holds the state of (-1: none)
  int64_t slot_floats_ = 0;
  cpu::CpuOps ops_;  // borrows pool_, comm_, kv_ and state_
  const std::unique_ptr<ModelGraph> graph_;
  const std::vector<LayerCacheSpec> caches_;  // the graph's, fixed for its life
  const int dcp_;                             // decode context parallel world (1: off)
};

absl::Status CpuBackend::Validate(const RoundInput& round) const {
  if (!kv_) return absl::FailedPreconditionError("KV pool not allocated");
  // A block id covers bs positions, or bs * world under context parallel.
  const int bs = block_tokens();
  std::set<std::pair<int32_t, int>> written;
  std::set<int32_t> slots, saved;
  for (size_t s = 0; s < round.seqs.size(); ++s) {
    const SeqStep& q = round.seqs[s];
    auto bad = [&](auto&&... parts) {
      return absl::InvalidArgumentError(absl::StrCat("round sequence ", s, ": ", parts...));
    };
    if (q.tokens.empty()) return bad("no tokens");
    if (kv_spec_.state_slots > 0) {
      if (q.state_slot < 0 || q.state_slot >= kv_spec_.state_slots) {
        return bad("state slot ", q.state_slot, " outside [0, ", kv_spec_.state_slots,
                   ") (the model has recurrent layers)");
      }
      if (!slots.insert(q.state_slot).second) {
        return bad("state slot ", q.state_slot, " is used by two sequences in one round");
      }
      const int K = kv_spec_.state_checkpoints;
      if (q.restore_checkpoint >= 0) {
        if (q.restore_checkpoint >= K) {
          return bad("state checkpoint ", q.restore_checkpoint, " outside [0, ", K, ")");
        }
        // The checkpoint must hold exactly the positions before this row.
        if (checkpoint_position_[q.restore_checkpoint] != q.start_position) {
          return bad("state checkpoint ", q.restore_checkpoint, " holds ",
                     checkpoint_position_[q.restore_checkpoint], " positions, the row starts at ",
                     q.start_position);
        }
      }
      for (const SeqStep::StateSave& save : q.state_saves) {
        if (save.slot < 0 || save.slot >= K) {
          return bad("state checkpoint ", save.slot, " outside [0, ", K, ")");
        }
        if (save.offset < 0 || save.offset >= static_cast<int32_t>(q.tokens.size())) {
          return bad("state checkpoint after offset ", save.offset, " outside the row");
        }
        if (!saved.insert(save.slot).second) {
          return bad("state checkpoint ", save.slot, " is written twice in one round");
        }
      }
    } else if (q.restore_checkpoint >= 0 || !q.state_saves.empty()) {
      return bad("state checkpoints for a model without recurrent layers");
    }
    if (cfg_.mtp_drafter &&
        q.hidden_in.size() != q.tokens.size() * static_cast<size_t>(cfg_.hidden)) {
      return bad("an MTP drafter needs ", q.tokens.size(), " x ", cfg_.hidden,
                 " hidden-state values, got ", q.hidden_in.size());
    }
    if (q.start_position < 0) return bad("negative start position ", q.start_position);
    // Before start + tokens is formed below: a start past every position
    // of the pool would overflow it (found by round_plan_fuzz).
    const int64_t pool_positions = int64_t{kv_spec_.num_blocks} * bs;
    if (q.start_position > pool_positions) {
      return bad("start position ", q.start_position, " past the KV pool's ", pool_positions,
                 " positions");
    }
    for (int32_t t : q.tokens) {
      if (t < 0 || t >= cfg_.vocab)
        return bad("token id ", t, " outside vocabulary [0, ", cfg_.vocab, ")");
    }
    const int64_t end = q.start_position + static_cast<int64_t>(q.tokens.size());
    if (end > static_cast<int64_t>(q.block_ids.size()) * bs) {
      return bad("positions up to ", end, " need ", (end + bs - 1) / bs, " blocks, got ",
                 q.block_ids.size());
    }
    for (int32_t b : q.block_ids) {
      if (b < 0 || b >= kv_spec_.num_blocks) {
        return bad("KV block ", b, " outside pool [0, ", kv_spec_.num_blocks, ")");
      }
    }
    for (int32_t o : q.logit_offsets) {
      if (o < 0 || o >= static_cast<int32_t>(q.tokens.size())) {
        return bad("logit offset ", o, " outside the ", q.tokens.size(), " new tokens");
      }
    }
    for (int64_t p = q.start_position; p < end; ++p) {
      if (!written.insert({q.block_ids[p / bs], static_cast<int>(p % bs)}).second) {
        return bad("KV slot ", p % bs, " of block ", q.block_ids[p / bs],
                   " is written by two sequences in one round");
      }
    }
  }
  for (size_t c = 0; c < round.block_copies.size(); ++c) {
    const BlockCopy& bc = round.block_copies[c];
    for (int32_t b : {bc.src, bc.dst}) {
      if (b < 0 || b >= kv_spec_.num_blocks) {
        return absl::InvalidArgumentError(absl::StrCat(
            "block copy ", c, ": KV block ", b, " outside pool [0, ", kv_spec_.num_blocks, ")"));
      }
    }
    if (bc.src == bc.dst) {
      return absl::InvalidArgumentError(
          absl::StrCat("block copy ", c, ": KV block ", bc.src, " copied onto itself"));
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<RoundOutput> CpuBackend::Step(const RoundInput& round) {
  if (absl::Status st = Validate(round); !st.ok()) return st;
  for (const BlockCopy& bc : round.block_copies) {
    std::memcpy(kv_->BlockData(bc.dst), kv_->BlockData(bc.src),
                static_cast<size_t>(kv_->block_bytes()));
  }
  // Every restore reads its checkpoint before any row of the round saves
  // into one (the router may hand a slot on in the same round).
  for (const SeqStep& q : round.seqs) {
    if (q.restore_checkpoint < 0) continue;
    std::memcpy(state_.data() + q.state_slot * slot_floats_,
                checkpoints_.data() + q.restore_checkpoint * slot_floats_,
                sizeof(float) * static_cast<size_t>(slot_floats_));
  }
  absl::StatusOr<RoundOutput> out = graph_->Forward(round, &ops_);
  if (out.ok()) {
    for (const SeqStep& q : round.seqs) {
      for (const SeqStep::StateSave& save : q.state_saves) {
        checkpoint_position_[save.slot] = q.start_position + save.offset + 1;
      }
    }
  }
  return out;
}

}  // namespace

absl::StatusOr<std::unique_ptr<Backend>> CreateCpuBackend(std::shared_ptr<const ModelWeights> model,
                                                          const CpuBackendOptions& options) {
  if (options.context_parallel && !IsMla(model->config)) {
    return absl::InvalidArgumentError(
        "decode context parallel splits a latent cache by position; this model keeps per-head "
        "K/V (its heads are split by tensor parallelism instead)");
  }
  absl::StatusOr<std::unique_ptr<ModelGraph>> graph = CreateGraph(model);
  if (!graph.ok()) return graph.status();
  return std::make_unique<CpuBackend>(std::move(model), std::move(*graph), options);
}

absl::StatusOr<int64_t> CpuKvBlockBytes(const ModelConfig& config, const TpShard& shard,
                                        const KvPoolSpec& spec) {
  // The pool AllocateKvPool would make is a KvCache of exactly this shape.
  absl::StatusOr<std::vector<LayerCacheSpec>> caches = GraphLayerCaches(config, shard);
  if (!caches.ok()) return caches.status();
  if (caches->empty()) return absl::InvalidArgumentError("the model has no layers");
  absl::StatusOr<PoolShape> shape = PoolShapeOf(*caches);
  if (!shape.ok()) return shape.status();
  return KvCache::BlockBytes(shape->layers, shape->kv_heads, shape->head_dim, spec, shape->planes,
                             shape->split);
}

}  // namespace ringlane::worker
