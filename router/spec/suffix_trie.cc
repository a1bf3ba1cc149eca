#include "router/spec/suffix_trie.h"

#include <algorithm>

namespace ringlane::router {

SuffixTrie::SuffixTrie(int max_depth) : max_depth_(std::max(1, max_depth)) {
  nodes_.emplace_back();
}

int32_t SuffixTrie::Child(int32_t node, int32_t token) const {
  auto it = edges_.find(Key(node, token));
  return it == edges_.end() ? -1 : it->second;
}

int32_t SuffixTrie::Increment(int32_t node, int32_t token) {
  auto [it, inserted] = edges_.try_emplace(Key(node, token), 0);
  if (inserted) {
    int32_t id;
    if (!free_.empty()) {
      id = free_.back();
      free_.pop_back();
    } else {
      id = static_cast<int32_t>(nodes_.size());
      nodes_.emplace_back();
    }
    Node& n = nodes_[id];
    n.token = token;
    n.depth = nodes_[node].depth + 1;
    n.count = 0;
    n.children.clear();
    nodes_[node].children.push_back(id);
    it->second = id;
  }
  const int32_t id = it->second;
  ++nodes_[id].count;
  return id;
}

int32_t SuffixTrie::Decrement(int32_t node, int32_t token) {
  auto it = edges_.find(Key(node, token));
  if (it == edges_.end()) return -1;
  const int32_t id = it->second;
  if (--nodes_[id].count > 0) return id;
  edges_.erase(it);
  std::vector<int32_t>& siblings = nodes_[node].children;
  siblings.erase(std::find(siblings.begin(), siblings.end(), id));
  nodes_[id].children.clear();
  nodes_[id].children.shrink_to_fit();
  free_.push_back(id);
  return id;
}

void SuffixTrie::Walk(absl::Span<const int32_t> path, bool add) {
  if (add) {
    int32_t n = 0;
    for (int32_t t : path) n = Increment(n, t);
    return;
  }
  // Deepest first, so a node is freed only after its child on the path.
  std::vector<int32_t> parents;
  int32_t n = 0;
  for (int32_t t : path) {
    const int32_t c = Child(n, t);
    if (c < 0) break;  // not indexed: Remove without a matching Add
    parents.push_back(n);
    n = c;
  }
  for (size_t i = parents.size(); i-- > 0;) Decrement(parents[i], path[i]);
}

void SuffixTrie::Add(absl::Span<const int32_t> tokens) {
  for (size_t s = 0; s < tokens.size(); ++s) {
    Walk(tokens.subspan(s, std::min<size_t>(max_depth_, tokens.size() - s)), true);
  }
}

void SuffixTrie::Remove(absl::Span<const int32_t> tokens) {
  for (size_t s = 0; s < tokens.size(); ++s) {
    Walk(tokens.subspan(s, std::min<size_t>(max_depth_, tokens.size() - s)), false);
  }
}

void SuffixTrie::Append(int32_t token) {
  size_t kept = 0;
  for (int32_t n : open_) {
    const int32_t c = Increment(n, token);
    if (nodes_[c].depth < max_depth_) open_[kept++] = c;
  }
  open_.resize(kept);
  const int32_t c = Increment(0, token);
  if (max_depth_ > 1) open_.push_back(c);
}

void SuffixTrie::DropFront(absl::Span<const int32_t> tokens) {
  Walk(tokens.subspan(0, std::min<size_t>(max_depth_, tokens.size())), false);
}

SuffixTrie::Match SuffixTrie::LongestMatch(absl::Span<const int32_t> context,
                                           int max_pattern) const {
  const int longest =
      std::min<int>({max_pattern, max_depth_ - 1, static_cast<int>(context.size())});
  for (int len = longest; len >= 1; --len) {
    int32_t n = 0;
    for (size_t i = context.size() - len; i < context.size() && n >= 0; ++i) {
      n = Child(n, context[i]);
    }
    if (n >= 0 && !nodes_[n].children.empty()) return {len, n};
  }
  return {};
}

std::vector<int32_t> SuffixTrie::Continue(Match m, int max_tokens, double min_fraction) const {
  std::vector<int32_t> out;
  if (m.length == 0) return out;
  int32_t n = m.node;
  while (static_cast<int>(out.size()) < max_tokens && !nodes_[n].children.empty()) {
    int32_t best = -1;
    for (int32_t c : nodes_[n].children) {
      if (best < 0 || nodes_[c].count > nodes_[best].count ||
          (nodes_[c].count == nodes_[best].count && nodes_[c].token < nodes_[best].token)) {
        best = c;
      }
    }
    if (nodes_[best].count < min_fraction * nodes_[n].count) break;
    out.push_back(nodes_[best].token);
    n = best;
  }
  return out;
}

}  // namespace ringlane::router
