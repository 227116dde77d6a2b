// Contract tests of the paged attention kernels against cpu::paged_attention (fp32 reference run
// on the bf16-rounded inputs, so only the kernel's rounding is measured; tolerance 1e-2 for the
// bf16 output). Covers kv_cache_write + device slot mapping, prefill of single prompts of
// 1..4100 tokens and of several sequences of different lengths with non-zero context lengths
// (chunked prefill) in one launch, decode at context lengths 1..32768 for batches 1, 17 and 64,
// GQA ratios 1..8, head_dim 32/64/128/256, the fused sigmoid output gate read in place from the
// [T, Hq, 2D] q_proj layout, and padding (rows and sequences) left untouched. Unused cache slots
// are NaN, so a kernel that reads past a sequence's keys fails. Every prefill variant of attention.h
// (AttnKernel) that takes the case is checked; MOEFOLD_TEST_KERNELS narrows the set.
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <numeric>
#include <tuple>

#include "core/error.h"
#include "cuda/contract.h"
#include "cuda/cuda_test_util.h"
#include "ops/cpu/attention.h"
#include "ops/cpu/linear.h"
#include "ops/cuda/attention.h"
#include "ops/cuda/cuda_check.h"
#include "ops/cuda/dummy_fill.h"

using namespace moefold;
using namespace moefold::test;
namespace cu = moefold::cuda;

namespace {

constexpr double kTol = 1e-2;

struct Heads {
  int Hq, Hkv, D;
  bool gate;
  const char* name;
};
const Heads kQwen35{16, 2, 256, true, "qwen3.5"};
const Heads kQwen3{32, 4, 128, false, "qwen3"};
const Heads kSmol{9, 3, 64, false, "smollm2"};
const Heads kTiny{4, 2, 32, false, "tiny"};
const Heads kTinyGated{4, 1, 32, true, "tiny_gated"};

void sync() { MOEFOLD_CUDA_CHECK(cudaDeviceSynchronize()); }

/// A paged KV cache with a random page assignment, its fp32 host image (NaN in unused slots) and
/// the block tables. max_run 1: pages in random order; larger: random runs of up to max_run
/// consecutive pages (page_runs), so that some key tiles cover consecutive pages.
struct PagedCache {
  int block_size, max_blocks, num_pages;
  int64_t kv_dim;
  std::vector<int32_t> tables;  // [S, max_blocks], -1 unused
  std::vector<float> k, v;      // [num_pages * block_size, kv_dim]

  PagedCache(const std::vector<int>& lens, int bs, int64_t kv_dim_, uint64_t seed, int max_run = 1)
      : block_size(bs), kv_dim(kv_dim_) {
    max_blocks = 1;
    int total = 0;
    for (int L : lens) {
      const int nb = (std::max(L, 0) + bs - 1) / bs;
      max_blocks = std::max(max_blocks, nb + 1);
      total += nb;
    }
    num_pages = total + 3;
    std::vector<int32_t> perm(static_cast<size_t>(num_pages));
    std::iota(perm.begin(), perm.end(), 0);
    for (size_t i = perm.size(); i > 1; --i) std::swap(perm[i - 1], perm[mix64(seed + i) % i]);
    if (max_run > 1) perm = page_runs(num_pages, max_run, seed);
    tables.assign(lens.size() * size_t(max_blocks), -1);
    size_t next = 0;
    for (size_t s = 0; s < lens.size(); ++s)
      for (int b = 0; b < (std::max(lens[s], 0) + bs - 1) / bs; ++b) tables[s * size_t(max_blocks) + size_t(b)] = perm[next++];
    k.assign(size_t(num_pages) * size_t(bs) * size_t(kv_dim), NAN);
    v = k;
  }
  int64_t slot(size_t s, int pos) const {
    return int64_t(tables[s * size_t(max_blocks) + size_t(pos / block_size)]) * block_size + pos % block_size;
  }
  /// Random K/V for positions [0, len) of sequence s.
  void fill(size_t s, int len, uint64_t seed) {
    if (len <= 0) return;
    auto kr = rand_bf16(size_t(len) * size_t(kv_dim), seed, 1.0f), vr = rand_bf16(size_t(len) * size_t(kv_dim), seed + 1, 1.0f);
    for (int p = 0; p < len; ++p) {
      const int64_t sl = slot(s, p);
      std::copy_n(kr.begin() + int64_t(p) * kv_dim, kv_dim, k.begin() + sl * kv_dim);
      std::copy_n(vr.begin() + int64_t(p) * kv_dim, kv_dim, v.begin() + sl * kv_dim);
    }
  }
};

/// q (dense [rows, Hq, D]) and, for gated shapes, the fused [rows, Hq, 2D] buffer it lives in.
struct Queries {
  std::vector<float> buf;  // what is uploaded
  int64_t width;           // per-head row width in buf (D or 2D)
  std::vector<float> q, gate;  // dense fp32 [rows, Hq, D]
};

Queries make_queries(const Heads& h, int64_t rows, float amp, uint64_t seed) {
  Queries Q;
  Q.width = h.gate ? 2 * h.D : h.D;
  Q.buf = rand_bf16(size_t(rows * h.Hq * Q.width), seed, amp);
  Q.q.resize(size_t(rows * h.Hq * h.D));
  if (h.gate) Q.gate.resize(Q.q.size());
  for (int64_t r = 0; r < rows * h.Hq; ++r)
    for (int64_t i = 0; i < h.D; ++i) {
      Q.q[size_t(r * h.D + i)] = Q.buf[size_t(r * Q.width + i)];
      if (h.gate) Q.gate[size_t(r * h.D + i)] = Q.buf[size_t(r * Q.width + h.D + i)] * 2.0f;
    }
  if (h.gate)  // gates spread over [-2amp, 2amp] for a visible effect: rescale and re-round the buffer half
    for (int64_t r = 0; r < rows * h.Hq; ++r)
      for (int64_t i = 0; i < h.D; ++i) Q.buf[size_t(r * Q.width + h.D + i)] = Q.gate[size_t(r * h.D + i)];
  return Q;
}

cu::AttentionShape shape_of(const Heads& h, int bs, const bf16* qbuf) {
  cu::AttentionShape s;
  s.num_heads = h.Hq;
  s.num_kv_heads = h.Hkv;
  s.head_dim = h.D;
  s.block_size = bs;
  if (h.gate) {
    s.q_token_stride = int64_t(h.Hq) * 2 * h.D;
    s.q_head_stride = 2 * h.D;
    s.gate = qbuf + h.D;
    s.gate_token_stride = s.q_token_stride;
    s.gate_head_stride = s.q_head_stride;
  }
  return s;
}

/// The reference for query rows [r0, r0 + n) of one sequence (positions start .. start + n - 1),
/// split into row chunks run in parallel, gate applied.
void reference(const Heads& h, const PagedCache& c, size_t s, const Queries& Q, int64_t r0, int start, int n,
               std::vector<float>& out, std::vector<std::function<void()>>& work) {
  constexpr int kRowsPerTask = 64;  // each task gathers the sequence's keys once: keep tasks few
  for (int a = 0; a < n; a += kRowsPerTask) {
    const int b = std::min(n, a + kRowsPerTask);
    work.push_back([&h, &c, s, &Q, r0, start, a, b, &out] {
      const int64_t row = r0 + a, stride = int64_t(h.Hq) * h.D;
      cpu::paged_attention(Q.q.data() + row * stride, c.k.data(), c.v.data(), c.tables.data() + s * size_t(c.max_blocks),
                           start + a, b - a, h.Hq, h.Hkv, h.D, c.block_size, float(1.0 / std::sqrt(double(h.D))),
                           out.data() + row * stride);
      if (h.gate)
        for (int64_t i = row * stride; i < (r0 + b) * stride; ++i) out[size_t(i)] *= cpu::sigmoid(Q.gate[size_t(i)]);
    });
  }
}

void run_all(std::vector<std::function<void()>>& work) {
  parallel_for(work.size(), [&](size_t i) { work[i](); });
  work.clear();
}

// ---- prefill -----------------------------------------------------------------------------------
/// MOEFOLD_TEST_KERNELS: comma-separated prefill variants to check or time (flash, wgmma, wgmma_vt,
/// wgmma_pipe, ws, ws_nopp, ws_noiw, ws_plain, ws_s3, ws_bn64, ws_pp, ws_qr, ws2, ws_persist, ws2_tall,
/// ws_persist_tall, tc, simt, auto); unset = all. Lets a GPU run check new variants in their own process.
bool kernel_selected(const std::string& name) {
  const char* v = std::getenv("MOEFOLD_TEST_KERNELS");
  if (!v || !*v) return true;
  const std::string list = std::string(",") + v + ",";
  return list.find("," + name + ",") != std::string::npos;
}


/// Sequences with context lengths ctx[s] and n[s] new rows (a trailing padding sequence with no
/// rows and 3 padding rows are added). max_run: PagedCache's page order.
void check_prefill(const Heads& h, std::vector<int> ctx, std::vector<int> n, int bs, float q_amp, uint64_t seed,
                   int max_run = 1) {
  const std::string shape =
      fmt::format("{},H={}/{},D={},bs={},seqs={},ctx={},n={}{}{}", h.name, h.Hq, h.Hkv, h.D, bs, ctx.size(),
                  join_ints(ctx), join_ints(n), q_amp > 4 ? ",peaky" : "",
                  max_run > 1 ? fmt::format(",page_runs<={}", max_run) : std::string());
  ctx.push_back(0);
  n.push_back(0);
  const size_t S = ctx.size();
  std::vector<int32_t> cu_seq(S + 1, 0);
  for (size_t s = 0; s < S; ++s) cu_seq[s + 1] = cu_seq[s] + n[s];
  const int64_t T = cu_seq[S], Tcap = T + 3, kv_dim = int64_t(h.Hkv) * h.D;
  const int max_q = *std::max_element(n.begin(), n.end());
  std::vector<int> lens(S);
  for (size_t s = 0; s < S; ++s) lens[s] = ctx[s] + n[s];
  PagedCache c(lens, bs, kv_dim, seed, max_run);
  for (size_t s = 0; s < S; ++s) c.fill(s, ctx[s], seed + 10 * s + 1);
  auto knew = rand_bf16(size_t(Tcap * kv_dim), seed + 2, 1.0f), vnew = rand_bf16(size_t(Tcap * kv_dim), seed + 3, 1.0f);
  Queries Q = make_queries(h, Tcap, q_amp, seed + 4);

  // Device: caches (NaN in unused slots), batch arrays, this step's K/V, q.
  auto dkc = dev_bf16(c.k), dvc = dev_bf16(c.v);
  auto dbt = cuda::to_device(c.tables);
  auto dcu = cuda::to_device(cu_seq);
  auto dctx = cuda::to_device(std::vector<int32_t>(ctx.begin(), ctx.end()));
  auto dk = dev_bf16(knew), dv = dev_bf16(vnew), dq = dev_bf16(Q.buf);
  DeviceBuffer<int32_t> dslots(static_cast<size_t>(Tcap));
  dslots.upload(std::vector<int32_t>(size_t(Tcap), -1));
  // The default (flash) kernel, and the older variants where they take the head size.
  const bool old_kernels = h.D == 32 || h.D == 64 || h.D == 96 || h.D == 128 || h.D == 192 || h.D == 256;
  std::vector<std::pair<cu::AttnKernel, std::string>> kernels{{cu::AttnKernel::Flash, "_flash"}};
  if (h.D % 64 == 0)
    kernels.insert(kernels.end(), {{cu::AttnKernel::Wgmma, "_wgmma"},
                                   {cu::AttnKernel::WgmmaVt, "_wgmma_vt"},
                                   {cu::AttnKernel::WgmmaPipe, "_wgmma_pipe"}});
  if (h.D % 64 == 0 && bs % 16 == 0)  // the warp-specialised kernel and its A/B variants
    kernels.insert(kernels.end(), {{cu::AttnKernel::Ws, "_ws"},
                                   {cu::AttnKernel::WsNoPingPong, "_ws_nopp"},
                                   {cu::AttnKernel::WsNoOverlap, "_ws_noiw"},
                                   {cu::AttnKernel::WsPlain, "_ws_plain"},
                                   {cu::AttnKernel::WsStages3, "_ws_s3"},
                                   {cu::AttnKernel::WsBn64, "_ws_bn64"},
                                   {cu::AttnKernel::WsPingPong, "_ws_pp"},
                                   {cu::AttnKernel::WsQRegs, "_ws_qr"},
                                   {cu::AttnKernel::WsV2, "_ws2"},
                                   {cu::AttnKernel::WsPersist, "_ws_persist"},
                                   {cu::AttnKernel::WsV2Tall, "_ws2_tall"},
                                   {cu::AttnKernel::WsPersistTall, "_ws_persist_tall"}});
  kernels.push_back({cu::AttnKernel::Auto, "_auto"});
  if (old_kernels) kernels.insert(kernels.end(), {{cu::AttnKernel::TensorCore, "_tc"}, {cu::AttnKernel::Simt, "_simt"}});
  std::erase_if(kernels, [](const auto& k) { return !kernel_selected(k.second.substr(1)); });
  if (kernels.empty()) return;
  std::vector<DeviceBuffer<bf16>> douts;
  for (size_t i = 0; i < kernels.size(); ++i) {
    douts.emplace_back(size_t(Tcap * h.Hq * h.D));
    douts.back().fill_bytes(0xFF);  // poison: rows past the batch must stay untouched
  }
  cu::AttentionShape sh = shape_of(h, bs, dq.data());
  cu::compute_slot_mapping(dcu.data(), dctx.data(), dbt.data(), c.max_blocks, bs, int(S), max_q, dslots.data(), nullptr);
  cu::kv_cache_write(dk.data(), 0, dv.data(), 0, dkc.data(), dvc.data(), dslots.data(), Tcap, kv_dim, nullptr, nullptr);
  for (size_t i = 0; i < kernels.size(); ++i) {
    sh.kernel = kernels[i].first;
    cu::attention_prefill(dq.data(), dkc.data(), dvc.data(), dbt.data(), c.max_blocks, dcu.data(), dctx.data(), int(S),
                          max_q, douts[i].data(), sh, nullptr);
  }
  sync();

  // Host: expected slots, cache write, reference attention.
  std::vector<int32_t> slots(size_t(Tcap), -1);
  for (size_t s = 0; s < S; ++s)
    for (int i = 0; i < n[s]; ++i) slots[size_t(cu_seq[s] + i)] = int32_t(c.slot(s, ctx[s] + i));
  for (size_t s = 0; s < S; ++s)
    if (n[s] > 0)
      cpu::kv_cache_write(knew.data() + cu_seq[s] * kv_dim, vnew.data() + cu_seq[s] * kv_dim, c.k.data(), c.v.data(),
                          c.tables.data() + s * size_t(c.max_blocks), ctx[s], n[s], bs, kv_dim);
  std::vector<float> ref(size_t(T * h.Hq * h.D));
  std::vector<std::function<void()>> work;
  for (size_t s = 0; s < S; ++s)
    if (n[s] > 0) reference(h, c, s, Q, cu_seq[s], ctx[s], n[s], ref, work);
  run_all(work);

  const auto gslots = dslots.download();
  size_t slot_mis = 0;
  for (size_t i = 0; i < slots.size(); ++i) slot_mis += gslots[i] != slots[i];
  EXPECT_TRUE(contract_exact("slot_mapping", shape, slot_mis));
  const auto gk = host_f32(dkc), gv = host_f32(dvc);
  size_t cache_mis = 0;
  for (int64_t r = 0; r < T; ++r)
    for (int64_t i = 0; i < kv_dim; ++i) {
      const int64_t at = int64_t(slots[size_t(r)]) * kv_dim + i;
      cache_mis += gk[size_t(at)] != knew[size_t(r * kv_dim + i)];
      cache_mis += gv[size_t(at)] != vnew[size_t(r * kv_dim + i)];
    }
  EXPECT_TRUE(contract_exact("kv_cache_write", shape, cache_mis));
  const std::string k = h.gate ? "attn_prefill_gated" : "attn_prefill";
  size_t pad_touched = 0;
  for (size_t i = 0; i < kernels.size(); ++i) {
    const auto out = host_f32(douts[i]);
    EXPECT_TRUE(contract(k + kernels[i].second, shape, rel_err(slice(out, 0, ref.size()), ref), kTol));
    pad_touched += touched(host_bits(douts[i]), ref.size(), out.size());
  }
  EXPECT_TRUE(contract_exact("attn_prefill_padding", shape, pad_touched));
  // ws2, ws_persist and their tall-box forms (attention_flash.h WsVariant::V2 / Persist / V2Tall /
  // PersistTall) only move data differently: Ws's bits, every element (padding included).
  const auto at = [&](const char* name) {
    return size_t(std::find_if(kernels.begin(), kernels.end(), [&](const auto& k) { return k.second == name; }) -
                  kernels.begin());
  };
  for (const char* v : {"_ws2", "_ws_persist", "_ws2_tall", "_ws_persist_tall"})
    if (const size_t iw = at("_ws"), iv = at(v); iw < kernels.size() && iv < kernels.size()) {
      const auto a = host_bits(douts[iw]), b = host_bits(douts[iv]);
      size_t mis = 0;
      for (size_t i = 0; i < a.size(); ++i) mis += a[i] != b[i];
      EXPECT_TRUE(contract_exact(std::string("attn_prefill") + v + "_bits_vs_ws", shape, mis));
    }
}

// ---- decode ------------------------------------------------------------------------------------
/// One query row per sequence over kv_lens[s] keys (context_lens = kv_len - 1); kv_len <= 0 marks a
/// padding sequence (context_lens = -1). Optionally cross-checks the prefill kernel on the same batch.
void check_decode(const Heads& h, const std::vector<int>& kv_lens, int bs, int64_t max_kv_len, uint64_t seed,
                  bool also_prefill = false) {
  const size_t S = kv_lens.size();
  const int64_t kv_dim = int64_t(h.Hkv) * h.D;
  std::vector<int> shown;
  int live = 0, maxlen = 0;
  for (int L : kv_lens) {
    if (L > 0) ++live, maxlen = std::max(maxlen, L);
    shown.push_back(L);
  }
  std::sort(shown.begin(), shown.end());
  const std::string shape = fmt::format("{},H={}/{},D={},bs={},B={},pad={},kv_max={},bound={}", h.name, h.Hq, h.Hkv,
                                        h.D, bs, live, S - size_t(live), maxlen, max_kv_len);
  PagedCache c(kv_lens, bs, kv_dim, seed);
  for (size_t s = 0; s < S; ++s) c.fill(s, kv_lens[s], seed + 10 * s + 1);
  Queries Q = make_queries(h, int64_t(S), 2.0f, seed + 4);
  std::vector<int32_t> ctx(S);
  for (size_t s = 0; s < S; ++s) ctx[s] = kv_lens[s] > 0 ? kv_lens[s] - 1 : -1;

  auto dkc = dev_bf16(c.k), dvc = dev_bf16(c.v);
  auto dbt = cuda::to_device(c.tables);
  auto dctx = cuda::to_device(ctx);
  auto dq = dev_bf16(Q.buf);
  DeviceBuffer<bf16> dout(S * size_t(h.Hq) * size_t(h.D));
  dout.fill_bytes(0xFF);
  const cu::AttentionShape sh = shape_of(h, bs, dq.data());
  const size_t ws = cu::attention_decode_workspace_bytes(int(S), sh, max_kv_len);
  DeviceBuffer<unsigned char> dws(ws);
  cu::attention_decode(dq.data(), dkc.data(), dvc.data(), dbt.data(), c.max_blocks, dctx.data(), int(S), max_kv_len,
                       dout.data(), sh, dws.data(), ws, nullptr);
  sync();

  std::vector<float> ref(dout.size(), 0.0f);
  std::vector<std::function<void()>> work;
  for (size_t s = 0; s < S; ++s)
    if (kv_lens[s] > 0) reference(h, c, s, Q, int64_t(s), ctx[s], 1, ref, work);
  run_all(work);
  const auto out = host_f32(dout);
  const auto bits = host_bits(dout);
  std::vector<float> got_live, ref_live;
  size_t pad_touched = 0;
  const size_t row = size_t(h.Hq) * size_t(h.D);
  for (size_t s = 0; s < S; ++s) {
    if (kv_lens[s] > 0) {
      got_live.insert(got_live.end(), out.begin() + ptrdiff_t(s * row), out.begin() + ptrdiff_t((s + 1) * row));
      ref_live.insert(ref_live.end(), ref.begin() + ptrdiff_t(s * row), ref.begin() + ptrdiff_t((s + 1) * row));
    } else {
      pad_touched += touched(bits, s * row, (s + 1) * row);
    }
  }
  EXPECT_TRUE(contract(h.gate ? "attn_decode_gated" : "attn_decode", shape, rel_err(got_live, ref_live), kTol));
  if (size_t(live) < S) {
    EXPECT_TRUE(contract_exact("attn_decode_padding", shape, pad_touched));
  }
  // The A/B forms of the decode kernel give the default's bits: the tiles staged through registers, one or
  // four q heads a warp.
  const std::tuple<const char*, const char*, const char*> forms[] = {
      {"MOEFOLD_ATTN_DECODE_STAGE", "sync", "attn_decode_stage_sync_bits"},
      {"MOEFOLD_ATTN_DECODE_ROWS", "1", "attn_decode_rows1_bits"},
      {"MOEFOLD_ATTN_DECODE_ROWS", "4", "attn_decode_rows4_bits"}};
  for (const auto& [var, value, name] : forms) {
    if (std::getenv(var) != nullptr) continue;
    dout.fill_bytes(0xFF);
    setenv(var, value, 1);
    cu::attention_decode(dq.data(), dkc.data(), dvc.data(), dbt.data(), c.max_blocks, dctx.data(), int(S), max_kv_len,
                         dout.data(), sh, dws.data(), ws, nullptr);
    sync();
    unsetenv(var);
    const auto form_bits = host_bits(dout);
    size_t differ = 0;
    for (size_t i = 0; i < bits.size(); ++i) differ += form_bits[i] != bits[i] ? 1 : 0;
    EXPECT_TRUE(contract_exact(name, shape, differ));
  }

  if (also_prefill) {  // the prefill kernel on the same batch (one row per sequence, long contexts)
    std::vector<int32_t> cu_seq(S + 1, 0);
    for (size_t s = 0; s < S; ++s) cu_seq[s + 1] = cu_seq[s] + (kv_lens[s] > 0 ? 1 : 0);
    MOEFOLD_CHECK(cu_seq[S] == int32_t(S), "also_prefill needs no padding sequences");
    auto dcu = cuda::to_device(cu_seq);
    dout.fill_bytes(0xFF);
    cu::attention_prefill(dq.data(), dkc.data(), dvc.data(), dbt.data(), c.max_blocks, dcu.data(), dctx.data(), int(S),
                          1, dout.data(), sh, nullptr);
    sync();
    EXPECT_TRUE(contract("attn_prefill_as_decode", shape, rel_err(host_f32(dout), ref), kTol));
  }
}

std::vector<int> random_lens(size_t n, int lo, int hi, uint64_t seed, bool log_uniform) {
  std::vector<int> v(n);
  for (size_t i = 0; i < n; ++i) {
    const double u = double(mix64(seed + i) >> 11) * 0x1.0p-53;
    v[i] = log_uniform ? int(std::exp(std::log(double(lo)) + u * (std::log(double(hi)) - std::log(double(lo)))))
                       : lo + int(u * double(hi - lo + 1));
    v[i] = std::clamp(v[i], lo, hi);
  }
  return v;
}

}  // namespace

TEST(AttentionPrefill, SinglePrompts) {
  MOEFOLD_REQUIRE_GPU();
  uint64_t seed = 2000;
  for (int n : {1, 2, 17, 63, 64, 65, 127, 1000, 4100}) check_prefill(kQwen35, {0}, {n}, 16, 2.0f, seed += 100);
  for (int n : {1, 65, 1000}) check_prefill(kQwen3, {0}, {n}, 16, 2.0f, seed += 100);
}

TEST(AttentionPrefill, ChunkedMultiSequence) {
  MOEFOLD_REQUIRE_GPU();
  uint64_t seed = 3000;
  check_prefill(kQwen35, {0, 5, 100, 1000, 37, 4000}, {1, 17, 64, 65, 300, 127}, 16, 2.0f, seed += 100);
  check_prefill(kQwen35, {37, 0, 513}, {300, 64, 65}, 16, 16.0f, seed += 100);  // peaky softmax
  check_prefill(kQwen3, {0, 129, 17, 2000}, {63, 1, 200, 33}, 32, 2.0f, seed += 100);
  check_prefill(kSmol, {0, 3, 64}, {65, 1, 127}, 16, 2.0f, seed += 100);
  check_prefill(kTiny, {0, 7, 31}, {17, 2, 40}, 1, 8.0f, seed += 100);
  check_prefill(kTinyGated, {2, 0}, {63, 64}, 16, 2.0f, seed += 100);
}

// Every head size of real checkpoints (own instances) and multiples of 16 run on a padded instance:
// single prompts, a varlen batch with empty and 1-token sequences, a continuation over pages.
TEST(AttentionPrefill, HeadSizes) {
  MOEFOLD_REQUIRE_GPU();
  uint64_t seed = 7000;
  for (int D : {64, 80, 96, 128, 192, 256, 16, 48, 112, 160, 240}) {
    const Heads h{8, 2, D, D % 64 == 0, "heads"};
    for (int n : {1, 17, 65, 300}) check_prefill(h, {0}, {n}, 16, 2.0f, seed += 100);
    check_prefill(h, {0, 40, 0, 7, 0, 600}, {0, 1, 1, 0, 129, 70}, 16, 2.0f, seed += 100);
  }
  const Heads mha{3, 3, 80, true, "mha"};  // G = 1: 128 tokens per tile
  check_prefill(mha, {0, 130}, {300, 129}, 32, 2.0f, seed += 100);
}

// New tokens attending to thousands of cached ones (prefix-cache continuations, chunked prefill) over
// pages of several sizes.
TEST(AttentionPrefill, Continuations) {
  MOEFOLD_REQUIRE_GPU();
  uint64_t seed = 8000;
  check_prefill(kQwen35, {8192}, {200}, 16, 2.0f, seed += 100);
  check_prefill(kQwen35, {3000, 0, 5000}, {64, 0, 129}, 64, 16.0f, seed += 100);  // peaky softmax
  check_prefill(kQwen3, {4100}, {257}, 32, 2.0f, seed += 100);
  check_prefill(kQwen3, {999, 1, 4096}, {1, 1000, 65}, 128, 2.0f, seed += 100);
  check_prefill(kSmol, {2000, 63}, {127, 64}, 4, 2.0f, seed += 100);  // 4-token pages
}

// Pages consecutive in the cache (one run), in runs of up to 3 or 7 pages, and shuffled, at the head
// sizes of the tall-box forms (ws2_tall, ws_persist_tall: one TMA box per 64 columns for a key tile
// over consecutive pages, 16-key pieces elsewhere): 80-key tiles over 16-token pages start on page
// boundaries, over 32- and 64-token pages also mid-page; 128-key tiles span 8 / 4 / 2 pages; the
// sequences' last tiles (partial pieces) take the piece-wise path. Bits equal to ws everywhere.
TEST(AttentionPrefill, ConsecutivePages) {
  MOEFOLD_REQUIRE_GPU();
  uint64_t seed = 9000;
  for (int run : {1 << 20, 7, 3, 1}) {
    check_prefill(kQwen35, {0, 37, 500}, {1000, 300, 129}, 16, 2.0f, seed += 100, run);
    check_prefill(kQwen35, {0, 1000}, {700, 65}, 32, 2.0f, seed += 100, run);
    check_prefill(kQwen3, {0, 100}, {1000, 257}, 16, 2.0f, seed += 100, run);
    check_prefill(kQwen3, {0}, {600}, 64, 2.0f, seed += 100, run);
  }
}

// Head sizes the GPU cannot run fail with an Error before anything launches.
TEST(AttentionPrefill, UnsupportedHeadSizeIsAnError) {
  EXPECT_TRUE(cu::attention_supports_head_dim(256));
  EXPECT_TRUE(cu::attention_supports_head_dim(96));
  EXPECT_FALSE(cu::attention_supports_head_dim(80));  // prefill only (decode has no instance)
  EXPECT_FALSE(cu::attention_supports_head_dim(72));
  EXPECT_FALSE(cu::attention_supports_head_dim(512));
  for (int D : {8, 72, 100, 272}) {
    cu::AttentionShape sh;
    sh.num_heads = 4;
    sh.num_kv_heads = 2;
    sh.head_dim = D;
    sh.block_size = 16;
    EXPECT_THROW(cu::attention_prefill(nullptr, nullptr, nullptr, nullptr, 1, nullptr, nullptr, 1, 1, nullptr, sh, nullptr),
                 Error)
        << "head_dim " << D;
  }
}

TEST(AttentionDecode, Batch1) {
  MOEFOLD_REQUIRE_GPU();
  uint64_t seed = 4000;
  for (int L : {1, 2, 63, 64, 65, 1000, 4100, 32768}) check_decode(kQwen35, {L}, 16, 32768, seed += 100);
  check_decode(kQwen35, {4100}, 16, 4100, seed += 100);  // tight bound
  check_decode(kQwen35, {5000}, 16, 1000, seed += 100);  // bound exceeded: still correct
}

TEST(AttentionDecode, Batch17And64) {
  MOEFOLD_REQUIRE_GPU();
  uint64_t seed = 5000;
  auto l17 = random_lens(17, 1, 8192, seed, false);
  l17[3] = 32768;
  l17[5] = 1;
  check_decode(kQwen3, l17, 64, 32768, seed += 100, /*also_prefill=*/true);
  auto l64 = random_lens(64, 1, 32768, seed + 7, true);
  l64[0] = 1;
  l64[63] = 32768;
  l64.push_back(0);  // padding sequences
  l64.insert(l64.begin() + 10, -1);
  check_decode(kQwen35, l64, 16, 32768, seed += 100);
  check_decode(kSmol, random_lens(17, 1, 3000, 5009, false), 16, 4096, 5300);
  check_decode(kTinyGated, random_lens(64, 1, 2000, 5011, true), 16, 2048, 5400);
}

TEST(AttentionSmall, PrefillAndDecode) {
  MOEFOLD_REQUIRE_GPU();
  check_prefill(kTiny, {0, 7, 3}, {9, 2, 20}, 4, 2.0f, 6000);
  check_prefill(kTinyGated, {5}, {33}, 16, 2.0f, 6100);
  check_prefill(Heads{4, 1, 64, true, "small64"}, {0, 70}, {130, 3}, 8, 2.0f, 6150);  // wgmma variants too
  check_prefill(Heads{4, 1, 64, true, "small64"}, {0, 21, 0}, {70, 3, 1}, 16, 2.0f, 6170);  // ws: TMA pages, tail copies
  check_decode(kTiny, {1, 300, 0, 45}, 16, 4096, 6200);  // split path + padding
  check_decode(kTinyGated, {70, 2}, 8, 64, 6300);         // no-split path
}

// ---- timings (run with --gtest_also_run_disabled_tests --gtest_filter='*Perf*') -----------------
namespace {

/// Qwen3.5 attention shape on synthetic caches (uniform random bf16 in [-1, 1)). Block tables: every
/// sequence's pages consecutive in the cache (iota), or, with MOEFOLD_TEST_PERF_PAGES=shuffled, all
/// pages in random order (the ws tall-box forms then take their piece-wise path).
struct PerfSetup {
  int bs = 16, max_blocks;
  DeviceBuffer<bf16> kc, vc, q, out;
  DeviceBuffer<int32_t> bt;
  PerfSetup(int seqs, int max_len, int q_rows, int Hq, int Hkv, int D) {
    max_blocks = (max_len + bs - 1) / bs;
    std::vector<int32_t> t(size_t(seqs) * size_t(max_blocks));
    std::iota(t.begin(), t.end(), 0);
    if (const char* e = std::getenv("MOEFOLD_TEST_PERF_PAGES"); e && std::string(e) == "shuffled")
      t = page_runs(int(t.size()), 1, 4242);
    bt = cuda::to_device(t);
    kc = DeviceBuffer<bf16>(t.size() * size_t(bs) * size_t(Hkv) * size_t(D));
    vc = DeviceBuffer<bf16>(kc.size());
    q = DeviceBuffer<bf16>(size_t(q_rows) * size_t(Hq) * 2 * size_t(D));
    out = DeviceBuffer<bf16>(size_t(q_rows) * size_t(Hq) * size_t(D));
    uint64_t seed = 77;  // random, not constant, data (uniform in [-1, 1))
    for (auto* b : {&kc, &vc, &q}) cu::dummy_fill_bf16(DummyRecipe{seed++, 1.0f}, b->data(), int64_t(b->size()), nullptr);
    sync();
  }
};

}  // namespace

TEST(AttentionPerf, DISABLED_Timings) {
  MOEFOLD_REQUIRE_GPU();
  const Heads& h = kQwen35;
  for (auto [seqs, n] : {std::pair{1, 4096}, std::pair{8, 2048}, std::pair{1, 32768}}) {
    PerfSetup p(seqs, n, seqs * n, h.Hq, h.Hkv, h.D);
    std::vector<int32_t> cu_seq(size_t(seqs) + 1), ctx(static_cast<size_t>(seqs), 0);
    for (int s = 0; s <= seqs; ++s) cu_seq[size_t(s)] = s * n;
    auto dcu = cuda::to_device(cu_seq), dctx = cuda::to_device(ctx);
    cu::AttentionShape sh = shape_of(h, p.bs, p.q.data());
    const double flops = 4.0 * h.D * h.Hq * double(seqs) * double(n) * double(n + 1) / 2;
    for (auto kern : {cu::AttnKernel::TensorCore, cu::AttnKernel::Simt}) {
      if (kern == cu::AttnKernel::Simt && n > 4096) continue;
      sh.kernel = kern;
      const double us = time_us([&] {
        cu::attention_prefill(p.q.data(), p.kc.data(), p.vc.data(), p.bt.data(), p.max_blocks, dcu.data(), dctx.data(),
                              seqs, n, p.out.data(), sh, nullptr);
      }, 2, 5);
      perf_line(kern == cu::AttnKernel::Simt ? "attn_prefill_simt" : "attn_prefill_tc",
                fmt::format("qwen3.5,gated,seqs={},n={}", seqs, n), us, fmt::format("TFLOP/s={:.1f}", flops / us * 1e-6));
    }
  }
  // Decode: the default, four and one q heads a warp, the register staging; in the order A B C D D C B A.
  for (auto [B, L] : {std::pair{1, 513}, std::pair{1, 4096}, std::pair{1, 32768}, std::pair{8, 4096}, std::pair{64, 4096},
                      std::pair{64, 16384}}) {
    PerfSetup p(B, L, B, h.Hq, h.Hkv, h.D);
    auto dctx = cuda::to_device(std::vector<int32_t>(size_t(B), L - 1));
    const cu::AttentionShape sh = shape_of(h, p.bs, p.q.data());
    const size_t ws = cu::attention_decode_workspace_bytes(B, sh, L);
    DeviceBuffer<unsigned char> dws(ws);
    const double bytes = double(B) * double(L) * h.Hkv * h.D * 2 * 2;
    const std::tuple<const char*, const char*, const char*> forms[] = {{nullptr, nullptr, "attn_decode"},
                                                                       {"MOEFOLD_ATTN_DECODE_ROWS", "4", "attn_decode_rows4"},
                                                                       {"MOEFOLD_ATTN_DECODE_ROWS", "1", "attn_decode_rows1"},
                                                                       {"MOEFOLD_ATTN_DECODE_STAGE", "sync", "attn_decode_sync_stage"}};
    double us[4] = {0, 0, 0, 0};
    for (int f : {0, 1, 2, 3, 3, 2, 1, 0}) {
      const auto& [var, value, name] = forms[f];
      if (var) setenv(var, value, 1);
      us[f] += 0.5 * time_us([&] {
        cu::attention_decode(p.q.data(), p.kc.data(), p.vc.data(), p.bt.data(), p.max_blocks, dctx.data(), B, L,
                             p.out.data(), sh, dws.data(), ws, nullptr);
      });
      if (var) unsetenv(var);
    }
    for (int f = 0; f < 4; ++f)
      perf_line(std::get<2>(forms[f]), fmt::format("qwen3.5,gated,B={},kv={}", B, L), us[f],
                fmt::format("TB/s={:.2f}", bytes / us[f] * 1e-6));
  }
}

// The benchmark shapes of docs/benchmarks.md (scripts/gpu/attention_vs_sdpa.py runs this beside torch
// SDPA): causal prefill at 1x4096, 1x32768, 8x4096 (one varlen launch), and 1024 new tokens over 8192
// cached ones, at Qwen3.5 (16/2 heads, D 256, gated) and Qwen3-30B-A3B (32/4 heads, D 128).
void perf_cases(std::initializer_list<cu::AttnKernel> kerns);

TEST(AttentionPerf, DISABLED_Flash) {
  MOEFOLD_REQUIRE_GPU();
  perf_cases({cu::AttnKernel::Auto, cu::AttnKernel::Flash, cu::AttnKernel::Wgmma, cu::AttnKernel::WgmmaVt,
              cu::AttnKernel::WgmmaPipe, cu::AttnKernel::Ws, cu::AttnKernel::WsNoPingPong, cu::AttnKernel::WsNoOverlap,
              cu::AttnKernel::WsPlain, cu::AttnKernel::WsStages3, cu::AttnKernel::WsBn64, cu::AttnKernel::WsPingPong,
              cu::AttnKernel::WsQRegs, cu::AttnKernel::WsV2, cu::AttnKernel::WsPersist, cu::AttnKernel::WsV2Tall,
              cu::AttnKernel::WsPersistTall});
}

void perf_cases(std::initializer_list<cu::AttnKernel> kerns) {
  struct Case {
    int seqs, n, ctx;
    const char* name;
  };
  const Case cases[] = {{1, 4096, 0, "1x4096"}, {1, 32768, 0, "1x32768"}, {8, 4096, 0, "8x4096"}, {1, 1024, 8192, "1024+8192"}};
  for (const Heads* h : {&kQwen35, &kQwen3}) {
    for (const Case& c : cases) {
      PerfSetup p(c.seqs, c.ctx + c.n, c.seqs * c.n, h->Hq, h->Hkv, h->D);
      std::vector<int32_t> cu_seq(size_t(c.seqs) + 1), ctx(static_cast<size_t>(c.seqs), c.ctx);
      for (int s = 0; s <= c.seqs; ++s) cu_seq[size_t(s)] = s * c.n;
      auto dcu = cuda::to_device(cu_seq), dctx = cuda::to_device(ctx);
      cu::AttentionShape sh = shape_of(*h, p.bs, p.q.data());
      const double pairs = double(c.seqs) * (double(c.n) * c.ctx + double(c.n) * (c.n + 1) / 2);
      const double flops = 4.0 * h->D * h->Hq * pairs;
      for (auto kern : kerns) {
        if (kern == cu::AttnKernel::TensorCore && c.n > 4096) continue;
        const char* names[] = {"auto",     "fa",       "wgmma", "wgmma_vt", "tc_old",  "simt",
                               "wgmma_pipe", "ws",    "ws_nopp", "ws_noiw", "ws_plain", "ws_s3",
                               "ws_bn64",    "ws_pp", "ws_qr", "ws2", "ws_persist", "ws2_tall", "ws_persist_tall"};
        const char* sel[] = {"auto",       "flash", "wgmma",   "wgmma_vt", "tc",       "simt",  "wgmma_pipe", "ws",
                             "ws_nopp",    "ws_noiw", "ws_plain", "ws_s3", "ws_bn64", "ws_pp", "ws_qr", "ws2", "ws_persist",
                             "ws2_tall",   "ws_persist_tall"};
        if (!kernel_selected(sel[int(kern)])) continue;
        sh.kernel = kern;
        const double us = time_us([&] {
          cu::attention_prefill(p.q.data(), p.kc.data(), p.vc.data(), p.bt.data(), p.max_blocks, dcu.data(), dctx.data(),
                                c.seqs, c.n, p.out.data(), sh, nullptr);
        }, 2, 7);
        perf_line(std::string("attn_") + names[int(kern)],
                  fmt::format("{},Hq={},Hkv={},D={},{}", h->name, h->Hq, h->Hkv, h->D, c.name), us,
                  fmt::format("TFLOP/s={:.1f}", flops / us * 1e-6));
      }
    }
  }
}
