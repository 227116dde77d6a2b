#!/usr/bin/env python3
"""Peers of moefold's FP8 decode kernels on the GPU machine (torch only): torch._scaled_mm for the dense
projections and torch._scaled_grouped_mm for the routed experts, at decode sizes, L2 flushed before each
timed run, weight bytes / time against a device-to-device copy measured in the same run. Prints one
`PEER ...` line per case (the same shapes as tests/cuda/fp8_kernels_test.cc's Fp8Bench)."""
import os
import sys

import torch

# FP8_PEER_T="1,8,64": the token counts to time (default 1, 2, 4, 8, 16, 32, 64).
TOKENS = tuple(int(t) for t in os.environ.get("FP8_PEER_T", "1,2,4,8,16,32,64").split(","))

dev = "cuda"
flush = torch.empty(256 << 20, dtype=torch.uint8, device=dev)


def timed(fn, iters=15):
    fn()
    ts = []
    for i in range(iters):
        flush.fill_(i & 0xFF)
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        fn()
        b.record()
        b.synchronize()
        ts.append(a.elapsed_time(b) * 1e3)
    ts.sort()
    return ts[len(ts) // 2]


def main():
    print("torch", torch.__version__, torch.cuda.get_device_name())
    src = torch.empty(1 << 30, dtype=torch.uint8, device=dev)
    dst = torch.empty_like(src)
    us = timed(lambda: dst.copy_(src), 8)
    peak = 2 * (1 << 30) / us * 1e-3
    print(f"PEER ceiling d2d_copy GB/s={peak:.0f}")
    f8 = torch.float8_e4m3fn
    for n, k in ((8192, 2048), (2048, 4096), (12288, 2048)):
        w = (torch.randn(n, k, device=dev) * 0.05).to(f8)
        for t in TOKENS:
            m = max(16, t)
            x = torch.randn(m, k, device=dev).to(f8)
            mode = None
            for name, sa, sb in (
                    ("block1x128x128x128", torch.ones(m, k // 128, device=dev), torch.ones(k // 128, n // 128, device=dev)),
                    ("rowwise", torch.ones(m, 1, device=dev), torch.ones(1, n, device=dev))):
                try:
                    torch._scaled_mm(x, w.t(), scale_a=sa, scale_b=sb, out_dtype=torch.bfloat16)
                    mode = (name, sa, sb)
                    break
                except Exception as e:  # noqa: BLE001 (report what this torch supports)
                    last = str(e).splitlines()[0][:120]
            if mode is None:
                print(f"PEER _scaled_mm N={n} K={k} T={t} unavailable: {last}")
                continue
            name, sa, sb = mode
            us = timed(lambda: torch._scaled_mm(x, w.t(), scale_a=sa, scale_b=sb, out_dtype=torch.bfloat16))
            gb = n * k / us * 1e-3
            print(f"PEER _scaled_mm({name}) N={n} K={k} T={t} us={us:.1f} GB/s={gb:.0f} ({100 * gb / peak:.0f}%)")
    # Routed experts: Qwen3.6-35B-A3B (E 256, k 8, H 2048, I 512); touched experts = min(E, T k), 16 rows each.
    E, k_, H, I = 256, 8, 2048, 512
    wg = (torch.randn(E, 2 * I, H, device=dev) * 0.03).to(f8)
    wd = (torch.randn(E, H, I, device=dev) * 0.03).to(f8)
    for t in TOKENS:
        g = min(E, t * k_)
        offs = torch.arange(16, 16 * g + 1, 16, device=dev, dtype=torch.int32)
        xa = torch.randn(16 * g, H, device=dev).to(f8)
        xd = torch.randn(16 * g, I, device=dev).to(f8)
        try:
            bg, bd = wg[:g].transpose(-2, -1), wd[:g].transpose(-2, -1)
            sa, sg, sd = (torch.ones(16 * g, device=dev), torch.ones(g, 2 * I, device=dev), torch.ones(g, H, device=dev))
            f_g = lambda: torch._scaled_grouped_mm(xa, bg, sa, sg, offs=offs, out_dtype=torch.bfloat16)
            f_d = lambda: torch._scaled_grouped_mm(xd, bd, sa, sd, offs=offs, out_dtype=torch.bfloat16)
            ug, ud = timed(f_g), timed(f_d)
        except Exception as e:  # noqa: BLE001
            print(f"PEER _scaled_grouped_mm T={t} unavailable: {str(e).splitlines()[0][:160]}")
            continue
        bg_bytes, bd_bytes = g * 2 * I * H, g * H * I
        print(f"PEER _scaled_grouped_mm(rowwise) T={t} touched={g} gate_up us={ug:.1f} GB/s={bg_bytes / ug * 1e-3:.0f} "
              f"down us={ud:.1f} GB/s={bd_bytes / ud * 1e-3:.0f} both GB/s={(bg_bytes + bd_bytes) / (ug + ud) * 1e-3:.0f} "
              f"({100 * (bg_bytes + bd_bytes) / (ug + ud) * 1e-3 / peak:.0f}%)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
