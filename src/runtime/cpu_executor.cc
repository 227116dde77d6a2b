#include <fmt/format.h>

#include "models/memory_check.h"
#include "models/model.h"
#include "runtime/executor.h"
#include "runtime/kv_cache.h"

namespace moefold {

namespace {

class CpuExecutor : public Executor {
 public:
  CpuExecutor(const Model& m, int32_t nb, int32_t bs, int32_t ns, KvCacheDtype d)
      : model_(m), kv_(checked(m.config(), nb, bs, ns, d), nb, bs, kv_elem_for(d, false)), states_(m.config(), ns) {}
  const ModelConfig& config() const override { return model_.config(); }
  std::string device() const override { return "cpu"; }
  int32_t num_kv_blocks() const override { return kv_.num_blocks; }
  void reset_slot(int32_t s) override { states_.reset(s); }
  int32_t num_state_slots() const override { return states_.num_slots; }
  void copy_slot(int32_t src, int32_t dst) override { states_.copy(src, dst); }
  int64_t state_slot_bytes() const override { return states_.slot_bytes(); }
  void forward(const ForwardBatch& b, std::vector<float>& logits) override {
    model_.forward(b, kv_, states_, logits, routing_);
  }
  void set_routing(RoutingControl routing) override { routing_ = routing; }

 private:
  /// Refuses a KV cache + DeltaNet state that does not fit in memory, before allocating it.
  static const ModelConfig& checked(const ModelConfig& c, int32_t nb, int32_t bs, int32_t ns, KvCacheDtype d) {
    check_kv_cache_dtype(c, d, "cpu");
    const cpu::KvElem e = kv_elem_for(d, false);
    check_memory_fits(cpu_cache_bytes(c, nb, bs, ns, kv_elem_bytes(e)), available_memory_bytes(),
                      fmt::format("the CPU KV cache ({} blocks of {} tokens, {}) and DeltaNet state ({} sequences)", nb,
                                  bs, kv_elem_name(e), ns));
    return c;
  }

  const Model& model_;
  KvCache kv_;
  StatePool states_;
  RoutingControl routing_;
};

}  // namespace

std::unique_ptr<Executor> make_cpu_executor(const Model& model, int32_t nb, int32_t bs, int32_t ns, KvCacheDtype d) {
  return std::make_unique<CpuExecutor>(model, nb, bs, ns, d);
}

}  // namespace moefold
