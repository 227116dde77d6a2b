#!/usr/bin/env python3
"""Reference timing of the routed MoE chain with torch._grouped_mm, for side-by-side comparison with
moefold's MoeBench.RealShape (tests/cuda/moe_test/perf_test.cu) in the same device command.

Shape: Qwen3.5-35B-A3B layer (256 experts, hidden 2048, intermediate 512, top-8), bf16 weights laid out
as moefold's: gate_up [E, 2I, H] (gate rows first), down [E, H, I]. Per token count: router (fp32
softmax, top-8, renormalised), sort pairs by expert, gather, grouped gate_up GEMM, silu(g) * u, grouped
down GEMM, weighted combine. Each chain is captured in a CUDA graph (8 input sets rotated, so the touched
experts differ between replays); median of per-replay CUDA-event times. Also times the two grouped GEMMs
alone. Prints one 'TORCH ...' line per token count.
"""
import statistics
import sys

import torch


def main() -> int:
    if not torch.cuda.is_available() or not hasattr(torch, "_grouped_mm"):
        print("TORCH moe skipped: no CUDA or no torch._grouped_mm")
        return 0
    torch.manual_seed(0)
    dev = "cuda"
    E, k, H, I = 256, 8, 2048, 512
    wr = (torch.rand(E, H, device=dev) * 2 - 1).mul_(0.08).to(torch.bfloat16)
    gate_up = (torch.rand(E, 2 * I, H, device=dev) * 2 - 1).mul_(0.04).to(torch.bfloat16)
    down = (torch.rand(E, H, I, device=dev) * 2 - 1).mul_(0.08).to(torch.bfloat16)
    gu_t = gate_up.transpose(-2, -1)  # [E, H, 2I] view, column-major inner: what _grouped_mm wants
    dn_t = down.transpose(-2, -1)  # [E, I, H]
    print(f"TORCH moe E={E} k={k} H={H} I={I} torch={torch.__version__} (graph replays, median)")

    for T in (1, 8, 64, 4096):
        nsets = 8
        xs = [(torch.rand(T, H, device=dev) * 2 - 1).mul_(1.7).to(torch.bfloat16) for _ in range(nsets)]
        outs = [torch.empty(T, H, device=dev, dtype=torch.bfloat16) for _ in range(nsets)]
        state = {}

        def chain(i: int, gemm_only: bool = False):
            x = xs[i]
            if gemm_only:
                xg, offs = state[i]
            else:
                logits = (x @ wr.t()).float()
                p = torch.softmax(logits, dim=-1)
                w, ids = torch.topk(p, k, dim=-1)
                w = w / w.sum(-1, keepdim=True)
                flat = ids.reshape(-1)
                order = torch.argsort(flat, stable=True)
                counts = torch.zeros(E, dtype=torch.int64, device=dev).index_add_(0, flat, torch.ones_like(flat))
                offs = torch.cumsum(counts, 0).to(torch.int32)
                xg = x[order // k]
            gu = torch._grouped_mm(xg, gu_t, offs=offs)
            act = torch.nn.functional.silu(gu[:, :I]) * gu[:, I:]
            y = torch._grouped_mm(act, dn_t, offs=offs)
            if gemm_only:
                return y
            yw = torch.empty_like(y)
            yw[order] = y
            o = (yw.view(T, k, H).float() * w.unsqueeze(-1)).sum(1)
            outs[i].copy_(o)
            return counts

        # Static routing for the GEMM-only timing (computed once, eagerly).
        touched = []
        for i in range(nsets):
            logits = (xs[i] @ wr.t()).float()
            ids = torch.topk(torch.softmax(logits, -1), k, dim=-1).indices.reshape(-1)
            order = torch.argsort(ids, stable=True)
            counts = torch.zeros(E, dtype=torch.int64, device=dev).index_add_(0, ids, torch.ones_like(ids))
            state[i] = (xs[i][order // k].contiguous(), torch.cumsum(counts, 0).to(torch.int32))
            touched.append(int((counts > 0).sum()))

        def graphs(gemm_only: bool):
            gs = []
            s = torch.cuda.Stream()
            s.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(s):
                for i in range(nsets):
                    chain(i, gemm_only)  # warm-up (workspace allocation) outside capture
            torch.cuda.current_stream().wait_stream(s)
            for i in range(nsets):
                g = torch.cuda.CUDAGraph()
                with torch.cuda.graph(g):
                    chain(i, gemm_only)
                gs.append(g)
            return gs

        def time_graphs(gs, iters: int) -> float:
            for i in range(3 * nsets):
                gs[i % nsets].replay()
            ms = []
            a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            for i in range(iters):
                a.record()
                gs[i % nsets].replay()
                b.record()
                b.synchronize()
                ms.append(a.elapsed_time(b))
            return statistics.median(ms)

        iters = 50 if T >= 4096 else 200
        try:
            t_full = time_graphs(graphs(False), iters)
            t_gemm = time_graphs(graphs(True), iters)
        except Exception as e:  # noqa: BLE001 - report and go on
            print(f"TORCH moe T={T} failed: {type(e).__name__}: {e}")
            continue
        experts = sum(touched) / nsets
        wbytes = experts * 3 * I * H * 2
        flops = T * k * (2 * H * 2 * I + 2 * I * H)
        print(
            f"TORCH moe T={T} experts_touched={experts:.1f} full_ms={t_full:.4f} grouped_gemms_ms={t_gemm:.4f} "
            f"gemm_GB/s={wbytes / (t_gemm * 1e-3) / 1e9:.0f} gemm_TFLOP/s={flops / (t_gemm * 1e-3) / 1e12:.1f}"
        )
        sys.stdout.flush()
    return 0


if __name__ == "__main__":
    sys.exit(main())
