// GPU contract tests of the FP8 KV cache (--kv-cache-dtype fp8; ops/cuda/attention.h): kv_cache_write_fp8
// against cpu::kv_cache_write over the same bf16-rounded inputs (bitwise: the same e4m3 bytes, the
// same saturation count, padding rows and other slots untouched), attention_decode_fp8 and
// attention_prefill_fp8 (continuations over cached FP8 pages) against cpu::paged_attention over the
// same pages (fp32 reference; tolerance 1e-2 for the bf16 output, NaN never passes), and a prompt
// resumed from cached FP8 pages bitwise equal to the same rows of a cold prefill.
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <numeric>

#include "cuda/contract.h"
#include "cuda/cuda_test_util.h"
#include "test_util.h"
#include "ops/cpu/attention.h"
#include "ops/cpu/kv_quant.h"
#include "ops/cuda/attention.h"
#include "ops/cuda/cuda_check.h"

using namespace moefold;
using namespace moefold::test;
namespace cu = moefold::cuda;

namespace {

struct Heads {
  int Hq, Hkv, D;
  const char* name;
};
const Heads kCases[] = {{9, 3, 64, "smollm2"}, {32, 4, 128, "qwen3"}, {16, 2, 256, "qwen3.5"}, {4, 2, 32, "tiny"}};

void sync() { MOEFOLD_CUDA_CHECK(cudaDeviceSynchronize()); }

/// Per-head scales: 1 for head 0 (the default without checkpoint scales), others spread over 1/64..4.
std::vector<float> head_scales(int Hkv, uint64_t seed) {
  std::vector<float> s(size_t(Hkv), 1.0f);
  for (int h = 1; h < Hkv; ++h) s[size_t(h)] = std::ldexp(1.0f, int(mix64(seed + h) % 9) - 6) * 1.37f;
  return s;
}

/// Host FP8 pages of sequences `lens` (random page order), filled by the CPU store from random K/V.
struct Fp8Cache {
  int bs, max_blocks = 1, pages = 0;
  int64_t kv_dim;
  std::vector<int32_t> tables;
  std::vector<uint8_t> k, v;
  std::vector<float> ks, vs;
  Fp8Cache(const Heads& h, const std::vector<int>& lens, int bs_, uint64_t seed) : bs(bs_), kv_dim(int64_t(h.Hkv) * h.D) {
    for (int L : lens) max_blocks = std::max(max_blocks, (L + bs - 1) / bs + 1);
    pages = int(lens.size()) * max_blocks + 3;
    std::vector<int32_t> order(static_cast<size_t>(pages));
    std::iota(order.begin(), order.end(), 0);
    for (size_t i = order.size(); i > 1; --i) std::swap(order[i - 1], order[mix64(seed + i) % i]);
    tables.assign(lens.size() * size_t(max_blocks), -1);
    size_t next = 0;
    for (size_t s = 0; s < lens.size(); ++s)
      for (int b = 0; b < max_blocks; ++b) tables[s * size_t(max_blocks) + size_t(b)] = order[next++];
    k.assign(size_t(pages) * size_t(bs) * size_t(kv_dim), 0x7f);  // NaN: unused slots fail a reader
    v = k;
    ks = head_scales(h.Hkv, seed + 1), vs = head_scales(h.Hkv, seed + 2);
    for (size_t s = 0; s < lens.size(); ++s) {
      const auto kk = rand_bf16(size_t(lens[s]) * size_t(kv_dim), seed + 10 + s, 2.0f);
      const auto vv = rand_bf16(size_t(lens[s]) * size_t(kv_dim), seed + 20 + s, 1.0f);
      cpu::kv_cache_write(kk.data(), vv.data(), view(), &tables[s * size_t(max_blocks)], 0, lens[s]);
    }
  }
  cpu::KvPages view() {
    cpu::KvPages p;
    p.elem = cpu::KvElem::F8E4M3, p.k = k.data(), p.v = v.data(), p.k_scale = ks.data(), p.v_scale = vs.data();
    p.block_size = bs, p.num_kv_heads = int64_t(ks.size()), p.head_dim = kv_dim / int64_t(ks.size());
    return p;
  }
};

cu::AttentionShape shape_of(const Heads& h, int bs) {
  cu::AttentionShape sh;
  sh.num_heads = h.Hq, sh.num_kv_heads = h.Hkv, sh.head_dim = h.D, sh.block_size = bs;
  return sh;
}

TEST(KvWriteFp8, BytesEqualTheCpuStore) {
  MOEFOLD_REQUIRE_GPU();
  for (const Heads& h : kCases) {
    const int bs = 16, rows = 37, pages = 8;
    const int64_t kv_dim = int64_t(h.Hkv) * h.D;
    auto k = rand_bf16(size_t(rows * kv_dim), 5, 3.0f), v = rand_bf16(size_t(rows * kv_dim), 6, 1.0f);
    k[3] = 4000.0f, k[size_t(kv_dim + 1)] = -1e6f, v[7] = INFINITY, v[9] = NAN;  // 3 saturate, a NaN
    const auto ks = head_scales(h.Hkv, 7), vs = head_scales(h.Hkv, 8);
    std::vector<int32_t> slots(static_cast<size_t>(rows));
    for (int r = 0; r < rows; ++r) slots[size_t(r)] = r == 5 ? -1 : int32_t((r * 7 + 3) % (pages * bs));  // row 5: padding
    // Host: the CPU store, one row at a time at its slot.
    std::vector<uint8_t> hk(size_t(pages * bs * kv_dim), 0xAB), hv = hk;
    cpu::KvPages p;
    p.elem = cpu::KvElem::F8E4M3, p.k = hk.data(), p.v = hv.data(), p.k_scale = ks.data(), p.v_scale = vs.data();
    p.block_size = 1, p.num_kv_heads = h.Hkv, p.head_dim = h.D;
    int64_t sat = 0;
    for (int r = 0; r < rows; ++r)
      if (slots[size_t(r)] >= 0)
        sat += cpu::kv_cache_write(&k[size_t(r * kv_dim)], &v[size_t(r * kv_dim)], p, &slots[size_t(r)], 0, 1);
    auto dk = dev_bf16(k), dv = dev_bf16(v);
    auto dslots = cuda::to_device(slots);
    auto dks = cuda::to_device(ks), dvs = cuda::to_device(vs);
    DeviceBuffer<uint8_t> dkc(hk.size()), dvc(hk.size());
    dkc.fill_bytes(0xAB), dvc.fill_bytes(0xAB);
    DeviceBuffer<unsigned long long> dsat(1);
    dsat.fill_bytes(0);
    cu::kv_cache_write_fp8(dk.data(), 0, dv.data(), 0, dkc.data(), dvc.data(), dslots.data(), rows, h.Hkv, h.D,
                           dks.data(), dvs.data(), dsat.data(), nullptr, nullptr);
    sync();
    const auto gk = dkc.download(), gv = dvc.download();
    size_t mis = 0;
    for (size_t i = 0; i < hk.size(); ++i) mis += (gk[i] != hk[i]) + (gv[i] != hv[i]);
    const std::string shape = fmt::format("{}:rows={},kv_dim={}", h.name, rows, kv_dim);
    EXPECT_TRUE(contract_exact("kv_write_fp8_kernel", shape, mis));
    EXPECT_TRUE(contract_exact("kv_write_fp8_kernel:saturated", shape, size_t(std::llabs(int64_t(dsat.download()[0]) - sat))));
    EXPECT_EQ(sat, 3);
  }
}

/// Decode (one row per sequence over ctx + 1 keys) or prefill rows [ctx, ctx + n) of each sequence.
void check(const Heads& h, const std::vector<int>& ctx, const std::vector<int>& n, bool decode, uint64_t seed) {
  const int bs = 16;
  const size_t S = ctx.size();
  std::vector<int> lens(S, 0);
  for (size_t s = 0; s < S; ++s) lens[s] = ctx[s] + n[s];
  Fp8Cache c(h, lens, bs, seed);
  std::vector<int32_t> cu_seq(S + 1, 0), dctx(ctx.begin(), ctx.end());
  for (size_t s = 0; s < S; ++s) cu_seq[s + 1] = cu_seq[s] + n[s];
  const int T = cu_seq[S], max_q = *std::max_element(n.begin(), n.end());
  const auto q = rand_bf16(size_t(T) * h.Hq * h.D, seed + 99, 1.0f);
  auto dq = dev_bf16(q);
  DeviceBuffer<bf16> dout(size_t(T) * h.Hq * h.D);
  dout.fill_bytes(0xFF);
  auto dkc = cuda::to_device(c.k), dvc = cuda::to_device(c.v);
  auto dbt = cuda::to_device(c.tables), dcu = cuda::to_device(cu_seq), dcl = cuda::to_device(dctx);
  auto dks = cuda::to_device(c.ks), dvs = cuda::to_device(c.vs);
  const cu::AttentionShape sh = shape_of(h, bs);
  if (decode) {
    // Sequence s's row is at position ctx[s] (already cached): context_lens = ctx.
    const int64_t max_kv = int64_t(c.max_blocks) * bs;
    const size_t ws = cu::attention_decode_workspace_bytes(int(S), sh, max_kv);
    DeviceBuffer<uint8_t> dws(std::max<size_t>(ws, 16));
    cu::attention_decode_fp8(dq.data(), dkc.data(), dvc.data(), dks.data(), dvs.data(), dbt.data(), c.max_blocks,
                             dcl.data(), int(S), max_kv, dout.data(), sh, dws.data(), ws, nullptr);
  } else {
    cu::attention_prefill_fp8(dq.data(), dkc.data(), dvc.data(), dks.data(), dvs.data(), dbt.data(), c.max_blocks,
                              dcu.data(), dcl.data(), int(S), max_q, dout.data(), sh, nullptr);
  }
  sync();
  const auto out = host_f32(dout);
  std::vector<float> ref(out.size());
  const float scale = 1.0f / std::sqrt(float(h.D));
  for (size_t s = 0; s < S; ++s)
    cpu::paged_attention(&q[size_t(cu_seq[s]) * h.Hq * h.D], c.view(), &c.tables[s * size_t(c.max_blocks)], ctx[s],
                         n[s], h.Hq, scale, &ref[size_t(cu_seq[s]) * h.Hq * h.D]);
  std::string shape = fmt::format("{}:S={},ctx=", h.name, S);
  for (size_t s = 0; s < S; ++s) shape += fmt::format("{}{}+{}", s ? "/" : "", ctx[s], n[s]);
  EXPECT_TRUE(contract(decode ? "attn_kernel:decode_fp8" : "attn_kernel:prefill_fp8", shape, rel_err(out, ref), 1e-2));
}

TEST(AttentionFp8, DecodeMatchesTheCpuOverTheSamePages) {
  MOEFOLD_REQUIRE_GPU();
  for (const Heads& h : kCases) {
    check(h, {0}, {1}, true, 1);
    check(h, {1, 17, 200, 1000, 5000}, {1, 1, 1, 1, 1}, true, 2);  // one and many splits
  }
}

TEST(AttentionFp8, PrefillContinuationsMatchTheCpuOverTheSamePages) {
  MOEFOLD_REQUIRE_GPU();
  for (const Heads& h : kCases) {
    check(h, {0}, {77}, false, 3);
    check(h, {0, 64, 130, 16}, {33, 1, 100, 250}, false, 4);  // cold, a row, continuations
  }
}

TEST(AttentionFp8, ResumedRowsEqualAColdPrefillBitwise) {
  MOEFOLD_REQUIRE_GPU();
  for (const Heads& h : kCases) {
    const int bs = 16, L = 100, pre = 64;
    Fp8Cache c(h, {L}, bs, 9);
    const auto q = rand_bf16(size_t(L) * h.Hq * h.D, 10, 1.0f);
    auto dq = dev_bf16(q);
    auto dkc = cuda::to_device(c.k), dvc = cuda::to_device(c.v);
    auto dbt = cuda::to_device(c.tables);
    auto dks = cuda::to_device(c.ks), dvs = cuda::to_device(c.vs);
    const cu::AttentionShape sh = shape_of(h, bs);
    auto run = [&](int ctx, int n, const bf16* qp) {
      DeviceBuffer<bf16> out(size_t(n) * h.Hq * h.D);
      out.fill_bytes(0xFF);
      auto dcu = cuda::to_device(std::vector<int32_t>{0, n}), dcl = cuda::to_device(std::vector<int32_t>{ctx});
      cu::attention_prefill_fp8(qp, dkc.data(), dvc.data(), dks.data(), dvs.data(), dbt.data(), c.max_blocks,
                                dcu.data(), dcl.data(), 1, n, out.data(), sh, nullptr);
      sync();
      return host_bits(out);
    };
    const auto cold = run(0, L, dq.data());
    const auto warm = run(pre, L - pre, dq.data() + size_t(pre) * h.Hq * h.D);
    size_t mis = 0;
    for (size_t i = 0; i < warm.size(); ++i) mis += warm[i] != cold[size_t(pre) * h.Hq * h.D + i];
    EXPECT_TRUE(contract_exact("attn_kernel:prefill_fp8:resumed_eq_cold", fmt::format("{}:L={},pre={}", h.name, L, pre), mis));
  }
}

}  // namespace
