// Batch invariance of the prefill attention kernels, bitwise (attention.h, AttentionShape::batch_invariant):
// one sequence's query rows computed
//   (a) as one whole prompt (context 0),
//   (b) as continuations whose new rows start after 1, 17, 63, 64, 65, 96, 127 and 1000 cached
//       tokens, running to the prompt's end ("cont") or as a 45-row chunk ending before it ("chunk"),
//   (c) three times beside other sequences (of other data, an empty one, 1-row ones) in one varlen
//       launch ("varlen"),
// each launch over its own random page assignment (runs of consecutive pages, shuffled; unused slots NaN), must give the same bf16 bits at
// every position they share, for every kernel selected explicitly (the warp-specialised kernel and its
// variants, the wgmma kernel and its variants, Auto as the executor calls it). (a) is also checked
// against the fp32 CPU reference (cpu::paged_attention, tolerance 1e-2), so constant or garbage
// outputs cannot pass. Shapes: head_dim 64 (the qwen3 fixture's 4/2 heads: 64 tokens per query
// tile; SmolLM2's 9/3: 42), 128 (32/4 heads, and 8/8: 128 tokens per tile), 192, 256 (16/2 heads, gated).
//
// A failing case prints a NOTE per offset: how many rows differ and how many of those visit a
// different number of key tiles wholly past their own last key in the two launches (the query tile
// that holds a row reads keys up to its LAST row, so where it starts and ends moves the count). The
// first test also prints how often exp2 of the online softmax's rescale exponent is not 1 when the
// max did not move (the exponent compiled as fma(m, sl2, -m * sl2): m * sl2's rounding error).
//
// DISABLED_Perf times the warp-specialised and wgmma kernels at the 35B and Qwen3-30B shapes (PERF
// lines), so that the same run shows what the invariance fix costs (a binary with the old kernels beside).
//
// MOEFOLD_TEST_KERNELS (comma-separated: ws, ws2, ws_persist, ws2_tall, ws_persist_tall, ws_nopp, ws_noiw, ws_plain, ws_s3, ws_bn64, ws_pp,
// wgmma, wgmma_vt, wgmma_pipe, auto, flash) narrows or widens the set; unset: all but flash.
#include "ops/cuda/cuda_check.h"
// (cuda_check.h first: see its note on fmt under nvcc)
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <map>
#include <numeric>
#include <string>
#include <vector>

#include "core/dtype.h"
#include "cuda/contract.h"
#include "cuda/cuda_test_util.h"
#include "ops/cpu/attention.h"
#include "ops/cpu/linear.h"
#include "ops/cuda/attention.h"
#include "ops/cuda/attention_ws.cuh"
#include "ops/cuda/dummy_fill.h"

using namespace moefold;
using namespace moefold::test;
namespace cu = moefold::cuda;

namespace {

constexpr double kTol = 1e-2;
constexpr int kLen = 1100;  // the shared sequence's length (offset 1000 leaves it 100 rows)
constexpr int kOffsets[] = {1, 17, 63, 64, 65, 96, 127, 1000};
constexpr int kChunk = 45;

struct Heads {
  int Hq, Hkv, D;
  bool gate;
  int bs;  // page size
  const char* name;
};

struct Kernel {
  cu::AttnKernel k;
  std::string name;
  int bn;  // keys per tile of this instance at this head size (the NOTE's tile count); 0: unknown
};

bool selected(const std::string& name) {
  const char* v = std::getenv("MOEFOLD_TEST_KERNELS");
  if (!v || !*v) return name != "flash";
  return (std::string(",") + v + ",").find("," + name + ",") != std::string::npos;
}

/// The kernels to check at head size D, with their key-tile sizes (attention_ws.cu launch_attention_ws,
/// attention_wgmma.cu WgCfg, attention_flash.cu kBN). Variants that run the default instance at
/// this head size are left out.
std::vector<Kernel> kernels_for(int D) {
  using K = cu::AttnKernel;
  if (D < 64) {  // only the flash kernel serves these head sizes (Auto takes it)
    std::vector<Kernel> small{{K::Auto, "auto", 0}, {K::Flash, "flash", 64}};
    std::erase_if(small, [](const Kernel& k) { return !selected(k.name); });
    return small;
  }
  const int ws_bn = D == 192 ? 64 : D == 256 ? 80 : 128, wg_bn = D <= 128 ? 128 : 64;
  std::vector<Kernel> all{{K::Ws, "ws", ws_bn}};
  if (D == 128 || D == 256)  // Ws's bits, other data movement
    all.insert(all.end(), {{K::WsV2, "ws2", ws_bn},
                           {K::WsPersist, "ws_persist", ws_bn},
                           {K::WsV2Tall, "ws2_tall", ws_bn},
                           {K::WsPersistTall, "ws_persist_tall", ws_bn}});
  if (D == 128)
    all.insert(all.end(), {{K::WsNoPingPong, "ws_nopp", 128},
                           {K::WsNoOverlap, "ws_noiw", 128},
                           {K::WsPlain, "ws_plain", 128},
                           {K::WsStages3, "ws_s3", 128},
                           {K::WsPingPong, "ws_pp", 128}});
  if (D == 256)
    all.insert(all.end(), {{K::WsNoPingPong, "ws_nopp", 80},
                           {K::WsNoOverlap, "ws_noiw", 80},
                           {K::WsPlain, "ws_plain", 80},
                           {K::WsBn64, "ws_bn64", 64}});
  all.insert(all.end(), {{K::Wgmma, "wgmma", wg_bn}, {K::WgmmaVt, "wgmma_vt", 64}, {K::WgmmaPipe, "wgmma_pipe", wg_bn},
                         {K::Auto, "auto", 0}, {K::Flash, "flash", 64}});
  std::erase_if(all, [](const Kernel& k) { return !selected(k.name); });
  return all;
}

/// One sequence of a launch: query rows at positions [ctx, ctx + n), keys [0, ctx + n) cached. src 0
/// is the shared sequence; src > 0 another one of random data.
struct Seq {
  int ctx, n, src;
};

/// Random keys, values and query rows (q, gate interleaved as the fused [T, Hq, 2D] q_proj output
/// when gated) of one sequence, by position.
struct Source {
  std::vector<float> k, v, q;
  int64_t q_row;  // floats per position in q
};

Source make_source(const Heads& h, int len, uint64_t seed) {
  const int64_t kv_dim = int64_t(h.Hkv) * h.D;
  Source s;
  s.q_row = int64_t(h.Hq) * h.D * (h.gate ? 2 : 1);
  s.k = rand_bf16(size_t(len) * size_t(kv_dim), seed, 1.0f);
  s.v = rand_bf16(size_t(len) * size_t(kv_dim), seed + 1, 1.0f);
  s.q = rand_bf16(size_t(len) * size_t(s.q_row), seed + 2, 4.0f);  // scaled scores (log2 units) up to ~6
  // Every 8th (position, head) row gets one gate of -96: sigmoid below 2^-126, where the gated epilogue's
  // sigmoid_nobranch hands its row (and, with 16-byte stores, its quad) back to sigmoidf_.
  if (h.gate)
    for (int p = 0; p < len; ++p)
      for (int hh = 0; hh < h.Hq; ++hh)
        if ((int64_t(p) * h.Hq + hh) % 8 == 3)
          s.q[size_t(p) * size_t(s.q_row) + size_t(hh) * 2 * size_t(h.D) + size_t(h.D) + size_t(p % h.D)] = -96.0f;
  return s;
}

/// The host image of one launch: caches (NaN where no sequence's key lives), block tables over a
/// random page order (page_runs), cu_seqlens, context lengths, q rows (3 padding rows at the end).
struct Launch {
  std::vector<Seq> seqs;
  int max_blocks = 1, max_q = 0;
  std::vector<int32_t> tables, cu{0}, ctx;
  std::vector<float> kc, vc, q;
};

Launch build(const Heads& h, const std::vector<Seq>& seqs, const std::vector<Source>& src, uint64_t seed) {
  const int64_t kv_dim = int64_t(h.Hkv) * h.D, bs = h.bs;
  Launch L;
  L.seqs = seqs;
  int pages = 3;
  for (const Seq& s : seqs) {
    const int nb = int((s.ctx + s.n + bs - 1) / bs);
    L.max_blocks = std::max(L.max_blocks, nb + 1);
    pages += nb;
    L.cu.push_back(L.cu.back() + s.n);
    L.ctx.push_back(s.ctx);
    L.max_q = std::max(L.max_q, s.n);
  }
  // Runs of up to 8 consecutive pages in random order: key tiles over consecutive pages and over
  // scattered ones in every launch (the tall-box forms load the former with one box per 64 columns).
  const std::vector<int32_t> perm = page_runs(pages, 8, seed);
  L.tables.assign(seqs.size() * size_t(L.max_blocks), -1);
  L.kc.assign(size_t(pages) * size_t(bs) * size_t(kv_dim), NAN);
  L.vc = L.kc;
  const int64_t qrow = src[0].q_row;
  L.q = rand_bf16(size_t(L.cu.back() + 3) * size_t(qrow), seed + 7, 2.0f);  // padding rows keep these
  size_t next = 0;
  for (size_t i = 0; i < seqs.size(); ++i) {
    const Seq& s = seqs[i];
    const Source& d = src[size_t(s.src)];
    for (int b = 0; b < (s.ctx + s.n + bs - 1) / bs; ++b) L.tables[i * size_t(L.max_blocks) + size_t(b)] = perm[next++];
    for (int p = 0; p < s.ctx + s.n; ++p) {
      const int64_t slot = int64_t(L.tables[i * size_t(L.max_blocks) + size_t(p / bs)]) * bs + p % bs;
      std::copy_n(d.k.begin() + p * kv_dim, kv_dim, L.kc.begin() + slot * kv_dim);
      std::copy_n(d.v.begin() + p * kv_dim, kv_dim, L.vc.begin() + slot * kv_dim);
    }
    std::copy_n(d.q.begin() + int64_t(s.ctx) * qrow, int64_t(s.n) * qrow, L.q.begin() + int64_t(L.cu[i]) * qrow);
  }
  return L;
}

/// The launch on the device, run once per kernel.
struct DeviceLaunch {
  DeviceBuffer<bf16> kc, vc, q, out;
  DeviceBuffer<int32_t> bt, cu, ctx;
  explicit DeviceLaunch(const Launch& L, const Heads& h)
      : kc(dev_bf16(L.kc)), vc(dev_bf16(L.vc)), q(dev_bf16(L.q)),
        out(size_t(L.cu.back() + 3) * size_t(h.Hq) * size_t(h.D)), bt(cuda::to_device(L.tables)),
        cu(cuda::to_device(L.cu)), ctx(cuda::to_device(L.ctx)) {}

  /// The output bits [rows + 3, Hq, D] of `k` (poisoned first).
  std::vector<uint16_t> run(const Launch& L, const Heads& h, cu::AttnKernel k) {
    out.fill_bytes(0xFF);
    cu::AttentionShape sh;
    sh.num_heads = h.Hq;
    sh.num_kv_heads = h.Hkv;
    sh.head_dim = h.D;
    sh.block_size = h.bs;
    sh.kernel = k;
    sh.batch_invariant = true;  // as the executor calls it by default (matters for Auto only)
    if (h.gate) {
      sh.q_token_stride = int64_t(h.Hq) * 2 * h.D;
      sh.q_head_stride = 2 * h.D;
      sh.gate = q.data() + h.D;
      sh.gate_token_stride = sh.q_token_stride;
      sh.gate_head_stride = sh.q_head_stride;
    }
    cu::attention_prefill(q.data(), kc.data(), vc.data(), bt.data(), L.max_blocks, cu.data(), ctx.data(),
                          int(L.seqs.size()), L.max_q, out.data(), sh, nullptr);
    MOEFOLD_CUDA_CHECK(cudaDeviceSynchronize());
    return host_bits(out);
  }
};

/// Key tiles wholly past position p's own last key that p's query tile visits, in a launch where p's
/// sequence has context ctx and n rows (the kernels' tiling: query tiles of tb tokens from the first
/// new row, key tiles of bn keys from key 0, up to the query tile's last row).
int trailing_tiles(int p, int ctx, int n, int tb, int bn) {
  const int t0 = (p - ctx) / tb * tb, kv_end = ctx + std::min(t0 + tb, n);
  return (kv_end + bn - 1) / bn - 1 - p / bn;
}

/// Mismatches of one comparison: elements, (position) rows, rows whose trailing-tile count differs.
struct Diff {
  size_t elems = 0, rows = 0, rows_other_tiles = 0;
  void operator+=(const Diff& d) {
    elems += d.elems, rows += d.rows, rows_other_tiles += d.rows_other_tiles;
  }
};

/// Compares the rows of launch sequence i (src 0) with the whole prompt's rows at the same positions.
Diff compare(const Launch& L, size_t i, const std::vector<uint16_t>& got, const std::vector<uint16_t>& whole,
             const Heads& h, int bn) {
  const Seq& s = L.seqs[i];
  const size_t row = size_t(h.Hq) * size_t(h.D);
  const int tb = 128 / std::min(h.Hq / h.Hkv, 128);
  Diff d;
  for (int t = 0; t < s.n; ++t) {
    const int p = s.ctx + t;
    size_t e = 0;
    const uint16_t* a = got.data() + size_t(L.cu[i] + t) * row;
    const uint16_t* b = whole.data() + size_t(p) * row;
    for (size_t j = 0; j < row; ++j) e += a[j] != b[j];
    if (e == 0) continue;
    d.elems += e;
    ++d.rows;
    if (bn > 0 && trailing_tiles(p, s.ctx, s.n, tb, bn) != trailing_tiles(p, 0, kLen, tb, bn)) ++d.rows_other_tiles;
  }
  return d;
}

/// Elements from `from` on that do not hold the poison (rows past the launch's last must stay untouched).
size_t touched_bits(const std::vector<uint16_t>& b, size_t from) {
  size_t n = 0;
  for (size_t i = from; i < b.size(); ++i) n += b[i] != 0xFFFF;
  return n;
}

void check_shape(const Heads& h, uint64_t seed) {
  const std::vector<Kernel> kernels = kernels_for(h.D);
  if (kernels.empty()) return;
  const std::string shape = fmt::format("{},H={}/{},D={},bs={},L={}", h.name, h.Hq, h.Hkv, h.D, h.bs, kLen);
  std::vector<Source> src;
  src.push_back(make_source(h, kLen, seed));
  for (int i = 1; i <= 3; ++i) src.push_back(make_source(h, 900, seed + 100 * uint64_t(i)));

  // (a) the whole prompt, and its reference.
  const Launch whole = build(h, {{0, kLen, 0}}, src, seed + 11);
  std::map<std::string, std::vector<uint16_t>> whole_bits;
  {
    DeviceLaunch dl(whole, h);
    for (const Kernel& k : kernels) whole_bits[k.name] = dl.run(whole, h, k.k);
  }
  const int64_t row = int64_t(h.Hq) * h.D;
  std::vector<float> q(size_t(kLen * row)), ref(q.size());
  for (int64_t t = 0; t < kLen * h.Hq; ++t)
    std::copy_n(src[0].q.begin() + t * (h.gate ? 2 : 1) * h.D, h.D, q.begin() + t * h.D);
  parallel_for((kLen + 31) / 32, [&](size_t c) {
    const int a = int(c) * 32, n = std::min(32, kLen - a);
    cpu::paged_attention(q.data() + a * row, whole.kc.data(), whole.vc.data(), whole.tables.data(), a, n, h.Hq, h.Hkv,
                         h.D, h.bs, float(1.0 / std::sqrt(double(h.D))), ref.data() + a * row);
    if (h.gate)
      for (int64_t i = a * row; i < (a + n) * row; ++i) {
        const int64_t t = i / h.D, d = i % h.D;
        ref[size_t(i)] *= cpu::sigmoid(src[0].q[size_t(t * 2 * h.D + h.D + d)]);
      }
  });
  for (const Kernel& k : kernels) {
    const std::vector<uint16_t>& b = whole_bits[k.name];
    std::vector<float> got(ref.size());
    for (size_t i = 0; i < got.size(); ++i) got[i] = bf16_to_f32(b[i]);
    EXPECT_TRUE(contract("attn_prefill_" + k.name, shape + ",whole", rel_err(got, ref), kTol));
  }

  // (b) continuations and chunks, (c) one varlen launch.
  struct Case {
    std::string group;
    int offset;
    std::vector<Seq> seqs;
  };
  std::vector<Case> cases;
  for (int c : kOffsets) {
    cases.push_back({"cont", c, {{c, kLen - c, 0}}});
    cases.push_back({"chunk", c, {{c, std::min(kChunk, kLen - c - 1), 0}}});
  }
  cases.push_back({"varlen", 0, {{0, 300, 1}, {96, kLen - 96, 0}, {5, 0, 2}, {1000, 1, 0}, {700, 129, 3}, {0, kLen, 0},
                                 {65, 200, 0}, {899, 1, 1}}});
  std::map<std::pair<std::string, std::string>, Diff> total;  // (kernel, group)
  std::map<std::string, size_t> pad;  // per kernel
  // ws2 and ws_persist against ws, element by element, over every launch (whole prompt included).
  const char* kSameAsWs[] = {"ws2", "ws_persist", "ws2_tall", "ws_persist_tall"};
  const auto mismatches = [](const std::vector<uint16_t>& a, const std::vector<uint16_t>& b) {
    size_t m = a.size() != b.size() ? a.size() + b.size() : 0;
    for (size_t i = 0; i < std::min(a.size(), b.size()); ++i) m += a[i] != b[i];
    return m;
  };
  std::map<std::string, size_t> cross_mis;  // variant -> elements differing from ws
  for (const char* v : kSameAsWs)
    if (whole_bits.count("ws") && whole_bits.count(v)) cross_mis[v] = mismatches(whole_bits["ws"], whole_bits[v]);
  uint64_t lseed = seed + 1000;
  for (const Case& c : cases) {
    const Launch L = build(h, c.seqs, src, lseed += 17);
    DeviceLaunch dl(L, h);
    std::vector<uint16_t> ws_bits;
    for (const Kernel& k : kernels) {
      const std::vector<uint16_t> got = dl.run(L, h, k.k);
      if (k.name == "ws") ws_bits = got;
      if (cross_mis.count(k.name)) cross_mis[k.name] += mismatches(ws_bits, got);
      Diff d;
      for (size_t i = 0; i < L.seqs.size(); ++i)
        if (L.seqs[i].src == 0) d += compare(L, i, got, whole_bits[k.name], h, k.bn);
      total[{k.name, c.group}] += d;
      pad[k.name] += touched_bits(got, size_t(L.cu.back()) * size_t(row));
      if (d.elems > 0)
        std::printf("NOTE attn_invariance_%s %s %s offset %d: %zu elements in %zu rows differ; %zu of those rows visit "
                    "another number of key tiles past their last key\n",
                    k.name.c_str(), shape.c_str(), c.group.c_str(), c.offset, d.elems, d.rows, d.rows_other_tiles);
    }
  }
  for (const auto& [v, mis] : cross_mis)
    EXPECT_TRUE(contract_exact("attn_" + v + "_bits_vs_ws", shape + ",whole+cont+chunk+varlen", mis));
  for (const Kernel& k : kernels) {
    for (const char* g : {"cont", "chunk", "varlen"}) {
      const std::string sh = shape + "," + g + (std::string(g) == "varlen" ? "" : ",offsets=1+17+63+64+65+96+127+1000");
      EXPECT_TRUE(contract_exact("attn_invariance_" + k.name, sh, total[{k.name, g}].elems));
    }
    EXPECT_TRUE(contract_exact("attn_prefill_padding_" + k.name, shape + ",cont+chunk+varlen", pad[k.name]));
  }
}

// exp2 of the rescale exponent when the running max did not move, as the kernels compiled it before
// the fix: ex2.approx(fma(m, sl2, -(m * sl2))), for raw scores m in [-64, 64).
__global__ void rescale_residual_kernel(float sl2, int n, unsigned* not_one, unsigned* below) {
  const int i = int(blockIdx.x * blockDim.x + threadIdx.x);
  if (i >= n) return;
  const float m = -64.0f + 128.0f * (float(i) + 0.5f) / float(n);
  const float msc = __fmul_rn(m, sl2);
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(__fmaf_rn(m, sl2, -msc)));
  if (y != 1.0f) atomicAdd(not_one, 1u);
  if (y < 1.0f) atomicAdd(below, 1u);
}

}  // namespace

// sigmoid_nobranch (the gated epilogue's sigmoid, attention_ws.cuh) against sigmoidf_ over every bf16
// (the gate's type: 65,536 inputs, NaN and infinities included) and 2^22 fp32 values across the whole
// range: bit for bit wherever it does not flag `slow`, and it flags exactly where sigmoidf_'s
// reciprocal leaves its fast range (1 + e^-x >= 2^126, or NaN).
__global__ void sigmoid_nobranch_kernel(int n, unsigned* mismatch, unsigned* slow_count, unsigned* wrong_flag) {
  const int i = int(blockIdx.x * blockDim.x + threadIdx.x);
  if (i >= n) return;
  uint32_t h = uint32_t(i) * 0x9e3779b9u;  // (a 32-bit mix: every exponent and sign)
  h ^= h >> 16, h *= 0x85ebca6bu, h ^= h >> 13, h *= 0xc2b2ae35u, h ^= h >> 16;
  const uint32_t bits = i < 65536 ? uint32_t(i) << 16 : h;
  const float x = __uint_as_float(bits);
  bool slow = false;
  const float got = cu::detail::sigmoid_nobranch(x, slow), want = cu::detail::sigmoidf_(x);
  const float y = 1.0f + expf(-x);
  if (slow) atomicAdd(slow_count, 1u);
  if (slow != !(y < 0x1p126f)) atomicAdd(wrong_flag, 1u);
  if (!slow && __float_as_uint(got) != __float_as_uint(want)) atomicAdd(mismatch, 1u);
}

TEST(AttentionEpilogue, SigmoidWithoutBranchEqualsSigmoidfBitwise) {
  MOEFOLD_REQUIRE_GPU();
  constexpr int kN = 65536 + (1 << 22);
  DeviceBuffer<unsigned> cnt(3);
  cnt.upload(std::vector<unsigned>{0, 0, 0});
  sigmoid_nobranch_kernel<<<kN / 256, 256>>>(kN, cnt.data(), cnt.data() + 1, cnt.data() + 2);
  MOEFOLD_CUDA_CHECK_LAUNCH();
  const auto c = cnt.download();
  std::printf("NOTE sigmoid_nobranch: %u of %d inputs take sigmoidf_ again (slow)\n", c[1], kN);
  EXPECT_TRUE(contract_exact("attn_epilogue_sigmoid_nobranch_bits", "bf16_all+fp32_random_4M", c[0]));
  EXPECT_TRUE(contract_exact("attn_epilogue_sigmoid_nobranch_slow_flag", "bf16_all+fp32_random_4M", c[2]));
  EXPECT_GT(c[1], 0u);  // the range's edge is reached (bf16 below -87.3, NaN)
}

// The qwen3 fixture's shape (prefix_cache_cuda_test EightRequestsSharingAPrefixInOneStep/qwen3) and SmolLM2's.
TEST(AttentionInvariance, HeadDim64) {
  MOEFOLD_REQUIRE_GPU();
  {
    constexpr int kN = 1 << 20;
    DeviceBuffer<unsigned> cnt(2);
    for (int D : {64, 128, 256}) {
      cnt.upload(std::vector<unsigned>{0, 0});
      const float sl2 = float(1.0 / std::sqrt(double(D)) * 1.4426950408889634);
      rescale_residual_kernel<<<kN / 256, 256>>>(sl2, kN, cnt.data(), cnt.data() + 1);
      MOEFOLD_CUDA_CHECK_LAUNCH();
      const auto c = cnt.download();
      std::printf("NOTE ex2(fma(m, sl2, -m*sl2)) != 1 for %u of %d raw scores m in [-64, 64) (%u below 1), D=%d\n", c[0],
                  kN, c[1], D);
    }
  }
  check_shape({4, 2, 64, false, 16, "qwen3_fixture"}, 100);
  check_shape({9, 3, 64, false, 16, "smollm2"}, 200);
}

// The llama fixture's shape (mixed_step_cuda_test DecodeBesideChunkedPrefillsEqualsAlone/llama): head_dim 32
// runs the flash kernel.
TEST(AttentionInvariance, HeadDim32) {
  MOEFOLD_REQUIRE_GPU();
  check_shape({4, 2, 32, false, 16, "llama_fixture"}, 700);
}

TEST(AttentionInvariance, HeadDim128) {
  MOEFOLD_REQUIRE_GPU();
  check_shape({32, 4, 128, false, 16, "qwen3_30b"}, 300);
  check_shape({8, 8, 128, false, 32, "mha"}, 400);
}

TEST(AttentionInvariance, HeadDim192And256) {
  MOEFOLD_REQUIRE_GPU();
  check_shape({4, 1, 192, false, 64, "d192"}, 500);
  check_shape({16, 2, 256, true, 16, "qwen3.5"}, 600);
}

// ---- timings (--gtest_also_run_disabled_tests --gtest_filter='*Perf*') ----------------------------
TEST(AttentionInvariance, DISABLED_Perf) {
  MOEFOLD_REQUIRE_GPU();
  struct Case {
    Heads h;
    int n, ctx;
    const char* name;
  };
  const Case cases[] = {{{16, 2, 256, true, 16, "qwen3.5"}, 32768, 0, "1x32768"},
                        {{16, 2, 256, true, 16, "qwen3.5"}, 1024, 8192, "1024+8192"},
                        {{32, 4, 128, false, 16, "qwen3"}, 32768, 0, "1x32768"},
                        {{4, 2, 64, false, 16, "qwen3_fixture"}, 8192, 0, "1x8192"}};
  for (const Case& c : cases) {
    const Heads& h = c.h;
    const int len = c.ctx + c.n, blocks = (len + h.bs - 1) / h.bs;
    std::vector<int32_t> table(static_cast<size_t>(blocks));
    std::iota(table.begin(), table.end(), 0);
    const size_t kv = size_t(blocks) * size_t(h.bs) * size_t(h.Hkv) * size_t(h.D);
    DeviceBuffer<bf16> kc(kv), vc(kv), q(size_t(c.n) * size_t(h.Hq) * 2 * size_t(h.D)),
        out(size_t(c.n) * size_t(h.Hq) * size_t(h.D));
    uint64_t seed = 91;
    for (auto* b : {&kc, &vc, &q}) cu::dummy_fill_bf16(DummyRecipe{seed++, 1.0f}, b->data(), int64_t(b->size()), nullptr);
    auto bt = cuda::to_device(table), dcu = cuda::to_device(std::vector<int32_t>{0, c.n}),
         dctx = cuda::to_device(std::vector<int32_t>{c.ctx});
    const double flops = 4.0 * h.D * h.Hq * (double(c.n) * c.ctx + double(c.n) * (c.n + 1) / 2);
    for (const Kernel& k : kernels_for(h.D)) {
      if (k.name != "ws" && k.name != "ws2" && k.name != "ws_persist" && k.name != "ws2_tall" &&
          k.name != "ws_persist_tall" && k.name != "wgmma")
        continue;
      cu::AttentionShape sh;
      sh.num_heads = h.Hq;
      sh.num_kv_heads = h.Hkv;
      sh.head_dim = h.D;
      sh.block_size = h.bs;
      sh.kernel = k.k;
      sh.q_token_stride = int64_t(h.Hq) * 2 * h.D;  // the fused [T, Hq, 2D] layout (gate = its second half)
      sh.q_head_stride = 2 * h.D;
      if (h.gate) {
        sh.gate = q.data() + h.D;
        sh.gate_token_stride = sh.q_token_stride;
        sh.gate_head_stride = sh.q_head_stride;
      }
      const double us = time_us([&] {
        cu::attention_prefill(q.data(), kc.data(), vc.data(), bt.data(), blocks, dcu.data(), dctx.data(), 1, c.n,
                              out.data(), sh, nullptr);
      }, 2, 7);
      perf_line("attn_" + k.name, fmt::format("{},Hq={},Hkv={},D={},{}", h.name, h.Hq, h.Hkv, h.D, c.name), us,
                fmt::format("TFLOP/s={:.1f}", flops / us * 1e-6));
    }
  }
}
