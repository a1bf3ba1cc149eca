#include "router/kv/kv_block_manager.h"

#include <xxhash.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"

namespace ringlane::router {
namespace {

// Part of the persisted hash format (see kv_block_manager.h).
constexpr std::string_view kChainTag = "ringlane-kv-chain-v1";

void PutU32(std::string& out, uint32_t v) {
  for (int i = 0; i < 4; ++i) out.push_back(static_cast<char>((v >> (8 * i)) & 0xff));
}

void PutString(std::string& out, const std::string& s) {
  PutU32(out, static_cast<uint32_t>(s.size()));
  out.append(s);
}

BlockHash FromXxh(XXH128_hash_t h) { return BlockHash{.high = h.high64, .low = h.low64}; }

BlockHash Truncate(BlockHash h, int bits) {
  if (bits >= 128) return h;
  if (bits <= 64) {
    h.high = 0;
    if (bits < 64) h.low &= (uint64_t{1} << bits) - 1;
  } else {
    h.high &= (uint64_t{1} << (bits - 64)) - 1;
  }
  return h;
}

}  // namespace

std::string BlockHash::Bytes() const {
  XXH128_canonical_t c;
  XXH128_canonicalFromHash(&c, XXH128_hash_t{.low64 = low, .high64 = high});
  return std::string(reinterpret_cast<const char*>(c.digest), sizeof(c.digest));
}

BlockHash ChainRoot(const BlockIdentity& identity) {
  std::string bytes(kChainTag);
  PutString(bytes, identity.model_id);
  PutString(bytes, identity.model_revision);
  PutString(bytes, identity.kv_dtype);
  PutString(bytes, identity.layout);
  PutU32(bytes, static_cast<uint32_t>(identity.block_size_tokens));
  PutU32(bytes, static_cast<uint32_t>(identity.tp_world_size));
  return FromXxh(XXH3_128bits(bytes.data(), bytes.size()));
}

BlockHash ChainNext(const BlockHash& parent, absl::Span<const int32_t> block_tokens, int64_t tag) {
  std::string bytes = parent.Bytes();
  bytes.reserve(bytes.size() + 4 * block_tokens.size() + 8);
  for (int32_t t : block_tokens) PutU32(bytes, static_cast<uint32_t>(t));
  if (tag != 0) {
    PutU32(bytes, static_cast<uint32_t>(static_cast<uint64_t>(tag)));
    PutU32(bytes, static_cast<uint32_t>(static_cast<uint64_t>(tag) >> 32));
  }
  return FromXxh(XXH3_128bits(bytes.data(), bytes.size()));
}

int64_t BlockTag(int64_t linear_chunk, int64_t end, int64_t chunked_until) {
  return linear_chunk > 0 && end > chunked_until ? chunked_until + 1 : 0;
}

std::vector<BlockHash> ChainHashes(const BlockIdentity& identity, absl::Span<const int32_t> tokens,
                                   size_t max_blocks, int64_t linear_chunk, int64_t chunked_until) {
  std::vector<BlockHash> out;
  if (identity.block_size_tokens <= 0) return out;
  const size_t block = static_cast<size_t>(identity.block_size_tokens);
  const size_t n = std::min(max_blocks, tokens.size() / block);
  BlockHash h = ChainRoot(identity);
  for (size_t i = 0; i < n; ++i) {
    const int64_t end = static_cast<int64_t>((i + 1) * block);
    h = ChainNext(h, tokens.subspan(i * block, block), BlockTag(linear_chunk, end, chunked_until));
    out.push_back(h);
  }
  return out;
}

absl::StatusOr<std::unique_ptr<KvBlockManager>> KvBlockManager::Create(Options options) {
  const BlockIdentity& id = options.identity;
  if (options.num_blocks <= 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("num_blocks must be positive, got ", options.num_blocks));
  }
  if (id.block_size_tokens <= 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("block_size_tokens must be positive, got ", id.block_size_tokens));
  }
  if (id.tp_world_size <= 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("tp_world_size must be positive, got ", id.tp_world_size));
  }
  if (id.model_id.empty()) return absl::InvalidArgumentError("model_id is empty");
  if (id.kv_dtype.empty()) return absl::InvalidArgumentError("kv_dtype is empty");
  if (options.state_checkpoints < 0 ||
      (options.state_checkpoints > 0 &&
       (options.checkpoint_interval <= 0 ||
        options.checkpoint_interval % id.block_size_tokens != 0))) {
    return absl::InvalidArgumentError(absl::StrCat(
        "state checkpoints (", options.state_checkpoints, ") need an interval (",
        options.checkpoint_interval, ") that is a positive multiple of the block size (",
        id.block_size_tokens, ")"));
  }
  if (options.linear_chunk < 0 || (options.linear_chunk > 0 && options.state_checkpoints > 0 &&
                                   options.checkpoint_interval % options.linear_chunk != 0)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "the KDA chunk (", options.linear_chunk,
        ") must be >= 0 and divide the checkpoint interval (", options.checkpoint_interval, ")"));
  }
  if (options.hash_bits_for_testing < 0 || options.hash_bits_for_testing > 128) {
    return absl::InvalidArgumentError(
        absl::StrCat("hash bits must be in 0..128, got ", options.hash_bits_for_testing));
  }
  return std::unique_ptr<KvBlockManager>(new KvBlockManager(std::move(options)));
}

KvBlockManager::KvBlockManager(Options options)
    : num_blocks_(options.num_blocks),
      block_size_(options.identity.block_size_tokens),
      identity_(std::move(options.identity)),
      hash_bits_(options.hash_bits_for_testing),
      max_recorded_registrations_(options.max_recorded_registrations),
      reuse_partial_(options.reuse_partial_blocks),
      reuse_prefixes_(options.reuse_prefixes),
      state_checkpoints_(options.state_checkpoints),
      checkpoint_interval_(options.checkpoint_interval),
      linear_chunk_(options.linear_chunk),
      root_(Truncate(ChainRoot(identity_), hash_bits_)),
      blocks_(num_blocks_) {
  Reset();
  counters_.resets = 0;
}

BlockHash KvBlockManager::HashBlock(const BlockHash& parent, absl::Span<const int32_t> block_tokens,
                                    int64_t tag) const {
  return Truncate(ChainNext(parent, block_tokens, tag), hash_bits_);
}

bool KvBlockManager::LinkValid(const Link& link) const {
  if (link.block < 0) return true;
  const Block& b = blocks_[link.block];
  return b.registered && b.generation == link.generation;
}

KvBlockManager::PrefixMatch KvBlockManager::Walk(absl::Span<const int32_t> tokens, bool partial,
                                                 int64_t chunked_until) const {
  PrefixMatch match;
  if (!reuse_prefixes_) return match;
  // The last token is always recomputed: its logits give the first sample.
  const int64_t max_tokens = tokens.empty() ? 0 : static_cast<int64_t>(tokens.size()) - 1;
  const size_t bs = static_cast<size_t>(block_size_);
  const size_t n = static_cast<size_t>(max_tokens) / bs;
  BlockHash hash = root_;
  Link link;
  for (size_t i = 0; i < n; ++i) {
    absl::Span<const int32_t> want = tokens.subspan(i * bs, bs);
    const int64_t tag = BlockTag(linear_chunk_, static_cast<int64_t>((i + 1) * bs), chunked_until);
    hash = HashBlock(hash, want, tag);
    auto it = index_.find(hash);
    if (it == index_.end()) break;
    const Block& b = blocks_[it->second];
    // The hash only finds a candidate; the tokens, the tag and the
    // registration link decide, so a collision is a miss and never someone
    // else's KV.
    if (b.parent != link || b.tag != tag ||
        !std::equal(want.begin(), want.end(), b.tokens.begin(), b.tokens.end())) {
      break;
    }
    match.block_ids.push_back(it->second);
    link = Link{.block = it->second, .generation = b.generation};
  }
  if (state_checkpoints_ > 0) {
    // A recurrent state resumes only where a checkpoint of it was kept.
    while (!match.block_ids.empty() && blocks_[match.block_ids.back()].checkpoint < 0) {
      match.block_ids.pop_back();
    }
    match.cached_tokens = static_cast<int64_t>(match.block_ids.size()) * block_size_;
    return match;
  }
  match.cached_tokens = static_cast<int64_t>(match.block_ids.size()) * block_size_;
  if (!partial) return match;
  // The first positions of a block chained on the same registration: the
  // key names the parent exactly, and the tokens are compared one by one.
  const int64_t start = match.cached_tokens;
  const int64_t room = std::min<int64_t>(block_size_, max_tokens - start);
  if (room <= 0) return match;
  auto it = children_.find(KeyOf(link, tokens[static_cast<size_t>(start)]));
  if (it == children_.end()) return match;
  for (BlockId c : it->second) {
    const Block& b = blocks_[c];
    const int64_t limit = std::min<int64_t>(room, static_cast<int64_t>(b.tokens.size()));
    int64_t m = 0;
    while (m < limit &&
           b.tokens[static_cast<size_t>(m)] == tokens[static_cast<size_t>(start + m)]) {
      ++m;
    }
    if (m > match.partial_tokens) {
      match.partial_tokens = m;
      match.partial_block = c;
    }
  }
  match.cached_tokens += match.partial_tokens;
  return match;
}

KvBlockManager::PrefixMatch KvBlockManager::MatchPrefix(absl::Span<const int32_t> tokens,
                                                        int64_t chunked_until) const {
  return Walk(tokens, reuse_partial_, chunked_until);
}

void KvBlockManager::AddChild(BlockId id) {
  const Block& b = blocks_[id];
  children_[KeyOf(b.parent, b.tokens.front())].push_back(id);
}

bool KvBlockManager::Dominated(const Link& parent, absl::Span<const int32_t> tokens,
                               BlockId except) {
  auto it = children_.find(KeyOf(parent, tokens.front()));
  if (it == children_.end()) return false;
  bool covered = false;
  std::vector<BlockId> drop;
  for (BlockId c : it->second) {
    if (c == except) continue;
    Block& b = blocks_[c];
    const bool extends = b.tokens.size() >= tokens.size() &&
                         std::equal(tokens.begin(), tokens.end(), b.tokens.begin());
    if (extends) {
      covered = true;
      if (b.ref_count == 0) lru_.splice(lru_.end(), lru_, b.lru_pos);
    } else if (b.partial && b.ref_count == 0 && b.tokens.size() < tokens.size() &&
               std::equal(b.tokens.begin(), b.tokens.end(), tokens.begin())) {
      drop.push_back(c);
    }
  }
  for (BlockId c : drop) {
    lru_.erase(blocks_[c].lru_pos);
    Unregister(c);
    free_.push_back(c);
  }
  return covered;
}

void KvBlockManager::RegisterPartial(BlockId id, const Lane& lane) {
  Block& b = blocks_[id];
  b.registered = true;
  b.partial = true;
  b.parent = lane.chain_link;
  b.generation = next_generation_++;
  b.tokens = lane.tail;
  AddChild(id);
  ++partial_count_;
}

std::optional<int64_t> KvBlockManager::BlocksFor(int64_t num_positions) const {
  // Compared before rounding up so that a huge request cannot overflow.
  if (num_positions > static_cast<int64_t>(num_blocks_) * block_size_) return std::nullopt;
  return (num_positions + block_size_ - 1) / block_size_;
}

BlockId KvBlockManager::TakeBlock() {
  BlockId id;
  if (!free_.empty()) {
    id = free_.back();
    free_.pop_back();
  } else {
    id = lru_.front();
    lru_.pop_front();
    // A partial block has no chain hash: nothing a store could key it by.
    if (max_recorded_registrations_ > 0 && !blocks_[id].partial) {
      if (evictions_.size() >= max_recorded_registrations_) evictions_.pop_front();
      evictions_.push_back(
          Eviction{id, blocks_[id].hash, blocks_[id].checkpoint, blocks_[id].end_position});
    }
    Unregister(id);
    ++counters_.evictions;
  }
  DropCheckpoint(id);
  blocks_[id].ref_count = 1;
  return id;
}

void KvBlockManager::DropCheckpoint(BlockId id) {
  Block& b = blocks_[id];
  if (b.checkpoint < 0) return;
  CheckpointSlot& c = checkpoint_slots_[static_cast<size_t>(b.checkpoint)];
  c.block = -1;
  checkpoint_lru_.erase(c.lru_pos);
  c.lru_pos = checkpoint_lru_.insert(checkpoint_lru_.begin(), b.checkpoint);  // reused first
  b.checkpoint = -1;
}

void KvBlockManager::TouchCheckpoint(int32_t slot) {
  CheckpointSlot& c = checkpoint_slots_[static_cast<size_t>(slot)];
  checkpoint_lru_.splice(checkpoint_lru_.end(), checkpoint_lru_, c.lru_pos);
}

int32_t KvBlockManager::TakeResumeCheckpoint(LaneId lane) {
  auto it = lanes_.find(lane);
  if (it == lanes_.end() || it->second.resume_checkpoint < 0) return -1;
  const int32_t slot = it->second.resume_checkpoint;
  --checkpoint_slots_[static_cast<size_t>(slot)].pins;
  it->second.resume_checkpoint = -1;
  return slot;
}

void KvBlockManager::UnpinCheckpoint(int32_t slot) {
  if (slot < 0 || slot >= state_checkpoints_) return;
  CheckpointSlot& c = checkpoint_slots_[static_cast<size_t>(slot)];
  if (c.pins > 0) --c.pins;
}

absl::StatusOr<int32_t> KvBlockManager::CheckpointFor(LaneId lane, int64_t position, bool pin) {
  auto it = lanes_.find(lane);
  if (it == lanes_.end()) return absl::NotFoundError(absl::StrCat("unknown lane ", lane));
  const Lane& l = it->second;
  if (!CheckpointPosition(position) ||
      position > static_cast<int64_t>(l.blocks.size()) * block_size_) {
    return absl::InvalidArgumentError(
        absl::StrCat("no state checkpoint at position ", position, " of lane ", lane));
  }
  const BlockId id = l.blocks[static_cast<size_t>(position / block_size_ - 1)];
  Block& b = blocks_[id];
  if (b.checkpoint >= 0) {
    TouchCheckpoint(b.checkpoint);
    if (pin) ++checkpoint_slots_[static_cast<size_t>(b.checkpoint)].pins;
    return b.checkpoint;
  }
  // The least recently used slot no pending resume needs (free ones sit at
  // the front).
  for (int32_t slot : checkpoint_lru_) {
    CheckpointSlot& c = checkpoint_slots_[static_cast<size_t>(slot)];
    if (c.pins > 0) continue;
    if (c.block >= 0) {
      blocks_[c.block].checkpoint = -1;
      ++counters_.checkpoint_evictions;
    }
    c.block = id;
    if (pin) ++c.pins;
    b.checkpoint = slot;
    TouchCheckpoint(slot);
    ++counters_.checkpoints_saved;
    return slot;
  }
  return -1;
}

void KvBlockManager::Unregister(BlockId id) {
  Block& b = blocks_[id];
  if (!b.partial) index_.erase(b.hash);
  if (reuse_partial_ && !b.tokens.empty()) {
    auto it = children_.find(KeyOf(b.parent, b.tokens.front()));
    if (it != children_.end()) {
      std::erase(it->second, id);
      if (it->second.empty()) children_.erase(it);
    }
  }
  if (b.partial) --partial_count_;
  b.partial = false;
  b.registered = false;
  b.tokens.clear();
  b.tokens.shrink_to_fit();
  b.parent = Link{};
}

absl::StatusOr<int64_t> KvBlockManager::Allocate(LaneId lane, absl::Span<const int32_t> prompt,
                                                 int64_t num_positions, bool reuse_partial,
                                                 int64_t chunked_until) {
  if (lanes_.contains(lane)) {
    return absl::AlreadyExistsError(absl::StrCat("lane ", lane, " already has blocks"));
  }
  if (num_positions < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("num_positions must be >= 0, got ", num_positions));
  }
  PrefixMatch match = Walk(prompt, reuse_partial_ && reuse_partial, chunked_until);
  const int64_t matched = static_cast<int64_t>(match.block_ids.size());
  // Matched blocks that sit in the LRU are about to be referenced, so they
  // cannot also be evicted to make room; neither can a partial hit's source
  // before it is copied.
  int64_t matched_evictable = 0;
  for (BlockId id : match.block_ids) matched_evictable += blocks_[id].ref_count == 0;
  const int64_t takeable = static_cast<int64_t>(free_.size() + lru_.size()) - matched_evictable;
  std::optional<int64_t> needed = BlocksFor(std::max(num_positions, match.cached_tokens));
  int64_t supply = takeable;
  if (match.partial_block >= 0) {
    supply -= blocks_[match.partial_block].ref_count == 0;
    if (!needed.has_value() || *needed - matched > supply) {
      // Not worth failing for: recompute those positions instead.
      match.cached_tokens -= match.partial_tokens;
      match.partial_block = -1;
      match.partial_tokens = 0;
      needed = BlocksFor(std::max(num_positions, match.cached_tokens));
      supply = takeable;
    }
  }
  if (!needed.has_value() || *needed - matched > supply) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "KV pool cannot cover ", num_positions, " positions of lane ", lane, ": ", supply,
        " blocks of ", block_size_, " tokens available beyond ", matched, " cached"));
  }

  Lane& l = lanes_[lane];
  l.chain_hash = root_;
  l.chunked_until = chunked_until;
  if (state_checkpoints_ > 0 && !match.block_ids.empty()) {
    l.resume_checkpoint = blocks_[match.block_ids.back()].checkpoint;
    ++checkpoint_slots_[static_cast<size_t>(l.resume_checkpoint)].pins;
    TouchCheckpoint(l.resume_checkpoint);
  }
  for (BlockId id : match.block_ids) {
    Block& b = blocks_[id];
    if (b.ref_count++ == 0) lru_.erase(b.lru_pos);
    l.blocks.push_back(id);
    l.chain_hash = b.hash;
    l.chain_link = Link{.block = id, .generation = b.generation};
    l.committed_tokens.insert(l.committed_tokens.end(), b.tokens.begin(), b.tokens.end());
  }
  l.committed_blocks = static_cast<int32_t>(matched);
  Block* source = match.partial_block >= 0 ? &blocks_[match.partial_block] : nullptr;
  if (source != nullptr && source->ref_count++ == 0) lru_.erase(source->lru_pos);
  for (int64_t i = matched; i < *needed; ++i) l.blocks.push_back(TakeBlock());
  if (source != nullptr) {
    // Unpinned as most recently used: a hit refreshes it.
    if (--source->ref_count == 0) {
      source->lru_pos = lru_.insert(lru_.end(), match.partial_block);
    }
    copies_.push_back(
        BlockCopy{.src = match.partial_block, .dst = l.blocks[static_cast<size_t>(matched)]});
    const size_t start = static_cast<size_t>(matched) * static_cast<size_t>(block_size_);
    l.tail.assign(prompt.begin() + static_cast<std::ptrdiff_t>(start),
                  prompt.begin() + static_cast<std::ptrdiff_t>(start + match.partial_tokens));
    counters_.partial_hit_tokens += match.partial_tokens;
    ++counters_.block_copies;
  }

  counters_.hit_tokens += match.cached_tokens;
  counters_.miss_tokens += static_cast<int64_t>(prompt.size()) - match.cached_tokens;
  return match.cached_tokens;
}

absl::Status KvBlockManager::AppendSlots(LaneId lane, int64_t num_positions) {
  auto it = lanes_.find(lane);
  if (it == lanes_.end()) return absl::NotFoundError(absl::StrCat("unknown lane ", lane));
  if (num_positions < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("num_positions must be >= 0, got ", num_positions));
  }
  Lane& l = it->second;
  std::optional<int64_t> needed = BlocksFor(num_positions);
  const int64_t have = static_cast<int64_t>(l.blocks.size());
  const int64_t supply = static_cast<int64_t>(free_.size() + lru_.size());
  if (!needed.has_value() || *needed - have > supply) {
    return absl::ResourceExhaustedError(
        absl::StrCat("KV pool cannot grow lane ", lane, " to ", num_positions,
                     " positions: ", supply, " blocks of ", block_size_, " tokens available"));
  }
  for (int64_t i = have; i < *needed; ++i) l.blocks.push_back(TakeBlock());
  return absl::OkStatus();
}

absl::Status KvBlockManager::TrimSlots(LaneId lane, int64_t num_positions) {
  auto it = lanes_.find(lane);
  if (it == lanes_.end()) return absl::NotFoundError(absl::StrCat("unknown lane ", lane));
  Lane& l = it->second;
  const int64_t committed = int64_t{l.committed_blocks} * block_size_;
  if (num_positions < committed) {
    return absl::InvalidArgumentError(absl::StrCat("lane ", lane, " cannot roll back to ",
                                                   num_positions, " positions below its ",
                                                   committed, " committed ones"));
  }
  const size_t tail_left = static_cast<size_t>(num_positions - committed);
  if (l.tail.size() > tail_left) l.tail.resize(tail_left);
  const int64_t keep = (num_positions + block_size_ - 1) / block_size_;
  while (static_cast<int64_t>(l.blocks.size()) > keep) {
    // Past the committed blocks every block is the lane's private one.
    Block& block = blocks_[l.blocks.back()];
    if (--block.ref_count == 0) {
      DropCheckpoint(l.blocks.back());
      free_.push_back(l.blocks.back());
    }
    l.blocks.pop_back();
  }
  return absl::OkStatus();
}

absl::Status KvBlockManager::CommitFullBlocks(LaneId lane, absl::Span<const int32_t> tokens) {
  auto it = lanes_.find(lane);
  if (it == lanes_.end()) return absl::NotFoundError(absl::StrCat("unknown lane ", lane));
  Lane& l = it->second;
  const size_t bs = static_cast<size_t>(block_size_);
  if (tokens.size() > l.blocks.size() * bs) {
    return absl::InvalidArgumentError(absl::StrCat("lane ", lane, " has blocks for ",
                                                   l.blocks.size() * bs, " positions, not ",
                                                   tokens.size()));
  }
  if (tokens.size() < l.committed_tokens.size()) {
    return absl::InvalidArgumentError(absl::StrCat("lane ", lane, " already committed ",
                                                   l.committed_tokens.size(), " tokens, got ",
                                                   tokens.size()));
  }
  const size_t full = tokens.size() / bs;
  auto keep_tail = [&] {
    if (!reuse_partial_) return;
    l.tail.assign(tokens.begin() + static_cast<std::ptrdiff_t>(l.committed_blocks * bs),
                  tokens.end());
  };
  if (full <= static_cast<size_t>(l.committed_blocks)) {
    keep_tail();
    return absl::OkStatus();
  }
  // Registering KV under tokens it was not computed from would poison every
  // later hit, so a caller passing another sequence is refused outright.
  if (!std::equal(l.committed_tokens.begin(), l.committed_tokens.end(), tokens.begin())) {
    return absl::InvalidArgumentError(
        absl::StrCat("tokens differ from the ones lane ", lane, " committed before"));
  }

  for (size_t i = l.committed_blocks; i < full; ++i) {
    absl::Span<const int32_t> blk = tokens.subspan(i * bs, bs);
    const int64_t tag =
        BlockTag(linear_chunk_, static_cast<int64_t>((i + 1) * bs), l.chunked_until);
    const BlockHash hash = HashBlock(l.chain_hash, blk, tag);
    // The parent registration can have been evicted meanwhile when it was
    // another lane's copy; children of a gone parent could never match.
    if (l.chain_open && !LinkValid(l.chain_link)) l.chain_open = false;
    if (l.chain_open) {
      auto found = index_.find(hash);
      if (found == index_.end()) {
        const BlockId id = l.blocks[i];
        Block& b = blocks_[id];
        b.registered = true;
        b.hash = hash;
        b.parent = l.chain_link;
        b.generation = next_generation_++;
        b.tokens.assign(blk.begin(), blk.end());
        b.end_position = static_cast<int64_t>((i + 1) * bs);
        b.tag = tag;
        index_.emplace(hash, id);
        if (reuse_partial_) {
          Dominated(b.parent, blk, id);  // partial blocks this one extends
          AddChild(id);
        }
        l.chain_link = Link{.block = id, .generation = b.generation};
        if (max_recorded_registrations_ > 0) {
          if (registrations_.size() >= max_recorded_registrations_) {
            registrations_.pop_front();
          }
          registrations_.push_back(id);
        }
      } else {
        Block& existing = blocks_[found->second];
        if (existing.parent == l.chain_link && existing.tag == tag &&
            std::equal(blk.begin(), blk.end(), existing.tokens.begin(), existing.tokens.end())) {
          // Same content computed twice (equal prompts in flight together):
          // keep the lane's copy private rather than swap ids under rounds
          // in flight, and count the registered one as used.
          if (existing.ref_count == 0) lru_.splice(lru_.end(), lru_, existing.lru_pos);
          // The lane's checkpoint there is the state of this same chain: a
          // registered block without one takes it, so prefix hits reach it
          // (a kvstore restore of blocks the pool still held lands here).
          Block& mine = blocks_[l.blocks[i]];
          if (existing.checkpoint < 0 && mine.checkpoint >= 0) {
            existing.checkpoint = mine.checkpoint;
            checkpoint_slots_[static_cast<size_t>(mine.checkpoint)].block = found->second;
            mine.checkpoint = -1;
          }
          l.chain_link = Link{.block = found->second, .generation = existing.generation};
        } else {
          ++counters_.hash_collisions;
          l.chain_open = false;
        }
      }
    }
    l.chain_hash = hash;
    l.committed_tokens.insert(l.committed_tokens.end(), blk.begin(), blk.end());
    ++l.committed_blocks;
  }
  keep_tail();
  return absl::OkStatus();
}

absl::Status KvBlockManager::CommitTail(LaneId lane, absl::Span<const int32_t> tail) {
  auto it = lanes_.find(lane);
  if (it == lanes_.end()) return absl::NotFoundError(absl::StrCat("unknown lane ", lane));
  Lane& l = it->second;
  if (tail.size() >= static_cast<size_t>(block_size_)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "a tail of ", tail.size(), " tokens fills a block of ", block_size_, "; commit it"));
  }
  if ((static_cast<size_t>(l.committed_blocks) + (tail.empty() ? 0 : 1)) > l.blocks.size()) {
    return absl::InvalidArgumentError(
        absl::StrCat("lane ", lane, " has no block for a tail of ", tail.size(), " tokens"));
  }
  if (reuse_partial_) l.tail.assign(tail.begin(), tail.end());
  return absl::OkStatus();
}

absl::Status KvBlockManager::Release(LaneId lane) {
  auto it = lanes_.find(lane);
  if (it == lanes_.end()) return absl::NotFoundError(absl::StrCat("unknown lane ", lane));
  const Lane& l = it->second;
  if (l.resume_checkpoint >= 0) --checkpoint_slots_[static_cast<size_t>(l.resume_checkpoint)].pins;
  const std::vector<BlockId>& table = l.blocks;
  // A block past the committed ones that holds committed tokens stays cached
  // as partial, unless nothing could reach it or another block has it all.
  const bool keep_partial = reuse_partial_ && !l.tail.empty() && l.chain_open &&
                            LinkValid(l.chain_link) &&
                            static_cast<size_t>(l.committed_blocks) < table.size();
  // Tail first, so the LRU evicts a chain from its end and keeps the shared
  // head longest.
  for (size_t i = table.size(); i-- > 0;) {
    const BlockId id = table[i];
    Block& block = blocks_[id];
    if (--block.ref_count > 0) continue;
    if (!block.registered && keep_partial && i == static_cast<size_t>(l.committed_blocks) &&
        !Dominated(l.chain_link, l.tail, id)) {
      RegisterPartial(id, l);
    }
    if (block.registered) {
      block.lru_pos = lru_.insert(lru_.end(), id);
    } else {
      // Nothing can reach a checkpoint of a block no prefix hit can find.
      DropCheckpoint(id);
      free_.push_back(id);
    }
  }
  lanes_.erase(it);
  return absl::OkStatus();
}

void KvBlockManager::Reset() {
  lanes_.clear();
  index_.clear();
  lru_.clear();
  free_.clear();
  registrations_.clear();
  evictions_.clear();
  children_.clear();
  copies_.clear();
  partial_count_ = 0;
  for (Block& b : blocks_) b = Block{};
  checkpoint_lru_.clear();
  checkpoint_slots_.assign(static_cast<size_t>(state_checkpoints_), CheckpointSlot{});
  for (int32_t k = 0; k < state_checkpoints_; ++k) {
    checkpoint_slots_[static_cast<size_t>(k)].lru_pos =
        checkpoint_lru_.insert(checkpoint_lru_.end(), k);
  }
  // Descending, so that the stack hands out block 0 first.
  for (BlockId id = num_blocks_ - 1; id >= 0; --id) free_.push_back(id);
  ++counters_.resets;
}

std::vector<KvBlockManager::Eviction> KvBlockManager::TakeEvictions() {
  std::vector<Eviction> out(evictions_.begin(), evictions_.end());
  evictions_.clear();
  return out;
}

std::vector<KvBlockManager::BlockCopy> KvBlockManager::TakeCopies() {
  std::vector<BlockCopy> out;
  out.swap(copies_);
  return out;
}

std::vector<BlockId> KvBlockManager::TakeRegistrations() {
  std::vector<BlockId> out(registrations_.begin(), registrations_.end());
  registrations_.clear();
  return out;
}

absl::StatusOr<absl::Span<const BlockId>> KvBlockManager::BlockTable(LaneId lane) const {
  auto it = lanes_.find(lane);
  if (it == lanes_.end()) return absl::NotFoundError(absl::StrCat("unknown lane ", lane));
  return absl::Span<const BlockId>(it->second.blocks);
}

absl::StatusOr<int64_t> KvBlockManager::CommittedPositions(LaneId lane) const {
  auto it = lanes_.find(lane);
  if (it == lanes_.end()) return absl::NotFoundError(absl::StrCat("unknown lane ", lane));
  return static_cast<int64_t>(it->second.committed_tokens.size());
}

std::optional<BlockHash> KvBlockManager::RegisteredHash(BlockId block) const {
  if (block < 0 || block >= num_blocks_ || !blocks_[block].registered || blocks_[block].partial) {
    return std::nullopt;
  }
  return blocks_[block].hash;
}

std::optional<KvBlockManager::RegisteredBlock> KvBlockManager::Registered(BlockId block) const {
  if (block < 0 || block >= num_blocks_ || !blocks_[block].registered || blocks_[block].partial) {
    return std::nullopt;
  }
  const Block& b = blocks_[block];
  return RegisteredBlock{
      .hash = b.hash, .checkpoint = b.checkpoint, .end_position = b.end_position};
}

int32_t KvBlockManager::available_blocks() const {
  return static_cast<int32_t>(free_.size() + lru_.size());
}

KvBlockStats KvBlockManager::stats() const {
  KvBlockStats s = counters_;
  s.num_blocks = num_blocks_;
  s.free_blocks = static_cast<int32_t>(free_.size());
  s.evictable_blocks = static_cast<int32_t>(lru_.size());
  s.in_use_blocks = num_blocks_ - s.free_blocks - s.evictable_blocks;
  s.cached_blocks = static_cast<int32_t>(index_.size());
  s.partial_blocks = partial_count_;
  s.num_lanes = static_cast<int32_t>(lanes_.size());
  return s;
}

}  // namespace ringlane::router
