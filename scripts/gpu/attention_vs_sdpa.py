#!/usr/bin/env python3
"""Prefill attention: moefold's kernels beside torch SDPA, in the same GPU run.

Runs the attention_test binary's AttentionPerf.DISABLED_Flash timings (PERF lines), then times
torch.nn.functional.scaled_dot_product_attention on the same shapes (bf16, causal; the
continuation case with a lower-right causal mask; K/V expanded to the query heads) and a bf16 GEMM
(torch.mm 8192^3) for the machine's matrix rate, and prints one table.

Usage (GPU machine, repository root, after `source scripts/gpu/env.sh build-cuda`):
  python3 scripts/gpu/attention_vs_sdpa.py [--binary build-cuda/tests/attention_test]
"""
import argparse
import os
import re
import subprocess
import sys

import torch
import torch.nn.functional as F

SHAPES = {  # name -> (seqs, new tokens per sequence, cached tokens per sequence)
    "1x4096": (1, 4096, 0),
    "1x32768": (1, 32768, 0),
    "8x4096": (8, 4096, 0),
    "1024+8192": (1, 1024, 8192),
}
HEADS = {"qwen3.5": (16, 2, 256), "qwen3": (32, 4, 128)}


def timed_ms(fn, warmup=2, iters=7):
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(iters):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        fn()
        b.record()
        b.synchronize()
        times.append(a.elapsed_time(b))
    times.sort()
    return times[len(times) // 2]


def flops(hq, d, seqs, n, ctx):
    return 4.0 * d * hq * seqs * (n * ctx + n * (n + 1) / 2)


def sdpa_ms(hq, hkv, d, seqs, n, ctx):
    q = torch.randn(seqs, hq, n, d, device="cuda", dtype=torch.bfloat16)
    k = torch.randn(seqs, hq, ctx + n, d, device="cuda", dtype=torch.bfloat16)
    v = torch.randn_like(k)
    if ctx == 0:
        return timed_ms(lambda: F.scaled_dot_product_attention(q, k, v, is_causal=True))
    from torch.nn.attention.bias import causal_lower_right

    mask = causal_lower_right(n, ctx + n)
    return timed_ms(lambda: F.scaled_dot_product_attention(q, k, v, attn_mask=mask))


def gemm_tflops():
    a = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
    b = torch.randn_like(a)
    ms = timed_ms(lambda: torch.mm(a, b), 3, 10)
    return 2 * 8192**3 / ms * 1e-9


VARIANT_COLUMNS = [  # perf kernel name -> column title (the variants beside the default)
    ("attn_ws", "ws"), ("attn_ws_nopp", "ws_nopp"), ("attn_ws_noiw", "ws_noiw"), ("attn_ws_plain", "ws_plain"),
    ("attn_ws_s3", "ws_s3"), ("attn_ws_bn64", "ws_bn64"), ("attn_ws_pp", "ws_pp"), ("attn_ws_qr", "ws_qr"), ("attn_ws2", "ws2"), ("attn_ws_persist", "ws_pers"), ("attn_ws2_tall", "ws2_tall"), ("attn_ws_persist_tall", "wsp_tall"), ("attn_wgmma", "wgmma"), ("attn_wgmma_vt", "wg_vt"), ("attn_wgmma_pipe", "wg_pipe"),
    ("attn_fa", "flash"),
]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--binary", default="build-cuda/tests/attention_test")
    ap.add_argument("--kernels", default="auto,ws,ws_qr:ws_nopp,ws_noiw,ws_plain:ws_s3,ws_bn64,ws_pp,wgmma",
                    help="variant groups (MOEFOLD_TEST_KERNELS values) separated by ':', one process each")
    ap.add_argument("--timeout", type=int, default=40, help="seconds per process")
    args = ap.parse_args()
    ours = {}
    rc = 0
    # One process per group of variants, so that a fault in one cannot hide the others' timings.
    for kernels in args.kernels.split(":"):
        env = dict(os.environ, MOEFOLD_TEST_KERNELS=kernels)
        test = f"AttentionPerf.DISABLED_Flash[{kernels}]"
        proc = subprocess.run(["timeout", str(args.timeout), args.binary, "--gtest_also_run_disabled_tests",
                               "--gtest_filter=AttentionPerf.DISABLED_Flash"], capture_output=True, text=True, env=env)
        for line in proc.stdout.splitlines():
            m = re.match(r"PERF kernel=(\S+) shape=(\S+) us=([\d.]+)", line)
            if m:
                print(line)
                name, hq, hkv, d, case = m.group(2).split(",")
                ours[(m.group(1), name, case)] = float(m.group(3)) / 1000.0
        if proc.returncode != 0:
            rc = 1
            print(f"{test}: rc={proc.returncode}", proc.stdout[-1500:], proc.stderr[-1500:], file=sys.stderr)
    gemm = gemm_tflops()
    cols = [(k, t) for k, t in VARIANT_COLUMNS if any(key[0] == k for key in ours)]
    print(f"\nbf16 GEMM (torch.mm 8192^3): {gemm:.0f} TFLOP/s   torch {torch.__version__}, {torch.cuda.get_device_name()}")
    print("moefold = the default (AttnKernel::Auto); SDPA/us > 1: moefold faster; variant columns in ms")
    print(f"{'heads':9} {'shape':10} {'moefold ms':>10} {'SDPA ms':>9} {'SDPA/us':>7} {'ours TF/s':>9} {'SDPA TF/s':>9} "
          f"{'ours/GEMM':>9} " + " ".join(f"{t:>8}" for _, t in cols))
    for hname, (hq, hkv, d) in HEADS.items():
        for sname, (seqs, n, ctx) in SHAPES.items():
            f = flops(hq, d, seqs, n, ctx)
            t_sdpa = sdpa_ms(hq, hkv, d, seqs, n, ctx)
            t_ours = ours.get(("attn_auto", hname, sname))
            if t_ours is None:  # the default's process failed: show the first variant that ran
                t_ours = next((ours[(k, hname, sname)] for k, _ in cols if (k, hname, sname) in ours), None)
            var = " ".join(f"{ours.get((k, hname, sname), float('nan')):8.3f}" for k, _ in cols)
            if t_ours is None:
                print(f"{hname:9} {sname:10} {'-':>10} {t_sdpa:9.3f}")
                continue
            print(f"{hname:9} {sname:10} {t_ours:10.3f} {t_sdpa:9.3f} {t_sdpa / t_ours:7.2f} {f / t_ours * 1e-9:9.0f} "
                  f"{f / t_sdpa * 1e-9:9.0f} {f / t_ours * 1e-9 / gemm:9.2f} {var}")
            torch.cuda.empty_cache()
    return rc


if __name__ == "__main__":
    sys.exit(main())
