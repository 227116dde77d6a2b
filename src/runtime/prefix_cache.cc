// Page pool with reference counts, prefix index and DeltaNet snapshots (contract: prefix_cache.h).
#include "runtime/prefix_cache.h"

#include <algorithm>

#include "core/error.h"

namespace moefold {

namespace {
uint64_t mix(uint64_t h, uint64_t v) {
  // splitmix64 finaliser over h ^ v: every input bit reaches every output bit.
  uint64_t z = h ^ (v + 0x9e3779b97f4a7c15ULL + (h << 6) + (h >> 2));
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
  return z ^ (z >> 31);
}
}  // namespace

uint64_t page_hash(uint64_t parent, std::span<const int32_t> tokens) {
  uint64_t h = mix(0x6d6f65666f6c64ULL, parent);
  for (int32_t t : tokens) h = mix(h, uint64_t(uint32_t(t)));
  return mix(h, tokens.size());
}

PrefixCache::PrefixCache(int32_t num_blocks, int32_t block_size, int32_t first_snapshot_slot,
                         int32_t num_snapshot_slots, int64_t snapshot_bytes)
    : block_size_(block_size), pages_(size_t(std::max(num_blocks, 0))), first_snap_(first_snapshot_slot),
      snap_bytes_(snapshot_bytes), snap_slots_(size_t(std::max(num_snapshot_slots, 0))) {
  MOEFOLD_CHECK(num_blocks >= 1 && block_size >= 1, "PrefixCache: {} pages of {} tokens", num_blocks, block_size);
  for (int32_t b = num_blocks - 1; b >= 0; --b) free_.push_back(b);
  for (int32_t s = num_snapshot_slots - 1; s >= 0; --s) snap_free_.push_back(s);
}

int32_t PrefixCache::allocate() {
  int32_t b = -1;
  if (!free_.empty()) {
    b = free_.back();
    free_.pop_back();
  } else if (!lru_.empty()) {
    b = lru_.front();
    evict_page(b);
  } else {
    return -1;
  }
  pages_[size_t(b)].refs = 1;
  return b;
}

void PrefixCache::evict_page(int32_t b) {
  Page& p = pages_[size_t(b)];
  lru_.erase(p.lru);
  by_hash_.erase(p.hash);
  if (auto it = snap_by_key_.find(p.hash); it != snap_by_key_.end()) drop_snapshot(it->second);
  p.registered = false;
  p.tokens.clear();
  ++stats_.evicted_pages;
}

void PrefixCache::acquire(int32_t b) {
  MOEFOLD_CHECK(b >= 0 && b < num_total(), "PrefixCache: page {} out of range", b);
  Page& p = pages_[size_t(b)];
  MOEFOLD_CHECK(p.refs > 0 || p.registered, "PrefixCache: acquire of free page {}", b);
  if (p.refs == 0) lru_.erase(p.lru);
  ++p.refs;
}

void PrefixCache::release(int32_t b) {
  MOEFOLD_CHECK(b >= 0 && b < num_total() && pages_[size_t(b)].refs > 0, "PrefixCache: release of page {} that is not held", b);
  Page& p = pages_[size_t(b)];
  if (--p.refs > 0) return;
  if (p.registered) p.lru = lru_.insert(lru_.end(), b);
  else free_.push_back(b);
}

uint64_t PrefixCache::register_page(int32_t b, uint64_t parent, std::span<const int32_t> tokens) {
  MOEFOLD_CHECK(int32_t(tokens.size()) == block_size_, "PrefixCache: a page holds {} tokens, got {}", block_size_,
                tokens.size());
  MOEFOLD_CHECK(b >= 0 && b < num_total() && pages_[size_t(b)].refs > 0, "PrefixCache: register of page {} that is not held", b);
  const uint64_t h = page_hash(parent, tokens);
  Page& p = pages_[size_t(b)];
  if (p.registered || by_hash_.count(h)) return h;  // an equal page is already indexed
  p.registered = true;
  p.hash = h;
  p.parent = parent;
  p.tokens.assign(tokens.begin(), tokens.end());
  by_hash_[h] = b;
  return h;
}

int32_t PrefixCache::find_page(uint64_t parent, uint64_t hash, std::span<const int32_t> tokens) const {
  auto it = by_hash_.find(hash);
  if (it == by_hash_.end()) return -1;
  const Page& p = pages_[size_t(it->second)];
  if (p.parent != parent || !std::equal(p.tokens.begin(), p.tokens.end(), tokens.begin(), tokens.end())) return -1;
  return it->second;
}

PrefixCache::Snap& PrefixCache::snap(int32_t slot) {
  const int32_t i = slot - first_snap_;
  MOEFOLD_CHECK(i >= 0 && i < num_snapshot_slots(), "PrefixCache: slot {} is not a snapshot slot", slot);
  return snap_slots_[size_t(i)];
}

std::optional<int32_t> PrefixCache::reserve_snapshot() {
  int32_t i = -1;
  if (!snap_free_.empty()) {
    i = snap_free_.back();
    snap_free_.pop_back();
  } else if (!snap_lru_.empty()) {
    i = snap_lru_.front() - first_snap_;
    drop_snapshot(snap_lru_.front());
    snap_free_.pop_back();  // drop_snapshot freed exactly slot i
    ++stats_.evicted_snapshots;
  } else {
    return std::nullopt;
  }
  snap_slots_[size_t(i)].state = Snap::kPending;
  return first_snap_ + i;
}

void PrefixCache::commit_snapshot(int32_t slot, uint64_t key) {
  Snap& s = snap(slot);
  MOEFOLD_CHECK(s.state == Snap::kPending, "PrefixCache: commit of snapshot slot {} that is not reserved", slot);
  if (snap_by_key_.count(key) || !by_hash_.count(key)) {
    cancel_snapshot(slot);
    return;
  }
  s.state = Snap::kLive;
  s.key = key;
  s.lru = snap_lru_.insert(snap_lru_.end(), slot);
  snap_by_key_[key] = slot;
}

void PrefixCache::cancel_snapshot(int32_t slot) {
  Snap& s = snap(slot);
  MOEFOLD_CHECK(s.state == Snap::kPending, "PrefixCache: cancel of snapshot slot {} that is not reserved", slot);
  s.state = Snap::kFree;
  snap_free_.push_back(slot - first_snap_);
}

void PrefixCache::drop_snapshot(int32_t slot) {
  Snap& s = snap(slot);
  snap_lru_.erase(s.lru);
  snap_by_key_.erase(s.key);
  s.state = Snap::kFree;
  snap_free_.push_back(slot - first_snap_);
}

std::optional<int32_t> PrefixCache::find_snapshot(uint64_t key) {
  auto it = snap_by_key_.find(key);
  if (it == snap_by_key_.end()) return std::nullopt;
  Snap& s = snap(it->second);
  snap_lru_.splice(snap_lru_.end(), snap_lru_, s.lru);
  return it->second;
}

void PrefixCache::clear_unused() {
  while (!lru_.empty()) {
    const int32_t b = lru_.front();
    evict_page(b);
    free_.push_back(b);
  }
}

void PrefixCache::count_query(int64_t queried, int64_t hit) {
  ++stats_.queries;
  stats_.queried_tokens += queried;
  stats_.hit_tokens += hit;
}

PrefixCacheStats PrefixCache::stats() const {
  PrefixCacheStats s = stats_;
  s.cached_pages = int32_t(by_hash_.size());
  s.snapshots = int32_t(snap_by_key_.size());
  s.snapshot_slots = num_snapshot_slots();
  s.snapshot_bytes = int64_t(s.snapshots) * snap_bytes_;
  return s;
}

}  // namespace moefold
