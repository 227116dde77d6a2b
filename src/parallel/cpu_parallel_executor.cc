#include "parallel/cpu_parallel_executor.h"

#include <cblas.h>
#include <fmt/format.h>

#include <algorithm>
#include <condition_variable>
#include <exception>
#include <mutex>
#include <thread>

#include "core/error.h"
#include "models/memory_check.h"
#include "parallel/cpu_communicator.h"
#include "parallel/shard_weights.h"
#include "runtime/kv_cache.h"

namespace moefold {

namespace {

class CpuParallelExecutor : public Executor {
 public:
  CpuParallelExecutor(const Model& full, const ParallelConfig& p, int32_t nb, int32_t bs, int32_t ns, KvCacheDtype d)
      : cfg_(full.config()), group_(p.tensor_parallel_size) {
    const int N = p.tensor_parallel_size;
    check_kv_cache_dtype(cfg_, d, "cpu");
    const cpu::KvElem elem = kv_elem_for(d, false);
    std::vector<RankShard> shards;
    int64_t cache_bytes = 0;
    for (int r = 0; r < N; ++r) {
      shards.push_back(plan_shard(cfg_, p, r));  // every rank's plan first: a bad size fails before any copy
      cache_bytes += cpu_cache_bytes(local_config(cfg_, shards.back()), nb, bs, ns, kv_elem_bytes(elem));
    }
    check_memory_fits(cache_bytes, available_memory_bytes(),
                      fmt::format("the CPU KV caches and DeltaNet states of {} tensor-parallel ranks ({} blocks of "
                                  "{} tokens, {} sequences each)",
                                  N, nb, bs, ns));
    for (int r = 0; r < N; ++r) {
      const RankShard& s = shards[size_t(r)];
      ModelConfig local = local_config(cfg_, s);
      ranks_.push_back(std::make_unique<Rank>(
          std::make_unique<Model>(local, shard_weights(cfg_, full.weights(), s), ShardContext{&group_.comm(r), s}),
          KvCache(local, nb, bs, elem), StatePool(local, ns)));
    }
    // The ranks' matrix products share the cores: each OpenBLAS call gets its share of the threads
    // OpenBLAS had (the cores, or OPENBLAS_NUM_THREADS), so N ranks never run N full pools.
    blas_threads_before_ = openblas_get_num_threads();
    openblas_set_num_threads(std::max(1, blas_threads_before_ / N));
    for (int r = 1; r < N; ++r) workers_.emplace_back([this, r] { worker(r); });
  }

  ~CpuParallelExecutor() override {
    {
      std::lock_guard<std::mutex> lock(mu_);
      stop_ = true;
    }
    cv_.notify_all();
    for (auto& t : workers_) t.join();
    openblas_set_num_threads(blas_threads_before_);
  }

  const ModelConfig& config() const override { return cfg_; }
  std::string device() const override { return "cpu"; }
  int32_t num_kv_blocks() const override { return ranks_[0]->kv.num_blocks; }
  void reset_slot(int32_t s) override {
    for (auto& r : ranks_) r->states.reset(s);
  }
  int32_t num_state_slots() const override { return ranks_[0]->states.num_slots; }
  void copy_slot(int32_t src, int32_t dst) override {
    for (auto& r : ranks_) r->states.copy(src, dst);
  }
  int64_t state_slot_bytes() const override {
    int64_t n = 0;
    for (auto& r : ranks_) n += r->states.slot_bytes();
    return n;
  }
  void set_routing(RoutingControl routing) override { routing_ = routing; }

  // Rank 0 runs on the calling thread, the others on their workers; all step through the same batch.
  void forward(const ForwardBatch& b, std::vector<float>& logits) override {
    replay_copy_.reset();
    if (routing_.replay && routing_.replay == routing_.capture)  // rank 0 writes it: the others read a copy
      replay_copy_ = std::make_unique<RoutedExperts>(*routing_.replay);
    {
      std::lock_guard<std::mutex> lock(mu_);
      batch_ = &b;
      done_ = 0;
      ++generation_;
      errors_.assign(ranks_.size(), nullptr);
      aborted_.assign(ranks_.size(), 0);
    }
    cv_.notify_all();
    run_rank(0, logits);
    {
      std::unique_lock<std::mutex> lock(mu_);
      done_cv_.wait(lock, [&] { return done_ == int(ranks_.size()) - 1; });
      batch_ = nullptr;
    }
    // The error to report: the lowest rank's own failure, not a rank that was only aborted by it.
    std::exception_ptr first, first_own;
    for (size_t r = 0; r < errors_.size(); ++r) {
      if (!errors_[r]) continue;
      if (!first) first = errors_[r];
      if (!first_own && !aborted_[r]) first_own = errors_[r];
    }
    if (first) {
      group_.reset();
      std::rethrow_exception(first_own ? first_own : first);
    }
  }

  std::vector<int64_t> expert_load() const {
    std::vector<int64_t> out;
    for (auto& r : ranks_) out.push_back(r->model->routed_pairs());
    return out;
  }

 private:
  struct Rank {
    Rank(std::unique_ptr<Model> m, KvCache k, StatePool s) : model(std::move(m)), kv(std::move(k)), states(std::move(s)) {}
    std::unique_ptr<Model> model;
    KvCache kv;
    StatePool states;
    std::vector<float> logits;  ///< ranks > 0: every rank gets the full logits; only rank 0's are returned
  };

  void run_rank(int r, std::vector<float>& logits) {
    Rank& k = *ranks_[size_t(r)];
    RoutingControl rc = routing_;
    if (r > 0) {
      rc.capture = nullptr;
      if (replay_copy_) rc.replay = replay_copy_.get();
    }
    try {
      k.model->forward(*batch_, k.kv, k.states, logits, rc);
    } catch (const std::exception& e) {
      const bool is_abort = std::string_view(e.what()).rfind("communicator aborted", 0) == 0;
      {
        std::lock_guard<std::mutex> lock(mu_);
        errors_[size_t(r)] = std::current_exception();
        aborted_[size_t(r)] = is_abort;
      }
      group_.abort(fmt::format("tensor-parallel rank {} failed: {}", r, e.what()));
    }
  }

  void worker(int r) {
    uint64_t seen = 0;
    for (;;) {
      {
        std::unique_lock<std::mutex> lock(mu_);
        cv_.wait(lock, [&] { return stop_ || generation_ != seen; });
        if (stop_) return;
        seen = generation_;
      }
      run_rank(r, ranks_[size_t(r)]->logits);
      {
        std::lock_guard<std::mutex> lock(mu_);
        ++done_;
      }
      done_cv_.notify_one();
    }
  }

  ModelConfig cfg_;
  CpuCommGroup group_;
  std::vector<std::unique_ptr<Rank>> ranks_;
  std::vector<std::thread> workers_;
  std::mutex mu_;
  std::condition_variable cv_, done_cv_;
  const ForwardBatch* batch_ = nullptr;
  uint64_t generation_ = 0;
  int done_ = 0;
  bool stop_ = false;
  std::vector<std::exception_ptr> errors_;
  std::vector<char> aborted_;  ///< per rank: its error was only the abort another rank caused
  RoutingControl routing_;
  std::unique_ptr<RoutedExperts> replay_copy_;
  int blas_threads_before_ = 1;
};

}  // namespace

std::unique_ptr<Executor> make_cpu_parallel_executor(const Model& model, const ParallelConfig& p, int32_t nb,
                                                     int32_t bs, int32_t ns, KvCacheDtype d) {
  return std::make_unique<CpuParallelExecutor>(model, p, nb, bs, ns, d);
}

std::vector<int64_t> expert_load_per_rank(const Executor& e) {
  const auto* p = dynamic_cast<const CpuParallelExecutor*>(&e);
  return p ? p->expert_load() : std::vector<int64_t>{};
}

}  // namespace moefold
