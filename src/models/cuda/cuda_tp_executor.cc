#include "models/cuda/cuda_tp_executor.h"

#include <cuda_runtime_api.h>
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <condition_variable>
#include <cstdlib>
#include <exception>
#include <functional>
#include <mutex>
#include <string_view>
#include <thread>

#include "core/error.h"
#include "models/cuda/cuda_tp_rank.h"
#include "ops/cuda/cuda_check.h"
#include "parallel/device_communicator.h"
#include "parallel/shard_weights.h"
#include "parallel/tp_backend.h"

namespace moefold {

namespace {

class CudaTpExecutor : public Executor {
 public:
  CudaTpExecutor(const Model& full, const ParallelConfig& p, CudaTpGroup g, const CudaExecutorOptions& opt)
      : cfg_(full.config()), group_(std::move(g)) {
    const int N = p.tensor_parallel_size;
    MOEFOLD_CHECK(int(group_.comms.size()) == N && int(group_.devices.size()) == N,
                  "CUDA tensor parallel: --tensor-parallel-size {} given a group of {} communicators", N,
                  group_.comms.size());
    std::vector<RankShard> shards;
    for (int r = 0; r < N; ++r) shards.push_back(plan_shard(cfg_, p, r));  // a bad size fails before any copy
    const bool single_device = group_.comms[0]->backend() == "device";
    // The ranks build together and would each size their KV cache from the same free memory.
    MOEFOLD_CHECK(!single_device || opt.num_blocks > 0,
                  "CUDA tensor parallel on one GPU: the KV cache size must be given (num_blocks > 0), not sized "
                  "from free memory by {} ranks at once",
                  N);
    ranks_.resize(size_t(N));
    for (int r = 1; r < N; ++r) workers_.emplace_back([this, r] { worker(r); });
    // Every rank builds its executor on its own thread, together: over NCCL the
    // graph captures at load run collectives that need every rank.
    try {
      run_all([&](int r) {
        const RankShard& s = shards[size_t(r)];
        ModelConfig local = local_config(cfg_, s);
        ModelWeights w = shard_weights(cfg_, full.weights(), s);
        pad_expert_columns(local, w, 64);  // the MoE kernels take multiples of 64 (exact: zero columns)
        CudaExecutorOptions ro = opt;
        ro.device = group_.devices[size_t(r)];
        if (single_device) ro.enforce_eager = true;
        CudaShard cs;
        cs.comm = group_.comms[size_t(r)];
        cs.shard = s;
        ranks_[size_t(r)] = make_cuda_rank_executor(local, std::move(w), cs, ro);
      });
    } catch (...) {
      stop_workers();
      free_ranks();
      throw;
    }
    scratch_logits_.resize(size_t(N));
    scratch_samples_.resize(size_t(N));
    scratch_routing_.resize(static_cast<size_t>(N));
  }

  ~CudaTpExecutor() override {
    stop_workers();
    free_ranks();
  }

  const ModelConfig& config() const override { return cfg_; }
  std::string device() const override {
    return fmt::format("cuda:{} (tp {}, {})", fmt::join(group_.devices, ","), ranks_.size(), group_.comms[0]->backend());
  }
  int32_t num_kv_blocks() const override { return ranks_[0]->num_kv_blocks(); }
  void reset_slot(int32_t s) override {
    on_each([&](int r) { ranks_[size_t(r)]->reset_slot(s); });
  }
  int32_t num_state_slots() const override { return ranks_[0]->num_state_slots(); }
  void copy_slot(int32_t src, int32_t dst) override {
    on_each([&](int r) { ranks_[size_t(r)]->copy_slot(src, dst); });
  }
  int64_t state_slot_bytes() const override {
    int64_t n = 0;
    for (auto& r : ranks_) n += r->state_slot_bytes();
    return n;
  }
  void set_routing(RoutingControl routing) override { routing_ = routing; }

  void forward(const ForwardBatch& b, std::vector<float>& logits) override {
    step([&](int r) { ranks_[size_t(r)]->forward(b, r == 0 ? logits : scratch_logits_[size_t(r)]); });
  }
  void forward_sample(const ForwardBatch& b, std::span<const RowSampling> rows, std::span<const int32_t> masked,
                      std::vector<SampleResult>& out) override {
    step(
        [&](int r) { ranks_[size_t(r)]->forward_sample(b, rows, masked, r == 0 ? out : scratch_samples_[size_t(r)]); });
  }

  std::vector<std::string> rank_names() const {
    std::vector<std::string> out;
    for (size_t r = 0; r < ranks_.size(); ++r)
      out.push_back(fmt::format("cuda:{} {}", group_.devices[r], group_.comms[r]->backend()));
    return out;
  }

 private:
  /// One forward of every rank: the routing each rank sees (rank 0 captures; a
  /// replay that is also the capture target is copied first, as the CPU
  /// parallel executor does), then all ranks together.
  void step(const std::function<void(int)>& fn) {
    std::unique_ptr<RoutedExperts> replay_copy;
    if (routing_.replay && routing_.replay == routing_.capture)
      replay_copy = std::make_unique<RoutedExperts>(*routing_.replay);
    for (size_t r = 0; r < ranks_.size(); ++r) {
      RoutingControl rc = routing_;
      if (r > 0) {
        // The other ranks capture into scratch: a capturing step runs eagerly, and every rank must take
        // the same path (a graph bucket pads the collectives' counts, an eager step does not).
        if (rc.capture) rc.capture = &scratch_routing_[r];
        if (replay_copy) rc.replay = replay_copy.get();
      }
      ranks_[r]->set_routing(rc);
    }
    run_all(fn);
  }

  void stop_workers() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      stop_ = true;
    }
    cv_.notify_all();
    for (auto& t : workers_) t.join();
    workers_.clear();
  }
  void free_ranks() {  // each rank's buffers freed with its device current
    for (size_t r = 0; r < ranks_.size(); ++r) {
      cudaSetDevice(group_.devices[r]);
      ranks_[r].reset();
    }
  }

  /// fn(r) for every rank on this thread, each with its device current (no
  /// collectives inside).
  void on_each(const std::function<void(int)>& fn) {
    int prev = 0;
    MOEFOLD_CUDA_CHECK(cudaGetDevice(&prev));
    for (size_t r = 0; r < ranks_.size(); ++r) {
      MOEFOLD_CUDA_CHECK(cudaSetDevice(group_.devices[r]));
      fn(int(r));
    }
    MOEFOLD_CUDA_CHECK(cudaSetDevice(prev));
  }

  /// fn(r) on every rank's thread at once (rank 0 on this one); rethrows the
  /// lowest rank's own error (not the abort it caused in the others).
  void run_all(const std::function<void(int)>& fn) {
    const size_t N = group_.comms.size();
    {
      std::lock_guard<std::mutex> lock(mu_);
      job_ = &fn;
      done_ = 0;
      ++generation_;
      errors_.assign(N, nullptr);
      aborted_.assign(N, 0);
    }
    cv_.notify_all();
    run_rank(0);
    {
      std::unique_lock<std::mutex> lock(mu_);
      done_cv_.wait(lock, [&] { return done_ == int(N) - 1; });
      job_ = nullptr;
    }
    std::exception_ptr first, first_own;
    for (size_t r = 0; r < N; ++r) {
      if (!errors_[r]) continue;
      if (!first) first = errors_[r];
      if (!first_own && !aborted_[r]) first_own = errors_[r];
    }
    if (first) {
      if (group_.reset) group_.reset();
      std::rethrow_exception(first_own ? first_own : first);
    }
  }

  void run_rank(int r) {
    try {
      MOEFOLD_CUDA_CHECK(cudaSetDevice(group_.devices[size_t(r)]));
      (*job_)(r);
    } catch (const std::exception& e) {
      const bool is_abort = std::string_view(e.what()).rfind("communicator aborted", 0) == 0;
      {
        std::lock_guard<std::mutex> lock(mu_);
        errors_[size_t(r)] = std::current_exception();
        aborted_[size_t(r)] = is_abort;
      }
      if (group_.abort) group_.abort(fmt::format("tensor-parallel rank {} failed: {}", r, e.what()));
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
      run_rank(r);
      {
        std::lock_guard<std::mutex> lock(mu_);
        ++done_;
      }
      done_cv_.notify_one();
    }
  }

  ModelConfig cfg_;
  CudaTpGroup group_;
  std::vector<std::unique_ptr<Executor>> ranks_;
  std::vector<std::vector<float>> scratch_logits_;  // ranks > 0: forward() leaves them empty
  std::vector<std::vector<SampleResult>> scratch_samples_;
  std::vector<RoutedExperts> scratch_routing_;  // ranks > 0: where a routing capture goes (discarded)
  RoutingControl routing_;
  std::vector<std::thread> workers_;
  std::mutex mu_;
  std::condition_variable cv_, done_cv_;
  const std::function<void(int)>* job_ = nullptr;
  uint64_t generation_ = 0;
  int done_ = 0;
  bool stop_ = false;
  std::vector<std::exception_ptr> errors_;
  std::vector<char> aborted_;
};

}  // namespace

CudaTpGroup single_device_tp_group(int ranks, int device) {
  auto g = std::make_shared<DeviceCommGroup>(ranks, device);
  CudaTpGroup out;
  for (int r = 0; r < ranks; ++r) {
    out.comms.push_back(&g->comm(r));
    out.devices.push_back(device);
  }
  out.abort = [p = g.get()](const std::string& why) { p->abort(why); };
  out.reset = [p = g.get()] { p->reset(); };
  out.owner = std::move(g);
  return out;
}

std::unique_ptr<Executor> make_cuda_tp_executor(const Model& model, const ParallelConfig& p, CudaTpGroup group,
                                                const CudaExecutorOptions& opt) {
  validate(p);
  return std::make_unique<CudaTpExecutor>(model, p, std::move(group), opt);
}

namespace {
NcclGroupFactory g_nccl_factory = nullptr;
}  // namespace

void set_nccl_group_factory(NcclGroupFactory f) { g_nccl_factory = f; }

std::unique_ptr<Executor> make_cuda_tp_executor_from_dir(const std::string& dir, LoadFormat format, uint64_t seed,
                                                         const ParallelConfig& p, const CudaExecutorOptions& opt) {
  validate(p);
  const int N = p.tensor_parallel_size;
  int gpus = 0;
  if (cudaGetDeviceCount(&gpus) != cudaSuccess) {
    cudaGetLastError();
    gpus = 0;
  }
  MOEFOLD_CHECK(gpus > 0, "--device cuda: no usable CUDA device");
  const TpCommBackend backend = choose_tp_backend(N, gpus, std::getenv(kTpSingleDeviceEnv));
  MOEFOLD_CHECK(opt.quantization == Quantization::None && !opt.fp8_lm_head,
                "--tensor-parallel-size {} --device cuda: --quantization fp8 and --fp8-lm-head are not supported by "
                "the sharded CUDA executor yet",
                N);
  MOEFOLD_CHECK(opt.kv_cache_dtype != KvCacheDtype::Fp8E4m3,
                "--tensor-parallel-size {} --device cuda: --kv-cache-dtype fp8 is not supported by the sharded CUDA "
                "executor yet (it is on one GPU and on the CPU)",
                N);
  CudaTpGroup group;
  if (backend == TpCommBackend::SingleDevice) {
    fmt::print(stderr,
               "moefold: --tensor-parallel-size {} on GPU 0 over the single-device test communicator ({}=1): every "
               "shard in one GPU's memory, eager steps, no speed-up\n",
               N, kTpSingleDeviceEnv);
    group = single_device_tp_group(N, 0);
  } else {
    MOEFOLD_CHECK(g_nccl_factory != nullptr,
                  "--tensor-parallel-size {} --device cuda over {} GPUs needs NCCL, which this binary was built without "
                  "(configure with -DMOEFOLD_LINK_NCCL=ON); {}=1 runs the ranks on GPU 0 for tests",
                  N, N, kTpSingleDeviceEnv);
    std::vector<int> devices(static_cast<size_t>(N));
    for (int r = 0; r < N; ++r) devices[size_t(r)] = r;
    group = g_nccl_factory(devices);
    fmt::print(stderr,
               "moefold: --tensor-parallel-size {} over NCCL on GPUs 0..{} (NCCL_NVLS_ENABLE={})\n",
               N, N - 1, std::getenv("NCCL_NVLS_ENABLE") ? std::getenv("NCCL_NVLS_ENABLE") : "0");
  }
  auto full = load_model(dir, format, seed);
  return make_cuda_tp_executor(*full, p, std::move(group), opt);
}

std::vector<std::string> cuda_tp_ranks(const Executor& e) {
  const auto* t = dynamic_cast<const CudaTpExecutor*>(&e);
  return t ? t->rank_names() : std::vector<std::string>{};
}

}  // namespace moefold
