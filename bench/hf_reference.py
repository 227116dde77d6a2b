"""transformers reference speed on the same shape as `moefold bench offline` (run in the same command).

Builds the text model of a Qwen3.5/3.6-MoE config.json with random bf16 weights directly on the GPU
(transformers' own initialisation; no checkpoint, nothing downloaded) and times prefill of one
sequence and greedy decode steps at several batch sizes with a KV/state cache, printing one table.
Usage: python3 bench/hf_reference.py --model configs/qwen3.6-35b-a3b --prefill 4096 --decode-batch 1,8
"""
import argparse
import json
import statistics
import time

import torch
import transformers


def timed(fn, repeats):
    times = []
    for _ in range(repeats):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        fn()
        torch.cuda.synchronize()
        times.append(time.perf_counter() - t0)
    return statistics.median(times), max(times) - min(times)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", required=True)
    ap.add_argument("--prefill", default="4096")
    ap.add_argument("--decode-batch", default="1,8")
    ap.add_argument("--decode-context", type=int, default=512)
    ap.add_argument("--decode-steps", type=int, default=8)
    ap.add_argument("--json")
    args = ap.parse_args()

    cfg = transformers.AutoConfig.from_pretrained(args.model)
    text_cfg = getattr(cfg, "text_config", cfg)
    cls = transformers.AutoModelForCausalLM._model_mapping[type(text_cfg)]
    torch.manual_seed(0)
    torch.set_default_dtype(torch.bfloat16)
    t0 = time.perf_counter()
    with torch.device("cuda"):
        model = cls(text_cfg).eval()
    torch.cuda.synchronize()
    print(f"transformers {transformers.__version__}, torch {torch.__version__}, {cls.__name__} built in "
          f"{time.perf_counter() - t0:.1f} s, {sum(p.numel() for p in model.parameters()) / 1e9:.2f} B params")
    vocab = text_cfg.vocab_size
    rows = []
    with torch.inference_mode():
        for T in [int(x) for x in args.prefill.split(",") if x]:
            ids = torch.randint(0, min(vocab, 200000), (1, T), device="cuda")
            try:
                model(ids, use_cache=False, logits_to_keep=1)  # warm-up
                med, spread = timed(lambda: model(ids, use_cache=False, logits_to_keep=1), 3)
                rows.append({"case": f"prefill {T}", "median_s": med, "spread_s": spread, "tokens_per_s": T / med})
            except torch.OutOfMemoryError as e:
                rows.append({"case": f"prefill {T}", "error": f"out of memory: {e}"[:120]})
            torch.cuda.empty_cache()
        for B in [int(x) for x in args.decode_batch.split(",") if x]:
            ids = torch.randint(0, min(vocab, 200000), (B, args.decode_context), device="cuda")
            out = model(ids, use_cache=True, logits_to_keep=1)
            cache = out.past_key_values
            nxt = out.logits[:, -1:].argmax(-1)
            times = []
            for step in range(args.decode_steps + 1):
                torch.cuda.synchronize()
                t0 = time.perf_counter()
                out = model(nxt, past_key_values=cache, use_cache=True)
                torch.cuda.synchronize()
                if step:
                    times.append(time.perf_counter() - t0)
                cache, nxt = out.past_key_values, out.logits[:, -1:].argmax(-1)
            med = statistics.median(times)
            rows.append({"case": f"decode batch {B}", "median_s": med, "spread_s": max(times) - min(times),
                         "tokens_per_s": B / med})
            del cache, out
            torch.cuda.empty_cache()
    print(f"\n{'case (transformers)':<28} {'median':>12} {'spread':>12} {'tokens/s':>12}")
    for r in rows:
        if "error" in r:
            print(f"{r['case']:<28} {r['error']}")
        else:
            print(f"{r['case']:<28} {r['median_s'] * 1e3:10.1f} ms {r['spread_s'] * 1e3:10.1f} ms {r['tokens_per_s']:12.1f}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=2)


if __name__ == "__main__":
    main()
