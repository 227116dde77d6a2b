#!/usr/bin/env python3
"""Gated DeltaNet prefill: moefold's gdn_chunked_prefill beside FLA's Triton chunk_gated_delta_rule, same GPU run.

Runs on the GPU machine (torch + triton there; FLA from wheels: fla-core, einops). For each shape
S x len (S sequences of len tokens, Hk key / Hv value heads, dk = dv = 128, bf16 in, fp32 state):
  - moefold: build-cuda/tests/gdn_bench_test (GdnBench.DISABLED_Prefill), CUDA-graph replays;
  - FLA: chunk_gated_delta_rule(q, k, v, g, beta, initial_state, output_final_state=True,
    use_qk_l2norm_in_kernel=True) on [S, len, H, 128] tensors (g, beta precomputed: moefold's kernel also
    computes them from the raw logits), captured into a torch CUDA graph and replayed;
  - the device-to-device copy bandwidth (torch copy_, graph replays), the ceiling for conv1d prefill.
TFLOP/s count the recurrent form's 6 * tokens * Hv * dk * dv. Prints a table last.

Usage: python3 scripts/gpu/gdn_bench.py [--binary PATH] [--shapes 1:4096:16:32,...] [--reps N] [--no-fla]
       [--fla-shapes N] [--variants 'VAR=val;...'] [--dry-run]
"""
import argparse
import os
import re
import subprocess
import sys
import time

DEFAULT_SHAPES = ("1:4096:16:32,1:32768:16:32,8:4096:16:32,8:512:16:32,64:512:16:32,"
                  "1:4096:16:64,1:32768:16:64,8:4096:16:64,8:512:16:64,64:512:16:64")


def graph_time_us(fn, reps):
    """Mean microseconds of one CUDA-graph replay of fn() (falls back to eager launches if capture fails)."""
    import torch
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for _ in range(2):
            fn()
    torch.cuda.current_stream().wait_stream(s)
    torch.cuda.synchronize()
    mode = "graph"
    try:
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            fn()
        run = g.replay
    except Exception as e:  # noqa: BLE001 - report and time eagerly
        print(f"  (graph capture failed: {type(e).__name__}: {str(e)[:120]}; timing eager launches)", flush=True)
        torch.cuda.synchronize()
        run, mode = fn, "eager"
    for _ in range(3):
        run()
    a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    a.record()
    for _ in range(reps):
        run()
    b.record()
    b.synchronize()
    return 1e3 * a.elapsed_time(b) / reps, mode


def copy_bandwidth(reps):
    """Device-to-device copy of 2 GiB (bf16 elements; 16-byte vector copies), read + write bytes per second."""
    import torch
    n = 1 << 30  # elements per buffer (2 GiB)
    x = torch.ones(n, dtype=torch.bfloat16, device="cuda")
    y = torch.empty_like(x)
    us, _ = graph_time_us(lambda: y.copy_(x), max(reps, 50))
    # Also eager copies back to back (the figure other benches quote); the faster of the two counts.
    a_ev, b_ev = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    for _ in range(5):
        y.copy_(x)
    a_ev.record()
    for _ in range(50):
        y.copy_(x)
    b_ev.record()
    b_ev.synchronize()
    us = min(us, 1e3 * a_ev.elapsed_time(b_ev) / 50)
    del x, y
    torch.cuda.empty_cache()
    return 2 * 2 * n / (us * 1e-6) / 1e9  # GB/s


def fla_time(shape, reps):
    import torch
    import torch.nn.functional as F
    from fla.ops.gated_delta_rule import chunk_gated_delta_rule
    S, T, Hk, Hv = shape
    torch.manual_seed(0)
    dev = "cuda"
    q = torch.randn(S, T, Hk, 128, device=dev, dtype=torch.bfloat16)
    k = torch.randn(S, T, Hk, 128, device=dev, dtype=torch.bfloat16)
    v = torch.randn(S, T, Hv, 128, device=dev, dtype=torch.bfloat16)
    a = torch.rand(S, T, Hv, device=dev) * 4 - 2
    A_log = torch.linspace(-3, 1, Hv, device=dev)
    dt_bias = torch.linspace(-3, 0.5, Hv, device=dev)
    g = (-A_log.exp() * F.softplus(a + dt_bias)).float()
    beta = torch.sigmoid(torch.randn(S, T, Hv, device=dev)).to(torch.bfloat16)
    h0 = torch.zeros(S, Hv, 128, 128, device=dev, dtype=torch.float32)

    def run():
        return chunk_gated_delta_rule(q, k, v, g, beta, initial_state=h0, output_final_state=True,
                                      use_qk_l2norm_in_kernel=True)

    return graph_time_us(run, reps)


def moefold_times(binary, shapes, reps, timeout, extra_env=None):
    env = dict(os.environ, GDN_BENCH=shapes, GDN_BENCH_REPS=str(reps), **(extra_env or {}))
    cmd = [binary, "--gtest_also_run_disabled_tests", "--gtest_filter=GdnBench.DISABLED_Prefill"]
    try:
        p = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout)
        text = p.stdout + p.stderr
    except subprocess.TimeoutExpired as e:
        text = (e.stdout or b"").decode() if isinstance(e.stdout, bytes) else (e.stdout or "")
        print(f"moefold bench timed out after {timeout} s", flush=True)
    res = {}
    for m in re.finditer(r"BENCH kernel=(\S+) seqs=(\d+) len=(\d+) hk=(\d+) hv=(\d+) us=([\d.]+) bytes=([\d.]+)", text):
        key = (int(m[2]), int(m[3]), int(m[4]), int(m[5]))
        res.setdefault(key, {})[m[1]] = (float(m[6]), float(m[7]))
    for line in text.splitlines():
        if line.startswith("PHASES"):
            print("  " + line, flush=True)
    if not res:
        print(text[-3000:], flush=True)
    return res


HEADER = ("| shape (S x len, Hk/Hv) | moefold us | FLA us | FLA / moefold | moefold TFLOP/s | FLA TFLOP/s |"
          " chunk kernels us | conv1d us | conv1d % of copy |\n|---|---|---|---|---|---|---|---|---|")


def row(sh, mf, fla, bw):
    S, T, Hk, Hv = sh
    flop = 6.0 * S * T * Hv * 128 * 128
    m = mf.get(sh, {})
    mt = m.get("gdn_prefill", (float("nan"), 0))[0]
    ft = fla.get(sh, (float("nan"), ""))[0]
    ct, cb = m.get("conv1d_prefill", (float("nan"), 0))
    kt = m.get("gdn_tc_chunk", (float("nan"), 0))[0]
    conv_pct = 100.0 * cb / (ct * 1e-6) / 1e9 / bw if ct == ct else float("nan")
    return (f"| {S} x {T}, {Hk}/{Hv} | {mt:.1f} | {ft:.1f} | {ft / mt:.2f} | {flop / (mt * 1e-6) / 1e12:.1f} |"
            f" {flop / (ft * 1e-6) / 1e12:.1f} | {kt:.1f} | {ct:.1f} | {conv_pct:.0f} |")


def fake_moefold(shapes):
    """--dry-run stand-in for moefold_times: plausible numbers, no GPU."""
    return {sh: {"gdn_prefill": (100.0 * sh[0] * sh[1] / 4096, 1e6), "gdn_tc_chunk": (30.0, 1e6),
                 "conv1d_prefill": (50.0, 1e8)} for sh in shapes}


def print_variants(shapes, mf, variants):
    """The default path's time beside each variant's, one row per shape."""
    if not variants:
        return
    print()
    print("| shape | default us | " + " | ".join(variants) + " |")
    print("|---|---|" + "---|" * len(variants))
    for sh in shapes:
        S, T, Hk, Hv = sh
        vals = [mf.get(sh, {}).get("gdn_prefill", (float("nan"),))[0]]
        vals += [variants[name].get(sh, {}).get("gdn_prefill", (float("nan"),))[0] for name in variants]
        print(f"| {S} x {T}, {Hk}/{Hv} | " + " | ".join(f"{x:.1f}" for x in vals) + " |", flush=True)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--binary", default="build-cuda/tests/gdn_bench_test")
    ap.add_argument("--shapes", default=DEFAULT_SHAPES)
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--timeout", type=int, default=60, help="seconds for each run of the moefold binary")
    ap.add_argument("--fla-budget", type=float, default=150.0, help="seconds for all FLA shapes (compiles included)")
    ap.add_argument("--no-fla", action="store_true")
    ap.add_argument("--fla-shapes", type=int, default=0, help="time FLA on the first N shapes only (0: all)")
    ap.add_argument("--variants", default="",
                    help="';'-separated kernel variants to time besides the default, each 'VAR=val,VAR=val' "
                         "(e.g. MOEFOLD_GDN_TC_BV=16;MOEFOLD_GDN_TC_STAGES=1)")
    ap.add_argument("--dry-run", action="store_true",
                    help="no GPU: fake timings, exercise every printing path (a check of this script)")
    args = ap.parse_args()
    shapes = [tuple(int(x) for x in s.split(":")) for s in args.shapes.split(",")]
    variant_envs = [(v, dict(kv.split("=", 1) for kv in v.split(","))) for v in filter(None, args.variants.split(";"))]

    if args.dry_run:
        bw = 4200.0
        mf = fake_moefold(shapes)
        variants = {name: fake_moefold(shapes) for name, _ in variant_envs}
        fla_res = {sh: (150.0 * sh[0] * sh[1] / 4096, "graph") for sh in shapes[:-1]}  # one shape missing
        print_variants(shapes, mf, variants)
    else:
        import torch
        print(f"device: {torch.cuda.get_device_name()}, torch {torch.__version__}", flush=True)
        bw = copy_bandwidth(args.reps)
        print(f"copy bandwidth (device-to-device, read + write): {bw:.0f} GB/s", flush=True)
        mf = moefold_times(args.binary, args.shapes, args.reps, args.timeout)
        for sh in shapes:
            print("  " + row(sh, mf, {}, bw), flush=True)
        variants = {name: moefold_times(args.binary, args.shapes, args.reps, args.timeout, env)
                    for name, env in variant_envs}
        print_variants(shapes, mf, variants)  # before FLA: its compiles may outlast the caller's timeout
        fla_res = {}
        if not args.no_fla:
            t0 = time.time()
            try:
                import fla as fla_module
                print(f"fla {getattr(fla_module, '__version__', '?')}", flush=True)
            except ImportError as e:
                fla_module = None
                print(f"FLA not importable: {e}", flush=True)
            fla_shapes = shapes[:args.fla_shapes] if args.fla_shapes > 0 else shapes
            for sh in fla_shapes if fla_module else []:
                if time.time() - t0 > args.fla_budget:
                    print(f"FLA budget spent; skipping {sh}", flush=True)
                    continue
                try:
                    t1 = time.time()
                    fla_res[sh] = fla_time(sh, args.reps)
                    print(f"  fla {sh}: {fla_res[sh][0]:.1f} us ({fla_res[sh][1]}; {time.time() - t1:.0f} s incl."
                          " compile)", flush=True)
                    print("  " + row(sh, mf, fla_res, bw), flush=True)
                except Exception as e:  # noqa: BLE001 - report and go on
                    print(f"  fla {sh} failed: {type(e).__name__}: {str(e)[:200]}", flush=True)
                torch.cuda.empty_cache()

    print()
    print(f"copy bandwidth {bw:.0f} GB/s; TFLOP/s count 6 * tokens * Hv * 128 * 128 (recurrent form)")
    print(HEADER)
    for sh in shapes:
        print(row(sh, mf, fla_res, bw))
    sys.stdout.flush()


if __name__ == "__main__":
    main()
