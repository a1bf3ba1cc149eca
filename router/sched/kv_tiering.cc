#include "router/sched/kv_tiering.h"

#include <algorithm>
#include <iterator>
#include <utility>

#include "services/log.h"

namespace ringlane::router {

namespace v1 = ringlane::v1;

namespace {

// Placeholder lanes live far above the planner's lane ids (which count up
// from 1 per stream), so the two never meet in the ledger.
constexpr LaneId kPlaceholderLane0 = LaneId{1} << 62;

}  // namespace

KvTiering::KvTiering(KvTieringOptions options, absl::Mutex* mu)
    : options_(options),
      mu_(mu),
      next_placeholder_(kPlaceholderLane0),
      restorer_([this] { RestoreLoop(); }) {}

KvTiering::~KvTiering() {
  {
    absl::MutexLock l(mu_);
    stop_ = true;
  }
  restorer_.join();
}

void KvTiering::Connected(std::shared_ptr<WorkerGroup> group, bool enabled, GroupMetrics* metrics) {
  group_ = std::move(group);
  enabled_ = enabled;
  metrics_ = metrics;
  ++connection_;
  pending_.clear();
  // The new formation's pool is empty: what the store holds is still there,
  // but nothing prepared for the old ledger applies. Running jobs finish on
  // the restorer thread and are dropped by their connection number.
  jobs_.remove_if([](const Job& j) { return j.state != Job::State::kRunning; });
}

void KvTiering::Remember(const std::string& hash) {
  if (remembered_set_.count(hash) != 0) return;
  remembered_.push_back(hash);
  remembered_set_.emplace(hash, std::prev(remembered_.end()));
  if (remembered_.size() > options_.remembered_hashes) {
    remembered_set_.erase(remembered_.front());
    remembered_.pop_front();
  }
}

void KvTiering::Forget(const std::string& hash) {
  auto it = remembered_set_.find(hash);
  if (it == remembered_set_.end()) return;
  remembered_.erase(it->second);
  remembered_set_.erase(it);
}

void KvTiering::AddOffloads(KvBlockManager& kv, v1::RoundPlan* plan) {
  // Evicted blocks can be written back only by the plan whose planning
  // evicted them: a later plan runs after the rows that overwrite them.
  const std::vector<KvBlockManager::Eviction> evicted = kv.TakeEvictions();
  if (!enabled_ || !options_.offload) {
    kv.TakeRegistrations();
    return;
  }
  for (BlockId b : kv.TakeRegistrations()) pending_.push_back(b);
  while (pending_.size() > options_.max_pending_offloads) pending_.pop_front();
  if (plan->rows_size() == 0) return;  // not sent: the evicted ones are lost
  int added = 0;
  // One entry per hash not offloaded (or restored) recently. With recurrent
  // layers a block that ends at a checkpoint position is stored with its
  // checkpoint or not at all (a store entry is KV and state, or a resume
  // there would lack the state); the ledger may have handed the slot on.
  auto add = [&](BlockId block, const BlockHash& hash, int32_t checkpoint, int64_t end) {
    const bool needs_state = kv.CheckpointPosition(end);
    if (needs_state && checkpoint < 0) return;
    std::string bytes = hash.Bytes();
    if (remembered_set_.count(bytes) != 0) return;
    v1::KvBlockRef* o = plan->add_offloads();
    o->set_block_id(block);
    o->set_prefix_hash(bytes);
    if (needs_state) {
      o->set_state_checkpoint(checkpoint);
      o->set_state_position(end);
    }
    Remember(bytes);
    ++added;
  };
  // Write-back first: these are gone for good after this plan.
  for (const KvBlockManager::Eviction& e : evicted) {
    if (added >= options_.max_offloads_per_round) break;
    add(e.block, e.hash, e.checkpoint, e.end_position);
  }
  while (!pending_.empty() && added < options_.max_offloads_per_round) {
    const BlockId b = pending_.front();
    pending_.pop_front();
    // What the block holds now: it may have been evicted, or evicted and
    // registered again under another chain, since it was recorded.
    if (std::optional<KvBlockManager::RegisteredBlock> r = kv.Registered(b)) {
      add(b, r->hash, r->checkpoint, r->end_position);
    }
  }
  if (added > 0 && metrics_ && metrics_->kvstore_offloaded_blocks) {
    metrics_->kvstore_offloaded_blocks->Increment(added);
  }
}

bool KvTiering::HasWork(uint64_t last_planned_round, uint64_t last_applied_round) const {
  for (const Job& j : jobs_) {
    if (j.state == Job::State::kDone) return true;
    if (j.state == Job::State::kPrepared && j.after_round <= last_applied_round &&
        last_applied_round >= last_planned_round) {
      return true;
    }
  }
  return false;
}

void KvTiering::Prepare(SchedState& s, KvBlockManager& kv, Waiting& w,
                        uint64_t last_planned_round) {
  w.kv_probed = true;
  const Choice& c = w.req->choices[w.choice];
  std::vector<int32_t> seq = w.req->p.prompt;
  seq.insert(seq.end(), c.generated.begin(), c.generated.end());
  const int64_t bs = kv.block_size_tokens();
  // The blocks a lane of this prompt could take as a prefix hit: all full
  // ones but a last token, which is always fed; with recurrent layers, up to
  // the last checkpoint position among them (a resume needs the state).
  int64_t matchable = (static_cast<int64_t>(seq.size()) - 1) / bs;
  if (kv.checkpoints()) {
    const int64_t every = kv.checkpoint_interval();
    matchable = matchable * bs / every * every / bs;
  }
  const int64_t until = kv.ChunkedUntil(static_cast<int64_t>(w.req->p.prompt.size()));
  const int64_t cached = static_cast<int64_t>(kv.MatchPrefix(seq, until).block_ids.size());
  if (matchable <= cached) return;
  Job job;
  job.connection = connection_;
  job.req = w.req;
  job.choice = w.choice;
  job.placeholder = next_placeholder_++;
  job.tokens.assign(seq.begin(), seq.begin() + matchable * bs);
  // Allocate caps its match one block short of the tokens given; the blocks
  // past the match are the fresh ones to fill.
  // Whole blocks only: the restore writes these blocks outside the plans, so
  // no plan could order a copy into one of them.
  absl::StatusOr<int64_t> hit =
      kv.Allocate(job.placeholder, job.tokens, matchable * bs, /*reuse_partial=*/false, until);
  if (!hit.ok()) return;  // no room now: the choice is prefilled as usual
  job.first_block = *hit / bs;
  absl::StatusOr<absl::Span<const BlockId>> table = kv.BlockTable(job.placeholder);
  const std::vector<BlockHash> hashes = ChainHashes(
      kv.identity(), job.tokens, std::numeric_limits<size_t>::max(), kv.linear_chunk(), until);
  if (!table.ok() || hashes.size() != static_cast<size_t>(matchable)) {
    kv.Release(job.placeholder).IgnoreError();
    return;
  }
  for (int64_t i = job.first_block; i < matchable; ++i) {
    v1::KvBlockRef* b = job.request.add_blocks();
    b->set_block_id((*table)[static_cast<size_t>(i)]);
    b->set_prefix_hash(hashes[static_cast<size_t>(i)].Bytes());
    const int64_t end = (i + 1) * bs;
    if (kv.CheckpointPosition(end)) {
      // The restore writes the slot outside the plans: pinned until Finish,
      // so that no plan hands it to another block meanwhile.
      absl::StatusOr<int32_t> slot = kv.CheckpointFor(job.placeholder, end, /*pin=*/true);
      if (!slot.ok() || *slot < 0) {
        // Every slot is pinned: restore up to the previous checkpoint.
        while (job.request.blocks_size() > 0 &&
               !job.request.blocks(job.request.blocks_size() - 1).has_state_checkpoint()) {
          job.request.mutable_blocks()->RemoveLast();
        }
        break;
      }
      job.pins.push_back(*slot);
      b->set_state_checkpoint(*slot);
      b->set_state_position(end);
    }
  }
  if (job.request.blocks_size() == 0) {
    for (int32_t slot : job.pins) kv.UnpinCheckpoint(slot);
    kv.Release(job.placeholder).IgnoreError();
    return;
  }
  job.after_round = last_planned_round;
  w.restoring = true;
  jobs_.push_back(std::move(job));
  static_cast<void>(s);
}

void KvTiering::Finish(SchedState& s, KvBlockManager& kv, Job& job) {
  const int64_t bs = kv.block_size_tokens();
  const int restored = job.restored;
  if (restored > 0) {
    // The restored blocks hold exactly these tokens' KV on every rank, so
    // they are registered like blocks a round computed, and need no offload.
    for (int i = 0; i < restored; ++i) Remember(job.request.blocks(i).prefix_hash());
    const size_t n = static_cast<size_t>((job.first_block + restored) * bs);
    kv.CommitFullBlocks(job.placeholder, absl::MakeConstSpan(job.tokens.data(), n)).IgnoreError();
  }
  // A store that lost blocks (restarted empty, evicted them) gets them
  // offered again the next time a lane registers them.
  for (int i = restored; i < job.request.blocks_size(); ++i) {
    Forget(job.request.blocks(i).prefix_hash());
  }
  // The restored checkpoints belong to registered blocks now; the others'
  // slots are dropped with their blocks at Release.
  for (int32_t slot : job.pins) kv.UnpinCheckpoint(slot);
  kv.Release(job.placeholder).IgnoreError();
  if (metrics_ && metrics_->kvstore_restores_hit) {
    (restored > 0 ? metrics_->kvstore_restores_hit : metrics_->kvstore_restores_miss)->Increment();
    metrics_->kvstore_restored_tokens->Increment(static_cast<double>(restored * bs));
  }
  for (Waiting& w : s.waiting) {
    if (w.req == job.req && w.choice == job.choice) w.restoring = false;
  }
}

void KvTiering::Poll(SchedState& s, KvBlockManager& kv, uint64_t last_planned_round,
                     uint64_t last_applied_round) {
  for (auto it = jobs_.begin(); it != jobs_.end();) {
    if (it->state == Job::State::kDone) {
      if (it->connection == connection_) Finish(s, kv, *it);
      it = jobs_.erase(it);
    } else {
      ++it;
    }
  }
  if (!enabled_ || !options_.restore || group_ == nullptr) return;
  for (Job& j : jobs_) {
    // Every round planned before the job's blocks were handed out has run
    // on every rank, so no write of theirs can land after the restore.
    if (j.state == Job::State::kPrepared && j.after_round <= last_applied_round) {
      j.state = Job::State::kRunning;
    }
  }
  int active = static_cast<int>(jobs_.size());
  for (Waiting& w : s.waiting) {
    if (active >= options_.max_restores) break;
    if (w.kv_probed || w.req->dead()) continue;
    Prepare(s, kv, w, last_planned_round);
    if (w.restoring) ++active;
  }
  // Blocks a placeholder evicted are overwritten by its restore, which no
  // plan orders: they cannot be written back.
  kv.TakeEvictions();
}

void KvTiering::RestoreLoop() {
  for (;;) {
    Job* job = nullptr;
    std::shared_ptr<WorkerGroup> group;
    v1::RestoreKvBlocksRequest request;
    {
      absl::MutexLock l(mu_);
      auto ready = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(*mu_) {
        if (stop_) return true;
        for (const Job& j : jobs_) {
          if (j.state == Job::State::kRunning && j.restored == 0 && j.request.blocks_size() > 0) {
            return true;
          }
        }
        return false;
      };
      mu_->Await(absl::Condition(&ready));
      if (stop_) return;
      for (Job& j : jobs_) {
        if (j.state == Job::State::kRunning && j.restored == 0 && j.request.blocks_size() > 0) {
          job = &j;
          break;
        }
      }
      group = group_;
      request = job->request;
      // Claimed: clearing the blocks marks it taken (its copy is `request`).
      job->request.clear_blocks();
    }
    const int restored = group ? group->RestoreKvBlocks(request, options_.restore_deadline) : 0;
    absl::MutexLock l(mu_);
    // std::list keeps `job` valid: only Poll erases, and only done jobs.
    *job->request.mutable_blocks() = request.blocks();
    job->restored = restored;
    job->state = Job::State::kDone;
  }
}

}  // namespace ringlane::router
