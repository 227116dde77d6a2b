"""--kv-cache-dtype (vLLM's flag; docs/fp8.md, "FP8 KV cache") on the command line and in serve, CPU:
the startup report's capacity (fp8 holds twice the tokens of bfloat16 and four times the CPU's fp32 for
the same --kv-cache-memory), the refusals (MLA, also with --device cuda; an unknown name),
drift's --b-kv-cache-dtype, and on the real SmolLM2-135M-Instruct: an fp8 KV server answers, and its
greedy tokens against transformers' (tests/fixtures/smollm2/greedy_reference.json) and against the fp32
KV cache are reported (how many of the 5 prompts match all 16 tokens) and checked to stay close."""

import json
import os
import pathlib
import re
import subprocess

import pytest

from conftest import ROOT, binary

SMOLLM2 = pathlib.Path(os.environ.get("MOEFOLD_SMOLLM2", ROOT / "models" / "smollm2-135m-instruct"))
REFERENCE = ROOT / "tests" / "fixtures" / "smollm2" / "greedy_reference.json"
KV_LINE = re.compile(r"KV cache (\S+) \(--kv-cache-dtype (\S+)\): (\d+) tokens")


def run(*args, timeout=120):
    return subprocess.run([binary(), *map(str, args)], capture_output=True, text=True, timeout=timeout)


def kv_report(srv):
    srv.log.flush()
    text = pathlib.Path(srv.log.name).read_text()
    m = KV_LINE.search(text)
    assert m, text
    return m.group(1), int(m.group(3))


def test_serve_reports_fp8_capacity_twice_bf16(model, start_server):
    seen = {}
    for dtype in ("auto", "bfloat16", "fp8"):
        srv = start_server(model[0], "--kv-cache-dtype", dtype, "--kv-cache-memory", "1M", "--max-num-seqs", 16)
        seen[dtype] = kv_report(srv)
        if dtype == "fp8":
            r = srv.post("/v1/completions", {"model": "tiny-moe", "prompt": "hello there", "max_tokens": 5,
                                             "temperature": 0, "ignore_eos": True})
            assert r.status_code == 200, r.text
            assert r.json()["usage"]["completion_tokens"] == 5
        srv.stop()
    assert seen["auto"][0] == "fp32" and seen["bfloat16"][0] == "bf16" and seen["fp8"][0] == "fp8_e4m3"
    assert seen["bfloat16"][1] == 2 * seen["auto"][1] > 0
    assert seen["fp8"][1] == 2 * seen["bfloat16"][1]


def test_refusals_are_clear(model):
    r = run("generate", "--model", ROOT / "tests" / "fixtures" / "deepseek_v32", "--prompt-ids", "1,2",
            "--max-tokens", "1", "--kv-cache-dtype", "fp8")
    assert r.returncode != 0 and "MLA" in r.stderr, r.stderr
    r = run("generate", "--model", model[0], "--load-format", "dummy", "--prompt-ids", "1", "--kv-cache-dtype",
            "fp8_e5m2")
    assert r.returncode != 0 and "--kv-cache-dtype" in r.stderr, r.stderr
    r = run("generate", "--model", ROOT / "tests" / "fixtures" / "deepseek_v32", "--prompt-ids", "1", "--device",
            "cuda", "--kv-cache-dtype", "fp8")
    assert r.returncode != 0 and "MLA" in r.stderr, r.stderr  # refused before any GPU is looked for


def test_generate_and_drift_take_the_flag(tmp_path):
    fixture = ROOT / "tests" / "fixtures" / "qwen3"
    outs = {}
    for dtype in ("auto", "fp8_e4m3", "fp8"):
        r = run("generate", "--model", fixture, "--prompt-ids", "1,2,3,4,5", "--max-tokens", "6", "--output", "json",
                "--temperature", "0", "--ignore-eos", "--kv-cache-dtype", dtype)
        assert r.returncode == 0, r.stderr
        outs[dtype] = json.loads(r.stdout.strip().splitlines()[-1])["tokens"]
    assert len(outs["fp8"]) == 6 and outs["fp8"] == outs["fp8_e4m3"]  # two names, one format
    out = tmp_path / "drift.json"
    r = run("drift", "--model", fixture, "--a-quantization", "none", "--b-quantization", "none",
            "--b-kv-cache-dtype", "fp8", "--num-prompts", "3", "--max-tokens", "6", "--json", out)
    assert r.returncode == 0, r.stderr
    assert "fp8 KV cache" in r.stdout
    j = json.loads(out.read_text())
    assert j["b"]["kv_cache_dtype"] == "fp8" and j["a"]["kv_cache_dtype"] == "auto" and len(j["prompts"]) == 3


@pytest.mark.skipif(not (SMOLLM2 / "model.safetensors").exists(), reason=f"converted SmolLM2 not found at {SMOLLM2}")
def test_smollm2_serves_with_fp8_kv_and_stays_close(start_server, tmp_path):
    ref = json.loads(REFERENCE.read_text())
    n = 16  # greedy tokens per prompt (of the reference's 32: keeps the test to seconds on 2 cores)
    got = {}
    for dtype in ("auto", "fp8"):
        srv = start_server(SMOLLM2, "--kv-cache-dtype", dtype, "--max-model-len", 512, "--max-num-seqs", 4,
                           "--num-kv-blocks", 64, load_format="safetensors", log_dir=str(tmp_path))
        assert kv_report(srv)[0] == ("fp8_e4m3" if dtype == "fp8" else "fp32")
        got[dtype] = []
        for case in ref["cases"]:
            r = srv.post("/v1/completions", {"model": srv_name(srv), "prompt": case["prompt_ids"], "max_tokens": n,
                                             "temperature": 0, "ignore_eos": True, "logprobs": 0,
                                             "return_tokens_as_token_ids": True}, timeout=600)
            assert r.status_code == 200, r.text
            got[dtype].append(token_ids(r.json()))
        srv.stop()
    first = []
    for case, a, b in zip(ref["cases"], got["auto"], got["fp8"]):
        assert len(b) == n
        first.append(next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), n))
    full = sum(f == n for f in first)
    ref_full = sum(b == case["greedy"][:n] for case, b in zip(ref["cases"], got["fp8"]))
    print(f"fp8 KV vs fp32 KV: {full} / {len(first)} prompts equal over {n} greedy tokens, first divergences "
          f"{first}; fp8 KV vs transformers: {ref_full} / {len(first)}")
    # Close, not equal: e4m3 keeps 3 mantissa bits (~4% per element on the attention output), and this
    # 135M model parts at near-ties (docs/fp8.md: 2 of these 5 prompts equal, first divergences
    # 16, 13, 0, 16, 7 when measured). What must hold: some prompts equal over all n tokens and, over the
    # prompts, at least half of the tokens before the first divergence.
    assert full >= 1 and sum(first) >= len(first) * n // 2, first


def srv_name(srv):
    return srv.http.get(srv.url + "/v1/models", timeout=10).json()["data"][0]["id"]


def token_ids(reply):
    """The generated ids (return_tokens_as_token_ids: logprobs tokens are "token_id:N")."""
    return [int(t.split(":", 1)[1]) for t in reply["choices"][0]["logprobs"]["tokens"]]
