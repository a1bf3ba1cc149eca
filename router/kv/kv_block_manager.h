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
//   block: XXH3-128 of the parent's Bytes(), then each token id as u32
BlockHash ChainRoot(const BlockIdentity& identity);
BlockHash ChainNext(const BlockHash& parent, absl::Span<const int32_t> block_tokens);
// The hashes of the first min(max_blocks, tokens.size() / B) full blocks.
std::vector<BlockHash> ChainHashes(const BlockIdentity& identity, absl::Span<const int32_t> tokens,
                                   size_t max_blocks = std::numeric_limits<size_t>::max());

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
  };

  // InvalidArgument for a non-positive num_blocks, block size or TP size, an
  // empty model_id or kv_dtype, or hash bits outside 0..128.
  static absl::StatusOr<std::unique_ptr<KvBlockManager>> Create(Options options);

  KvBlockManager(const KvBlockManager&) = delete;
  KvBlockManager& operator=(const KvBlockManager&) = delete;

  struct PrefixMatch {
    std::vector<BlockId> block_ids;  // the matching cached blocks, in order
    int64_t cached_tokens = 0;       // block_ids.size() * block size
  };

  // The cached prefix of `tokens` (for placement and usage reports). Changes
  // nothing: no references, no LRU refresh, no counters.
  PrefixMatch MatchPrefix(absl::Span<const int32_t> tokens) const;

  // Starts `lane` for `prompt`: matches the cached prefix, references those
  // blocks (refreshing them), and adds fresh blocks until the table covers
  // positions [0, max(num_positions, cached)). Fresh blocks come from the
  // free list first, then by evicting. Returns the cached token count: the
  // lane's first computed position. Errors, with nothing changed:
  // AlreadyExists for a known lane, InvalidArgument for num_positions < 0,
  // ResourceExhausted when the pool cannot supply the blocks.
  absl::StatusOr<int64_t> Allocate(LaneId lane, absl::Span<const int32_t> prompt,
                                   int64_t num_positions);

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
  // can reuse them. A block whose content is already registered (two equal
  // prompts in flight at once) stays the lane's private copy and refreshes
  // the registered one. Errors, with nothing changed: NotFound;
  // InvalidArgument when tokens cover positions the lane has no blocks for,
  // are fewer than it already committed, or differ from its committed tokens.
  absl::Status CommitFullBlocks(LaneId lane, absl::Span<const int32_t> tokens);

  // Drops `lane` and its references. NotFound for an unknown lane.
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
  struct Eviction {
    BlockId block = -1;
    BlockHash hash;
  };
  std::vector<Eviction> TakeEvictions();

  // Blocks a lane could still get: free plus evictable.
  int32_t available_blocks() const;
  KvBlockStats stats() const;
  int32_t num_blocks() const { return num_blocks_; }
  int32_t block_size_tokens() const { return block_size_; }
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
    // Valid while registered:
    BlockHash hash;
    Link parent;
    uint64_t generation = 0;
    std::vector<int32_t> tokens;
    std::list<BlockId>::iterator lru_pos;  // valid while registered and unreferenced
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
  };

  struct HashHasher {
    size_t operator()(const BlockHash& h) const { return static_cast<size_t>(h.low ^ h.high); }
  };

  explicit KvBlockManager(Options options);

  BlockHash HashBlock(const BlockHash& parent, absl::Span<const int32_t> block_tokens) const;
  // Walks the cached chain of `tokens` over at most max_blocks blocks.
  PrefixMatch Walk(absl::Span<const int32_t> tokens, size_t max_blocks) const;
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
  const BlockHash root_;

  std::vector<Block> blocks_;
  std::vector<BlockId> free_;          // a stack: recently freed ids are reused first
  std::list<BlockId> lru_;             // evictable blocks, least recently used first
  std::deque<BlockId> registrations_;  // for TakeRegistrations
  std::deque<Eviction> evictions_;     // for TakeEvictions
  std::unordered_map<BlockHash, BlockId, HashHasher> index_;
  std::unordered_map<LaneId, Lane> lanes_;
  uint64_t next_generation_ = 1;
  KvBlockStats counters_;  // only the cumulative fields are kept here
};

}  // namespace ringlane::router

#endif  // RINGLANE_ROUTER_KV_KV_BLOCK_MANAGER_H_
