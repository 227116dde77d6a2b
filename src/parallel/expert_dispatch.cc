#include "parallel/expert_dispatch.h"

#include <algorithm>
#include <cstring>
#include <vector>

#include "core/dtype.h"
#include "core/error.h"
#include "core/kernel_registry.h"
#include "core/profiler.h"
#include "ops/cpu/linear.h"

namespace moefold {

namespace {

const prof::Kernel kEpExperts{"cpu::moe_experts:ep", prof::Category::RoutedExpertGemm};
const prof::Kernel kDispatch{"cpu::all_to_all:moe_dispatch", prof::Category::Communication};

/// One all_to_all_v of the dispatch, timed as communication (bytes: what this rank sends and receives).
void exchange(Communicator& comm, const float* send, std::span<const int64_t> sc, std::span<const int64_t> so,
              float* recv, std::span<const int64_t> rc, std::span<const int64_t> ro) {
  double n = 0;
  for (size_t r = 0; r < sc.size(); ++r) n += double(sc[r] + rc[r]);
  prof::HostScope scope(kDispatch, prof::Work{4.0 * n, 0});
  comm.all_to_all_v(send, sc, so, recv, rc, ro);
}

/// ys[i] = E_{local[i]}(xs[i]) for n rows of H: grouped by expert (ascending row order inside each),
/// each group through the 16-row-tile linear, so a row's bits do not depend on its group.
void run_experts(const LocalExperts& ex, const float* xs, const int32_t* local, int64_t n, float* ys) {
  const int64_t H = ex.hidden, I = ex.inter;
  // The weights of the experts used, x read and y written; 3 H x I products per row.
  prof::HostScope scope(kEpExperts, prof::Work{4.0 * (double(ex.count) * 3 * H * I + 2.0 * n * H), 6.0 * n * H * I});
  std::vector<std::vector<int64_t>> by_expert(static_cast<size_t>(ex.count));
  for (int64_t i = 0; i < n; ++i) by_expert[size_t(local[i])].push_back(i);
  std::vector<float> xg, gu, act, yg;
  auto rnd = [&](std::vector<float>& v) {
    if (ex.round_bf16)
      for (auto& f : v) f = bf16_to_f32(f32_to_bf16(f));
  };
  for (int64_t e = 0; e < ex.count; ++e) {
    const auto& rows = by_expert[size_t(e)];
    const int64_t m = int64_t(rows.size());
    if (m == 0) continue;
    xg.resize(size_t(m * H));
    gu.resize(size_t(m * 2 * I));
    act.resize(size_t(m * I));
    yg.resize(size_t(m * H));
    for (int64_t r = 0; r < m; ++r) std::memcpy(&xg[size_t(r * H)], xs + rows[size_t(r)] * H, size_t(H) * 4);
    cpu::linear(xg.data(), ex.gate_up + e * 2 * I * H, nullptr, gu.data(), m, H, 2 * I);
    cpu::swiglu(gu.data(), act.data(), m, I);
    rnd(act);
    cpu::linear(act.data(), ex.down + e * H * I, nullptr, yg.data(), m, I, H);
    rnd(yg);
    for (int64_t r = 0; r < m; ++r) std::memcpy(ys + rows[size_t(r)] * H, &yg[size_t(r * H)], size_t(H) * 4);
  }
}

/// [lo, hi) of rank r's even share of T rows.
std::pair<int64_t, int64_t> row_share(int64_t T, int world, int r) {
  const int64_t base = T / world, extra = T % world;
  const int64_t lo = r * base + std::min<int64_t>(r, extra);
  return {lo, lo + base + (r < extra ? 1 : 0)};
}

int64_t all_gather_mode(const LocalExperts& ex, const float* x, const int32_t* ids, const float* wts, int64_t T,
                        int64_t k, float* out) {
  const int64_t H = ex.hidden;
  std::vector<int64_t> pairs;  // row * k + slot, in row then slot order
  for (int64_t i = 0; i < T * k; ++i)
    if (ids[i] >= ex.first && ids[i] < ex.first + ex.count) pairs.push_back(i);
  const int64_t n = int64_t(pairs.size());
  std::vector<float> xs(static_cast<size_t>(n * H)), ys(static_cast<size_t>(n * H));
  std::vector<int32_t> local(static_cast<size_t>(n));
  for (int64_t p = 0; p < n; ++p) {
    std::memcpy(&xs[size_t(p * H)], x + (pairs[size_t(p)] / k) * H, size_t(H) * 4);
    local[size_t(p)] = int32_t(ids[pairs[size_t(p)]] - ex.first);
  }
  run_experts(ex, xs.data(), local.data(), n, ys.data());
  for (int64_t p = 0; p < n; ++p) {
    const int64_t t = pairs[size_t(p)] / k;
    const float w = wts[pairs[size_t(p)]];
    for (int64_t h = 0; h < H; ++h) out[t * H + h] += w * ys[size_t(p * H + h)];
  }
  return n;
}

int64_t all_to_all_mode(Communicator& comm, const RankShard& s, const LocalExperts& ex, const float* x,
                        const int32_t* ids, const float* wts, int64_t T, int64_t k, float* out) {
  const int N = s.world, etp = s.expert_tp_size;
  const int64_t H = ex.hidden, rec = H + 1;  // a dispatched record: [local expert id, x row]
  const auto [lo, hi] = row_share(T, N, s.rank);
  // Records to each rank, in (row, slot, split) order; pos[(t - lo) * k + slot][j]: where the output
  // of split j comes back (record index within its destination's block).
  std::vector<std::vector<float>> to(static_cast<size_t>(N));
  std::vector<int64_t> back_rank(static_cast<size_t>((hi - lo) * k * etp)), back_idx(back_rank.size());
  for (int64_t t = lo; t < hi; ++t)
    for (int64_t sl = 0; sl < k; ++sl) {
      const int32_t e = ids[t * k + sl];
      const int64_t g = e / ex.count;
      for (int j = 0; j < etp; ++j) {
        const int dst = int(g) * etp + j;
        auto& buf = to[size_t(dst)];
        const size_t slot = size_t(((t - lo) * k + sl) * etp + j);
        back_rank[slot] = dst;
        back_idx[slot] = int64_t(buf.size()) / rec;
        buf.push_back(float(e - g * ex.count));  // exact: expert ids are far below 2^24
        buf.insert(buf.end(), x + t * H, x + (t + 1) * H);
      }
    }
  // 1. How many records each rank receives from each (one float per pair of ranks).
  std::vector<int64_t> ones(size_t(N), 1), iota(static_cast<size_t>(N));
  for (int r = 0; r < N; ++r) iota[size_t(r)] = r;
  std::vector<float> n_send(static_cast<size_t>(N)), n_recv(static_cast<size_t>(N));
  for (int r = 0; r < N; ++r) n_send[size_t(r)] = float(to[size_t(r)].size() / size_t(rec));
  exchange(comm, n_send.data(), ones, iota, n_recv.data(), ones, iota);
  // 2. The records.
  std::vector<float> send, recv;
  std::vector<int64_t> sc(static_cast<size_t>(N)), so(static_cast<size_t>(N)), rc(static_cast<size_t>(N)), ro(static_cast<size_t>(N));
  int64_t total_in = 0;
  for (int r = 0; r < N; ++r) {
    so[size_t(r)] = int64_t(send.size());
    sc[size_t(r)] = int64_t(to[size_t(r)].size());
    send.insert(send.end(), to[size_t(r)].begin(), to[size_t(r)].end());
    ro[size_t(r)] = total_in * rec;
    rc[size_t(r)] = int64_t(n_recv[size_t(r)]) * rec;
    total_in += int64_t(n_recv[size_t(r)]);
  }
  recv.resize(static_cast<size_t>(total_in * rec));
  exchange(comm, send.data(), sc, so, recv.data(), rc, ro);
  // 3. This rank's experts on what it received, then the outputs back to where the records came from.
  std::vector<float> xs(static_cast<size_t>(total_in * H)), ys(static_cast<size_t>(total_in * H));
  std::vector<int32_t> local(static_cast<size_t>(total_in));
  for (int64_t i = 0; i < total_in; ++i) {
    local[size_t(i)] = int32_t(recv[size_t(i * rec)]);
    MOEFOLD_CHECK(local[size_t(i)] >= 0 && local[size_t(i)] < ex.count, "expert parallel: a record names local expert {} of {}",
                  local[size_t(i)], ex.count);
    std::memcpy(&xs[size_t(i * H)], &recv[size_t(i * rec + 1)], size_t(H) * 4);
  }
  run_experts(ex, xs.data(), local.data(), total_in, ys.data());
  std::vector<int64_t> bsc(static_cast<size_t>(N)), bso(static_cast<size_t>(N)), brc(static_cast<size_t>(N)), bro(static_cast<size_t>(N));
  int64_t back_total = 0;
  for (int r = 0; r < N; ++r) {
    bsc[size_t(r)] = rc[size_t(r)] / rec * H;
    bso[size_t(r)] = ro[size_t(r)] / rec * H;
    brc[size_t(r)] = sc[size_t(r)] / rec * H;
    bro[size_t(r)] = back_total;
    back_total += brc[size_t(r)];
  }
  std::vector<float> outs(static_cast<size_t>(back_total));
  exchange(comm, ys.data(), bsc, bso, outs.data(), brc, bro);
  // 4. Combine this rank's rows: per slot, the expert's output (its splits summed in split order),
  // weighted, accumulated in slot order.
  std::vector<float> y(static_cast<size_t>(H));
  for (int64_t t = lo; t < hi; ++t)
    for (int64_t sl = 0; sl < k; ++sl) {
      const float w = wts[t * k + sl];
      for (int j = 0; j < etp; ++j) {
        const size_t slot = size_t(((t - lo) * k + sl) * etp + j);
        const float* yj = &outs[size_t(bro[size_t(back_rank[slot])] + back_idx[slot] * H)];
        if (j == 0) std::copy_n(yj, H, y.begin());
        else
          for (int64_t h = 0; h < H; ++h) y[size_t(h)] += yj[h];
      }
      for (int64_t h = 0; h < H; ++h) out[t * H + h] += w * y[size_t(h)];
    }
  return total_in;
}

}  // namespace

int64_t expert_parallel_moe(Communicator& comm, const RankShard& s, const LocalExperts& ex, const float* x,
                            const int32_t* ids, const float* wts, int64_t T, int64_t k, float* out) {
  const int64_t E = ex.count * s.ep_size;
  for (int64_t i = 0; i < T * k; ++i)
    MOEFOLD_CHECK(ids[i] >= 0 && ids[i] < E, "expert parallel: expert id {} at pair {} is outside [0, {})", ids[i], i, E);
  const bool a2a = s.dispatch == EpDispatch::AllToAll || (s.dispatch == EpDispatch::Auto && T >= s.world);
  return a2a ? all_to_all_mode(comm, s, ex, x, ids, wts, T, k, out) : all_gather_mode(ex, x, ids, wts, T, k, out);
}

}  // namespace moefold
