#include "ops/cpu/gated_delta_net.h"

#include <cmath>
#include <cstring>
#include <vector>

#include "ops/cpu/linear.h"

namespace moefold::cpu {

void causal_conv1d_silu(const float* x, const float* w, float* conv_state, float* y, int64_t T, int64_t C, int64_t K) {
  std::vector<float> buf(static_cast<size_t>(K - 1 + T));
  for (int64_t c = 0; c < C; ++c) {
    for (int64_t j = 0; j < K - 1; ++j) buf[size_t(j)] = conv_state[c * (K - 1) + j];
    for (int64_t t = 0; t < T; ++t) buf[size_t(K - 1 + t)] = x[t * C + c];
    const float* wc = w + c * K;
    for (int64_t t = 0; t < T; ++t) {
      float acc = 0;
      for (int64_t j = 0; j < K; ++j) acc += wc[j] * buf[size_t(t + j)];
      y[t * C + c] = silu(acc);
    }
    for (int64_t j = 0; j < K - 1; ++j) conv_state[c * (K - 1) + j] = buf[size_t(T + j)];
  }
}

static float softplus(float x) { return x > 20.0f ? x : std::log1p(std::exp(x)); }

void gdn_gating(const float* a, const float* b, const float* A_log, const float* dt_bias, float* g, float* beta,
                int64_t T, int64_t Hv) {
  for (int64_t t = 0; t < T; ++t)
    for (int64_t h = 0; h < Hv; ++h) {
      g[t * Hv + h] = -std::exp(A_log[h]) * softplus(a[t * Hv + h] + dt_bias[h]);
      beta[t * Hv + h] = sigmoid(b[t * Hv + h]);
    }
}

namespace {

// q, k -> L2-normalised (eps 1e-6 inside the rsqrt, as transformers' l2norm); q also scaled by dk^-0.5.
void normalise_qk(const float* q, const float* k, std::vector<float>& qn, std::vector<float>& kn, int64_t T,
                  const GdnShape& s) {
  const int64_t n = T * s.num_k_heads;
  qn.assign(size_t(n * s.k_dim), 0);
  kn.assign(size_t(n * s.k_dim), 0);
  const float qscale = 1.0f / std::sqrt(float(s.k_dim));
  for (int64_t r = 0; r < n; ++r) {
    double sq = 0, sk = 0;
    for (int64_t i = 0; i < s.k_dim; ++i) {
      sq += double(q[r * s.k_dim + i]) * q[r * s.k_dim + i];
      sk += double(k[r * s.k_dim + i]) * k[r * s.k_dim + i];
    }
    float iq = float(1.0 / std::sqrt(sq + 1e-6)) * qscale, ik = float(1.0 / std::sqrt(sk + 1e-6));
    for (int64_t i = 0; i < s.k_dim; ++i) {
      qn[size_t(r * s.k_dim + i)] = q[r * s.k_dim + i] * iq;
      kn[size_t(r * s.k_dim + i)] = k[r * s.k_dim + i] * ik;
    }
  }
}

}  // namespace

void gated_delta_rule_recurrent(const float* q, const float* k, const float* v, const float* g, const float* beta,
                                float* state, float* out, int64_t T, const GdnShape& s) {
  std::vector<float> qn, kn;
  normalise_qk(q, k, qn, kn, T, s);
  const int64_t dk = s.k_dim, dv = s.v_dim, Hv = s.num_v_heads, ratio = s.num_v_heads / s.num_k_heads;
  std::vector<float> d(static_cast<size_t>(dv));
  for (int64_t t = 0; t < T; ++t)
    for (int64_t h = 0; h < Hv; ++h) {
      float* S = state + h * dk * dv;
      const float* kt = kn.data() + (t * s.num_k_heads + h / ratio) * dk;
      const float* qt = qn.data() + (t * s.num_k_heads + h / ratio) * dk;
      const float* vt = v + (t * Hv + h) * dv;
      const float decay = std::exp(g[t * Hv + h]), b = beta[t * Hv + h];
      for (int64_t i = 0; i < dk * dv; ++i) S[i] *= decay;
      for (int64_t j = 0; j < dv; ++j) {
        float m = 0;
        for (int64_t i = 0; i < dk; ++i) m += S[i * dv + j] * kt[i];
        d[size_t(j)] = b * (vt[j] - m);
      }
      for (int64_t i = 0; i < dk; ++i)
        for (int64_t j = 0; j < dv; ++j) S[i * dv + j] += kt[i] * d[size_t(j)];
      float* o = out + (t * Hv + h) * dv;
      for (int64_t j = 0; j < dv; ++j) {
        float acc = 0;
        for (int64_t i = 0; i < dk; ++i) acc += S[i * dv + j] * qt[i];
        o[j] = acc;
      }
    }
}

void gated_delta_rule_chunked(const float* q, const float* k, const float* v, const float* g, const float* beta,
                              float* state, float* out, int64_t T, const GdnShape& s, int64_t chunk,
                              std::span<const GdnStateSnapshot> snapshots) {
  std::vector<float> qn, kn;
  normalise_qk(q, k, qn, kn, T, s);
  const int64_t dk = s.k_dim, dv = s.v_dim, Hv = s.num_v_heads, ratio = s.num_v_heads / s.num_k_heads;
  const int64_t C = chunk;
  std::vector<float> G(static_cast<size_t>(C)), A(static_cast<size_t>(C * C)), U(static_cast<size_t>(C * dv)), W(static_cast<size_t>(C * dk)), Vp(static_cast<size_t>(C * dv));
  for (int64_t h = 0; h < Hv; ++h) {
    float* S = state + h * dk * dv;
    const int64_t kh = h / ratio;
    auto K = [&](int64_t t) { return kn.data() + (t * s.num_k_heads + kh) * dk; };
    auto Q = [&](int64_t t) { return qn.data() + (t * s.num_k_heads + kh) * dk; };
    auto V = [&](int64_t t) { return v + (t * Hv + h) * dv; };
    for (int64_t c0 = 0; c0 < T; c0 += C) {
      const int64_t L = std::min(C, T - c0);
      // Cumulative log-decay within the chunk.
      float acc = 0;
      for (int64_t i = 0; i < L; ++i) G[size_t(i)] = (acc += g[(c0 + i) * Hv + h]);
      // A[i][j] = beta_i (k_i . k_j) exp(G_i - G_j), j < i.
      for (int64_t i = 0; i < L; ++i)
        for (int64_t j = 0; j < i; ++j) {
          float dot = 0;
          for (int64_t x = 0; x < dk; ++x) dot += K(c0 + i)[x] * K(c0 + j)[x];
          A[size_t(i * C + j)] = beta[(c0 + i) * Hv + h] * dot * std::exp(G[size_t(i)] - G[size_t(j)]);
        }
      // Forward substitution: (I + A) U = beta v, (I + A) W = beta k exp(G).
      for (int64_t i = 0; i < L; ++i) {
        const float b = beta[(c0 + i) * Hv + h], eg = std::exp(G[size_t(i)]);
        for (int64_t x = 0; x < dv; ++x) U[size_t(i * dv + x)] = b * V(c0 + i)[x];
        for (int64_t x = 0; x < dk; ++x) W[size_t(i * dk + x)] = b * K(c0 + i)[x] * eg;
        for (int64_t j = 0; j < i; ++j) {
          const float a = A[size_t(i * C + j)];
          for (int64_t x = 0; x < dv; ++x) U[size_t(i * dv + x)] -= a * U[size_t(j * dv + x)];
          for (int64_t x = 0; x < dk; ++x) W[size_t(i * dk + x)] -= a * W[size_t(j * dk + x)];
        }
      }
      // V' = U - W S.
      for (int64_t i = 0; i < L; ++i)
        for (int64_t x = 0; x < dv; ++x) {
          float m = 0;
          for (int64_t y = 0; y < dk; ++y) m += W[size_t(i * dk + y)] * S[y * dv + x];
          Vp[size_t(i * dv + x)] = U[size_t(i * dv + x)] - m;
        }
      // O_i = exp(G_i) q_i S + sum_{j<=i} (q_i . k_j) exp(G_i - G_j) V'_j.
      for (int64_t i = 0; i < L; ++i) {
        float* o = out + ((c0 + i) * Hv + h) * dv;
        const float eg = std::exp(G[size_t(i)]);
        for (int64_t x = 0; x < dv; ++x) {
          float m = 0;
          for (int64_t y = 0; y < dk; ++y) m += Q(c0 + i)[y] * S[y * dv + x];
          o[x] = eg * m;
        }
        for (int64_t j = 0; j <= i; ++j) {
          float dot = 0;
          for (int64_t y = 0; y < dk; ++y) dot += Q(c0 + i)[y] * K(c0 + j)[y];
          const float w = dot * std::exp(G[size_t(i)] - G[size_t(j)]);
          for (int64_t x = 0; x < dv; ++x) o[x] += w * Vp[size_t(j * dv + x)];
        }
      }
      // S = exp(G_last) S + sum_j exp(G_last - G_j) k_j V'_j^T.
      const float glast = G[size_t(L - 1)], dl = std::exp(glast);
      for (int64_t i = 0; i < dk * dv; ++i) S[i] *= dl;
      for (int64_t j = 0; j < L; ++j) {
        const float e = std::exp(glast - G[size_t(j)]);
        for (int64_t y = 0; y < dk; ++y) {
          const float ky = K(c0 + j)[y] * e;
          for (int64_t x = 0; x < dv; ++x) S[y * dv + x] += ky * Vp[size_t(j * dv + x)];
        }
      }
      for (const GdnStateSnapshot& snap : snapshots)
        if (snap.chunk == c0 / C) std::memcpy(snap.dst + h * dk * dv, S, size_t(dk * dv) * sizeof(float));
    }
  }
}

}  // namespace moefold::cpu
