#!/usr/bin/env python3
"""Peers and ceilings of moefold's W8A8 prefill experts on the GPU machine (torch only): the FP8 and bf16
dense GEMM rates (torch._scaled_mm / torch.matmul at 8192^3), and torch._scaled_grouped_mm (FP8, rowwise
scales: torch's finest grouped scaling) and torch._grouped_mm (bf16) at the Qwen3.6-35B-A3B expert shape
(E 256, k 8, H 2048, I 512) with T tokens' pairs spread evenly over the experts. Prints one `PEER ...` line
per case (the shapes of tests/cuda/moe_fp8_prefill_test.cc's Fp8Bench.PrefillExperts)."""
import os
import sys

import torch

TOKENS = tuple(int(t) for t in os.environ.get("FP8_PEER_T", "4096,16384").split(","))
dev = "cuda"


def timed(fn, iters=10):
    for _ in range(2):
        fn()
    a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    ts = []
    for _ in range(iters):
        a.record()
        fn()
        b.record()
        b.synchronize()
        ts.append(a.elapsed_time(b) * 1e3)
    ts.sort()
    return ts[len(ts) // 2]


def main():
    print("torch", torch.__version__, torch.cuda.get_device_name())
    f8 = torch.float8_e4m3fn
    n = 8192
    x = torch.randn(n, n, device=dev).to(f8)
    w = torch.randn(n, n, device=dev).to(f8)
    sa, sb = torch.ones(n, 1, device=dev), torch.ones(1, n, device=dev)
    us = timed(lambda: torch._scaled_mm(x, w.t(), scale_a=sa, scale_b=sb, out_dtype=torch.bfloat16))
    print(f"PEER ceiling fp8_gemm(_scaled_mm rowwise 8192^3) TFLOP/s={2 * n ** 3 / us * 1e-6:.0f}")
    xb, wb = torch.randn(n, n, device=dev, dtype=torch.bfloat16), torch.randn(n, n, device=dev, dtype=torch.bfloat16)
    us = timed(lambda: xb @ wb.t())
    print(f"PEER ceiling bf16_gemm(matmul 8192^3) TFLOP/s={2 * n ** 3 / us * 1e-6:.0f}")
    del x, w, xb, wb
    E, k, H, I = 256, 8, 2048, 512
    wg = (torch.randn(E, 2 * I, H, device=dev) * 0.03).to(f8)
    wd = (torch.randn(E, H, I, device=dev) * 0.03).to(f8)
    wgb, wdb = wg.to(torch.bfloat16), wd.to(torch.bfloat16)
    for t in TOKENS:
        P = t * k
        per = P // E
        offs = torch.arange(per, per * E + 1, per, device=dev, dtype=torch.int32)
        xa, xd = torch.randn(P, H, device=dev).to(f8), torch.randn(P, I, device=dev).to(f8)
        sa, sg, sd = torch.ones(P, device=dev), torch.ones(E, 2 * I, device=dev), torch.ones(E, H, device=dev)
        fl_g, fl_d = 2.0 * P * H * 2 * I, 2.0 * P * I * H
        try:
            ug = timed(lambda: torch._scaled_grouped_mm(xa, wg.transpose(-2, -1), sa, sg, offs=offs, out_dtype=torch.bfloat16))
            ud = timed(lambda: torch._scaled_grouped_mm(xd, wd.transpose(-2, -1), sa, sd, offs=offs, out_dtype=torch.bfloat16))
            print(f"PEER _scaled_grouped_mm(fp8 rowwise) T={t} gate_up us={ug:.0f} ({fl_g / ug * 1e-6:.0f} TFLOP/s) "
                  f"down us={ud:.0f} ({fl_d / ud * 1e-6:.0f} TFLOP/s) both us={ug + ud:.0f} "
                  f"({(fl_g + fl_d) / (ug + ud) * 1e-6:.0f} TFLOP/s)")
        except Exception as e:  # noqa: BLE001 (report what this torch supports)
            print(f"PEER _scaled_grouped_mm T={t} unavailable: {str(e).splitlines()[0][:160]}")
        xab, xdb = xa.to(torch.bfloat16), xd.to(torch.bfloat16)
        try:
            ug = timed(lambda: torch._grouped_mm(xab, wgb.transpose(-2, -1), offs=offs))
            ud = timed(lambda: torch._grouped_mm(xdb, wdb.transpose(-2, -1), offs=offs))
            print(f"PEER _grouped_mm(bf16) T={t} gate_up us={ug:.0f} ({fl_g / ug * 1e-6:.0f} TFLOP/s) down us={ud:.0f} "
                  f"({fl_d / ud * 1e-6:.0f} TFLOP/s) both us={ug + ud:.0f} ({(fl_g + fl_d) / (ug + ud) * 1e-6:.0f} TFLOP/s)")
        except Exception as e:  # noqa: BLE001
            print(f"PEER _grouped_mm T={t} unavailable: {str(e).splitlines()[0][:160]}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
