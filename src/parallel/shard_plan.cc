#include "parallel/shard_plan.h"

#include <algorithm>
#include <tuple>

#include "core/error.h"

namespace moefold {

int ParallelConfig::ep_size() const {
  if (!enable_expert_parallel) return 1;
  return expert_parallel_size > 0 ? expert_parallel_size : tensor_parallel_size;
}

void validate(const ParallelConfig& p) {
  MOEFOLD_CHECK(p.tensor_parallel_size >= 1 && p.tensor_parallel_size <= 1024,
                "--tensor-parallel-size {} must be in [1, 1024]", p.tensor_parallel_size);
  MOEFOLD_CHECK(p.expert_parallel_size >= 0, "--expert-parallel-size {} must be >= 1", p.expert_parallel_size);
  MOEFOLD_CHECK(p.expert_parallel_size == 0 || p.enable_expert_parallel,
                "--expert-parallel-size needs --enable-expert-parallel");
  MOEFOLD_CHECK(p.tensor_parallel_size % p.ep_size() == 0,
                "--expert-parallel-size {} must divide --tensor-parallel-size {} (the ranks of one expert split "
                "its intermediate)",
                p.ep_size(), p.tensor_parallel_size);
}

namespace {

/// Rank r's range of `n` items split evenly over `world` ranks; `what` names them in the error.
Range even(int64_t n, int world, int r, const std::string& what) {
  MOEFOLD_CHECK(n % world == 0, "tensor parallel size {} does not divide the {} {}", world, n, what);
  return {r * (n / world), n / world};
}

/// (query-like, kv-like) head ranges of rank r: kv heads split when world divides them, else
/// replicated (rank r takes kv head r / (world / n_kv)) when world is a multiple of them.
std::pair<Range, Range> grouped(int64_t n_q, int64_t n_kv, int world, int r, const std::string& q_what,
                                const std::string& kv_what) {
  const Range q = even(n_q, world, r, q_what);
  if (n_kv % world == 0) return {q, {r * (n_kv / world), n_kv / world}};
  MOEFOLD_CHECK(world % n_kv == 0,
                "tensor parallel size {} neither divides nor is a multiple of the {} {} (they are split or "
                "replicated over the ranks)",
                world, n_kv, kv_what);
  return {q, {int64_t(r) / (world / n_kv), 1}};
}

}  // namespace

RankShard plan_shard(const ModelConfig& c, const ParallelConfig& p, int rank) {
  validate(p);
  const int N = p.tensor_parallel_size;
  MOEFOLD_CHECK(rank >= 0 && rank < N, "rank {} is outside [0, {})", rank, N);
  MOEFOLD_CHECK(c.family != Family::DeepseekV4 || N == 1,
                "--tensor-parallel-size {}: DeepSeek-V4 runs on its own forward, which has no sharding yet", N);
  RankShard s;
  s.rank = rank;
  s.world = N;
  s.dispatch = p.dispatch;
  bool any_full = false, any_linear = false, any_moe = false, any_dense = false;
  for (size_t l = 0; l < c.layer_types.size(); ++l) {
    (c.layer_types[l] == LayerType::FullAttention ? any_full : any_linear) = true;
    (c.layer_is_moe[l] ? any_moe : any_dense) = true;
  }
  if (any_full && c.mla.enabled())
    s.q_heads = even(c.num_heads, N, rank, "MLA attention heads"), s.kv_heads = {0, c.num_kv_heads};
  else if (any_full)
    std::tie(s.q_heads, s.kv_heads) =
        grouped(c.num_heads, c.num_kv_heads, N, rank, "attention heads", "key/value heads");
  else
    s.q_heads = {0, c.num_heads}, s.kv_heads = {0, c.num_kv_heads};
  if (any_linear)
    std::tie(s.v_heads, s.k_heads) = grouped(c.linear_num_value_heads, c.linear_num_key_heads, N, rank,
                                             "DeltaNet value heads", "DeltaNet key heads");
  if (any_dense) s.mlp_cols = even(c.intermediate_size, N, rank, "dense MLP intermediate columns");
  if (any_moe) {
    s.ep_size = p.ep_size();
    s.expert_tp_size = N / s.ep_size;
    s.ep_rank = rank / s.expert_tp_size;
    MOEFOLD_CHECK(c.num_experts % s.ep_size == 0, "expert parallel size {} does not divide the {} routed experts",
                  s.ep_size, c.num_experts);
    s.experts = {s.ep_rank * (c.num_experts / s.ep_size), c.num_experts / s.ep_size};
    s.expert_cols = even(c.moe_intermediate_size, s.expert_tp_size, rank % s.expert_tp_size,
                         "routed expert intermediate columns (per expert-parallel group)");
    if (c.shared_expert_intermediate_size > 0)
      s.shared_cols = even(c.shared_expert_intermediate_size, N, rank, "shared expert intermediate columns");
  }
  s.vocab_shard = (c.vocab_size + N - 1) / N;
  const int64_t v0 = std::min<int64_t>(c.vocab_size, rank * s.vocab_shard);
  s.vocab = {v0, std::min<int64_t>(c.vocab_size, v0 + s.vocab_shard) - v0};
  return s;
}

ModelConfig local_config(const ModelConfig& c, const RankShard& s) {
  ModelConfig l = c;
  if (s.world == 1) return l;
  l.num_heads = s.q_heads.count;
  if (!c.mla.enabled()) l.num_kv_heads = s.kv_heads.count;
  if (s.v_heads.count > 0) {
    l.linear_num_value_heads = s.v_heads.count;
    l.linear_num_key_heads = s.k_heads.count;
  }
  if (s.mlp_cols.count > 0) l.intermediate_size = s.mlp_cols.count;
  if (s.expert_cols.count > 0) l.moe_intermediate_size = s.expert_cols.count;
  if (s.shared_cols.count > 0) l.shared_expert_intermediate_size = s.shared_cols.count;
  return l;
}

}  // namespace moefold
