#include "router/spec/draft_sources.h"

#include <algorithm>
#include <cmath>
#include <utility>

#include "absl/container/flat_hash_map.h"
#include "xxhash.h"

namespace ringlane::router {

namespace {

// The random source's draws.
uint64_t Mix(uint64_t h, uint64_t v) {
  h ^= v + 0x9e3779b97f4a7c15ULL + (h << 6) + (h >> 2);
  h ^= h >> 33;
  h *= 0xff51afd7ed558ccdULL;
  h ^= h >> 33;
  return h;
}

// Of an n-gram's tokens (a match is then checked token by token).
uint64_t HashOf(absl::Span<const int32_t> tokens) {
  return XXH3_64bits(tokens.data(), tokens.size() * sizeof(int32_t));
}

// Drafts per matched token, never fewer than one for a match.
int DepthFor(int match_length, double factor, int max_drafts) {
  if (match_length <= 0) return 0;
  const int d = static_cast<int>(std::ceil(factor * match_length));
  return std::clamp(d, 1, std::max(max_drafts, 0));
}

class NgramSource final : public DraftSource {
 public:
  explicit NgramSource(const DraftSourceOptions& o)
      : min_n_(std::max(1, o.ngram_min)), max_n_(std::max(min_n_, o.ngram_max)) {}
  const char* name() const override { return "ngram"; }

  Proposal ProposeAfter(uint64_t id, absl::Span<const int32_t> seq, absl::Span<const int32_t> tail,
                        int max_drafts) override {
    Proposal p;
    const int64_t len = static_cast<int64_t>(seq.size());
    if (max_drafts <= 0 || len < min_n_ + 1) return p;
    // The context is seq then tail; only seq's n-grams are indexed.
    const int64_t ctx_len = len + static_cast<int64_t>(tail.size());
    auto at = [&](int64_t i) { return i < len ? seq[i] : tail[i - len]; };
    LaneIndex& lane = lanes_[id];
    if (lane.last_end.empty()) lane.last_end.resize(max_n_ + 1);
    // Earlier occurrences only: n-grams ending before the last token. A long
    // prompt is indexed over several rounds rather than stalling one.
    const int64_t until = std::min(len - 1, lane.indexed + kIndexPerCall);
    for (int64_t e = lane.indexed; e < until; ++e) {
      for (int n = min_n_; n <= max_n_ && n <= e + 1; ++n) {
        lane.last_end[n][HashOf(seq.subspan(e - n + 1, n))] = static_cast<int32_t>(e);
      }
    }
    lane.indexed = until;
    std::vector<int32_t> last;
    for (int n = std::min<int64_t>(max_n_, len - 1); n >= min_n_; --n) {
      last.clear();
      for (int64_t i = ctx_len - n; i < ctx_len; ++i) last.push_back(at(i));
      auto it = lane.last_end[n].find(HashOf(last));
      if (it == lane.last_end[n].end()) continue;
      const int64_t e = it->second;
      if (!std::equal(last.begin(), last.end(), seq.begin() + (e - n + 1))) continue;
      // Copy on from the occurrence; past the context's end the copy reads
      // its own drafts, so a repeating period continues.
      for (int64_t j = 0; j < max_drafts; ++j) {
        const int64_t from = e + 1 + j;
        p.tokens.push_back(from < ctx_len ? at(from) : p.tokens[from - ctx_len]);
      }
      p.match_length = n;
      return p;
    }
    return p;
  }
  void Forget(uint64_t id) override { lanes_.erase(id); }
  size_t lanes() const override { return lanes_.size(); }

 private:
  static constexpr int64_t kIndexPerCall = 8192;
  struct LaneIndex {
    // [n]: n-gram hash -> end position of its latest occurrence.
    std::vector<absl::flat_hash_map<uint64_t, int32_t>> last_end;
    int64_t indexed = 0;  // end positions below this are indexed
  };
  const int min_n_;
  const int max_n_;
  absl::flat_hash_map<uint64_t, LaneIndex> lanes_;
};

class SuffixSource final : public DraftSource {
 public:
  SuffixSource(const DraftSourceOptions& o, std::shared_ptr<SuffixCache> cache)
      : o_(o), cache_(std::move(cache)) {}
  const char* name() const override { return "suffix"; }

  Proposal ProposeAfter(uint64_t id, absl::Span<const int32_t> seq, absl::Span<const int32_t> tail,
                        int max_drafts) override {
    Proposal p;
    if (max_drafts <= 0 || seq.empty()) return p;
    auto [it, fresh] = lanes_.try_emplace(id, o_.suffix_depth);
    LaneTrie& lane = it->second;
    const int64_t len = static_cast<int64_t>(seq.size());
    if (fresh && len > o_.suffix_window) lane.front = lane.appended = len - o_.suffix_window;
    for (; lane.appended < len; ++lane.appended) {
      lane.trie.Append(seq[lane.appended]);
      if (lane.appended + 1 - lane.front > o_.suffix_window) {
        lane.trie.DropFront(seq.subspan(lane.front));
        ++lane.front;
      }
    }
    // Matching reads at most the last suffix_max_pattern tokens of the
    // context (seq then tail); the trie holds seq's only.
    absl::Span<const int32_t> context = seq;
    std::vector<int32_t> joined;
    if (!tail.empty()) {
      const size_t keep = std::min(seq.size(), static_cast<size_t>(o_.suffix_max_pattern));
      joined.assign(seq.end() - static_cast<std::ptrdiff_t>(keep), seq.end());
      joined.insert(joined.end(), tail.begin(), tail.end());
      context = joined;
    }
    const SuffixTrie::Match local = lane.trie.LongestMatch(context, o_.suffix_max_pattern);
    Proposal global;
    if (cache_) {
      global = cache_->Propose(context, o_.suffix_max_pattern, o_.suffix_depth_factor,
                               o_.suffix_min_fraction, max_drafts);
    }
    if (local.length > 0 && local.length >= global.match_length) {
      p.tokens =
          lane.trie.Continue(local, DepthFor(local.length, o_.suffix_depth_factor, max_drafts),
                             o_.suffix_min_fraction);
      p.match_length = local.length;
      if (!p.tokens.empty()) return p;
    }
    return global;
  }
  void Forget(uint64_t id) override { lanes_.erase(id); }
  void Finished(absl::Span<const int32_t> seq, int64_t prompt_len) override {
    if (!cache_ || static_cast<int64_t>(seq.size()) <= prompt_len) return;
    const int64_t from = std::max<int64_t>(0, prompt_len - o_.suffix_max_pattern);
    cache_->Add(std::vector<int32_t>(seq.begin() + from, seq.end()));
  }
  size_t lanes() const override { return lanes_.size(); }

 private:
  struct LaneTrie {
    explicit LaneTrie(int depth) : trie(depth) {}
    SuffixTrie trie;
    int64_t front = 0;     // oldest start position indexed
    int64_t appended = 0;  // tokens appended so far
  };
  const DraftSourceOptions o_;
  const std::shared_ptr<SuffixCache> cache_;
  absl::flat_hash_map<uint64_t, LaneTrie> lanes_;
};

class RandomSource final : public DraftSource {
 public:
  explicit RandomSource(const DraftSourceOptions& o)
      : vocab_(std::max(1, o.vocab_size)), seed_(o.random_seed) {}
  const char* name() const override { return "random"; }
  Proposal ProposeAfter(uint64_t id, absl::Span<const int32_t> seq, absl::Span<const int32_t> tail,
                        int max_drafts) override {
    Proposal p;
    const uint64_t base = Mix(Mix(seed_, id), seq.size() + tail.size());
    for (int j = 0; j < max_drafts; ++j) {
      p.tokens.push_back(static_cast<int32_t>(Mix(base, j) % static_cast<uint64_t>(vocab_)));
    }
    return p;
  }

 private:
  const int32_t vocab_;
  const uint64_t seed_;
};

class ModelSource final : public DraftSource {
 public:
  const char* name() const override { return "model"; }
  bool worker_proposed() const override { return true; }

  Proposal ProposeAfter(uint64_t lane, absl::Span<const int32_t> seq,
                        absl::Span<const int32_t> tail, int max_drafts) override {
    Proposal p;
    auto it = lanes_.find(lane);
    // Proposals follow a known sequence only (they come with a result).
    if (tail.empty() && it != lanes_.end() &&
        it->second.seq_len == static_cast<int64_t>(seq.size()) && !it->second.tokens.empty()) {
      const auto& t = it->second.tokens;
      p.tokens.assign(t.begin(), t.begin() + std::min<ptrdiff_t>(max_drafts, t.size()));
      return p;
    }
    // Not proposed yet for this sequence: it will be once the row in
    // flight returns, about as deep as the last proposal.
    const int expect =
        it == lanes_.end() || it->second.last_depth <= 0 ? max_drafts : it->second.last_depth;
    p.tokens.assign(static_cast<size_t>(std::clamp(expect, 0, max_drafts)), -1);
    p.pending = true;
    return p;
  }

  void OnProposed(uint64_t lane, int64_t seq_len, absl::Span<const int32_t> tokens) override {
    Kept& k = lanes_[lane];
    k.seq_len = seq_len;
    k.tokens.assign(tokens.begin(), tokens.end());
    if (!tokens.empty()) k.last_depth = static_cast<int>(tokens.size());
  }

  void Forget(uint64_t lane) override { lanes_.erase(lane); }
  size_t lanes() const override { return lanes_.size(); }

 private:
  struct Kept {
    int64_t seq_len = -1;
    std::vector<int32_t> tokens;
    int last_depth = 0;
  };
  absl::flat_hash_map<uint64_t, Kept> lanes_;
};

}  // namespace

void SuffixCache::Add(std::vector<int32_t> tokens) {
  absl::MutexLock l(&mu_);
  trie_.Add(tokens);
  tokens_ += static_cast<int64_t>(tokens.size());
  kept_.push_back(std::move(tokens));
  while (tokens_ > max_tokens_ && !kept_.empty()) {
    trie_.Remove(kept_.front());
    tokens_ -= static_cast<int64_t>(kept_.front().size());
    kept_.pop_front();
  }
}

Proposal SuffixCache::Propose(absl::Span<const int32_t> context, int max_pattern,
                              double depth_factor, double min_fraction, int max_drafts) const {
  Proposal p;
  absl::MutexLock l(&mu_);
  const SuffixTrie::Match m = trie_.LongestMatch(context, max_pattern);
  if (m.length == 0) return p;
  p.tokens = trie_.Continue(m, DepthFor(m.length, depth_factor, max_drafts), min_fraction);
  p.match_length = p.tokens.empty() ? 0 : m.length;
  return p;
}

int64_t SuffixCache::tokens() const {
  absl::MutexLock l(&mu_);
  return tokens_;
}

std::unique_ptr<DraftSource> MakeDraftSource(const std::string& name,
                                             const DraftSourceOptions& options,
                                             std::shared_ptr<SuffixCache> cache) {
  if (name == "ngram") return std::make_unique<NgramSource>(options);
  if (name == "suffix") return std::make_unique<SuffixSource>(options, std::move(cache));
  if (name == "random") return std::make_unique<RandomSource>(options);
  if (name == "model") return std::make_unique<ModelSource>();
  return nullptr;
}

const std::vector<std::string>& DraftSourceNames() {
  static const std::vector<std::string> names = {"ngram", "suffix", "random", "model"};
  return names;
}

}  // namespace ringlane::router
