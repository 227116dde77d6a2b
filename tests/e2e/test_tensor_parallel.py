"""Tensor and expert parallelism from the command line (--device cpu): `generate`, `logits` and
`serve` with --tensor-parallel-size / -tp and --enable-expert-parallel give TP 1's greedy tokens (and
logits within fp32 tolerance: the ranks' partial sums round differently), and sizes that do not
divide the model fail with a clear message."""

import json
import pathlib
import subprocess

import numpy as np

from conftest import binary

ROOT = pathlib.Path(__file__).resolve().parents[2]
FIXTURES = ROOT / "tests" / "fixtures"
PROMPT = "1,7,42,99,3,120,17,5,64,11"


def run(*args, timeout=120):
    return subprocess.run([binary(), *map(str, args)], capture_output=True, text=True, timeout=timeout)


def greedy_tokens(model, *extra):
    r = run("generate", "--model", FIXTURES / model, "--prompt-ids", PROMPT, "--max-tokens", 8, "--output", "json",
            *extra)
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)["tokens"]


def test_generate_with_tp_and_ep_gives_tp1_tokens():
    for model in ("qwen3_5_moe", "qwen3_next", "llama"):
        ref = greedy_tokens(model)
        assert greedy_tokens(model, "-tp", 2) == ref, model
        assert greedy_tokens(model, "--tensor-parallel-size", 4, "--enable-expert-parallel") == ref, model
        assert greedy_tokens(model, "-tp=4", "--enable-expert-parallel", "--expert-parallel-size", 2) == ref, model


def test_logits_with_tp_within_fp32_tolerance(tmp_path):
    outs = {}
    for tp in (1, 2, 4):
        out = tmp_path / f"tp{tp}.npy"
        r = run("logits", "--model", FIXTURES / "qwen3_5_moe", "--prompt-ids", PROMPT, "--out", out, "-tp", tp)
        assert r.returncode == 0, r.stderr
        outs[tp] = np.load(out)
    ref = outs[1]
    for tp in (2, 4):
        assert outs[tp].shape == ref.shape
        assert np.max(np.abs(outs[tp] - ref)) <= 2e-5 * max(1.0, np.max(np.abs(ref))), tp


def test_sizes_that_do_not_divide_the_model_fail_clearly():
    r = run("generate", "--model", FIXTURES / "qwen3_5_moe", "--prompt-ids", PROMPT, "-tp", 8)
    assert r.returncode == 1
    assert "tensor parallel size 8 does not divide the 4 attention heads" in r.stderr
    r = run("generate", "--model", FIXTURES / "qwen3_5_moe", "--prompt-ids", PROMPT, "-tp", 2,
            "--expert-parallel-size", 2)
    assert r.returncode == 1
    assert "needs --enable-expert-parallel" in r.stderr
    r = run("generate", "--model", FIXTURES / "deepseek_v4", "--prompt-ids", "5,6,7", "-tp", 2)
    assert r.returncode == 1
    assert "DeepSeek-V4" in r.stderr


def test_help_lists_the_parallel_flags():
    for cmd in ("generate", "chat", "logits", "serve", "profile", "bench offline"):
        r = run(*cmd.split(), "--help")
        assert r.returncode == 0
        for flag in ("--tensor-parallel-size", "--enable-expert-parallel", "--expert-parallel-size"):
            assert flag in r.stdout, (cmd, flag)


def test_serve_with_tp_and_ep_answers_like_tp1(model, start_server):
    model_dir, _ = model
    body = {"model": "m", "prompt": [5, 9, 13, 2, 40, 77], "max_tokens": 8, "temperature": 0}
    texts = []
    for args in ((), ("-tp", 2), ("-tp", 4, "--enable-expert-parallel")):
        s = start_server(model_dir, "--max-num-seqs", 4, "--served-model-name", "m", *args)
        r = s.post("/v1/completions", body)
        assert r.status_code == 200, r.text
        texts.append(r.json()["choices"][0]["text"])
        if args:  # the per-rank expert load is a metric of parallel servers
            assert f'moefold_expert_routed_pairs_total{{rank="{args[1] - 1}"}}' in s.metrics_text()
        s.stop()
    assert texts[1] == texts[0] and texts[2] == texts[0]


def test_profile_shows_the_collectives_as_communication():
    r = run("profile", "--model", FIXTURES / "qwen3_5_moe", "--workload", "prefill:16", "--workload", "decode:1x4",
            "-tp", 2, "--enable-expert-parallel", "--require-kernel", "cpu::all_to_all:moe_dispatch")
    assert r.returncode == 0, r.stderr
    for kernel in ("cpu::all_reduce", "cpu::all_gather:logits", "cpu::all_to_all:moe_dispatch", "cpu::moe_experts:ep"):
        assert kernel in r.stdout, kernel
    assert any(line.startswith("communication") for line in r.stdout.splitlines())
