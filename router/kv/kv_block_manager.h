#ifndef RINGLANE_ROUTER_KV_KV_BLOCK_MANAGER_H_
#define RINGLANE_ROUTER_KV_KV_BLOCK_MANAGER_H_

// The ledger of one worker group's paged KV pool: which lane holds which
// block, the prefix cache over full blocks, and LRU eviction.

#include <cstddef>
#include <cstdint>
#include <deque>
#include <limits>
#include <list>
#include <memory>
#include <optional>
#include <string>
#include <unordered_map>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"

namespace ringlane::router {

using LaneId = uint64_t;  // LaneStep.lane_id
using BlockId = int32_t;  // LaneStep.block_ids

// What makes KV bytes of equal tokens differ. Two pools share cached blocks
// (later through the kvstore) only when every field is equal.
struct BlockIdentity {
  std::string model_id;        // served model id, e.g. "stories260K"
  std::string model_revision;  // weights revision; "" when there is only one
  std::string kv_dtype;        // element type of cached K/V: "f32", "bf16", "fp8", ...
  int32_t block_size_tokens = 16;
  int32_t tp_world_size = 1;  // a TP2 shard of a block is useless to TP4
  std::string layout;         // cache kind / layout version; "" for the first one
};

// A 128-bit prefix-chain hash (XXH3-128).
struct BlockHash {
  uint64_t high = 0;
  uint64_t low = 0;
  friend bool operator==(const BlockHash&, const BlockHash&) = default;
  // The 16 bytes of BlockKey.prefix_hash: xxHash's canonical form (high half
  // first, big-endian), so other languages' xxHash libraries agree.
  std::string Bytes() const;
};

// The chain. The root is the hash of the identity; block i of a sequence
// (tokens [i*B, (i+1)*B)) hashes its parent's hash (the root for i = 0) and
// its token ids, so a block's hash names every token before it and, through
// the root, the identity. Encodings (little-endian, stable across builds:
// the kvstore keeps these hashes on disk):
//   root:  XXH3-128 of "ringlane-kv-chain-v1", then model_id, model_revision,
//          kv_dtype, layout each as u32 byte length + bytes, then
//          block_size_tokens and tp_world_size as u32
//   block: XXH3-128 of the parent's Bytes(), then each token id as u32,
//          then, for a tag other than 0, the tag as u64
// A block's tag says how its KV was computed where that is not the same for
// every chain of its tokens: with a KDA chunk (BlockTag), 0 for a block that
// ends within its lane's chunked prefill, else that limit + 1.
BlockHash ChainRoot(const BlockIdentity& identity);
BlockHash ChainNext(const BlockHash& parent, absl::Span<const int32_t> block_tokens,
                    int64_t tag = 0);
// The tag of a block ending at `end` of a lane whose rows run chunked
// before `chunked_until`, under KDA chunks of `linear_chunk` (0: none).
int64_t BlockTag(int64_t linear_chunk, int64_t end, int64_t chunked_until);
// The hashes of the first min(max_blocks, tokens.size() / B) full blocks
// (their tags as BlockTag's).
std::vector<BlockHash> ChainHashes(const BlockIdentity& identity, absl::Span<const int32_t> tokens,
                                   size_t max_blocks = std::numeric_limits<size_t>::max(),
                                   int64_t linear_chunk = 0, int64_t chunked_until = 0);

// Counts for metrics. Every block is in exactly one of free, in use or
// evictable; cached counts registered blocks, in use or not.
struct KvBlockStats {
  int32_t num_blocks = 0;
  int32_t free_blocks = 0;       // unreferenced and uncached: handed out first
  int32_t in_use_blocks = 0;     // referenced by at least one lane
  int32_t evictable_blocks = 0;  // cached and unreferenced: reusable, or evicted (LRU)
  int32_t cached_blocks = 0;     // registered in the prefix index
  int32_t num_lanes = 0;
  // Cumulative (not cleared by Reset, so they can back Prometheus counters).
  int64_t hit_tokens = 0;       // prompt tokens served from cached blocks by Allocate
  int64_t miss_tokens = 0;      // prompt tokens Allocate left to compute
  int64_t evictions = 0;        // cached blocks dropped to make room
  int64_t hash_collisions = 0;  // equal hashes with different contents seen
  int64_t resets = 0;
  // Token-granular reuse (Options::reuse_partial_blocks).
  int32_t partial_blocks = 0;      // registered partly filled blocks (not in cached_blocks)
  int64_t partial_hit_tokens = 0;  // of hit_tokens, those served from a block's first slots
  int64_t block_copies = 0;        // copy-on-write copies handed to TakeCopies
  // State checkpoints (Options::state_checkpoints): slots handed to a block,
  // and those taken from another block to do so.
  int64_t checkpoints_saved = 0;
  int64_t checkpoint_evictions = 0;
};

// Tracks which KV blocks each lane holds in one worker group's pool, which
// full blocks are registered for prefix reuse, and hands out free ones. The
// worker holds the memory; this is the only record of what is in it. Owned
// by the group's scheduler thread; not thread-safe, and never needs to be:
// a prefix lookup and the references it takes happen inside one Allocate
// call, so no block can be evicted between a lookup and its use. MatchPrefix
// alone is advisory (placement) and stale after any mutating call.
//
// Blocks and reference counts. A lane's block table covers its positions in
// order (block i holds positions [i*B, (i+1)*B)). Lanes that share a prefix
// share its full blocks, one reference each. Registered blocks are full and
// immutable: a lane writes only positions at or beyond the ones it has
// committed or matched (Allocate returns where it starts), so a shared block
// is never written and needs no copy-on-write; a lane's partial last block is
// always its own. An unreferenced registered block stays cached (evictable);
// an unreferenced unregistered one returns to the free list.
//
// Prefix hits. A block matches block i of a prompt when its chain hash is
// equal, its stored token ids are equal, and it was registered on top of the
// very block that matched at i-1 (a registration link, not just a hash), so
// even a hash collision cannot serve KV computed from other tokens or at other
// positions. At most floor((n-1)/B) blocks of an n-token prompt match: the
// last prompt token is always fed to get the logits of the first sample.
//
// Token-granular hits (Options::reuse_partial_blocks). After the full blocks,
// a prompt can also reuse the first m < B positions of a block: a registered
// full block whose first m tokens it shares, or a partly filled last block a
// lane left behind (registered as partial at Release with the tokens whose
// KV was committed in it), chained on the same registration as the full
// match. Since the lane will write the positions after m, it gets a fresh
// block and the plan copies the cached one onto it first (TakeCopies,
// RoundPlan.block_copies): copy-on-write, so the cached block stays intact
// for others. Partial blocks are evictable like cached ones, have no chain
// hash (never offloaded, never in TakeEvictions), and a partial block whose
// tokens another cached block under the same parent extends is dropped.
//
// Eviction takes the least recently used evictable block. A lane's blocks
// become evictable when it releases them, its last block first, so a chain is
// eaten from its tail and its head (the prefix most prompts share) lasts
// longest. A hit takes the block out of the LRU; its release puts it back as
// most recent.
//
// Reuse of a freed block id relies on the worker running a group's rounds in
// the order the scheduler sent them: a round that writes a block handed out
// after a Release is planned, and so runs, after every round of the released
// lane.
class KvBlockManager {
 public:
  struct Options {
    int32_t num_blocks = 0;  // blocks in the pool, > 0
    BlockIdentity identity;
    // Keep only this many low bits (0..128) of every chain hash, at every
    // step of the chain. Tests lower it to force collisions (0: every block
    // hashes alike); anything below 128 breaks the kvstore's keys.
    int hash_bits_for_testing = 128;
    // Keep the ids of newly registered blocks for TakeRegistrations (the
    // kvstore's write-through), the newest this many at most.
    size_t max_recorded_registrations = 0;
    // Token-granular prefix hits through copy-on-write of a partly reused
    // block (see above); off: only whole blocks are reused.
    bool reuse_partial_blocks = false;
    // Off: no prefix is ever a hit (every lane computes from position 0).
    // For models with recurrent layers whose workers keep no checkpoints.
    bool reuse_prefixes = true;
    // Models with recurrent layers (glm5_next): the workers keep this many
    // state checkpoints, slots [0, state_checkpoints), each the state after
    // a position that is a multiple of checkpoint_interval (a multiple of
    // the block size, decoupled from it). A checkpoint belongs to the block
    // that ends at its position, and a prefix hit ends at the last matched
    // block that has one (no token-granular hits). 0: no checkpoints.
    int32_t state_checkpoints = 0;
    int64_t checkpoint_interval = 0;
    // Models with recurrent layers whose workers run prefill in chunks of
    // this many positions (WorkerInfo.linear_chunk; 0: none). The chunked
    // form agrees with the recurrence only to rounding, so what a block
    // holds depends on which of its positions (and the ones before it) ran
    // chunked: a lane's rows run chunked before its request's prompt rounded
    // down to whole chunks (ChunkedUntil), and a block past that limit is
    // registered under a hash that names the limit (BlockTag), where only a
    // lane with the same limit finds it. It divides checkpoint_interval.
    int64_t linear_chunk = 0;
  };

  // InvalidArgument for a non-positive num_blocks, block size or TP size, an
  // empty model_id or kv_dtype, or hash bits outside 0..128.
  static absl::StatusOr<std::unique_ptr<KvBlockManager>> Create(Options options);

  KvBlockManager(const KvBlockManager&) = delete;
  KvBlockManager& operator=(const KvBlockManager&) = delete;

  struct PrefixMatch {
    std::vector<BlockId> block_ids;  // the matching cached full blocks, in order
    // The block whose first partial_tokens positions follow them (-1: none).
    BlockId partial_block = -1;
    int64_t partial_tokens = 0;
    int64_t cached_tokens = 0;  // block_ids.size() * block size + partial_tokens
  };

  // The cached prefix of `tokens` (for placement and usage reports), at most
  // all but the last token. Changes nothing: no references, no LRU refresh,
  // no counters.
  PrefixMatch MatchPrefix(absl::Span<const int32_t> tokens, int64_t chunked_until = 0) const;

  // A copy the next plan must carry (RoundPlan.block_copies).
  struct BlockCopy {
    BlockId src = -1;
    BlockId dst = -1;
  };

  // Starts `lane` for `prompt`: matches the cached prefix, references those
  // blocks (refreshing them), and adds fresh blocks until the table covers
  // positions [0, max(num_positions, cached)). Fresh blocks come from the
  // free list first, then by evicting. A partial-block hit (when
  // `reuse_partial` and the option allow it, and the pool has room without
  // evicting the source) makes the first fresh block a copy of the source,
  // queued for TakeCopies; a caller that writes the lane's blocks other than
  // through the plans that carry those copies (the kvstore restore) passes
  // false. Returns the cached token count: the lane's first computed
  // position. Errors, with nothing changed: AlreadyExists for a known lane,
  // InvalidArgument for num_positions < 0, ResourceExhausted when the pool
  // cannot supply the blocks.
  // `chunked_until`: where the lane's chunked prefill ends (ChunkedUntil);
  // only blocks computed with the same limit are hits.
  absl::StatusOr<int64_t> Allocate(LaneId lane, absl::Span<const int32_t> prompt,
                                   int64_t num_positions, bool reuse_partial = true,
                                   int64_t chunked_until = 0);

  // The copies queued by Allocate since the last call, in order. The plan
  // being built must carry them: its rows may read their destinations.
  std::vector<BlockCopy> TakeCopies();

  // With state checkpoints: the checkpoint `lane`'s first row restores its
  // state from (LaneStep.resume_checkpoint), when Allocate found a hit, once
  // (-1 after, and without one). The slot is kept from eviction until then.
  int32_t TakeResumeCheckpoint(LaneId lane);
  // With state checkpoints: the slot a row of `lane` that runs through
  // `position` (a positive multiple of checkpoint_interval its table covers)
  // saves the state into, now the checkpoint of the block ending there: a
  // free slot, else the least recently used one's (its block loses it).
  // -1 when every slot is pinned by a pending resume. InvalidArgument for
  // another position, NotFound for an unknown lane. With `pin` the slot is
  // kept from eviction until UnpinCheckpoint: a kvstore restore writes it
  // outside the plans, so no plan may hand it to another block meanwhile.
  absl::StatusOr<int32_t> CheckpointFor(LaneId lane, int64_t position, bool pin = false);
  void UnpinCheckpoint(int32_t slot);
  bool checkpoints() const { return state_checkpoints_ > 0; }
  // Whether a checkpoint belongs at `position` (a positive multiple of the
  // interval); false without checkpoints.
  bool CheckpointPosition(int64_t position) const {
    return state_checkpoints_ > 0 && position > 0 && position % checkpoint_interval_ == 0;
  }
  int64_t checkpoint_interval() const { return checkpoint_interval_; }
  int64_t linear_chunk() const { return linear_chunk_; }
  // Where the chunked prefill of a lane whose request's prompt has
  // `prompt_tokens` tokens ends: the prompt's whole chunks, the same for
  // every lane of the request (a preempted choice's new lane included, so it
  // recomputes its generated tokens as they were first computed); 0 without
  // a chunk.
  int64_t ChunkedUntil(int64_t prompt_tokens) const {
    return linear_chunk_ > 0 ? prompt_tokens / linear_chunk_ * linear_chunk_ : 0;
  }

  // Grows `lane`'s table to cover positions [0, num_positions); a smaller
  // value changes nothing (only TrimSlots shrinks a table). Errors,
  // with nothing changed: NotFound, InvalidArgument for num_positions < 0,
  // ResourceExhausted when the pool cannot supply the blocks.
  absl::Status AppendSlots(LaneId lane, int64_t num_positions);

  // Rolls `lane` back to positions [0, num_positions) (rejected draft
  // positions of a verify row): blocks past the one holding the last kept
  // position go back to the free list. Errors, with nothing changed:
  // NotFound; InvalidArgument for num_positions below the lane's committed
  // positions, which are final.
  absl::Status TrimSlots(LaneId lane, int64_t num_positions);

  // Call when the rounds that wrote `lane`'s KV up to tokens.size() have
  // returned: `tokens` are the lane's tokens whose KV is now in its blocks
  // (prompt, then generated tokens already fed back; not the token just
  // sampled). Registers the full blocks not yet committed so later prompts
  // can reuse them, and remembers the tokens past them (for a partial block
  // at Release; O(block size) when no block filled up). A block whose content is already registered
  // (two equal prompts in flight at once) stays the lane's private copy and refreshes the
  // registered one. Errors, with nothing changed: NotFound; InvalidArgument when tokens cover
  // positions the lane has no blocks for, are fewer than it already committed, or differ from its
  // committed tokens.
  absl::Status CommitFullBlocks(LaneId lane, absl::Span<const int32_t> tokens);

  // Records `tail`, the lane's committed tokens past its committed blocks,
  // between two commits that fill a block (the applier calls it every round;
  // O(tail)). Ignored without reuse_partial_blocks. Errors, with nothing
  // changed: NotFound; InvalidArgument for a block or more of tokens, or
  // more positions than the lane's table covers.
  absl::Status CommitTail(LaneId lane, absl::Span<const int32_t> tail);

  // Drops `lane` and its references; with reuse_partial_blocks, its partly
  // filled last block stays cached as partial when it holds committed
  // tokens. NotFound for an unknown lane.
  absl::Status Release(LaneId lane);

  // The group restarted and its KV memory is gone: forget every lane and
  // cached block. Cumulative counters are kept.
  void Reset();

  // The lane's block ids in position order (LaneStep.block_ids); the view is
  // valid until the next mutating call. NotFound for an unknown lane.
  absl::StatusOr<absl::Span<const BlockId>> BlockTable(LaneId lane) const;

  // Positions of `lane` whose KV is final (matched or committed full blocks):
  // no round may write below this. NotFound for an unknown lane.
  absl::StatusOr<int64_t> CommittedPositions(LaneId lane) const;

  // The chain hash a block is registered under, if it is (for export to the
  // kvstore).
  std::optional<BlockHash> RegisteredHash(BlockId block) const;
  // The same with the state checkpoint it has (-1: none) and the position
  // it ends at (its chain's length in tokens), for an offload that carries
  // the checkpoint with the block.
  struct RegisteredBlock {
    BlockHash hash;
    int32_t checkpoint = -1;
    int64_t end_position = 0;
  };
  std::optional<RegisteredBlock> Registered(BlockId block) const;

  // The blocks registered since the last call, oldest first (when
  // Options::max_recorded_registrations > 0; older ones beyond it are
  // forgotten). A block may have been evicted or registered anew since: ask
  // RegisteredHash for what it holds now.
  std::vector<BlockId> TakeRegistrations();
  // The registered blocks evicted since the last call, with the hash they
  // were registered under (recorded as registrations are). Their contents
  // stay valid until a round planned after the eviction writes them, so a
  // write-back in the very plan whose planning evicted them (its offloads run
  // before its forward pass) still copies the right KV.
  // A checkpoint the block had goes with it: its slot is free from now on,
  // but only rows of a later plan or the same plan's forward pass (after
  // its offloads) can write it.
  struct Eviction {
    BlockId block = -1;
    BlockHash hash;
    int32_t checkpoint = -1;
    int64_t end_position = 0;
  };
  std::vector<Eviction> TakeEvictions();

  // Blocks a lane could still get: free plus evictable.
  int32_t available_blocks() const;
  KvBlockStats stats() const;
  int32_t num_blocks() const { return num_blocks_; }
  int32_t block_size_tokens() const { return block_size_; }
  bool reuses_partial_blocks() const { return reuse_partial_; }
  const BlockIdentity& identity() const { return identity_; }

 private:
  // Which registration a block was chained on. Block ids are reused, so the
  // id alone could point at a block re-registered with other contents; the
  // generation changes on every registration.
  struct Link {
    BlockId block = -1;  // -1: the chain root
    uint64_t generation = 0;
    friend bool operator==(const Link&, const Link&) = default;
  };

  struct Block {
    int32_t ref_count = 0;
    bool registered = false;
    bool partial = false;  // registered at Release with fewer than B tokens; no hash
    // Valid while registered:
    BlockHash hash;
    Link parent;
    uint64_t generation = 0;
    std::vector<int32_t> tokens;
    std::list<BlockId>::iterator lru_pos;  // valid while registered and unreferenced
    // The state checkpoint slot holding the state after this block's last
    // position (-1: none); dropped when the block is handed out again.
    int32_t checkpoint = -1;
    int64_t end_position = 0;  // valid while registered (full blocks)
    int64_t tag = 0;           // BlockTag, valid while registered (full blocks)
  };

  struct Lane {
    std::vector<BlockId> blocks;
    // Full blocks whose KV is final: matched at Allocate or committed since.
    int32_t committed_blocks = 0;
    std::vector<int32_t> committed_tokens;  // their tokens, to check later commits
    BlockHash chain_hash;                   // hash of the last committed block (or root)
    Link chain_link;                        // registration the next block chains onto
    // False once a block could not be registered (collision, or its parent
    // was evicted): later blocks would be unreachable, so they stay private.
    bool chain_open = true;
    // Committed tokens past the committed blocks (in blocks[committed_blocks]).
    std::vector<int32_t> tail;
    // The checkpoint its first row restores (TakeResumeCheckpoint), pinned.
    int32_t resume_checkpoint = -1;
    int64_t chunked_until = 0;  // Allocate's
  };

  // Registered blocks by what they continue: (parent registration, first
  // token), for token-granular matches.
  struct ChildKey {
    BlockId parent = -1;
    uint64_t generation = 0;
    int32_t first_token = 0;
    friend bool operator==(const ChildKey&, const ChildKey&) = default;
  };
  struct ChildKeyHasher {
    size_t operator()(const ChildKey& k) const {
      return static_cast<size_t>(k.generation * 0x9E3779B97F4A7C15ull) ^
             (static_cast<size_t>(static_cast<uint32_t>(k.first_token)) << 1) ^
             static_cast<size_t>(static_cast<uint32_t>(k.parent));
    }
  };

  struct HashHasher {
    size_t operator()(const BlockHash& h) const { return static_cast<size_t>(h.low ^ h.high); }
  };

  explicit KvBlockManager(Options options);

  BlockHash HashBlock(const BlockHash& parent, absl::Span<const int32_t> block_tokens,
                      int64_t tag) const;
  // Walks the cached chain of all but the last of `tokens`: full blocks,
  // then (with `partial`) the first positions of one more block.
  PrefixMatch Walk(absl::Span<const int32_t> tokens, bool partial, int64_t chunked_until) const;
  static ChildKey KeyOf(const Link& parent, int32_t first_token) {
    return ChildKey{
        .parent = parent.block, .generation = parent.generation, .first_token = first_token};
  }
  void AddChild(BlockId id);
  // Drops the partial children of `parent` whose tokens `tokens` extends;
  // true when a registered child already extends `tokens` (which then is
  // refreshed and needs no registration).
  bool Dominated(const Link& parent, absl::Span<const int32_t> tokens, BlockId except);
  void RegisterPartial(BlockId id, const Lane& lane);
  // Blocks needed to cover num_positions, or nullopt when more than the pool.
  std::optional<int64_t> BlocksFor(int64_t num_positions) const;
  // A referenced block from the free list, else the LRU's oldest; the caller
  // has checked one exists.
  BlockId TakeBlock();
  void Unregister(BlockId id);
  bool LinkValid(const Link& link) const;

  // Fixed at construction.
  const int32_t num_blocks_;
  const int32_t block_size_;
  const BlockIdentity identity_;
  const int hash_bits_;
  const size_t max_recorded_registrations_;
  const bool reuse_partial_;
  const bool reuse_prefixes_;
  const int32_t state_checkpoints_;
  const int64_t checkpoint_interval_;
  const int64_t linear_chunk_;
  const BlockHash root_;

  std::vector<Block> blocks_;
  std::vector<BlockId> free_;          // a stack: recently freed ids are reused first
  std::list<BlockId> lru_;             // evictable blocks, least recently used first
  std::deque<BlockId> registrations_;  // for TakeRegistrations
  std::deque<Eviction> evictions_;     // for TakeEvictions
  std::unordered_map<BlockHash, BlockId, HashHasher> index_;
  std::unordered_map<LaneId, Lane> lanes_;
  std::unordered_map<ChildKey, std::vector<BlockId>, ChildKeyHasher> children_;
  // State checkpoint slots: which block each belongs to (-1: free), how many
  // pending resumes pin it, and their use order (least recent first).
  struct CheckpointSlot {
    BlockId block = -1;
    int32_t pins = 0;
    std::list<int32_t>::iterator lru_pos;
  };
  std::vector<CheckpointSlot> checkpoint_slots_;
  std::list<int32_t> checkpoint_lru_;
  void DropCheckpoint(BlockId id);
  void TouchCheckpoint(int32_t slot);
  std::vector<BlockCopy> copies_;  // for TakeCopies
  int32_t partial_count_ = 0;
  uint64_t next_generation_ = 1;
  KvBlockStats counters_;  // only the cumulative fields are kept here
};

}  // namespace ringlane::router

#endif  // RINGLANE_ROUTER_KV_KV_BLOCK_MANAGER_H_
