#include "models/model.h"
#include "runtime/executor.h"
#include "runtime/kv_cache.h"

namespace moefold {

namespace {

class CpuExecutor : public Executor {
 public:
  CpuExecutor(const Model& m, int32_t nb, int32_t bs, int32_t ns)
      : model_(m), kv_(m.config(), nb, bs), states_(m.config(), ns) {}
  const ModelConfig& config() const override { return model_.config(); }
  std::string device() const override { return "cpu"; }
  int32_t num_kv_blocks() const override { return kv_.num_blocks; }
  void reset_slot(int32_t s) override { states_.reset(s); }
  void forward(const ForwardBatch& b, std::vector<float>& logits) override {
    model_.forward(b, kv_, states_, logits, routing_);
  }
  void set_routing(RoutingControl routing) override { routing_ = routing; }

 private:
  const Model& model_;
  KvCache kv_;
  StatePool states_;
  RoutingControl routing_;
};

}  // namespace

std::unique_ptr<Executor> make_cpu_executor(const Model& model, int32_t nb, int32_t bs, int32_t ns) {
  return std::make_unique<CpuExecutor>(model, nb, bs, ns);
}

}  // namespace moefold
