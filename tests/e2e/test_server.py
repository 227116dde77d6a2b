"""End-to-end tests of `moefold serve` through raw HTTP and the official `openai` client.

Covers: batching invariance (16 concurrent greedy requests = each alone, also with 32-token
prefill chunks and with preemption from a tiny KV pool), streaming (same text as non-streamed,
stop strings never leak, multibyte characters arrive whole), errors (status and body while a
valid request completes; queue full), 200 concurrent streams, killed clients releasing their KV
pages and state slots, and /metrics (parses, counters match the requests made).
"""

import concurrent.futures as cf
import json
import os
import random
import signal
import subprocess
import sys
import threading
import time

import pytest
import requests
from prometheus_client.parser import text_string_to_metric_families

from conftest import MAX_MODEL_LEN


# --- helpers ----------------------------------------------------------------------------------


def stream_raw(server, path, body, timeout=120):
    """POSTs a streaming request; returns (list of JSON payloads, saw [DONE]). Decodes the raw
    bytes strictly as UTF-8, so a chunk that split a character would fail here."""
    with server.http.post(server.url + path, json=body, stream=True, timeout=timeout) as r:
        assert r.status_code == 200, r.text
        assert r.headers["Content-Type"].startswith("text/event-stream")
        raw = b"".join(r.iter_content(chunk_size=None))
    text = raw.decode("utf-8")  # strict
    events, done = [], False
    for block in text.split("\n\n"):
        if not block.strip():
            continue
        assert block.startswith("data: "), block
        data = block[len("data: "):]
        assert not done, "data after [DONE]"
        if data == "[DONE]":
            done = True
        else:
            events.append(json.loads(data))
    return events, done


def stream_text(events, index=0):
    out = []
    for e in events:
        for c in e.get("choices", []):
            if c["index"] == index:
                out.append(c["delta"].get("content") or "" if "delta" in c else c["text"])
    return "".join(out)


def finish_of(events, index=0):
    reasons = [c["finish_reason"] for e in events for c in e.get("choices", []) if c["index"] == index]
    assert all(r is None for r in reasons[:-1])
    return reasons[-1]


def token_ids(choice):
    """Token ids of a /v1/completions choice requested with logprobs and
    return_tokens_as_token_ids."""
    return [int(t.split(":", 1)[1]) for t in choice["logprobs"]["tokens"]]


def metrics(server):
    """{(name, frozenset(labels)): value} of every sample in /metrics."""
    out = {}
    for fam in text_string_to_metric_families(server.metrics_text()):
        for s in fam.samples:
            out[(s.name, frozenset(s.labels.items()))] = s.value
    return out


def metric(m, name, **labels):
    return m.get((name, frozenset(labels.items())), 0.0)


def wait_for(predicate, timeout, what):
    deadline = time.time() + timeout
    while time.time() < deadline:
        if predicate():
            return
        time.sleep(0.1)
    pytest.fail(f"timed out waiting for {what}")


# --- batching invariance ----------------------------------------------------------------------

N_CONCURRENT = 16


def greedy_jobs(vocab):
    rng = random.Random(1234)
    lens = [1, 300] + [rng.randint(2, 299) for _ in range(N_CONCURRENT - 2)]
    jobs = []
    for i, n in enumerate(lens):
        prompt = [rng.randint(3, min(vocab, 2999) - 1) for _ in range(n)]
        jobs.append({"prompt": prompt, "max_tokens": 4 + 3 * i, "temperature": 0, "ignore_eos": True,
                     "logprobs": 0, "return_tokens_as_token_ids": True})
    return jobs


def run_completion(server, body):
    r = server.post("/v1/completions", body)
    assert r.status_code == 200, r.text
    c = r.json()["choices"][0]
    return token_ids(c), c["finish_reason"]


@pytest.fixture(scope="module")
def alone(server, model):
    """Each greedy job run alone (one at a time) on the default server."""
    jobs = greedy_jobs(model[1].vocab_size)
    return jobs, [run_completion(server, j) for j in jobs]


@pytest.mark.parametrize("variant", ["default", "chunked32", "tiny_kv"])
def test_concurrent_greedy_equals_alone(variant, alone, server, model, start_server):
    jobs, expected = alone
    if variant == "default":
        srv = server
    elif variant == "chunked32":
        srv = start_server(model[0], "--max-num-seqs", 16, "--max-num-batched-tokens", 32)
    else:
        # 40 pages of 16 tokens: any one request fits, the 16 together (~180 pages) do not.
        srv = start_server(model[0], "--max-num-seqs", 16, "--num-kv-blocks", 40, "--max-model-len", 640)
    # tiny_kv must preempt, which needs the 16 requests in the server together: they start at one barrier,
    # and a round in which the scheduler still ran them apart (a loaded CI machine) is run again.
    for _ in range(3 if variant == "tiny_kv" else 1):
        start = threading.Barrier(N_CONCURRENT)

        def together(j):
            start.wait()
            return run_completion(srv, j)

        with cf.ThreadPoolExecutor(N_CONCURRENT) as ex:
            got = list(ex.map(together, jobs))
        for i, (g, e) in enumerate(zip(got, expected)):
            assert g == e, f"job {i} (prompt {len(jobs[i]['prompt'])} tokens) differs under {variant}"
            assert len(g[0]) == jobs[i]["max_tokens"] and g[1] == "length"
        if variant != "tiny_kv" or metric(metrics(srv), "moefold_preemptions_total") > 0:
            break
    if variant == "tiny_kv":
        m = metrics(srv)
        assert metric(m, "moefold_preemptions_total") > 0
        assert metric(m, "moefold_kv_cache_blocks_used") == 0


# --- streaming --------------------------------------------------------------------------------


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_stream_and_non_stream_same_text_openai(server, seed):
    client = server.openai()
    msgs = [{"role": "user", "content": f"Tell me a story number {seed}, café ☕ ünïcödé"}]
    full = client.chat.completions.create(model="tiny-moe", messages=msgs, max_tokens=40, temperature=0.9,
                                          seed=seed)
    chunks = list(client.chat.completions.create(model="tiny-moe", messages=msgs, max_tokens=40, temperature=0.9,
                                                 seed=seed, stream=True, stream_options={"include_usage": True}))
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == full.choices[0].message.content
    assert full.choices[0].finish_reason in ("stop", "length")
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == full.choices[0].finish_reason
    assert chunks[-1].usage.completion_tokens == full.usage.completion_tokens
    assert chunks[-1].usage.prompt_tokens == full.usage.prompt_tokens
    # The same through /v1/completions.
    p = f"Once upon a time {seed}"
    full = client.completions.create(model="tiny-moe", prompt=p, max_tokens=30, temperature=0.7, seed=seed)
    text = "".join(c.choices[0].text for c in client.completions.create(
        model="tiny-moe", prompt=p, max_tokens=30, temperature=0.7, seed=seed, stream=True))
    assert text == full.choices[0].text


def test_stop_string_over_several_tokens_never_leaks(server, model):
    table = model[1]
    tried = 0
    for seed in range(1, 40):
        base = {"prompt": "The quick brown fox", "max_tokens": 60, "temperature": 0.8, "seed": seed,
                "ignore_eos": True, "logprobs": 0, "return_tokens_as_token_ids": True}
        r = server.post("/v1/completions", base).json()["choices"][0]
        ids = token_ids(r)
        assert table.decode(ids) == r["text"]
        # A stop string = last character of token k + token k+1 + first character of token k+2,
        # each piece valid UTF-8 on its own; so it starts and ends inside tokens.
        for k in range(5, len(ids) - 3):
            try:
                a, b, c = (table.bytes[i].decode("utf-8") for i in ids[k:k + 3])
            except UnicodeDecodeError:
                continue
            if any(i in table.special for i in ids[k:k + 3]):
                continue
            if len(a) < 2 or len(c) < 2 or not b or "\ufffd" in a + b + c:
                continue
            stop = a[-1] + b + c[0]
            tried += 1
            expected = r["text"][: r["text"].find(stop)]
            events, done = stream_raw(server, "/v1/completions",
                                      {**base, "stop": [stop], "logprobs": None, "stream": True})
            assert done
            assert stream_text(events) == expected
            assert finish_of(events) == "stop"
            for e in events:  # no chunk ever carried the stop string's beginning past the cut
                for ch in e["choices"]:
                    assert stop not in ch["text"]
            nonstream = server.post("/v1/completions", {**base, "stop": stop, "logprobs": None}).json()
            assert nonstream["choices"][0]["text"] == expected
            assert nonstream["choices"][0]["finish_reason"] == "stop"
            break
        if tried >= 3:
            break
    assert tried >= 3, "found no multi-token stop string to test"


def test_multibyte_characters_split_across_tokens_arrive_intact(byte_model, start_server):
    model_dir, table = byte_model
    srv = start_server(model_dir, "--max-num-seqs", 8)
    split_chars = 0
    for seed in range(1, 30):
        body = {"prompt": "héllo wörld ☕", "max_tokens": 120, "temperature": 1.0, "seed": seed,
                "ignore_eos": True, "logprobs": 0, "return_tokens_as_token_ids": True}
        full = srv.post("/v1/completions", body).json()["choices"][0]
        ids = token_ids(full)
        assert full["text"] == table.decode(ids)
        events, done = stream_raw(srv, "/v1/completions", {**body, "stream": True, "logprobs": None})
        assert done and stream_text(events) == full["text"]
        # Count characters of 2+ bytes that the output assembled from several one-byte tokens.
        data = b"".join(table.bytes[i] for i in ids)
        text = data.decode("utf-8", errors="replace")
        split_chars += sum(1 for ch in text if ch != "\ufffd" and len(ch.encode()) > 1)
        if split_chars >= 3:
            break
    assert split_chars >= 3, "the model never produced a multibyte character to check"


# --- errors -----------------------------------------------------------------------------------


def bad_inputs(model_vocab):
    too_long = [5] * (MAX_MODEL_LEN + 10)
    msgs = [{"role": "user", "content": "hi"}]
    C, CH = "/v1/completions", "/v1/chat/completions"
    return [
        ("malformed json", C, b'{"prompt": "x", ', None),
        ("not an object", C, b'[1, 2, 3]', None),
        ("missing prompt", C, {"max_tokens": 3}, "prompt"),
        ("missing messages", CH, {"max_tokens": 3}, "messages"),
        ("messages wrong type", CH, {"messages": "hello"}, "messages"),
        ("prompt wrong type", C, {"prompt": {"a": 1}}, "prompt"),
        ("max_tokens wrong type", C, {"prompt": "x", "max_tokens": "ten"}, "max_tokens"),
        ("temperature wrong type", CH, {"messages": msgs, "temperature": "hot"}, "temperature"),
        ("stream wrong type", C, {"prompt": "x", "stream": "yes"}, "stream"),
        ("empty prompt", C, {"prompt": ""}, "prompt"),
        ("empty token prompt", C, {"prompt": []}, "prompt"),
        ("token id out of range", C, {"prompt": [1, model_vocab + 5]}, "prompt"),
        ("prompt too long", C, {"prompt": too_long, "max_tokens": 1}, "prompt"),
        ("max_tokens zero", C, {"prompt": "x", "max_tokens": 0}, "max_tokens"),
        ("max_tokens negative", CH, {"messages": msgs, "max_tokens": -4}, "max_tokens"),
        ("max_completion_tokens zero", CH, {"messages": msgs, "max_completion_tokens": 0}, "max_completion_tokens"),
        ("max_tokens beyond context", C, {"prompt": "x", "max_tokens": MAX_MODEL_LEN}, "max_tokens"),
        ("temperature negative", C, {"prompt": "x", "temperature": -0.5}, "temperature"),
        ("top_p zero", C, {"prompt": "x", "top_p": 0}, "top_p"),
        ("top_p above one", CH, {"messages": msgs, "top_p": 1.5}, "top_p"),
        ("invalid utf-8", C, b'{"prompt": "caf\xc3\x28 \xff"}', None),
        ("unknown model", CH, {"model": "gpt-17", "messages": msgs}, "model"),
        ("n too large", C, {"prompt": "x", "n": 1000}, "n"),
        ("top_logprobs without logprobs", CH, {"messages": msgs, "top_logprobs": 3}, "top_logprobs"),
        ("stop wrong type", C, {"prompt": "x", "stop": 5}, "stop"),
    ]


def test_bad_inputs_get_400_while_valid_request_completes(server, model):
    long_body = {"prompt": "keep going", "max_tokens": 1000, "temperature": 0, "ignore_eos": True, "stream": True}
    result = {}

    def valid():
        t0 = time.time()
        try:
            result["events"], result["done"] = stream_raw(server, "/v1/completions", long_body)
        except Exception as e:  # reported by the assertions below
            result["error"] = repr(e)
        result["seconds"] = time.time() - t0

    t = threading.Thread(target=valid)
    t.start()
    try:
        wait_for(lambda: metric(metrics(server), "moefold_num_requests_running") == 1, 20, "the valid request")
        for name, path, body, param in bad_inputs(model[1].vocab_size):
            if isinstance(body, bytes):
                r = server.http.post(server.url + path, data=body, headers={"Content-Type": "application/json"},
                                     timeout=30)
            else:
                r = server.post(path, body)
            assert r.status_code == 400, f"{name}: {r.status_code} {r.text}"
            err = r.json()["error"]
            assert set(err) == {"message", "type", "param", "code"}, name
            assert err["type"] == "invalid_request_error" and err["message"], name
            if param:
                assert err["param"] == param, f"{name}: {err}"
        # The server is still healthy for everyone else, and the valid request was running throughout.
        assert server.http.get(server.url + "/health", timeout=10).status_code == 200
        assert t.is_alive(), f"the valid request ended before the bad ones were answered: {result}"
    finally:
        t.join(120)
    assert result.get("done"), f"the concurrent valid request did not complete: {result.get('error')}"
    assert finish_of(result["events"]) == "length"


def test_openai_client_raises_bad_request(server):
    import openai

    client = server.openai()
    with pytest.raises(openai.BadRequestError) as e:
        client.chat.completions.create(model="tiny-moe", messages=[{"role": "user", "content": "x"}], top_p=2.0)
    assert e.value.status_code == 400
    assert "top_p" in str(e.value)
    with pytest.raises(openai.BadRequestError):
        client.completions.create(model="no-such-model", prompt="x")


def test_queue_full_gets_503(model, start_server):
    srv = start_server(model[0], "--max-num-seqs", 1, "--max-queue", 1)
    body = {"prompt": "x", "max_tokens": 900, "temperature": 0, "ignore_eos": True, "stream": True}
    first = srv.http.post(srv.url + "/v1/completions", json=body, stream=True, timeout=60)
    second = None
    try:
        first_iter = first.iter_lines()
        next(first_iter)  # running now
        wait_for(lambda: metric(metrics(srv), "moefold_num_requests_running") == 1, 10, "first request running")
        second = srv.http.post(srv.url + "/v1/completions", json=body, stream=True, timeout=60)  # waits
        wait_for(lambda: metric(metrics(srv), "moefold_num_requests_waiting") == 1, 10, "second request queued")
        r = srv.post("/v1/completions", {"prompt": "y", "max_tokens": 2})
        assert r.status_code == 503
        err = r.json()["error"]
        assert err["code"] == "queue_full" and err["message"]
    finally:
        first.close()
        if second is not None:
            second.close()


def test_n_choices_and_logprobs_formats(server):
    r = server.post("/v1/completions", {"prompt": "abc", "n": 3, "max_tokens": 5, "temperature": 1.0, "seed": 5,
                                        "logprobs": 2, "ignore_eos": True}).json()
    assert [c["index"] for c in r["choices"]] == [0, 1, 2]
    assert r["usage"]["completion_tokens"] == 15
    for c in r["choices"]:
        lp = c["logprobs"]
        assert len(lp["tokens"]) == len(lp["token_logprobs"]) == len(lp["top_logprobs"]) == 5
        assert all(len(t) <= 2 for t in lp["top_logprobs"]) and all(x <= 0 for x in lp["token_logprobs"])
    client = server.openai()
    out = client.chat.completions.create(model="tiny-moe", messages=[{"role": "user", "content": "hi"}],
                                         max_tokens=4, logprobs=True, top_logprobs=3, temperature=0)
    content = out.choices[0].logprobs.content
    assert len(content) == out.usage.completion_tokens
    for entry in content:
        assert len(entry.top_logprobs) == 3 and entry.logprob <= 0
        assert entry.top_logprobs[0].logprob >= entry.top_logprobs[-1].logprob


def test_models_and_health(server):
    m = server.http.get(server.url + "/v1/models", timeout=10).json()
    assert m["object"] == "list" and m["data"][0]["id"] == "tiny-moe"
    assert server.openai().models.list().data[0].id == "tiny-moe"
    assert server.http.get(server.url + "/health", timeout=10).status_code == 200
    r = server.http.get(server.url + "/v1/nothing", timeout=10)
    assert r.status_code == 404 and r.json()["error"]["message"]


# --- load -------------------------------------------------------------------------------------


def test_200_concurrent_streaming_clients(server):
    variants = [{"prompt": f"Client variant {v}: ", "max_tokens": 6 + v, "temperature": 0.8, "seed": v,
                 "ignore_eos": True} for v in range(8)]
    reference = [server.post("/v1/completions", v).json()["choices"][0]["text"] for v in variants]

    def client(i):
        v = i % len(variants)
        events, done = stream_raw(server, "/v1/completions", {**variants[v], "stream": True})
        return v, events, done

    with cf.ThreadPoolExecutor(200) as ex:
        results = list(ex.map(client, range(200)))
    assert len(results) == 200
    for v, events, done in results:
        assert done
        assert stream_text(events) == reference[v]
        assert finish_of(events) == "length"
        assert len({e["id"] for e in events}) == 1


CLIENT = r"""
import json, sys, requests
s = requests.Session(); s.trust_env = False
body = {"prompt": "never ending", "max_tokens": 900, "temperature": 0, "ignore_eos": True, "stream": True}
with s.post(sys.argv[1] + "/v1/completions", json=body, stream=True, timeout=60) as r:
    for line in r.iter_lines():
        if line:
            print("chunk", flush=True)
"""


def test_killed_clients_release_kv_pages_and_state_slots(model, start_server):
    srv = start_server(model[0], "--max-num-seqs", 8)
    before = metrics(srv)
    procs = [subprocess.Popen([sys.executable, "-c", CLIENT, srv.url], stdout=subprocess.PIPE, text=True)
             for _ in range(6)]
    try:
        for p in procs:
            assert p.stdout.readline().startswith("chunk")  # the stream is flowing
        m = metrics(srv)
        assert metric(m, "moefold_num_requests_running") == 6
        assert metric(m, "moefold_kv_cache_blocks_used") > 0
        assert metric(m, "moefold_deltanet_state_slots_used") == 6
    finally:
        for p in procs:
            p.send_signal(signal.SIGKILL)
            p.wait(10)

    def released():
        m = metrics(srv)
        return (metric(m, "moefold_num_requests_running") == 0 and metric(m, "moefold_num_requests_waiting") == 0
                and metric(m, "moefold_kv_cache_blocks_used") == 0
                and metric(m, "moefold_deltanet_state_slots_used") == 0)

    wait_for(released, 20, "pool usage back to zero")
    after = metrics(srv)
    aborted = metric(after, "moefold_request_finish_total", reason="abort") - \
        metric(before, "moefold_request_finish_total", reason="abort")
    assert aborted == 6
    # The server still answers.
    assert srv.post("/v1/completions", {"prompt": "x", "max_tokens": 2}).status_code == 200


# --- metrics ----------------------------------------------------------------------------------


def test_metrics_parse_and_counters_match(model, start_server):
    srv = start_server(model[0], "--served-model-name", "metrics-model")
    prompt_tokens = completion_tokens = 0
    ok = 0
    for i in range(5):
        r = srv.post("/v1/completions", {"prompt": f"count {i}", "max_tokens": 3 + i, "ignore_eos": True}).json()
        prompt_tokens += r["usage"]["prompt_tokens"]
        completion_tokens += r["usage"]["completion_tokens"]
        ok += 1
    for i in range(3):
        events, done = stream_raw(srv, "/v1/chat/completions", {
            "messages": [{"role": "user", "content": f"chat {i}"}], "max_tokens": 4, "ignore_eos": True,
            "stream": True, "stream_options": {"include_usage": True}})
        assert done
        usage = events[-1]["usage"]
        prompt_tokens += usage["prompt_tokens"]
        completion_tokens += usage["completion_tokens"]
    bad = 0
    for body in ({"prompt": ""}, {"prompt": "x", "top_p": 7}, {"model": "other", "prompt": "x"}):
        assert srv.post("/v1/completions", body).status_code == 400
        bad += 1

    families = {f.name: f for f in text_string_to_metric_families(srv.metrics_text())}
    assert families["moefold_requests"].type == "counter"
    assert families["moefold_time_to_first_token_seconds"].type == "histogram"
    m = metrics(srv)
    assert metric(m, "moefold_requests_total", endpoint="/v1/completions", status="200") == ok
    assert metric(m, "moefold_requests_total", endpoint="/v1/chat/completions", status="200") == 3
    assert metric(m, "moefold_requests_total", endpoint="/v1/completions", status="400") == bad
    assert metric(m, "moefold_prompt_tokens_total") == prompt_tokens
    assert metric(m, "moefold_generation_tokens_total") == completion_tokens
    assert metric(m, "moefold_request_finish_total", reason="length") == 8
    assert metric(m, "moefold_time_to_first_token_seconds_count") == 8
    assert metric(m, "moefold_inter_token_latency_seconds_count") == completion_tokens - 8
    assert metric(m, "moefold_time_to_first_token_seconds_bucket", le="+Inf") == 8
    assert metric(m, "moefold_num_requests_running") == 0
    assert metric(m, "moefold_kv_cache_blocks_used") == 0
    assert metric(m, "moefold_kv_cache_blocks_total") > 0
    assert metric(m, "moefold_deltanet_state_slots_total") > 0
