"""End-to-end tests of `moefold bench serve` against a real `moefold serve` (the tiny CPU model of
conftest.py).

Covers: a random-token run with --ignore-eos (every request completes with exactly its output length,
input tokens from the server's usage equal the sent token ids, ordered percentiles, throughputs
consistent with the duration), text prompts from a JSONL file on the chat endpoint, --max-concurrency 1
(no two requests overlap), --ab against the same server (four runs, two pairs of ratios), failed
requests counted without a crash, an unreachable server, and `moefold bench` listing its subcommands.
Runs are a few prompts each to keep the suite short.
"""

import json
import math
import socket
import subprocess

import pytest

from conftest import binary

PERCENTILE_METRICS = ["ttft", "tpot", "itl", "e2el"]


def bench(*args, timeout=300):
    """Runs `moefold bench ...`; returns the CompletedProcess (text)."""
    return subprocess.run([binary(), "bench", *map(str, args)], capture_output=True, text=True, timeout=timeout)


def bench_serve(server, tmp_path, *args, name="result.json"):
    """Runs `moefold bench serve` against `server`, asserts success, returns (JSON result, stdout)."""
    out = tmp_path / name
    p = bench("serve", "--base-url", server.url, "--disable-tqdm", "--json", out, *args)
    assert p.returncode == 0, f"stdout:\n{p.stdout}\nstderr:\n{p.stderr}"
    return json.loads(out.read_text()), p.stdout


def check_run(r, num_prompts, output_len=None):
    """The invariants of every successful run's numbers."""
    assert r["completed"] == num_prompts and r["failed"] == 0, r["errors"]
    assert r["input_tokens_from_usage"] and r["output_tokens_from_usage"]
    if output_len is not None:
        assert r["total_output_tokens"] == num_prompts * output_len
    assert r["duration"] > 0
    assert math.isclose(r["request_throughput"], r["completed"] / r["duration"], rel_tol=1e-9)
    assert math.isclose(r["output_throughput"], r["total_output_tokens"] / r["duration"], rel_tol=1e-9)
    assert math.isclose(r["total_token_throughput"],
                        (r["total_input_tokens"] + r["total_output_tokens"]) / r["duration"], rel_tol=1e-9)
    assert r["mean_ttft_ms"] > 0 and r["min_ttft_ms"] > 0
    for m in PERCENTILE_METRICS:
        assert r[f"min_{m}_ms"] <= r[f"p50_{m}_ms"] <= r[f"p90_{m}_ms"] <= r[f"p99_{m}_ms"] <= r[f"max_{m}_ms"], m
    reqs = r["requests"]
    assert len(reqs) == num_prompts
    assert sum(q["output_tokens"] for q in reqs) == r["total_output_tokens"]
    assert sum(q["prompt_tokens"] for q in reqs) == r["total_input_tokens"]
    for q in reqs:
        assert q["success"] and q["error"] == ""
        assert 0 < q["ttft_ms"] <= q["latency_ms"]
        assert q["end_s"] <= r["duration"] + 1e-6  # the duration covers every request
        # Chunk gaps add up to the time between the first and the last content chunk.
        assert sum(q["itl_ms"]) <= q["latency_ms"] - q["ttft_ms"] + 1e-6


def test_random_token_ids_ignore_eos(server, model, tmp_path):
    r, stdout = bench_serve(server, tmp_path, "--tokenizer", model[0], "--random-prompt-format", "token-ids",
                            "--num-prompts", 6, "--random-input-len", 24, "--random-output-len", 8,
                            "--random-range-ratio", 0.5, "--ignore-eos", "--seed", 3)
    check_run(r, 6)
    # Output lengths are drawn in [4, 12]; with ignore_eos each request generates exactly its length,
    # and the server counts exactly the prompt tokens that were sent (drawn in [12, 36]).
    for q in r["requests"]:
        assert 4 <= q["output_tokens"] <= 12
        assert 12 <= q["prompt_tokens"] <= 36
        assert len(q["itl_ms"]) <= q["output_tokens"] - 1
    assert r["model_id"] == "tiny-moe"  # the first id of GET /v1/models
    assert "Serving Benchmark Result" in stdout and "P99 TTFT (ms):" in stdout and "Mean TPOT (ms):" in stdout


def test_random_text_prompts_exact_output_length(server, model, tmp_path):
    n, out_len = 5, 6
    r, _ = bench_serve(server, tmp_path, "--tokenizer", model[0], "--num-prompts", n, "--random-input-len", 32,
                       "--random-output-len", out_len, "--ignore-eos", "--request-rate", 50, "--burstiness", 2)
    check_run(r, n, output_len=out_len)
    assert r["request_rate"] == 50 and r["burstiness"] == 2
    # Decoded random ids re-encode (server side, same tokenizer) to about the drawn length.
    for q in r["requests"]:
        assert abs(q["prompt_tokens"] - 32) <= 3


def test_jsonl_file_on_chat_endpoint(server, tmp_path):
    data = tmp_path / "questions.jsonl"
    data.write_text("\n".join(json.dumps({"question": f"What is {i} plus {i}?", "answer": str(2 * i)})
                              for i in range(3)) + "\n")
    r, _ = bench_serve(server, tmp_path, "--endpoint", "/v1/chat/completions", "--dataset-name", "file",
                       "--dataset-path", data, "--dataset-field", "question", "--num-prompts", 4, "--output-len", 5,
                       "--ignore-eos")
    check_run(r, 4, output_len=5)
    # Chat prompts include the template's tokens: more than the question alone.
    assert all(q["prompt_tokens"] > 8 for q in r["requests"])


def test_max_concurrency_one_never_overlaps(server, model, tmp_path):
    r, stdout = bench_serve(server, tmp_path, "--tokenizer", model[0], "--random-prompt-format", "token-ids",
                            "--num-prompts", 5, "--random-input-len", 16, "--random-output-len", 6, "--ignore-eos",
                            "--max-concurrency", 1)
    check_run(r, 5, output_len=6)
    assert r["max_concurrency"] == 1 and r["max_concurrent_requests"] == 1
    spans = sorted((q["start_s"], q["end_s"]) for q in r["requests"])
    for (s0, e0), (s1, e1) in zip(spans, spans[1:]):
        assert e0 <= s1, f"request [{s0}, {e0}] overlaps [{s1}, {e1}]"
    assert "Maximum request concurrency:             1" in stdout


def test_ab_same_server_twice(server, model, tmp_path):
    r, stdout = bench_serve(server, tmp_path, "--tokenizer", model[0], "--random-prompt-format", "token-ids",
                            "--num-prompts", 3, "--random-input-len", 16, "--random-output-len", 4, "--ignore-eos",
                            "--ab", server.url)
    assert r["mode"] == "ab"
    assert [run["label"] for run in r["runs"]] == ["A1", "B1", "B2", "A2"]
    assert [run["target"] for run in r["runs"]] == ["a", "b", "b", "a"]
    assert r["targets"]["a"]["model_id"] == r["targets"]["b"]["model_id"] == "tiny-moe"
    for run in r["runs"]:
        check_run(run, 3, output_len=4)
    # The same requests in every run: the same prompt and output token counts.
    tokens = [[(q["prompt_tokens"], q["output_tokens"]) for q in run["requests"]] for run in r["runs"]]
    assert all(t == tokens[0] for t in tokens)
    cmp = r["comparison"]
    for key in ["request_throughput", "output_throughput", "total_token_throughput", "mean_ttft_ms", "p99_itl_ms",
                "median_e2el_ms"]:
        row = cmp[key]
        a1, b1, b2, a2 = (run_value(r, i, key) for i in range(4))
        assert (row["a1"], row["b1"], row["b2"], row["a2"]) == (a1, b1, b2, a2)
        assert math.isclose(row["ratio_pair1"], b1 / a1, rel_tol=1e-9)
        assert math.isclose(row["ratio_pair2"], b2 / a2, rel_tol=1e-9)
        assert row["ratio_min"] <= row["ratio_mean"] <= row["ratio_max"]
        assert row["ratio_pair1"] > 0 and row["ratio_pair2"] > 0
    assert "A/B comparison" in stdout and stdout.count("Serving Benchmark Result") == 4


def run_value(result, i, key):
    return result["runs"][i][key]


def test_failed_requests_are_counted_not_fatal(server, model, tmp_path):
    # Prompts longer than the server's max_model_len (1024): every request gets HTTP 400.
    out = tmp_path / "fail.json"
    p = bench("serve", "--base-url", server.url, "--disable-tqdm", "--json", out, "--tokenizer", model[0],
              "--random-prompt-format", "token-ids", "--num-prompts", 3, "--random-input-len", 1100,
              "--random-output-len", 4)
    assert p.returncode == 1, p.stderr
    assert "no request completed" in p.stderr
    r = json.loads(out.read_text())
    assert r["completed"] == 0 and r["failed"] == 3
    assert list(r["errors"].values()) == [3]
    assert next(iter(r["errors"])).startswith("HTTP 400")
    assert "Failed requests:                         3" in p.stdout


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_unreachable_server_is_a_clear_error(tmp_path):
    port = free_port()
    p = bench("serve", "--host", "127.0.0.1", "--port", port, "--num-prompts", 2, "--dataset-name", "file",
              "--dataset-path", tmp_path / "unused.txt", timeout=60)
    assert p.returncode == 1
    assert f"error: cannot reach http://127.0.0.1:{port}/v1/models" in p.stderr, p.stderr
    assert "Traceback" not in p.stderr and "terminate" not in p.stderr


def test_bad_options_are_clear_errors(server, model):
    p = bench("serve", "--base-url", server.url, "--num-prompts", 2)  # random prompts need a tokenizer
    assert p.returncode == 1 and "--tokenizer" in p.stderr, p.stderr
    p = bench("serve", "--base-url", server.url, "--tokenizer", model[0], "--percentile-metrics", "ttft,bogus")
    assert p.returncode == 1 and "unknown metric 'bogus'" in p.stderr, p.stderr


def test_bench_lists_its_subcommands():
    p = bench()
    assert p.returncode == 0
    assert "offline" in p.stdout and "serve" in p.stdout
    p = bench("offline", "--help")
    assert p.returncode == 0 and "--decode-batch" in p.stdout
