#!/usr/bin/env python3
"""TTFT of a long prompt whose prefix is in the server's prefix cache vs the same length cold.

Against a running `moefold serve` (standard library only, so it runs on the GPU machine as is):
for each of --repeat rounds, a cold request of --total random token ids (a prefix nobody sent), then
a warm-up request of the first --cached ids of another random prompt and the --total-id prompt that
extends it. Each timed request is streamed with max_tokens 1; TTFT is the time to its first content
chunk. Prints one line per request and a summary with the warm / cold ratio and the cached_tokens the
server reported (usage.prompt_tokens_details.cached_tokens).

Usage: prefix_ttft.py --url http://127.0.0.1:8000 [--cached 31744] [--total 32768] [--repeat 3]
"""

import argparse
import json
import random
import statistics
import time
import urllib.request


def prompt(n, seed):
    rng = random.Random(seed)
    return [rng.randrange(100, 20000) for _ in range(n)]


def timed(url, model, ids):
    body = {"model": model, "prompt": ids, "max_tokens": 1, "temperature": 0, "ignore_eos": True, "stream": True,
            "stream_options": {"include_usage": True}}
    req = urllib.request.Request(url + "/v1/completions", data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    t0 = time.perf_counter()
    ttft, usage = None, None
    with urllib.request.urlopen(req, timeout=600) as r:
        for line in r:
            line = line.decode().strip()
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            chunk = json.loads(line[6:])
            if chunk.get("choices") and ttft is None:
                ttft = time.perf_counter() - t0
            if chunk.get("usage"):
                usage = chunk["usage"]
    cached = (usage or {}).get("prompt_tokens_details", {}).get("cached_tokens")
    return ttft, cached


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--url", required=True)
    ap.add_argument("--model", default=None)
    ap.add_argument("--cached", type=int, default=31744)
    ap.add_argument("--total", type=int, default=32768)
    ap.add_argument("--repeat", type=int, default=3)
    a = ap.parse_args()
    model = a.model or json.load(urllib.request.urlopen(a.url + "/v1/models"))["data"][0]["id"]
    cold, warm = [], []
    salt = time.time_ns()  # prompts no earlier run of this script sent
    for i in range(a.repeat):
        t, c = timed(a.url, model, prompt(a.total, salt + 2 * i))
        cold.append(t)
        print(f"cold  round {i}: ttft {t * 1e3:9.1f} ms  cached_tokens {c}", flush=True)
        base = prompt(a.total, salt + 2 * i + 1)
        timed(a.url, model, base[:a.cached])  # fills the cache (pages + DeltaNet snapshot at its end)
        t, c = timed(a.url, model, base)
        warm.append(t)
        print(f"warm  round {i}: ttft {t * 1e3:9.1f} ms  cached_tokens {c} (expected {a.cached})", flush=True)
    mc, mw = statistics.median(cold), statistics.median(warm)
    print(f"| prompt | cached | cold TTFT ms | warm TTFT ms | warm/cold |")
    print(f"| {a.total} | {a.cached} | {mc * 1e3:.1f} | {mw * 1e3:.1f} | {mw / mc:.3f} |")


if __name__ == "__main__":
    main()
