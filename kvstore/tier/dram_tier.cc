#include "kvstore/tier/dram_tier.h"

namespace ringlane::kvstore {

DramTier::DramTier(int64_t capacity_bytes) : capacity_bytes_(capacity_bytes) {}

bool DramTier::Insert(const std::string& key, Block block, Evicted* evicted, bool* new_entry) {
  absl::MutexLock lock(&mu_);
  if (new_entry != nullptr) *new_entry = false;
  if (auto it = entries_.find(key); it != entries_.end()) {
    lru_.splice(lru_.end(), lru_, it->second.lru);
    return true;
  }
  const int64_t charge = Charge(key, block);
  if (charge > capacity_bytes_) return false;
  while (charged_bytes_ + charge > capacity_bytes_ && !lru_.empty()) {
    auto victim = entries_.find(lru_.front());
    evicted->emplace_back(victim->first, victim->second.block);
    EraseLocked(victim);
    ++evictions_;
  }
  lru_.push_back(key);
  charged_bytes_ += charge;
  payload_bytes_ += block.bytes();
  entries_.emplace(key, Entry{std::move(block), std::prev(lru_.end())});
  if (new_entry != nullptr) *new_entry = true;
  return true;
}

std::optional<Block> DramTier::Get(const std::string& key) {
  absl::MutexLock lock(&mu_);
  auto it = entries_.find(key);
  if (it == entries_.end()) return std::nullopt;
  lru_.splice(lru_.end(), lru_, it->second.lru);
  return it->second.block;
}

bool DramTier::Contains(const std::string& key) const {
  absl::MutexLock lock(&mu_);
  return entries_.contains(key);
}

bool DramTier::Touch(const std::string& key) {
  absl::MutexLock lock(&mu_);
  auto it = entries_.find(key);
  if (it == entries_.end()) return false;
  lru_.splice(lru_.end(), lru_, it->second.lru);
  return true;
}

void DramTier::EraseLocked(absl::flat_hash_map<std::string, Entry>::iterator it) {
  charged_bytes_ -= Charge(it->first, it->second.block);
  payload_bytes_ -= it->second.block.bytes();
  lru_.erase(it->second.lru);
  entries_.erase(it);
}

int64_t DramTier::EraseWithPrefix(std::string_view prefix) {
  absl::MutexLock lock(&mu_);
  // A linear scan: deleting a model is rare and the map is bounded by the
  // budget; an ordered index only for this is not worth its cost per hit.
  std::vector<std::string> doomed;
  for (const auto& [k, e] : entries_) {
    if (std::string_view(k).substr(0, prefix.size()) == prefix) doomed.push_back(k);
  }
  for (const auto& k : doomed) EraseLocked(entries_.find(k));
  return static_cast<int64_t>(doomed.size());
}

DramTier::Evicted DramTier::TakeAll() {
  absl::MutexLock lock(&mu_);
  Evicted all;
  all.reserve(entries_.size());
  for (const auto& k : lru_) all.emplace_back(k, entries_.find(k)->second.block);
  entries_.clear();
  lru_.clear();
  charged_bytes_ = 0;
  payload_bytes_ = 0;
  return all;
}

DramTier::Stats DramTier::stats() const {
  absl::MutexLock lock(&mu_);
  return Stats{.entries = static_cast<int64_t>(entries_.size()),
               .bytes = payload_bytes_,
               .capacity_bytes = capacity_bytes_,
               .evictions = evictions_};
}

std::vector<std::string> DramTier::KeysLruOrderForTesting() const {
  absl::MutexLock lock(&mu_);
  return {lru_.begin(), lru_.end()};
}

}  // namespace ringlane::kvstore
