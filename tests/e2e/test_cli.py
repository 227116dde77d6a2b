"""The `moefold` command line as a user meets it: --version, --help with every option's default,
the --device choices of every model command, and --stats of generate and chat (stderr only, so
stdout stays pure JSON with --output json). Each test runs the real binary; all take seconds."""

import json
import re
import subprocess

import pytest

from conftest import ROOT, binary

FIXTURE = ROOT / "tests" / "fixtures" / "qwen3_5_moe"  # tiny random checkpoint, token ids only
STATS = re.compile(
    r"^stats: prompt (\d+) tokens, prefill \d+\.\d ms \(([\d.]+|-) tokens/s\); "
    r"output (\d+) tokens, decode \d+\.\d ms \(([\d.]+|-) tokens/s\)$",
    re.M,
)
# Every command that loads a model (as typed after `moefold`) with the other options it requires.
MODEL_COMMANDS = {
    "logits": ["--prompt-ids", "1", "--out", "/dev/null"],
    "generate": ["--prompt-ids", "1"],
    "chat": ["--message", "hi"],
    "serve": [],
    "profile": ["--workload", "prefill:4"],
}


def run(*args, timeout=120):
    return subprocess.run([binary(), *map(str, args)], capture_output=True, text=True, timeout=timeout)


def help_text(command):
    r = run(*command, "--help")
    assert r.returncode == 0, r.stderr
    return r.stdout


def option_line(help_out, name):
    """The help line that declares option `name` (its type, choices and default)."""
    for line in help_out.splitlines():
        if re.match(rf"^\s+(-\w, )?{re.escape(name)}\b", line):
            return line
    pytest.fail(f"{name} not in help:\n{help_out}")


def test_version_prints_project_version():
    r = run("--version")
    assert r.returncode == 0, r.stderr
    assert re.match(r"^moefold \d+\.\d+\.\d+( \(git [^)]+\))?$", r.stdout.strip()), r.stdout
    cmake = (ROOT / "CMakeLists.txt").read_text()
    version = re.search(r"project\(moefold VERSION (\S+)", cmake).group(1)
    assert r.stdout.split()[1] == version


# (command, option, default shown in --help), some in every subcommand; all but the bench serve one were
# not shown before.
DEFAULTS = [
    (["generate"], "--max-tokens", "256"),
    (["generate"], "--temperature", "0"),
    (["generate"], "--load-format", "auto"),
    (["generate"], "--device", "cpu"),
    (["chat"], "--top-p", "1"),
    (["chat"], "--repetition-penalty", "1"),
    (["chat"], "--sampling-seed", "-1"),
    (["logits"], "--seed", "0"),
    (["serve"], "--load-format", "auto"),
    (["serve"], "--device", "cpu"),
    (["serve"], "--max-prefill-chunk", "0"),
    (["profile"], "--load-format", "auto"),
    (["bench", "offline"], "--load-format", "dummy"),
    (["bench", "offline"], "--decode-steps", "32"),
    (["bench", "serve"], "--random-range-ratio", "0"),
]


@pytest.mark.parametrize("command,option,default", DEFAULTS, ids=lambda v: v if isinstance(v, str) else " ".join(v))
def test_help_shows_defaults(command, option, default):
    line = option_line(help_text(command), option)
    assert re.search(rf"={re.escape(default)}(\s|$)", line), line  # CLI11 writes "--max-tokens INT=256"


@pytest.mark.parametrize("command", MODEL_COMMANDS)
def test_device_lists_cpu_and_cuda(command):
    line = option_line(help_text([command]), "--device")
    assert "cpu" in line and "cuda" in line, line


@pytest.mark.parametrize("command", MODEL_COMMANDS)
def test_bad_device_fails_while_parsing(command):
    # --model points nowhere: the device must be refused before anything is opened.
    r = run(command, "--model", "/nonexistent/model", "--device", "tpu", *MODEL_COMMANDS[command])
    assert r.returncode != 0
    assert "tpu" in r.stderr and "cuda" in r.stderr, r.stderr
    assert "/nonexistent/model" not in r.stderr, r.stderr


def check_stats(stderr, prompt_tokens, output_tokens):
    m = STATS.findall(stderr)
    assert len(m) == 1, stderr
    prompt, prefill_rate, output, decode_rate = m[0]
    assert int(prompt) == prompt_tokens and int(output) == output_tokens
    assert float(prefill_rate) > 0 and float(decode_rate) > 0


def test_generate_token_ids_stats_keep_stdout_json():
    r = run("generate", "--model", FIXTURE, "--prompt-ids", "1,2,3", "--max-tokens", 5, "--ignore-eos",
            "--output", "json", "--stats")
    assert r.returncode == 0, r.stderr
    assert len(json.loads(r.stdout)["tokens"]) == 5  # stdout is exactly one JSON document
    check_stats(r.stderr, 3, 5)


def test_generate_text_stats_keep_stdout_json(model):
    d, _ = model
    r = run("generate", "--model", d, "--load-format", "dummy", "--prompt", "hello there", "--max-tokens", 4,
            "--ignore-eos", "--output", "json", "--stats")
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    assert len(out["tokens"]) == 4
    m = STATS.search(r.stderr)
    assert m, r.stderr
    check_stats(r.stderr, int(m.group(1)), 4)
    assert int(m.group(1)) >= 2  # "hello there" is more than one token


def test_chat_stats_each_turn(model):
    d, _ = model
    r = subprocess.run([binary(), "chat", "--model", str(d), "--load-format", "dummy", "--max-tokens", "3",
                        "--ignore-eos", "--stats"], input="hi\nhow are you\n", capture_output=True, text=True,
                       timeout=120)
    assert r.returncode == 0, r.stderr
    turns = STATS.findall(r.stderr)
    assert len(turns) == 2, r.stderr
    assert all(int(t[2]) == 3 for t in turns)
    assert int(turns[1][0]) > int(turns[0][0])  # the second prompt holds the first exchange


def test_no_stats_without_flag():
    r = run("generate", "--model", FIXTURE, "--prompt-ids", "1,2,3", "--max-tokens", 2, "--output", "json")
    assert r.returncode == 0, r.stderr
    assert "stats:" not in r.stderr
