#include "runtime/model_runner.h"

#include <algorithm>
#include <numeric>

#include "core/error.h"
#include "core/profiler.h"

namespace moefold {

int64_t deltanet_slot_bytes(const ModelConfig& cfg, int64_t conv_elem_bytes) {
  int64_t layers = 0;
  for (LayerType t : cfg.layer_types) layers += t == LayerType::LinearAttention ? 1 : 0;
  const int64_t conv = cfg.conv_dim() * std::max<int64_t>(cfg.linear_conv_kernel_dim - 1, 0);
  const int64_t rec = cfg.linear_num_value_heads * cfg.linear_key_head_dim * cfg.linear_value_head_dim;
  return layers * (conv * conv_elem_bytes + rec * int64_t(sizeof(float)));
}

namespace {
bool has_linear_layers(const ModelConfig& c) {
  return std::find(c.layer_types.begin(), c.layer_types.end(), LayerType::LinearAttention) != c.layer_types.end();
}
}  // namespace

ModelRunner::ModelRunner(const Model& model, RunnerOptions opt)
    : ModelRunner(make_cpu_executor(model, opt.num_blocks, opt.block_size,
                                    opt.max_seqs + (opt.enable_prefix_caching ? std::max(opt.snapshot_slots, 0) : 0),
                                    opt.kv_cache_dtype),
                  opt) {}

ModelRunner::ModelRunner(std::unique_ptr<Executor> executor, RunnerOptions opt)
    : exec_(std::move(executor)),
      opt_{opt},
      hybrid_(has_linear_layers(exec_->config())),
      grid_(hybrid_ ? std::lcm(opt.block_size, kStateSnapshotChunk) : opt.block_size),
      cache_(opt.num_blocks > 0 ? opt.num_blocks : exec_->num_kv_blocks(), opt.block_size, opt.max_seqs,
             opt.enable_prefix_caching && hybrid_ ? opt.snapshot_slots : 0, exec_->state_slot_bytes()) {
  if (opt_.num_blocks <= 0) opt_.num_blocks = exec_->num_kv_blocks();
  if (!opt_.enable_prefix_caching || !hybrid_) opt_.snapshot_slots = 0;
  MOEFOLD_CHECK(opt_.block_size >= 1, "block size must be at least 1, got {}", opt_.block_size);
  MOEFOLD_CHECK(opt_.num_blocks <= exec_->num_kv_blocks(), "runner wants {} KV pages; the executor holds {}",
                opt_.num_blocks, exec_->num_kv_blocks());
  MOEFOLD_CHECK(opt_.snapshot_slots >= 0, "snapshot slots must be >= 0, got {}", opt_.snapshot_slots);
  MOEFOLD_CHECK(opt_.max_seqs + opt_.snapshot_slots <= exec_->num_state_slots(),
                "runner wants {} sequence + {} snapshot state slots; the executor holds {}", opt_.max_seqs,
                opt_.snapshot_slots, exec_->num_state_slots());
  MOEFOLD_CHECK(opt_.snapshot_interval >= 0 && (opt_.snapshot_slots == 0 || opt_.snapshot_interval % grid_ == 0),
                "the snapshot interval {} must be a multiple of the snapshot grid ({} tokens)", opt_.snapshot_interval,
                grid_);
  for (int32_t s = opt.max_seqs - 1; s >= 0; --s) free_slots_.push_back(s);
}

ModelRunner::PrefixMatch ModelRunner::match_prefix(std::span<const int32_t> prompt, bool more_tokens) const {
  PrefixMatch m;
  if (!opt_.enable_prefix_caching) return m;
  const int32_t bs = opt_.block_size;
  // At least one token left to compute (the whole prompt may be restored when tokens follow it).
  const int32_t max_pages = (int32_t(prompt.size()) - (more_tokens ? 0 : 1)) / bs;
  std::vector<int32_t> pages;
  std::vector<uint64_t> hashes;
  uint64_t parent = 0;
  for (int32_t i = 0; i < max_pages; ++i) {
    const std::span<const int32_t> toks = prompt.subspan(size_t(i) * size_t(bs), size_t(bs));
    const uint64_t h = page_hash(parent, toks);
    const int32_t b = cache_.find_page(parent, h, toks);
    if (b < 0) break;
    pages.push_back(b);
    hashes.push_back(h);
    parent = h;
  }
  int32_t n = int32_t(pages.size());
  if (hybrid_) {
    int32_t g = (n * bs / grid_) * grid_;
    while (g > 0 && !cache_.has_snapshot(hashes[size_t(g / bs - 1)])) g -= grid_;
    n = g / bs;
  }
  m.tokens = n * bs;
  for (int32_t i = 0; i < n; ++i) m.idle_pages += cache_.ref_count(pages[size_t(i)]) == 0 ? 1 : 0;
  return m;
}

int32_t ModelRunner::add_sequence(std::vector<int32_t> prompt, int32_t prompt_len) {
  MOEFOLD_CHECK(!prompt.empty(), "the prompt is empty");
  MOEFOLD_CHECK(!free_slots_.empty(), "no free sequence slot (max_seqs {})", opt_.max_seqs);
  if (prompt_len < 0) prompt_len = int32_t(prompt.size());
  MOEFOLD_CHECK(prompt_len >= 1 && prompt_len <= int32_t(prompt.size()), "prompt length {} outside [1, {}]",
                prompt_len, prompt.size());
  SequenceState s;
  s.prompt_len = prompt_len;
  s.slot = free_slots_.back();
  free_slots_.pop_back();
  if (opt_.enable_prefix_caching) {
    const int32_t bs = opt_.block_size;
    uint64_t parent = 0;
    for (size_t i = 0; (i + 1) * size_t(bs) <= size_t(prompt_len); ++i)
      s.page_hashes.push_back(parent = page_hash(parent, std::span(prompt).subspan(i * size_t(bs), size_t(bs))));
    const PrefixMatch m = match_prefix(std::span(prompt).first(size_t(prompt_len)), prompt_len < int32_t(prompt.size()));
    const int32_t n = m.tokens / bs;
    for (int32_t i = 0; i < n; ++i) {
      const size_t off = size_t(i) * size_t(bs);
      const int32_t b = cache_.find_page(i ? s.page_hashes[size_t(i - 1)] : 0, s.page_hashes[size_t(i)],
                                         std::span(prompt).subspan(off, size_t(bs)));
      cache_.acquire(b);
      s.blocks.push_back(b);
    }
    if (hybrid_ && n > 0) {
      const std::optional<int32_t> snap = cache_.find_snapshot(s.page_hashes[size_t(n - 1)]);
      MOEFOLD_CHECK(snap.has_value(), "prefix cache: the snapshot of a matched prefix vanished");
      exec_->copy_slot(*snap, s.slot);
    } else {
      exec_->reset_slot(s.slot);
    }
    s.num_computed = s.num_cached = m.tokens;
    s.num_registered = n;
    cache_.count_query(int64_t(prompt.size()), m.tokens);
  } else {
    exec_->reset_slot(s.slot);
  }
  s.tokens = std::move(prompt);
  seqs_[next_id_] = std::move(s);
  return next_id_++;
}

SequenceState& ModelRunner::seq_ref(int32_t seq) {
  auto it = seqs_.find(seq);
  MOEFOLD_CHECK(it != seqs_.end(), "unknown sequence id {}", seq);
  return it->second;
}
const SequenceState& ModelRunner::sequence(int32_t seq) const {
  auto it = seqs_.find(seq);
  MOEFOLD_CHECK(it != seqs_.end(), "unknown sequence id {}", seq);
  return it->second;
}

void ModelRunner::append_token(int32_t seq, int32_t token) { seq_ref(seq).tokens.push_back(token); }

void ModelRunner::release(int32_t seq) {
  SequenceState& s = seq_ref(seq);
  // Last page first: an evicted chain loses its tail before its (more widely shared) head.
  for (auto b = s.blocks.rbegin(); b != s.blocks.rend(); ++b) cache_.release(*b);
  free_slots_.push_back(s.slot);
  seqs_.erase(seq);
}

int32_t ModelRunner::blocks_needed(int32_t seq, int32_t extra) const {
  const SequenceState& s = sequence(seq);
  const int32_t need = (s.num_computed + extra + opt_.block_size - 1) / opt_.block_size;
  return std::max(0, need - int32_t(s.blocks.size()));
}

ForwardBatch ModelRunner::build_batch(const std::vector<Work>& work) {
  // Reserve pages first so that a failure leaves every sequence unchanged.
  int32_t need = 0;
  for (auto& w : work) {
    const SequenceState& s = sequence(w.seq);
    MOEFOLD_CHECK(w.num_tokens > 0 && s.num_computed + w.num_tokens <= int32_t(s.tokens.size()),
                  "sequence {}: cannot compute {} tokens ({} of {} done)", w.seq, w.num_tokens, s.num_computed,
                  s.tokens.size());
    MOEFOLD_CHECK(s.num_computed >= s.prompt_len ? w.num_tokens == 1 : s.num_computed + w.num_tokens <= s.prompt_len,
                  "sequence {}: a step of {} tokens from {} crosses its prompt end {} (prompt rows and decode rows "
                  "are separate steps)",
                  w.seq, w.num_tokens, s.num_computed, s.prompt_len);
    need += blocks_needed(w.seq, w.num_tokens);
  }
  MOEFOLD_CHECK(need <= cache_.num_free(), "out of KV cache pages: step needs {}, {} free", need, cache_.num_free());

  ForwardBatch b;
  b.cu_seqlens.push_back(0);
  for (auto& w : work) {
    SequenceState& s = seq_ref(w.seq);
    for (int32_t n = blocks_needed(w.seq, w.num_tokens); n > 0; --n) s.blocks.push_back(cache_.allocate());
    b.max_blocks_per_seq = std::max(b.max_blocks_per_seq, int32_t(s.blocks.size()));
  }
  for (auto& w : work) {
    SequenceState& s = seq_ref(w.seq);
    const int32_t r0 = b.cu_seqlens.back();
    for (int32_t i = 0; i < w.num_tokens; ++i) {
      b.token_ids.push_back(s.tokens[size_t(s.num_computed + i)]);
      b.positions.push_back(s.num_computed + i);
      if (w.all_logits || i == w.num_tokens - 1) b.logits_rows.push_back(r0 + i);
    }
    b.cu_seqlens.push_back(r0 + w.num_tokens);
    b.context_lens.push_back(s.num_computed);
    b.state_slots.push_back(s.slot);
    b.prefill.push_back(s.num_computed < s.prompt_len ? 1 : 0);
    plan_snapshots(int32_t(b.context_lens.size()) - 1, s, w.num_tokens, b);
    std::vector<int32_t> row(size_t(b.max_blocks_per_seq), -1);
    std::copy(s.blocks.begin(), s.blocks.end(), row.begin());
    b.block_tables.insert(b.block_tables.end(), row.begin(), row.end());
  }
  return b;
}

void ModelRunner::plan_snapshots(int32_t i, const SequenceState& s, int32_t n, ForwardBatch& b) {
  const int32_t c = s.num_computed, C = kStateSnapshotChunk;
  // Snapshots come from the chunked prefill, whose chunks sit on the absolute 64-token grid only when
  // this step's rows start on it.
  if (opt_.snapshot_slots == 0 || c >= s.prompt_len || c % C != 0) return;
  const int32_t last = (s.prompt_len / grid_) * grid_;
  const int32_t end = std::min(c + n, s.prompt_len);
  for (int32_t g = (c / grid_ + 1) * grid_; g <= end; g += grid_) {
    if (g != last && (opt_.snapshot_interval == 0 || g % opt_.snapshot_interval != 0)) continue;
    const uint64_t key = s.page_hashes[size_t(g / opt_.block_size - 1)];
    if (cache_.has_snapshot(key)) continue;
    bool planned = false;
    for (const PendingSnapshot& p : pending_) planned = planned || p.key == key;
    if (planned) continue;  // another sequence of this step takes it
    if (int32_t(b.snapshots.size()) >= kMaxStepSnapshots) return;
    const std::optional<int32_t> slot = cache_.reserve_snapshot();
    if (!slot) return;
    pending_.push_back({*slot, key});
    b.snapshots.push_back({i, (g - c) / C - 1, *slot});
  }
}

void ModelRunner::cancel_pending() {
  for (const PendingSnapshot& p : pending_) cache_.cancel_snapshot(p.slot);
  pending_.clear();
}

void ModelRunner::advance(const std::vector<Work>& work) {
  const int32_t bs = opt_.block_size;
  for (auto& w : work) {
    SequenceState& s = seq_ref(w.seq);
    s.num_computed += w.num_tokens;
    if (!opt_.enable_prefix_caching) continue;
    // Only prompt pages: their K/V (and the states at their ends) are those of a cold prefill.
    const int32_t full = std::min(s.num_computed, s.prompt_len) / bs;
    for (; s.num_registered < full; ++s.num_registered) {
      const size_t i = size_t(s.num_registered);
      cache_.register_page(s.blocks[i], i ? s.page_hashes[i - 1] : 0,
                           std::span(s.tokens).subspan(i * size_t(bs), size_t(bs)));
    }
  }
  for (const PendingSnapshot& p : pending_) cache_.commit_snapshot(p.slot, p.key);
  pending_.clear();
}

std::vector<std::span<float>> ModelRunner::step_views(const std::vector<Work>& work) {
  const ForwardBatch b = build_batch(work);
  {
    // The step's host facts, for the profiler's work counts of kernels that see only device counts.
    const prof::StepFacts facts{b.num_rows(), b.cu_seqlens, b.context_lens};
    const prof::StepFactsScope facts_scope(facts);
    try {
      exec_->forward(b, logits_);
    } catch (...) {
      cancel_pending();
      throw;
    }
  }

  const int64_t V = exec_->config().vocab_size;
  std::vector<std::span<float>> out;
  size_t r = 0;
  for (auto& w : work) {
    const size_t rows = w.all_logits ? size_t(w.num_tokens) : 1;
    out.emplace_back(logits_.data() + r * size_t(V), rows * size_t(V));
    r += rows;
  }
  advance(work);
  return out;
}

void ModelRunner::step_sample(const std::vector<Work>& work, std::span<const RowSampling> rows,
                              std::span<const int32_t> masked_tokens, std::vector<SampleResult>& out) {
  size_t want = 0;
  for (auto& w : work) want += w.all_logits ? size_t(w.num_tokens) : 1;
  MOEFOLD_CHECK(rows.size() == want, "step_sample: {} sampling rows for a step of {} logits rows", rows.size(), want);
  const ForwardBatch b = build_batch(work);
  {
    const prof::StepFacts facts{b.num_rows(), b.cu_seqlens, b.context_lens};
    const prof::StepFactsScope facts_scope(facts);
    try {
      exec_->forward_sample(b, rows, masked_tokens, out);
    } catch (...) {
      cancel_pending();
      throw;
    }
  }
  advance(work);
}

std::vector<std::vector<float>> ModelRunner::step(const std::vector<Work>& work) {
  std::vector<std::vector<float>> out;
  for (std::span<float> v : step_views(work)) out.emplace_back(v.begin(), v.end());
  return out;
}

}  // namespace moefold
