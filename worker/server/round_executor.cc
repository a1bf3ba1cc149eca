#include "worker/server/round_executor.h"

#include <algorithm>
#include <chrono>
#include <set>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"

namespace ringlane::worker {

namespace v1 = ringlane::v1;

namespace {
// LaneStep.propose_drafts' documented range (a worker proposes at most
// kMaxProposedDrafts of them).
constexpr int kMaxProposeDraftsField = 64;
}  // namespace

absl::StatusOr<SamplingParams> FromProto(const v1::SamplingParams& p) {
  if (!p.has_temperature()) return absl::InvalidArgumentError("sampling.temperature is not set");
  if (!p.has_seed()) return absl::InvalidArgumentError("sampling.seed is not set");
  SamplingParams s;
  s.temperature = p.temperature();
  s.top_k = p.top_k();
  s.top_p = p.has_top_p() ? p.top_p() : 1.0f;
  s.min_p = p.min_p();
  s.presence_penalty = p.presence_penalty();
  s.frequency_penalty = p.frequency_penalty();
  s.seed = p.seed();
  if (p.top_logprobs() < 0 || p.top_logprobs() > kMaxTopLogprobs) {
    return absl::InvalidArgumentError(
        absl::StrCat("sampling.top_logprobs must be in [0, ", kMaxTopLogprobs, "]"));
  }
  s.top_logprobs = p.top_logprobs() > 0 ? p.top_logprobs() : (p.logprobs() ? 0 : -1);
  // A protobuf map has no order; the sampler wants one.
  s.logit_bias.assign(p.logit_bias().begin(), p.logit_bias().end());
  std::sort(s.logit_bias.begin(), s.logit_bias.end());
  if (absl::Status st = ValidateSamplingParams(s); !st.ok()) {
    return absl::InvalidArgumentError(absl::StrCat("sampling: ", st.message()));
  }
  return s;
}

RoundExecutor::RoundExecutor(Backend* backend, int rank, TimedCommunicator* timer,
                             DraftRunner* draft)
    : backend_(backend), rank_(rank), timer_(timer), draft_(draft) {}

absl::Status RoundExecutor::ValidateEarlierOutput(const v1::LaneStep& row) const {
  const ModelConfig& config = backend_->config();
  // Every earlier output token is one of the lane's prompt positions, so a
  // list as long as the context cannot come from a real preemption.
  if (config.max_position > 0 && row.earlier_output_token_ids_size() >= config.max_position) {
    return absl::InvalidArgumentError(
        absl::StrCat("earlier_output_token_ids: ", row.earlier_output_token_ids_size(),
                     " tokens, the context holds ", config.max_position));
  }
  return InVocabulary("earlier_output_token_ids", row.earlier_output_token_ids());
}

absl::Status RoundExecutor::InVocabulary(
    absl::string_view field, const google::protobuf::RepeatedField<int32_t>& ids) const {
  const int vocab = backend_->config().vocab;
  for (int k = 0; k < ids.size(); ++k) {
    if (ids[k] < 0 || ids[k] >= vocab) {
      return absl::InvalidArgumentError(absl::StrCat(
          field, "[", k, "] = ", ids[k], " is outside the vocabulary [0, ", vocab, ")"));
    }
  }
  return absl::OkStatus();
}

bool RoundExecutor::Voided(const v1::LaneStep& row) const {
  if (!row.assume_accepted()) return false;
  auto it = lanes_.find(row.lane_id());
  return it != lanes_.end() && it->second->next_position != row.start_position();
}

absl::Status RoundExecutor::Validate(const v1::RoundPlan& plan) const {
  std::set<uint64_t> seen;
  for (int i = 0; i < plan.rows_size(); ++i) {
    const v1::LaneStep& row = plan.rows(i);
    auto bad = [&](const std::string& why) {
      return absl::InvalidArgumentError(
          absl::StrCat("row ", i, " (lane ", row.lane_id(), "): ", why));
    };
    if (!seen.insert(row.lane_id()).second) return bad("the lane appears twice in the round");
    auto it = lanes_.find(row.lane_id());
    const bool known = it != lanes_.end();
    const int64_t n = (row.use_last_sampled() ? 1 : 0) + row.token_ids_size();
    if (!known && !row.has_sampling()) {
      // Releasing a lane this rank never saw (its first plan was rejected)
      // is harmless; anything else needs the lane's parameters.
      // A row that also asks for a sample is not a plain release (found by
      // round_plan_fuzz: it was skipped, and its sample silently missing).
      if (n == 0 && row.release_lane() && !row.sample_last() && row.verify_offsets_size() == 0) {
        continue;
      }
      return bad("unknown lane without sampling parameters");
    }
    if (known && row.has_sampling()) return bad("sampling parameters for a lane that has them");
    if (!known) {
      auto p = FromProto(row.sampling());
      if (!p.ok()) return bad(std::string(p.status().message()));
      if (row.choice_index() < 0) return bad("negative choice_index");
      for (const auto& [token, bias] : row.sampling().logit_bias()) {
        if (token >= backend_->config().vocab) {
          return bad(absl::StrCat("sampling.logit_bias: token ", token,
                                  " is outside the vocabulary [0, ", backend_->config().vocab,
                                  ")"));
        }
      }
    }
    if (row.earlier_output_token_ids_size() > 0) {
      if (!row.has_sampling()) return bad("earlier_output_token_ids without sampling parameters");
      if (absl::Status st = ValidateEarlierOutput(row); !st.ok()) {
        return bad(std::string(st.message()));
      }
    }
    if (row.use_last_sampled() && !(known && it->second->has_last)) {
      return bad("use_last_sampled before the lane sampled a token");
    }
    if (row.assume_accepted() && !row.use_last_sampled()) {
      return bad("assume_accepted without use_last_sampled");
    }
    if (row.start_position() < 0) return bad("negative start_position");
    // Every position sums from here on (start + tokens, + a checkpoint's
    // offset): one past the pool would overflow them (round_plan_fuzz). A
    // block covers block_tokens() positions (more under context parallel).
    const int64_t pool_positions =
        int64_t{backend_->kv_pool().num_blocks} * backend_->block_tokens();
    if (row.start_position() > pool_positions) {
      return bad(absl::StrCat("start_position ", row.start_position(), " past the KV pool's ",
                              pool_positions, " positions"));
    }
    if (row.prefix_token_ids_size() > 0) {
      if (!row.has_sampling()) return bad("prefix_token_ids without sampling parameters");
      if (row.prefix_token_ids_size() != row.start_position()) {
        return bad(absl::StrCat("prefix_token_ids: ", row.prefix_token_ids_size(),
                                " tokens for start_position ", row.start_position()));
      }
      if (absl::Status st = InVocabulary("prefix_token_ids", row.prefix_token_ids()); !st.ok()) {
        return bad(std::string(st.message()));
      }
    }
    if (row.linear_chunked_until() < 0) return bad("negative linear_chunked_until");
    if (backend_->kv_pool().state_slots > 0 && n > 0) {
      // A row that may turn out void cannot promise a state at any position.
      if (row.assume_accepted() && row.state_checkpoints_size() > 0) {
        return bad("state checkpoints on an assume_accepted row (it may be void)");
      }
      // A void row runs nothing: where it says the state stands does not
      // matter.
      if (!Voided(row)) {
        // A recurrent state only moves forward: a row must continue exactly
        // where the lane's state stands, a new lane from position 0 or from
        // the checkpoint it resumes (the backend checks the checkpoint holds
        // that position). Rejected drafts would need per-draft states.
        if (row.has_resume_checkpoint() && known) {
          return bad("resume_checkpoint on a lane that already has a state");
        }
        const int64_t at = known                         ? it->second->state_position
                           : row.has_resume_checkpoint() ? row.start_position()
                                                         : 0;
        if (row.start_position() != at) {
          return bad(absl::StrCat("start_position ", row.start_position(),
                                  " but this model's recurrent state stands at position ", at,
                                  " (resuming elsewhere needs a state checkpoint)"));
        }
        // A verify row's drafts may be rejected: only its first token's state
        // is sure to stand.
        const int64_t sure = row.verify_offsets_size() > 1 ? 1 : n;
        for (const v1::StateCheckpoint& c : row.state_checkpoints()) {
          if (c.position() <= row.start_position() || c.position() > row.start_position() + sure) {
            return bad(absl::StrCat("state checkpoint at position ", c.position(),
                                    " outside the row's ",
                                    sure == 1 ? "first position" : "positions"));
          }
        }
      }
    } else if (row.has_resume_checkpoint() || row.state_checkpoints_size() > 0) {
      return bad("state checkpoints for a model without recurrent state (or a row without tokens)");
    }
    if (row.propose_drafts() < 0 || row.propose_drafts() > kMaxProposeDraftsField) {
      return bad(absl::StrCat("propose_drafts must be in [0, ", kMaxProposeDraftsField, "]"));
    }
    const bool verify = row.verify_offsets_size() > 0;
    if (row.sample_last() && verify) return bad("both sample_last and verify_offsets");
    if ((row.sample_last() || verify) && n == 0) return bad("sampling from a row with no tokens");
    if (verify) {
      for (int k = 0; k < row.verify_offsets_size(); ++k) {
        const int o = row.verify_offsets(k);
        if (o < 0 || (k > 0 && o != row.verify_offsets(k - 1) + 1)) {
          return bad("verify_offsets must be consecutive and non-negative");
        }
      }
      if (row.verify_offsets(row.verify_offsets_size() - 1) != n - 1) {
        return bad("the last verify offset must be the row's last position");
      }
    }
    if (row.allowed_tokens_size() > 0) {
      const int samples = row.sample_last() ? 1 : row.verify_offsets_size();
      if (row.allowed_tokens_size() != samples) {
        return bad(absl::StrCat(row.allowed_tokens_size(), " allowed_tokens masks for ", samples,
                                " sampled positions"));
      }
      const size_t bytes = (static_cast<size_t>(backend_->config().vocab) + 7) / 8;
      for (int k = 0; k < row.allowed_tokens_size(); ++k) {
        const std::string& mask = row.allowed_tokens(k);
        if (mask.size() != bytes) {
          return bad(absl::StrCat("allowed_tokens[", k, "] has ", mask.size(),
                                  " bytes; the vocabulary needs ", bytes));
        }
        // Bits past the vocabulary would allow tokens that do not exist.
        const int tail = backend_->config().vocab % 8;
        if (tail != 0 && (static_cast<uint8_t>(mask.back()) >> tail) != 0) {
          return bad(absl::StrCat("allowed_tokens[", k, "] allows tokens past the vocabulary"));
        }
        if (std::all_of(mask.begin(), mask.end(), [](char c) { return c == 0; })) {
          return bad(absl::StrCat("allowed_tokens[", k, "] allows no token"));
        }
      }
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<v1::RoundResult> RoundExecutor::Run(const v1::RoundPlan& plan) {
  v1::RoundResult result;
  result.set_round_id(plan.round_id());
  auto reject = [&](const absl::Status& st) {
    result.mutable_error()->set_code(static_cast<int>(st.code()));
    result.mutable_error()->set_message(std::string(st.message()));
    return result;
  };
  last_sampled_ = 0;
  last_accepted_ = 0;
  last_fed_ = 0;
  last_voided_ = 0;
  last_replayed_ = 0;
  last_proposed_ = 0;
  last_draft_prefix_fed_ = 0;
  last_draft_us_ = 0;
  if (absl::Status st = Validate(plan); !st.ok()) return reject(st);

  // Recurrent models: every new lane with tokens takes a state slot now, for
  // its first round; they go back if the backend rejects the round.
  const int state_slots = backend_->kv_pool().state_slots;
  if (state_slots > 0 && !slots_ready_) {
    free_slots_.clear();
    for (int32_t k = state_slots - 1; k >= 0; --k) free_slots_.push_back(k);
    slots_ready_ = true;
  }
  // A lane released by a row without tokens gives its slot back first, so
  // a lane that finishes and one that starts can share a round (the router
  // admits as many lanes as there are slots). Nothing changes until the
  // round is accepted.
  std::map<uint64_t, int32_t> new_slots;
  std::vector<int32_t> avail;
  std::set<uint64_t> released_first;
  if (state_slots > 0) {
    avail = free_slots_;
    for (const v1::LaneStep& row : plan.rows()) {
      auto it = lanes_.find(row.lane_id());
      if (it == lanes_.end() || !row.release_lane() || it->second->state_slot < 0) continue;
      if (row.use_last_sampled() || row.token_ids_size() > 0) continue;
      avail.push_back(it->second->state_slot);
      released_first.insert(row.lane_id());
    }
    for (const v1::LaneStep& row : plan.rows()) {
      if (lanes_.count(row.lane_id()) || !row.has_sampling()) continue;
      if (!row.use_last_sampled() && row.token_ids_size() == 0) continue;
      if (avail.empty()) {
        return reject(absl::ResourceExhaustedError(
            absl::StrCat("every one of the ", state_slots,
                         " recurrent state slots is held by a lane (the worker's --state_slots)")));
      }
      new_slots[row.lane_id()] = avail.back();
      avail.pop_back();
    }
  }

  const auto t0 = std::chrono::steady_clock::now();
  if (timer_) timer_->TakeElapsedUs();
  // Rows with tokens become the backend's sequences, in row order.
  RoundInput in;
  std::vector<int> seq_of_row(plan.rows_size(), -1);
  for (int i = 0; i < plan.rows_size(); ++i) {
    const v1::LaneStep& row = plan.rows(i);
    if (!row.use_last_sampled() && row.token_ids_size() == 0) continue;
    // Decided before any row runs: a lane has one row per round, so its
    // state here is what the rounds before left.
    if (Voided(row)) {
      ++last_voided_;
      continue;
    }
    SeqStep s;
    s.start_position = row.start_position();
    if (row.use_last_sampled()) s.tokens.push_back(lanes_.at(row.lane_id())->last_sampled);
    s.tokens.insert(s.tokens.end(), row.token_ids().begin(), row.token_ids().end());
    s.block_ids.assign(row.block_ids().begin(), row.block_ids().end());
    if (state_slots > 0) {
      auto known = lanes_.find(row.lane_id());
      s.state_slot =
          known != lanes_.end() ? known->second->state_slot : new_slots.at(row.lane_id());
      if (row.has_resume_checkpoint()) s.restore_checkpoint = row.resume_checkpoint();
      s.linear_chunked_until = row.linear_chunked_until();
      for (const v1::StateCheckpoint& c : row.state_checkpoints()) {
        s.state_saves.push_back(
            {static_cast<int32_t>(c.position() - row.start_position() - 1), c.slot()});
      }
    }
    if (row.sample_last()) {
      s.logit_offsets.push_back(static_cast<int32_t>(s.tokens.size() - 1));
    } else {
      s.logit_offsets.assign(row.verify_offsets().begin(), row.verify_offsets().end());
    }
    seq_of_row[i] = static_cast<int>(in.seqs.size());
    last_fed_ += static_cast<int64_t>(s.tokens.size());
    in.seqs.push_back(std::move(s));
  }
  in.block_copies.reserve(static_cast<size_t>(plan.block_copies_size()));
  for (const v1::KvBlockCopy& c : plan.block_copies()) {
    in.block_copies.push_back(BlockCopy{.src = c.src_block_id(), .dst = c.dst_block_id()});
  }
  RoundOutput out;
  in.want_hidden = draft_ != nullptr && draft_->wants_hidden();
  // Recurrent models: a verify row's lane state is kept as it was before the
  // row, to rewind it past drafts that turn out rejected (the recurrence
  // cannot be undone; the accepted tokens are fed again from there).
  std::vector<int> rewindable(in.seqs.size(), 0);
  if (state_slots > 0) {
    if (rewind_.size() < in.seqs.size()) rewind_.resize(in.seqs.size());
    for (int i = 0; i < plan.rows_size(); ++i) {
      const v1::LaneStep& row = plan.rows(i);
      const int seq = seq_of_row[i];
      if (seq < 0 || row.verify_offsets_size() < 2 || row.release_lane()) continue;
      if (absl::Status st = backend_->SaveStateSlot(in.seqs[seq].state_slot, &rewind_[seq]);
          !st.ok()) {
        return st;
      }
      rewindable[seq] = 1;
    }
  }
  if (!in.seqs.empty() || !in.block_copies.empty()) {
    absl::StatusOr<RoundOutput> o = backend_->Step(in);
    if (!o.ok()) {
      // The backend checks a round completely before its first collective, so
      // every rank rejects the same plan without meeting the others.
      if (absl::IsInvalidArgument(o.status())) return reject(o.status());
      return o.status();
    }
    out = std::move(*o);
  }

  // What the draft model is fed of each sequence: all of it, less the
  // rejected drafts of a verify row, and the last sample where the row asks
  // for a proposal.
  std::vector<DraftRunner::Feed> feeds;
  std::vector<v1::LaneOutput*> output_of_seq;
  if (draft_ != nullptr) {
    feeds.resize(in.seqs.size());
    output_of_seq.assign(in.seqs.size(), nullptr);
    for (int i = 0; i < plan.rows_size(); ++i) {
      if (seq_of_row[i] < 0) continue;
      feeds[seq_of_row[i]].lane = plan.rows(i).lane_id();
      feeds[seq_of_row[i]].keep = static_cast<int>(in.seqs[seq_of_row[i]].tokens.size());
      feeds[seq_of_row[i]].prefix = plan.rows(i).prefix_token_ids();
    }
  }

  // The plan is accepted: create lanes, sample, release.
  RoundInput replay;  // the rewound lanes' kept tokens, fed again below
  if (state_slots > 0) {
    free_slots_ = std::move(avail);
    for (uint64_t lane : released_first) lanes_.at(lane)->state_slot = -1;
  }
  for (int i = 0; i < plan.rows_size(); ++i) {
    const v1::LaneStep& row = plan.rows(i);
    auto it = lanes_.find(row.lane_id());
    if (it == lanes_.end()) {
      if (!row.has_sampling()) continue;  // release of an unknown lane
      it = lanes_
               .emplace(row.lane_id(),
                        std::make_unique<Lane>(*FromProto(row.sampling()),
                                               static_cast<uint32_t>(row.choice_index()),
                                               row.earlier_output_token_ids()))
               .first;
    }
    Lane& lane = *it->second;
    const int seq = seq_of_row[i];
    if (state_slots > 0 && seq >= 0) {
      if (lane.state_slot < 0) lane.state_slot = new_slots.at(row.lane_id());
      lane.state_position =
          in.seqs[seq].start_position + static_cast<int64_t>(in.seqs[seq].tokens.size());
    }
    if (seq >= 0 && !in.seqs[seq].logit_offsets.empty()) {
      const SeqStep& s = in.seqs[seq];
      const std::vector<float>& logits = out.logits[seq];
      v1::LaneOutput* lo = rank_ == 0 ? result.add_outputs() : nullptr;
      if (lo) lo->set_lane_id(row.lane_id());
      int accepted = 0;
      for (size_t k = 0; k < s.logit_offsets.size(); ++k) {
        const int32_t off = s.logit_offsets[k];
        absl::Span<const float> row_logits(logits.data() + k * out.vocab, out.vocab);
        const uint8_t* allowed =
            row.allowed_tokens_size() > 0
                ? reinterpret_cast<const uint8_t*>(row.allowed_tokens(static_cast<int>(k)).data())
                : nullptr;
        SampleResult r = lane.sampler.Sample(row_logits, s.start_position + off + 1, allowed);
        lane.sampler.Observe(r.token);
        lane.last_sampled = r.token;
        lane.has_last = true;
        ++last_sampled_;
        if (lo) {
          v1::SampledToken* t = lo->add_tokens();
          t->set_token_id(r.token);
          t->set_logprob(r.logprob);
          for (const TokenLogprob& alt : r.top) {
            v1::TokenLogprob* a = t->add_top_logprobs();
            a->set_token_id(alt.token);
            a->set_logprob(alt.logprob);
          }
        }
        // A draft is the input at the next offset; the first one that differs
        // from the sample ends the row's output (that sample is the bonus).
        const bool last = k + 1 == s.logit_offsets.size();
        if (last || s.tokens[off + 1] != r.token) break;
        ++accepted;
      }
      last_accepted_ += accepted;
      if (lo) lo->set_accepted_draft_count(accepted);
      const int kept = s.logit_offsets[0] + accepted + 1;
      lane.next_position = s.start_position + kept;
      if (rewindable[seq] && kept < static_cast<int>(s.tokens.size())) {
        // Rewind: the state as before the row, then its kept tokens again.
        if (absl::Status st = backend_->RestoreStateSlot(s.state_slot, rewind_[seq]); !st.ok()) {
          return st;
        }
        SeqStep again;
        again.start_position = s.start_position;
        again.tokens.assign(s.tokens.begin(), s.tokens.begin() + kept);
        again.block_ids = s.block_ids;
        again.state_slot = s.state_slot;
        replay.seqs.push_back(std::move(again));
        lane.state_position = s.start_position + kept;
      }
      if (draft_ != nullptr) {
        DraftRunner::Feed& f = feeds[seq];
        f.keep = s.logit_offsets[0] + accepted + 1;
        f.has_next = true;
        f.next = lane.last_sampled;
        if (row.propose_drafts() > 0 && !row.release_lane()) {
          f.propose = row.propose_drafts();
          output_of_seq[seq] = lo;
        }
      }
    }
    if (row.release_lane()) {
      if (lane.state_slot >= 0) free_slots_.push_back(lane.state_slot);
      lanes_.erase(it);
      if (draft_ != nullptr) draft_->Forget(row.lane_id());
    }
  }
  if (!replay.seqs.empty()) {
    // Same tokens at the same positions over the same context: the KV it
    // writes again is the same, and each state ends where plain decode
    // would have it. Every rank replays the same rows (the samples agree).
    absl::StatusOr<RoundOutput> o = backend_->Step(replay);
    if (!o.ok()) return o.status();
    last_replayed_ = 0;
    for (const SeqStep& q : replay.seqs) last_replayed_ += static_cast<int64_t>(q.tokens.size());
  }
  if (draft_ != nullptr && (!in.seqs.empty() || !in.block_copies.empty())) {
    const auto d0 = std::chrono::steady_clock::now();
    std::vector<std::vector<int32_t>> proposals = draft_->Run(in, feeds, out);
    last_draft_us_ =
        std::chrono::duration_cast<std::chrono::microseconds>(std::chrono::steady_clock::now() - d0)
            .count();
    result.set_draft_propose_time_us(draft_->last_propose_us());
    last_draft_prefix_fed_ = draft_->last_prefix_fed();
    for (size_t k = 0; k < proposals.size(); ++k) {
      last_proposed_ += static_cast<int64_t>(proposals[k].size());
      if (output_of_seq[k] == nullptr) continue;
      output_of_seq[k]->mutable_draft_token_ids()->Add(proposals[k].begin(), proposals[k].end());
    }
  }
  result.set_draft_tokens_proposed(static_cast<int32_t>(last_proposed_));
  const int64_t total_us =
      std::chrono::duration_cast<std::chrono::microseconds>(std::chrono::steady_clock::now() - t0)
          .count();
  const int64_t coll_us = timer_ ? timer_->TakeElapsedUs() : 0;
  result.set_collective_time_us(coll_us);
  result.set_compute_time_us(std::max<int64_t>(0, total_us - coll_us));
  return result;
}

}  // namespace ringlane::worker
