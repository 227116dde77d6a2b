// PrefixCache: the KV page pool with reference counts, a content index of full prompt pages and the
// DeltaNet state snapshots that make those pages usable for hybrid models.
//
// Pages. Every page has a reference count (the live sequences that hold it). A full page of prompt
// tokens can be registered under the hash of the token chain that ends with it (parent hash + its
// tokens); a page whose count drops to zero then stays cached, on an LRU list, until allocate() needs
// it (pages no running request holds are the only ones evicted). Unregistered pages go straight back
// to the free list. A lookup compares the stored tokens too, so a hash collision is never a hit.
//
// Snapshots. A snapshot is a DeltaNet state slot (conv + recurrent state of every linear-attention
// layer, kept exactly as the live state) taken after `tokens` tokens of a prompt, keyed by the chain
// hash of the page that ends at that position. It is dropped when that page is evicted (a snapshot is
// worthless without its pages), or, least recently used first, when the snapshot slots run out.
//
// Not thread-safe (the runner's thread only).
#pragma once
#include <cstdint>
#include <list>
#include <optional>
#include <span>
#include <unordered_map>
#include <vector>

namespace moefold {

/// The chain hash of a page: a 64-bit mix of the parent page's hash (0 for the first page) and the
/// page's token ids.
uint64_t page_hash(uint64_t parent, std::span<const int32_t> tokens);

/// Counters and gauges of a PrefixCache (for metrics).
struct PrefixCacheStats {
  int64_t queries = 0;         ///< lookups (one per sequence admitted with caching on)
  int64_t queried_tokens = 0;  ///< prompt tokens looked up
  int64_t hit_tokens = 0;      ///< prompt tokens served from the cache
  int32_t cached_pages = 0;    ///< registered pages (held or evictable)
  int32_t snapshots = 0;       ///< live snapshots
  int32_t snapshot_slots = 0;  ///< snapshot capacity
  int64_t snapshot_bytes = 0;  ///< memory of the live snapshots
  int64_t evicted_pages = 0, evicted_snapshots = 0;
};

class PrefixCache {
 public:
  /// `num_blocks` pages of `block_size` tokens; snapshot slots are the state-pool slots
  /// [first_snapshot_slot, first_snapshot_slot + num_snapshot_slots), each `snapshot_bytes` big.
  PrefixCache(int32_t num_blocks, int32_t block_size, int32_t first_snapshot_slot, int32_t num_snapshot_slots,
              int64_t snapshot_bytes);

  // ---- pages ----
  /// A page with reference count 1: a free one, else the least recently used cached page (evicted:
  /// its hash and any snapshot keyed on it are dropped). -1 when every page is held.
  int32_t allocate();
  /// Takes one more reference on `block` (a cached page with count 0 leaves the LRU list).
  void acquire(int32_t block);
  /// Drops one reference; at zero a registered page becomes evictable (most recently used), an
  /// unregistered one free. Throws Error for a page that is not held.
  void release(int32_t block);
  /// Pages allocate() can hand out now: free + cached with count 0.
  int32_t num_free() const { return int32_t(free_.size() + lru_.size()); }
  int32_t num_total() const { return int32_t(pages_.size()); }
  int32_t ref_count(int32_t block) const { return pages_.at(size_t(block)).refs; }

  /// Registers held page `block` as the full page `tokens` (block_size ids) following `parent`; returns
  /// its hash. When an equal page is already registered the index keeps that one (this page stays
  /// unregistered and is freed on release).
  uint64_t register_page(int32_t block, uint64_t parent, std::span<const int32_t> tokens);
  /// The registered page holding `tokens` after `parent`, or -1.
  int32_t find_page(uint64_t parent, uint64_t hash, std::span<const int32_t> tokens) const;

  // ---- snapshots ----
  /// A snapshot slot to fill in the coming step (free, else the least recently used snapshot's,
  /// which is dropped); nullopt when there are no snapshot slots or all are pending.
  std::optional<int32_t> reserve_snapshot();
  /// Publishes a reserved slot, now holding the state after the page of hash `key`. If a snapshot
  /// with that key already exists (or the page is no longer registered) the slot is given back.
  void commit_snapshot(int32_t slot, uint64_t key);
  /// Gives back a reserved slot unused (the step failed).
  void cancel_snapshot(int32_t slot);
  /// The snapshot slot keyed `key` (marked most recently used), or nullopt.
  std::optional<int32_t> find_snapshot(uint64_t key);
  bool has_snapshot(uint64_t key) const { return snap_by_key_.count(key) != 0; }

  /// Drops every registered page and snapshot that no sequence holds (for tests and a reset).
  void clear_unused();

  /// Counts one lookup of `queried` prompt tokens of which `hit` were served from the cache.
  void count_query(int64_t queried, int64_t hit);
  /// Counters and current gauges.
  PrefixCacheStats stats() const;
  int32_t block_size() const { return block_size_; }
  int32_t num_snapshot_slots() const { return int32_t(snap_slots_.size()); }

 private:
  struct Page {
    int32_t refs = 0;
    bool registered = false;
    uint64_t hash = 0, parent = 0;
    std::vector<int32_t> tokens;
    std::list<int32_t>::iterator lru;  ///< valid while registered && refs == 0
  };
  struct Snap {
    enum State { kFree, kPending, kLive } state = kFree;
    uint64_t key = 0;
    std::list<int32_t>::iterator lru;  ///< valid while kLive
  };
  /// Removes page b's registration (and its snapshot); b must have refs == 0 and be on the LRU.
  void evict_page(int32_t b);
  void drop_snapshot(int32_t slot);
  Snap& snap(int32_t slot);

  int32_t block_size_;
  std::vector<Page> pages_;
  std::vector<int32_t> free_;
  std::list<int32_t> lru_;  ///< evictable pages, least recently used first
  std::unordered_map<uint64_t, int32_t> by_hash_;
  int32_t first_snap_;
  int64_t snap_bytes_;
  std::vector<Snap> snap_slots_;
  std::vector<int32_t> snap_free_;
  std::list<int32_t> snap_lru_;  ///< live snapshots, least recently used first
  std::unordered_map<uint64_t, int32_t> snap_by_key_;
  PrefixCacheStats stats_;
};

}  // namespace moefold
