#include "worker/server/worker_service.h"

#include <xxhash.h>

#include <chrono>
#include <memory>
#include <thread>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "services/log.h"
#include "services/status_grpc.h"
#include "worker/sampler.h"
#include "worker/server/round_executor.h"
#include "worker/server/step_loop.h"

namespace ringlane::worker {

namespace v1 = ringlane::v1;

namespace {

constexpr int kDefaultChunkBytes = 1 << 20;
constexpr size_t kPrefixHashBytes = 16;  // BlockKey.prefix_hash
// How long a new Rounds stream waits for the one still open to end.
constexpr std::chrono::seconds kStreamTakeoverWait{10};

}  // namespace

v1::DType ToProto(DType t) {
  switch (t) {
    case DType::kF32:
      return v1::DTYPE_F32;
    case DType::kBF16:
      return v1::DTYPE_BF16;
    case DType::kF16:
      return v1::DTYPE_F16;
    case DType::kFP8E4M3:
      return v1::DTYPE_FP8_E4M3;
  }
  return v1::DTYPE_UNSPECIFIED;
}

WorkerService::WorkerService(GroupMember* group, const ModelConfig& config,
                             const KvPoolSpec& kv_pool, int64_t kv_block_bytes,
                             std::vector<LayerCacheSpec> layer_caches, WorkerIdentity id,
                             WorkerMetrics* metrics, KvStoreLink* kvstore)
    : group_(group),
      config_(config),
      kv_pool_(kv_pool),
      kv_block_bytes_(kv_block_bytes),
      layer_caches_(std::move(layer_caches)),
      id_(std::move(id)),
      metrics_(metrics),
      kvstore_(kvstore),
      state_bytes_(StateBytesPerSlot(layer_caches_)) {
  // A block stored with its state checkpoint is another payload under the
  // same chain hash: its own fingerprint keeps the two from aliasing.
  const std::string desc = absl::StrCat("ringlane-kv-state-checkpoint-v1;",
                                        id_.kv_layout_fingerprint, ";", state_bytes_);
  checkpoint_layout_fingerprint_ = XXH64(desc.data(), desc.size(), 0);
}

grpc::Status WorkerService::GetInfo(grpc::ServerContext*, const v1::GetInfoRequest*,
                                    v1::WorkerInfo* info) {
  info->set_model_id(id_.model_id);
  info->set_model_revision(id_.model_revision);
  info->set_num_layers(config_.layers);
  info->set_num_heads(config_.heads);
  info->set_num_kv_heads(config_.kv_heads);
  info->set_head_dim(config_.head_dim);
  info->set_vocab_size(config_.vocab);
  info->set_max_context_tokens(config_.max_position);
  info->set_tp_rank(id_.rank);
  info->set_tp_world_size(id_.world_size);
  info->set_moe_sharding(id_.moe_sharding);
  info->set_draft_model_id(id_.draft_model_id);
  info->set_max_proposed_drafts(id_.max_proposed_drafts);
  info->set_kv_pool_blocks(kv_pool_.num_blocks);
  info->set_block_size_tokens(kv_pool_.block_size);
  info->set_kv_block_bytes(kv_block_bytes_);
  info->set_kv_dtype(ToProto(kv_pool_.dtype));
  info->set_weight_dtype(ToProto(config_.weight_dtype));
  info->set_backend(id_.backend);
  info->set_bos_token_id(config_.bos_id);
  info->set_eos_token_id(config_.eos_id);
  for (const LayerCacheSpec& c : layer_caches_) {
    // The engine's CacheKind values are the proto's (checked in graph/llama.cc).
    info->add_layer_cache_kinds(static_cast<v1::CacheKind>(c.kind));
  }
  if (state_bytes_ > 0) {
    info->set_state_slots(kv_pool_.state_slots);
    info->set_state_bytes_per_slot(state_bytes_);
    info->set_state_checkpoints(kv_pool_.state_checkpoints);
    info->set_state_checkpoint_interval(kv_pool_.state_checkpoint_interval);
    info->set_linear_chunk(config_.linear.chunk);
  }
  // The bounds this rank's sampler enforces, so the router can refuse a
  // request up front instead of learning them from a rejected round.
  info->mutable_limits()->set_max_top_logprobs(kMaxTopLogprobs);
  info->mutable_limits()->set_max_abs_penalty(kMaxAbsPenalty);
  info->mutable_limits()->set_max_abs_logit_bias(kMaxAbsLogitBias);
  info->set_kvstore_address(kvstore_ != nullptr ? id_.kvstore_address : "");
  info->set_kv_layout_fingerprint(id_.kv_layout_fingerprint);
  info->set_kv_block_copies(true);
  GroupMember::State s = group_->state();
  info->set_group(id_.group);
  info->set_group_epoch(s.ready ? s.epoch : 0);
  info->set_group_ready(s.ready && !draining_);
  info->set_group_status(draining_ ? "draining" : s.status);
  return grpc::Status::OK;
}

grpc::Status WorkerService::Rounds(
    grpc::ServerContext* ctx, grpc::ServerReaderWriter<v1::RoundResult, v1::RoundPlan>* stream) {
  if (draining_) return grpc::Status(grpc::StatusCode::UNAVAILABLE, "worker is draining");
  // A router that cancelled its streams (a rank missed the round deadline)
  // reconnects at once, while the old stream's handler may still be inside a
  // round (waiting in a collective for a frozen peer, until the collective
  // timeout). Wait for it a while instead of refusing the new stream.
  const auto wait_until = std::chrono::steady_clock::now() + kStreamTakeoverWait;
  while (stream_open_.exchange(true)) {
    if (ctx->IsCancelled() || std::chrono::steady_clock::now() >= wait_until) {
      return grpc::Status(grpc::StatusCode::FAILED_PRECONDITION,
                          "a Rounds stream is already open on this worker");
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  struct Closer {
    std::atomic<bool>* open;
    ~Closer() { *open = false; }
  } closer{&stream_open_};

  StepLoop& steps = group_->steps();
  absl::StatusOr<int64_t> epoch = steps.CurrentEpoch();
  if (!epoch.ok()) return services::ToGrpcStatus(epoch.status());
  // Per-lane state lives as long as the stream, and only within the epoch.
  // The step loop makes it at the first round and alone uses it in rounds;
  // this thread reads its counters once a round is done.
  std::unique_ptr<RoundExecutor> exec;
  auto num_lanes = [&exec] { return exec ? exec->num_lanes() : 0; };
  RL_LOG(INFO) << "Rounds stream opened by " << ctx->peer() << " (epoch " << *epoch << ")";
  grpc::Status end = grpc::Status::OK;
  v1::RoundPlan plan;
  uint64_t rounds = 0;
  while (stream->Read(&plan)) {
    const auto arrived = std::chrono::steady_clock::now();
    if (draining_) {
      end = grpc::Status(grpc::StatusCode::UNAVAILABLE, "worker is draining");
      break;
    }
    if (plan.offloads_size() > 0) Offload(plan);
    absl::StatusOr<StepLoop::RoundOutcome> outcome = steps.RunRound(*epoch, &exec, plan, arrived);
    if (!outcome.ok()) {
      end = services::ToGrpcStatus(outcome.status());
      break;
    }
    if (!outcome->failure.ok()) {
      // A collective or the device failed: this group is done (the step loop
      // has told it); the loop re-forms it, and the other ranks learn it from
      // the rendezvous.
      const absl::Status& failure = outcome->failure;
      if (metrics_) metrics_->rounds_failed->Increment();
      RL_LOG(ERROR) << "round " << plan.round_id() << " failed in epoch " << *epoch << ": "
                    << failure.message();
      end = grpc::Status(grpc::StatusCode::UNAVAILABLE,
                         absl::StrCat("round ", plan.round_id(), " failed: ", failure.message(),
                                      "; the worker group re-forms and its KV contents are lost"));
      break;
    }
    const v1::RoundResult& r = outcome->result;
    if (metrics_) {
      if (r.has_error()) {
        metrics_->rounds_rejected->Increment();
      } else {
        metrics_->rounds_ok->Increment();
        metrics_->tokens_fed->Increment(static_cast<double>(exec->last_fed()));
        metrics_->rows_voided->Increment(static_cast<double>(exec->last_voided()));
        metrics_->tokens_sampled->Increment(static_cast<double>(exec->last_sampled()));
        metrics_->drafts_accepted->Increment(static_cast<double>(exec->last_accepted()));
        metrics_->state_replayed_tokens->Increment(static_cast<double>(exec->last_replayed()));
        metrics_->drafts_proposed->Increment(static_cast<double>(exec->last_proposed()));
        metrics_->draft_model_seconds->Increment(static_cast<double>(exec->last_draft_us()) * 1e-6);
        metrics_->draft_prefix_tokens->Increment(
            static_cast<double>(exec->last_draft_prefix_fed()));
        metrics_->compute_seconds->Observe(r.compute_time_us() * 1e-6);
        metrics_->collective_seconds->Observe(r.collective_time_us() * 1e-6);
      }
      metrics_->lanes->Set(static_cast<double>(num_lanes()));
    }
    if (r.has_error()) {
      RL_LOG(WARNING) << "round " << plan.round_id() << " rejected: " << r.error().message();
    }
    ++rounds;
    if (!stream->Write(r)) break;  // the client went away
  }
  if (metrics_) metrics_->lanes->Set(0);
  RL_LOG(INFO) << "Rounds stream from " << ctx->peer() << " ended after " << rounds << " rounds, "
               << num_lanes() << " lanes dropped"
               << (end.ok() ? "" : absl::StrCat(": ", end.error_message()));
  return end;
}

v1::BlockKey WorkerService::KeyFor(const std::string& prefix_hash, bool with_state) const {
  v1::BlockKey k;
  k.set_model_id(id_.model_id);
  k.set_prefix_hash(prefix_hash);
  k.set_rank(id_.rank);
  k.set_tp_world_size(id_.world_size);
  k.set_kv_dtype(ToProto(kv_pool_.dtype));
  k.set_block_size_tokens(kv_pool_.block_size);
  k.set_layout_fingerprint(with_state ? checkpoint_layout_fingerprint_ : id_.kv_layout_fingerprint);
  // A state is sharded by heads: every rank stores its own.
  k.set_rank_shared(id_.kv_rank_shared && !with_state);
  return k;
}

namespace {

// A block stored with its state checkpoint: the block's KV, the checkpoint's
// position (8 bytes, little-endian; checked again on restore), the state.
constexpr size_t kPositionBytes = 8;

void AppendPosition(int64_t position, std::vector<uint8_t>* out) {
  for (size_t i = 0; i < kPositionBytes; ++i) {
    out->push_back(static_cast<uint8_t>(static_cast<uint64_t>(position) >> (8 * i)));
  }
}

int64_t ReadPosition(const uint8_t* p) {
  uint64_t v = 0;
  for (size_t i = 0; i < kPositionBytes; ++i) v |= uint64_t{p[i]} << (8 * i);
  return static_cast<int64_t>(v);
}

}  // namespace

void WorkerService::Offload(const v1::RoundPlan& plan) {
  if (kvstore_ == nullptr) return;
  std::vector<uint8_t> payload, state;
  for (const v1::KvBlockRef& ref : plan.offloads()) {
    const bool with_state = ref.has_state_checkpoint();
    // The other ranks' copies of a rank-shared block are these same bytes.
    if (id_.kv_rank_shared && id_.rank != 0 && !with_state) continue;
    // A bad entry costs only its own upload: the forward pass does not read
    // offloads, so ranks need not agree on them.
    if (ref.prefix_hash().size() != kPrefixHashBytes) continue;
    if (with_state && state_bytes_ == 0) continue;
    if (!group_->steps().ExportBlock(ref.block_id(), &payload, nullptr).ok()) continue;
    if (with_state) {
      // A checkpoint that no longer holds this position's state is not
      // stored: the block without it would be a resume point without a state.
      if (!group_->steps()
               .ExportCheckpoint(ref.state_checkpoint(), ref.state_position(), &state, nullptr)
               .ok()) {
        if (metrics_) metrics_->kvstore_checkpoints_unavailable->Increment();
        continue;
      }
      AppendPosition(ref.state_position(), &payload);
      payload.insert(payload.end(), state.begin(), state.end());
      if (metrics_) metrics_->kvstore_checkpoints_offloaded->Increment();
    }
    const uint64_t sum = XXH64(payload.data(), payload.size(), 0);
    if (metrics_) metrics_->kv_blocks_exported->Increment();
    kvstore_->Offload(KeyFor(ref.prefix_hash(), with_state),
                      std::string(reinterpret_cast<const char*>(payload.data()), payload.size()),
                      sum);
  }
}

grpc::Status WorkerService::RestoreKvBlocks(grpc::ServerContext* ctx,
                                            const v1::RestoreKvBlocksRequest* req,
                                            v1::RestoreKvBlocksResponse* resp) {
  if (kvstore_ == nullptr) {
    return grpc::Status(grpc::StatusCode::FAILED_PRECONDITION, "this worker has no kvstore");
  }
  if (req->blocks_size() > kv_pool_.num_blocks) {
    return grpc::Status(
        grpc::StatusCode::INVALID_ARGUMENT,
        absl::StrCat(req->blocks_size(), " blocks to restore; the pool has ", kv_pool_.num_blocks));
  }
  std::vector<v1::BlockKey> keys;
  keys.reserve(static_cast<size_t>(req->blocks_size()));
  for (int i = 0; i < req->blocks_size(); ++i) {
    const v1::KvBlockRef& ref = req->blocks(i);
    if (ref.block_id() < 0 || ref.block_id() >= kv_pool_.num_blocks) {
      return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT,
                          absl::StrCat("blocks[", i, "]: block id ", ref.block_id(),
                                       " outside the pool [0, ", kv_pool_.num_blocks, ")"));
    }
    if (ref.prefix_hash().size() != kPrefixHashBytes) {
      return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT,
                          absl::StrCat("blocks[", i, "]: prefix_hash of ", ref.prefix_hash().size(),
                                       " bytes, expected ", kPrefixHashBytes));
    }
    if (ref.has_state_checkpoint() &&
        (state_bytes_ == 0 || ref.state_checkpoint() < 0 ||
         ref.state_checkpoint() >= kv_pool_.state_checkpoints || ref.state_position() <= 0)) {
      return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT,
                          absl::StrCat("blocks[", i, "]: state checkpoint ", ref.state_checkpoint(),
                                       " at position ", ref.state_position(), " (this rank keeps ",
                                       kv_pool_.state_checkpoints, " checkpoints)"));
    }
    keys.push_back(KeyFor(ref.prefix_hash(), ref.has_state_checkpoint()));
  }
  absl::StatusOr<services::KvGetResult> got = kvstore_->Fetch(keys);
  int restored = 0;
  std::string stopped;
  bool miss = false;
  if (!got.ok()) {
    stopped = absl::StrCat("kvstore: ", got.status().message());
  } else {
    const StepLoop::CancelledFn cancelled = [ctx] { return ctx->IsCancelled(); };
    for (const services::KvStoredBlock& b : got->blocks) {
      const v1::KvBlockRef& ref = req->blocks(restored);
      const bool with_state = ref.has_state_checkpoint();
      const int64_t want =
          kv_block_bytes_ + (with_state ? static_cast<int64_t>(kPositionBytes) + state_bytes_ : 0);
      if (static_cast<int64_t>(b.payload.size()) != want) {
        stopped =
            absl::StrCat("stored block of ", b.payload.size(), " bytes, this rank's are ", want);
        break;
      }
      const auto* data = reinterpret_cast<const uint8_t*>(b.payload.data());
      // Checked before anything is written: a state of another position
      // would resume the lane from the wrong tokens.
      if (with_state && ReadPosition(data + kv_block_bytes_) != ref.state_position()) {
        stopped = absl::StrCat("stored state checkpoint of ", ReadPosition(data + kv_block_bytes_),
                               " positions, expected ", ref.state_position());
        break;
      }
      absl::Status st = group_->steps().ImportBlock(
          ref.block_id(), absl::MakeConstSpan(data, static_cast<size_t>(kv_block_bytes_)),
          cancelled);
      if (st.ok() && with_state) {
        st = group_->steps().ImportCheckpoint(
            ref.state_checkpoint(), ref.state_position(),
            absl::MakeConstSpan(data + kv_block_bytes_ + kPositionBytes,
                                static_cast<size_t>(state_bytes_)),
            cancelled);
        if (st.ok() && metrics_) metrics_->kvstore_checkpoints_restored->Increment();
      }
      if (!st.ok()) {
        stopped = absl::StrCat("import: ", st.message());
        break;
      }
      ++restored;
    }
    if (stopped.empty() && restored < req->blocks_size()) {
      miss = got->stopped.ok();
      stopped = miss ? "not stored" : absl::StrCat("kvstore: ", got->stopped.message());
    }
  }
  if (metrics_) {
    metrics_->kvstore_blocks_restored->Increment(restored);
    metrics_->kv_blocks_imported->Increment(restored);
    if (restored < req->blocks_size()) {
      (miss ? metrics_->kvstore_restore_stopped_miss : metrics_->kvstore_restore_stopped_error)
          ->Increment();
    }
  }
  if (!stopped.empty() && !miss) {
    RL_LOG(WARNING) << "kvstore restore stopped after " << restored << " of " << req->blocks_size()
                    << " blocks: " << stopped;
  }
  resp->set_num_restored(restored);
  resp->set_stopped(stopped);
  return grpc::Status::OK;
}

uint64_t KvLayoutFingerprint(const std::string& backend,
                             const std::vector<LayerCacheSpec>& caches) {
  std::string desc = absl::StrCat("ringlane-kv-layout-v1;", backend);
  for (const LayerCacheSpec& c : caches) {
    absl::StrAppend(&desc, ";", static_cast<int>(c.kind), ",", c.kv_heads, ",", c.head_dim);
    // How a latent row splits decides its packed FP8 layout.
    if (c.kind == CacheKind::kLatentKv) {
      absl::StrAppend(&desc, ",", c.latent_dim, ",", c.rope_dim, ",", c.index_dim);
    }
  }
  return XXH64(desc.data(), desc.size(), 0);
}

grpc::Status WorkerService::ExportKvBlocks(grpc::ServerContext* ctx,
                                           const v1::ExportKvBlocksRequest* req,
                                           grpc::ServerWriter<v1::KvBlockChunk>* writer) {
  if (req->prefix_hashes_size() != 0 && req->prefix_hashes_size() != req->block_ids_size()) {
    return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT,
                        absl::StrCat(req->block_ids_size(), " block ids but ",
                                     req->prefix_hashes_size(), " prefix hashes"));
  }
  if (req->max_chunk_bytes() < 0) {
    return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT, "negative max_chunk_bytes");
  }
  const int64_t chunk = req->max_chunk_bytes() > 0 ? req->max_chunk_bytes() : kDefaultChunkBytes;
  std::vector<uint8_t> payload;
  const StepLoop::CancelledFn cancelled = [ctx] { return ctx->IsCancelled(); };
  for (int i = 0; i < req->block_ids_size(); ++i) {
    if (ctx->IsCancelled()) return grpc::Status::CANCELLED;
    if (absl::Status st = group_->steps().ExportBlock(req->block_ids(i), &payload, cancelled);
        !st.ok()) {
      return services::ToGrpcStatus(st);
    }
    const uint64_t sum = XXH64(payload.data(), payload.size(), 0);
    const v1::BlockKey key = KeyFor(req->prefix_hashes_size() ? req->prefix_hashes(i) : "");
    for (int64_t off = 0; off < static_cast<int64_t>(payload.size()) || off == 0; off += chunk) {
      v1::KvBlockChunk c;
      *c.mutable_key() = key;
      c.set_block_id(req->block_ids(i));
      c.set_offset_bytes(off);
      c.set_total_bytes(static_cast<int64_t>(payload.size()));
      const int64_t n = std::min<int64_t>(chunk, static_cast<int64_t>(payload.size()) - off);
      c.set_data(payload.data() + off, static_cast<size_t>(n));
      c.set_payload_xxh64(sum);
      if (!writer->Write(c)) return grpc::Status::CANCELLED;
      if (payload.empty()) break;
    }
    if (metrics_) metrics_->kv_blocks_exported->Increment();
  }
  return grpc::Status::OK;
}

grpc::Status WorkerService::ImportKvBlocks(grpc::ServerContext* ctx,
                                           grpc::ServerReader<v1::KvBlockChunk>* reader,
                                           v1::ImportKvBlocksResponse* resp) {
  const StepLoop::CancelledFn cancelled = [ctx] { return ctx->IsCancelled(); };
  auto fail = [](grpc::StatusCode code, const std::string& msg) { return grpc::Status(code, msg); };
  v1::KvBlockChunk c;
  std::string payload;
  int32_t block = -1;
  int64_t total = 0;
  uint64_t sum = 0;
  int blocks = 0;
  int64_t bytes = 0;
  auto finish_block = [&]() -> grpc::Status {
    if (XXH64(payload.data(), payload.size(), 0) != sum) {
      return fail(grpc::StatusCode::DATA_LOSS,
                  absl::StrCat("block ", block, ": payload checksum mismatch"));
    }
    absl::Status st = group_->steps().ImportBlock(
        block,
        absl::MakeConstSpan(reinterpret_cast<const uint8_t*>(payload.data()), payload.size()),
        cancelled);
    if (!st.ok()) return services::ToGrpcStatus(st);
    ++blocks;
    bytes += static_cast<int64_t>(payload.size());
    if (metrics_) metrics_->kv_blocks_imported->Increment();
    block = -1;
    return grpc::Status::OK;
  };
  while (reader->Read(&c)) {
    const v1::BlockKey& k = c.key();
    const v1::BlockKey mine = KeyFor(k.prefix_hash());
    if (k.model_id() != mine.model_id() || k.rank() != mine.rank() ||
        k.tp_world_size() != mine.tp_world_size() || k.kv_dtype() != mine.kv_dtype() ||
        k.block_size_tokens() != mine.block_size_tokens()) {
      return fail(
          grpc::StatusCode::FAILED_PRECONDITION,
          absl::StrCat("block for model '", k.model_id(), "' rank ", k.rank(), " of ",
                       k.tp_world_size(), ", kv dtype ", k.kv_dtype(), ", block size ",
                       k.block_size_tokens(), " does not fit this rank (model '", mine.model_id(),
                       "' rank ", mine.rank(), " of ", mine.tp_world_size(), ", kv dtype ",
                       mine.kv_dtype(), ", block size ", mine.block_size_tokens(), ")"));
    }
    if (c.total_bytes() != kv_block_bytes_) {
      return fail(grpc::StatusCode::INVALID_ARGUMENT,
                  absl::StrCat("block payload of ", c.total_bytes(), " bytes; this rank's are ",
                               kv_block_bytes_));
    }
    if (block < 0) {
      if (c.offset_bytes() != 0) {
        return fail(grpc::StatusCode::INVALID_ARGUMENT,
                    absl::StrCat("block ", c.block_id(), " starts at offset ", c.offset_bytes()));
      }
      block = c.block_id();
      total = c.total_bytes();
      sum = c.payload_xxh64();
      payload.clear();
    } else if (c.block_id() != block || c.offset_bytes() != static_cast<int64_t>(payload.size()) ||
               c.payload_xxh64() != sum) {
      return fail(grpc::StatusCode::INVALID_ARGUMENT,
                  absl::StrCat("chunk of block ", c.block_id(), " at offset ", c.offset_bytes(),
                               " does not continue block ", block, " at ", payload.size()));
    }
    if (static_cast<int64_t>(payload.size() + c.data().size()) > total) {
      return fail(grpc::StatusCode::INVALID_ARGUMENT,
                  absl::StrCat("block ", block, ": more data than its ", total, " bytes"));
    }
    payload += c.data();
    if (static_cast<int64_t>(payload.size()) == total) {
      if (grpc::Status st = finish_block(); !st.ok()) return st;
    }
  }
  if (block >= 0) {
    return fail(grpc::StatusCode::INVALID_ARGUMENT,
                absl::StrCat("stream ended inside block ", block, " (", payload.size(), " of ",
                             total, " bytes)"));
  }
  resp->set_num_blocks(blocks);
  resp->set_total_bytes(bytes);
  return grpc::Status::OK;
}

}  // namespace ringlane::worker
