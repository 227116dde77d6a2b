#!/usr/bin/env python3
"""Numpy model of the rounding in the tensor-core GDN prefill (src/ops/cuda/gated_delta_net_tc.cu).

Runs one head (dk = dv = 128) of the chunked delta rule (chunk 64) with bf16 / tf32 rounding at the
points where the kernel rounds, against an fp64 token-by-token recurrence, and prints the relative error
of the output and of the final state. Each rounding can be switched to exact (fp64) with an environment
variable set to 0, to see which ones the state error comes from:
  SPLIT=0  single bf16 (no residual term) for S in K S, T and R in V' = T R, e^(G_L - G) V' in the update
  TF32=0   exact off-diagonal block products of the triangular solve
Usage: python3 scripts/gpu/gdn_precision_model.py [T] [A_log] [dt_bias]   (defaults 200 -3 -3: slow decay)
No GPU needed; this is how the kernel's split-bf16 operands were chosen (state error ~1e-3 -> ~1e-5).
"""
import os
import sys

import numpy as np


def bf(x):
    """Round to bf16 (nearest even), returned as float64."""
    b = np.asarray(x, np.float32).view(np.uint32).astype(np.uint64)
    b = ((b + 0x7FFF + ((b >> 16) & 1)) >> 16) << 16
    return b.astype(np.uint32).view(np.float32).astype(np.float64)


def tf32(x):
    b = np.asarray(x, np.float32).view(np.uint32).astype(np.uint64)
    b = ((b + 0xFFF + ((b >> 13) & 1)) >> 13) << 13
    return b.astype(np.uint32).view(np.float32).astype(np.float64)


def split(x):
    """bf16 + bf16 residual (what the kernel feeds as two mma operands)."""
    h = bf(x)
    return h + bf(x - h)


def main():
    T = int(sys.argv[1]) if len(sys.argv) > 1 else 200
    A_log = float(sys.argv[2]) if len(sys.argv) > 2 else -3.0
    dt_bias = float(sys.argv[3]) if len(sys.argv) > 3 else -3.0
    use_split = os.environ.get("SPLIT", "1") == "1"
    use_tf32 = os.environ.get("TF32", "1") == "1"
    sp = split if use_split else bf
    tf = tf32 if use_tf32 else (lambda x: np.asarray(x, np.float64))
    rng = np.random.default_rng(0)
    dk = dv = 128
    q, k, v = (bf(rng.standard_normal((T, d))) for d in (dk, dk, dv))
    a, b = bf(rng.standard_normal(T)), bf(1.5 * rng.standard_normal(T))
    g = -np.exp(A_log) * np.where(a + dt_bias > 20, a + dt_bias, np.log1p(np.exp(a + dt_bias)))
    beta = 1 / (1 + np.exp(-b))
    S0 = 0.5 * rng.standard_normal((dk, dv))
    qn = q / np.sqrt((q * q).sum(-1, keepdims=True) + 1e-6) * dk ** -0.5
    kn = k / np.sqrt((k * k).sum(-1, keepdims=True) + 1e-6)

    S, O_ref = S0.copy(), np.zeros((T, dv))
    for t in range(T):
        S = np.exp(g[t]) * S
        S = S + np.outer(kn[t], beta[t] * (v[t] - S.T @ kn[t]))
        O_ref[t] = S.T @ qn[t]
    S_ref = S

    S, O = S0.copy(), np.zeros((T, dv))
    for c0 in range(0, T, 64):
        n = min(64, T - c0)
        Q, K, V, gg, bb = np.zeros((64, dk)), np.zeros((64, dk)), np.zeros((64, dv)), np.zeros(64), np.zeros(64)
        Q[:n], K[:n], V[:n], gg[:n], bb[:n] = qn[c0:c0 + n], kn[c0:c0 + n], v[c0:c0 + n], g[c0:c0 + n], beta[c0:c0 + n]
        G = np.cumsum(gg)
        D = np.exp(np.minimum(G[:, None] - G[None, :], 0))
        A = np.tril(bb[:, None] * (K @ K.T) * D, -1).astype(np.float32).astype(np.float64)
        M = np.tril((Q @ K.T) * D)
        Tm = np.zeros((64, 64))
        for w in range(4):  # diagonal blocks: fp32 substitution
            blk = slice(16 * w, 16 * w + 16)
            Tm[blk, blk] = np.linalg.inv(np.eye(16) + A[blk, blk]).astype(np.float32)
        for j in range(4):  # off-diagonal blocks, column by column, tf32 products
            for i in range(j + 1, 4):
                bi, bj = slice(16 * i, 16 * i + 16), slice(16 * j, 16 * j + 16)
                X = sum(tf(A[bi, 16 * m:16 * m + 16]) @ tf(Tm[16 * m:16 * m + 16, bj]) for m in range(j, i))
                Tm[bi, bj] = -(tf(Tm[bi, bi]) @ tf(X))
        KS = K @ sp(S)
        R = bb[:, None] * (V - np.exp(G)[:, None] * KS)
        VN = sp(Tm) @ sp(R)
        O[c0:c0 + n] = (np.exp(G)[:, None] * (Q @ bf(S)) + bf(M) @ bf(VN))[:n]
        S = np.exp(G[63]) * S + K.T @ sp(VN * np.exp(G[63] - G)[:, None])

    rel = lambda x, y: np.linalg.norm(x - y) / np.linalg.norm(y)  # noqa: E731
    print(f"T={T} A_log={A_log} dt_bias={dt_bias} SPLIT={int(use_split)} TF32={int(use_tf32)}: "
          f"out rel err {rel(bf(O), O_ref):.2e}, state rel err {rel(S, S_ref):.2e}")


if __name__ == "__main__":
    main()
