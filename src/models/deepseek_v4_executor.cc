#include "models/deepseek_v4_executor.h"

#include <algorithm>

#include "core/error.h"
#include "models/deepseek_v4.h"

namespace moefold {

namespace {

class DeepseekV4Executor : public Executor {
 public:
  DeepseekV4Executor(const std::string& dir, bool dummy, uint64_t seed, int32_t nb, int32_t ns)
      : cfg_(ModelConfig::from_dir(dir)), model_(load_deepseek_v4(dir, dummy, seed)), nb_(nb) {
    for (int32_t s = 0; s < ns; ++s) caches_.push_back(model_->new_cache());
  }
  const ModelConfig& config() const override { return cfg_; }
  std::string device() const override { return "cpu"; }
  int32_t num_kv_blocks() const override { return nb_; }
  void reset_slot(int32_t s) override { caches_.at(size_t(s)) = model_->new_cache(); }
  int32_t num_state_slots() const override { return int32_t(caches_.size()); }
  void copy_slot(int32_t src, int32_t dst) override {
    if (src < 0 || dst < 0 || src >= num_state_slots() || dst >= num_state_slots())
      fail("deepseek_v4: copy_slot({}, {}) is out of range (slots: {})", src, dst, num_state_slots());
    caches_[size_t(dst)] = caches_[size_t(src)];
  }
  // The per-sequence caches grow with the sequence; this family does not take prefix-cache snapshots
  // (its runner keeps prefix caching off), so it reports no fixed slot size.
  int64_t state_slot_bytes() const override { return 0; }
  void set_routing(RoutingControl r) override {
    if (r.replay || r.capture) fail("deepseek_v4: routing capture / replay is not implemented for this family");
  }
  void forward(const ForwardBatch& b, std::vector<float>& logits) override {
    const int64_t V = cfg_.vocab_size;
    std::vector<float> rows(size_t(b.num_rows()) * size_t(V));
    for (int32_t s = 0; s < b.num_seqs(); ++s) {
      const int32_t lo = b.cu_seqlens[size_t(s)], hi = b.cu_seqlens[size_t(s) + 1], slot = b.state_slots[size_t(s)];
      if (slot < 0 || slot >= int32_t(caches_.size())) fail("deepseek_v4: state slot {} is out of range", slot);
      Dsv4Cache& c = caches_[size_t(slot)];
      if (hi > lo && b.positions[size_t(lo)] != c.len)
        fail("deepseek_v4: sequence {} continues at position {} but its cache holds {} tokens", s,
             b.positions[size_t(lo)], c.len);
      auto out = model_->forward(c, std::span<const int32_t>(b.token_ids.data() + lo, size_t(hi - lo)));
      std::copy(out.begin(), out.end(), rows.begin() + int64_t(lo) * V);
    }
    logits.resize(b.logits_rows.size() * size_t(V));
    for (size_t i = 0; i < b.logits_rows.size(); ++i)
      std::copy_n(rows.begin() + int64_t(b.logits_rows[i]) * V, V, logits.begin() + int64_t(i) * V);
  }

 private:
  ModelConfig cfg_;
  std::unique_ptr<DeepseekV4Model> model_;
  int32_t nb_;
  std::vector<Dsv4Cache> caches_;
};

}  // namespace

std::unique_ptr<Executor> make_deepseek_v4_executor(const std::string& dir, bool dummy, uint64_t seed,
                                                    int32_t num_blocks, int32_t num_slots) {
  return std::make_unique<DeepseekV4Executor>(dir, dummy, seed, num_blocks, num_slots);
}

}  // namespace moefold
