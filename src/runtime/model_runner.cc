#include "runtime/model_runner.h"

#include <algorithm>

#include "core/error.h"
#include "core/profiler.h"

namespace moefold {

ModelRunner::ModelRunner(const Model& model, RunnerOptions opt)
    : ModelRunner(make_cpu_executor(model, opt.num_blocks, opt.block_size, opt.max_seqs), opt) {}

ModelRunner::ModelRunner(std::unique_ptr<Executor> executor, RunnerOptions opt)
    : exec_(std::move(executor)),
      opt_{opt.num_blocks > 0 ? opt.num_blocks : exec_->num_kv_blocks(), opt.block_size, opt.max_seqs},
      blocks_(opt_.num_blocks) {
  MOEFOLD_CHECK(opt_.num_blocks <= exec_->num_kv_blocks(), "runner wants {} KV pages; the executor holds {}",
                opt_.num_blocks, exec_->num_kv_blocks());
  for (int32_t s = opt.max_seqs - 1; s >= 0; --s) free_slots_.push_back(s);
}

int32_t ModelRunner::add_sequence(std::vector<int32_t> prompt) {
  MOEFOLD_CHECK(!prompt.empty(), "the prompt is empty");
  MOEFOLD_CHECK(!free_slots_.empty(), "no free sequence slot (max_seqs {})", opt_.max_seqs);
  SequenceState s;
  s.tokens = std::move(prompt);
  s.slot = free_slots_.back();
  free_slots_.pop_back();
  exec_->reset_slot(s.slot);
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
  for (int32_t b : s.blocks) blocks_.release(b);
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
    need += blocks_needed(w.seq, w.num_tokens);
  }
  MOEFOLD_CHECK(need <= blocks_.num_free(), "out of KV cache pages: step needs {}, {} free", need, blocks_.num_free());

  ForwardBatch b;
  b.cu_seqlens.push_back(0);
  for (auto& w : work) {
    SequenceState& s = seq_ref(w.seq);
    for (int32_t n = blocks_needed(w.seq, w.num_tokens); n > 0; --n) s.blocks.push_back(blocks_.allocate());
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
    std::vector<int32_t> row(size_t(b.max_blocks_per_seq), -1);
    std::copy(s.blocks.begin(), s.blocks.end(), row.begin());
    b.block_tables.insert(b.block_tables.end(), row.begin(), row.end());
  }
  return b;
}

void ModelRunner::advance(const std::vector<Work>& work) {
  for (auto& w : work) seq_ref(w.seq).num_computed += w.num_tokens;
}

std::vector<std::span<float>> ModelRunner::step_views(const std::vector<Work>& work) {
  const ForwardBatch b = build_batch(work);
  {
    // The step's host facts, for the profiler's work counts of kernels that see only device counts.
    const prof::StepFacts facts{b.num_rows(), b.cu_seqlens, b.context_lens};
    const prof::StepFactsScope facts_scope(facts);
    exec_->forward(b, logits_);
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
    exec_->forward_sample(b, rows, masked_tokens, out);
  }
  advance(work);
}

std::vector<std::vector<float>> ModelRunner::step(const std::vector<Work>& work) {
  std::vector<std::vector<float>> out;
  for (std::span<float> v : step_views(work)) out.emplace_back(v.begin(), v.end());
  return out;
}

}  // namespace moefold
