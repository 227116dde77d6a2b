"""End-to-end tests of the prefix cache through `moefold serve` and the official `openai` client.

The tiny model is hybrid (two Gated DeltaNet layers): a cached prefix is restorable at the last
64-token boundary of an earlier prompt, so `usage.prompt_tokens_details.cached_tokens` is exactly
that boundary, and the replies must be those of a server with the cache off.
"""

import pytest
from prometheus_client.parser import text_string_to_metric_families

NAME = "tiny-moe"


def ids(n, seed):
    x = seed * 2654435761 + 17
    out = []
    for _ in range(n):
        x = (x * 1103515245 + 12345) % (1 << 31)
        out.append(10 + (x >> 8) % 200)
    return out


def metric(srv, name):
    for f in text_string_to_metric_families(srv.metrics_text()):
        for s in f.samples:
            if s.name == name:
                return s.value
    raise KeyError(name)


@pytest.fixture(scope="module")
def cached(model, start_server):
    return start_server(model[0], "--served-model-name", NAME)


@pytest.fixture(scope="module")
def uncached(model, start_server):
    return start_server(model[0], "--served-model-name", NAME, "--no-enable-prefix-caching")


def complete(client, prompt, **kw):
    r = client.completions.create(model=NAME, prompt=prompt, max_tokens=6, temperature=0, logprobs=1, **kw)
    return r.choices[0].text, r.choices[0].logprobs.token_logprobs, r.usage


def test_cached_tokens_exact_and_replies_unchanged(cached, uncached):
    c, u = cached.openai(), uncached.openai()
    base = ids(150, 1)
    text0, lp0, usage0 = complete(c, base)
    assert usage0.prompt_tokens == 150
    assert usage0.prompt_tokens_details.cached_tokens == 0
    assert (text0, lp0) == complete(u, base)[:2]
    queried0 = metric(cached, "moefold_prefix_cache_queries_total")
    hits0 = metric(cached, "moefold_prefix_cache_hits_total")
    # Longer prompts sharing the first 150 tokens: the snapshot at 128 (the last 64-token boundary).
    for extra, want in [(1, 128), (40, 128), (200, 128)]:
        p = base + ids(extra, 100 + extra)
        got = complete(c, p)
        assert got[2].prompt_tokens_details.cached_tokens == want, extra
        assert got[:2] == complete(u, p)[:2], f"cached reply differs (+{extra} tokens)"
    # The same prompt again: its own boundary at 128 (at least one token is always computed).
    assert complete(c, base)[2].prompt_tokens_details.cached_tokens == 128
    assert metric(cached, "moefold_prefix_cache_hits_total") - hits0 == 4 * 128
    assert metric(cached, "moefold_prefix_cache_queries_total") - queried0 == 151 + 190 + 350 + 150
    assert metric(cached, "moefold_prefix_cache_pages") > 0
    assert metric(cached, "moefold_prefix_cache_snapshot_bytes") > 0
    # The server without the cache reports none.
    assert complete(u, base)[2].prompt_tokens_details.cached_tokens == 0


def test_multi_turn_chat_streams_cached_tokens(cached, uncached):
    c, u = cached.openai(), uncached.openai()
    msgs = [{"role": "system", "content": "You are a helpful assistant. " * 12}]
    prev_prompt = 0
    for turn in range(4):
        msgs.append({"role": "user", "content": f"Question number {turn}: what comes next in the story?"})
        kw = dict(model=NAME, messages=msgs, max_tokens=8, temperature=0)
        full = c.chat.completions.create(**kw)
        chunks = list(c.chat.completions.create(**kw, stream=True, stream_options={"include_usage": True}))
        assert full.choices[0].message.content == u.chat.completions.create(**kw).choices[0].message.content
        usage = chunks[-1].usage
        assert usage.prompt_tokens == full.usage.prompt_tokens
        # The streamed request repeats the non-streamed one: its prompt's own last boundary (unless that
        # is the prompt's end: at least one token is always computed).
        p = usage.prompt_tokens
        if p % 64:
            assert usage.prompt_tokens_details.cached_tokens == (p // 64) * 64
        # The non-streamed one resumed from the previous turn's prompt (the prompts grow; the last tokens
        # of the previous prompt may tokenize differently once the reply follows them).
        got = full.usage.prompt_tokens_details.cached_tokens
        assert got % 64 == 0 and ((prev_prompt // 64) - 1) * 64 <= got <= (prev_prompt // 64) * 64, (turn, got)
        if turn == 0:
            assert got == 0
        prev_prompt = full.usage.prompt_tokens
        msgs.append({"role": "assistant", "content": full.choices[0].message.content})


def test_concurrent_requests_sharing_a_prefix(cached, uncached):
    import concurrent.futures as cf

    shared = ids(200, 7)
    prompts = [shared + ids(5 + 3 * i, 300 + i) for i in range(8)]
    complete(cached.openai(), shared)  # cache the shared prefix (snapshot at 192)
    with cf.ThreadPoolExecutor(8) as ex:
        got = list(ex.map(lambda p: complete(cached.openai(), p), prompts))
    for p, g in zip(prompts, got):
        assert g[2].prompt_tokens_details.cached_tokens == 192
        assert g[:2] == complete(uncached.openai(), p)[:2]


def test_bench_serve_prefix_repetition_reports_hit_rate(cached, model, tmp_path):
    import json
    import subprocess

    from conftest import binary

    out = tmp_path / "prefix.json"
    # Two prefixes of 130 tokens, 8 requests one at a time: each prefix's first request misses, the
    # other six resume at the prefix's last 64-token boundary (128).
    args = [binary(), "bench", "serve", "--base-url", cached.url, "--disable-tqdm", "--json", out,
            "--dataset-name", "prefix_repetition", "--tokenizer", model[0],
            "--random-prompt-format", "token-ids", "--prefix-repetition-prefix-len", 130,
            "--prefix-repetition-suffix-len", 10, "--prefix-repetition-num-prefixes", 2,
            "--num-prompts", 8, "--output-len", 4, "--max-concurrency", 1, "--ignore-eos", "--seed", 11]
    p = subprocess.run(list(map(str, args)), capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stdout + p.stderr
    r = json.loads(out.read_text())
    assert r["completed"] == 8
    assert r["total_input_tokens"] == 8 * 140
    assert r["total_cached_tokens"] == 6 * 128
    assert abs(r["prefix_cache_hit_rate"] - 6 * 128 / (8 * 140)) < 1e-9
    assert sorted(q["cached_tokens"] for q in r["requests"]) == [0, 0] + [128] * 6
    assert "Prefix cache hit rate (%):" in p.stdout


def run_multi_turn_bench(srv, model, out, *extra):
    import json
    import subprocess

    from conftest import binary

    args = [binary(), "bench", "serve", "--base-url", srv.url, "--disable-tqdm", "--json", out,
            "--dataset-name", "multi_turn", "--tokenizer", model[0], "--ignore-eos", "--seed", 5, *extra]
    p = subprocess.run(list(map(str, args)), capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stdout + p.stderr
    return json.loads(out.read_text()), p.stdout


def test_bench_serve_multi_turn_carries_replies_and_reports_hits(cached, model, tmp_path):
    # 3 conversations x 4 turns, one conversation at a time: every turn after the first resumes from the
    # previous turn's prompt, so it reports a hit on the 64-token grid.
    r, stdout = run_multi_turn_bench(cached, model, tmp_path / "mt.json", "--num-prompts", 3,
                                     "--multi-turn-num-turns", 4, "--multi-turn-shared-prefix-len", 90,
                                     "--multi-turn-prefix-len", 10, "--multi-turn-user-len", 20,
                                     "--output-len", 6, "--max-concurrency", 1)
    assert r["completed"] == 12 and r["failed"] == 0
    assert r["multi_turn_num_turns"] == 4
    reqs = r["requests"]
    for c in range(3):
        turns = reqs[4 * c:4 * c + 4]
        prompts = [q["prompt_tokens"] for q in turns]
        assert prompts == sorted(prompts) and len(set(prompts)) == 4, prompts  # each turn extends the last
        assert all(q["output_tokens"] == 6 for q in turns)
        for prev, q in zip(turns, turns[1:]):
            assert q["cached_tokens"] % 64 == 0 and q["cached_tokens"] >= 64, (c, q["cached_tokens"])
            assert q["cached_tokens"] <= prev["prompt_tokens"] + 6
    assert r["total_cached_tokens"] > 0 and 0 < r["prefix_cache_hit_rate"] < 1
    assert "multi_turn: 3 conversations x 4 turns" in stdout
    assert "Prefix cache hit rate (%):" in stdout


def test_long_multi_turn_load_stays_within_the_snapshot_budget(cached, model, start_server, tmp_path):
    import threading

    # One snapshot's size from the default server's gauges, then a server with room for three of them and
    # 64 KV pages: 8 conversations x 6 turns, 4 at once, must all complete with the gauges in budget.
    complete(cached.openai(), ids(130, 77))
    slot = metric(cached, "moefold_prefix_cache_snapshot_bytes") / metric(cached, "moefold_prefix_cache_snapshots")
    budget = int(3 * slot)
    srv = start_server(model[0], "--served-model-name", NAME, "--prefix-snapshot-memory", budget,
                       "--num-kv-blocks", 64, "--max-model-len", 1024, "--max-num-seqs", 4)
    seen, stop = [], threading.Event()

    def sample():
        while not stop.is_set():
            seen.append((metric(srv, "moefold_prefix_cache_snapshots"), metric(srv, "moefold_prefix_cache_snapshot_bytes")))
            stop.wait(0.02)

    t = threading.Thread(target=sample, daemon=True)
    t.start()
    try:
        r, _ = run_multi_turn_bench(srv, model, tmp_path / "load.json", "--num-prompts", 8,
                                    "--multi-turn-num-turns", 6, "--multi-turn-shared-prefix-len", 70,
                                    "--multi-turn-prefix-len", 20, "--multi-turn-user-len", 25,
                                    "--output-len", 8, "--max-concurrency", 4)
    finally:
        stop.set()
        t.join(5)
    assert r["completed"] == 48 and r["failed"] == 0, r["errors"]
    assert len(seen) > 3
    assert max(n for n, _ in seen) <= 3 and max(b for _, b in seen) <= budget
    assert metric(srv, "moefold_prefix_cache_snapshots") > 0
    assert r["total_cached_tokens"] > 0


def test_ten_turn_completion_chat_resumes_each_turn(cached, uncached):
    # Each turn's prompt is the previous prompt, its reply and a new line: it resumes at the previous
    # prompt's last 64-token boundary (one boundary lower at most, where the join re-tokenizes) and its
    # reply is the uncached server's.
    c, u = cached.openai(), uncached.openai()
    prompt = "Story so far: once upon a time there was a tiny model. " * 3
    prev = 0
    for turn in range(10):
        text, lp, usage = complete(c, prompt)
        assert (text, lp) == complete(u, prompt)[:2], turn
        got = usage.prompt_tokens_details.cached_tokens
        assert got % 64 == 0 and max(0, (prev // 64 - 1) * 64) <= got <= (prev // 64) * 64, (turn, got, prev)
        prev = usage.prompt_tokens
        prompt += text + f"\nTurn {turn}: and then what happened next in the story?\n"
    assert prev > 300
