#!/usr/bin/env python3
"""Where FP8 (e4m3, 128 x 128 block scales) loses precision in a checkpoint: per tensor kind, the relative
rms error of the quantised weights (||W8 * s - W|| / ||W||), the same over the partial edge blocks alone
(a dimension that is not a multiple of 128, e.g. SmolLM2's 576 = 4.5 blocks), and, for comparison, with
finer 1 x 128 blocks (one scale per row and 128 columns). numpy only (the quantiser of
make_fp8_fixtures.py). Usage: scripts/fp8_weight_error.py MODEL_DIR"""
import collections
import os
import re
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import make_fp8_fixtures as f8  # noqa: E402


def rel(a, b):
    d = float(np.sqrt(np.sum((a.astype(np.float64) - b) ** 2)))
    n = float(np.sqrt(np.sum(b.astype(np.float64) ** 2)))
    return d / n if n else 0.0


def rows_1x128(w):
    """Dequantised w with one scale per row and 128 columns."""
    R, C = w.shape
    out = np.empty_like(w)
    for c0 in range(0, C, 128):
        blk = w[:, c0:c0 + 128]
        s = np.abs(blk).max(axis=1, keepdims=True) / np.float32(f8.E4M3_MAX)
        s = np.where(s > 0, s, 1).astype(np.float32)
        out[:, c0:c0 + 128] = f8.e4m3_to_f32(f8.f32_to_e4m3(blk / s)) * s
    return out


def main():
    tensors = f8.read_checkpoint(sys.argv[1])
    acc = collections.defaultdict(lambda: [0.0, 0.0, 0.0, 0.0, 0.0, 0])  # err2, norm2, edge err2, edge norm2, err2 1x128
    for name, (dt, shape, arr) in sorted(tensors.items()):
        if not f8.quantisable(name, shape) or len(shape) != 2:
            continue
        w = f8.to_f32(dt, arr).reshape(shape)
        codes, scale, _ = f8.quantize_blocks(w, "f32")
        dq = f8.dequantize_blocks(codes, scale)
        kind = re.sub(r"^.*layers\.\d+\.", "", name).replace(".weight", "")
        a = acc[kind]
        a[0] += float(np.sum((dq.astype(np.float64) - w) ** 2))
        a[1] += float(np.sum(w.astype(np.float64) ** 2))
        C = shape[1]
        if C % 128:
            e = slice(C - C % 128, C)
            a[2] += float(np.sum((dq[:, e].astype(np.float64) - w[:, e]) ** 2))
            a[3] += float(np.sum(w[:, e].astype(np.float64) ** 2))
        a[4] += float(np.sum((rows_1x128(w).astype(np.float64) - w) ** 2))
        a[5] += 1
    print(f"{'tensor':24s} {'n':>3s} {'128x128 rel rms':>16s} {'partial col block':>18s} {'1x128 rel rms':>14s}")
    for kind, (e2, n2, ee2, en2, r2, n) in acc.items():
        edge = f"{np.sqrt(ee2 / en2):.4f}" if en2 else "-"
        print(f"{kind:24s} {n:3d} {np.sqrt(e2 / n2):16.4f} {edge:>18s} {np.sqrt(r2 / n2):14.4f}")


if __name__ == "__main__":
    main()
