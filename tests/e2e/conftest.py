"""Fixtures for the `moefold serve` end-to-end tests.

Every server is a real `moefold serve` process on a free loopback port (``--port 0``; the port is
read from its first stdout line) serving a tiny dummy-weight qwen3_5_moe model (two Gated DeltaNet
and two attention layers, MoE FFN) written into a temporary directory together with a tokenizer
and a ChatML chat template. Servers are killed at the end of their scope, also when a test fails.
"""

import json
import os
import pathlib
import subprocess
import threading
import time

import pytest
import requests

ROOT = pathlib.Path(__file__).resolve().parents[2]
FIXTURE_TOKENIZER = ROOT / "tests" / "fixtures" / "tokenizer" / "qwen35_mini" / "tokenizer.json"
CHATML = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)
MAX_MODEL_LEN = 1024

# Loopback only: never let a proxy setting route the tests elsewhere.
os.environ["NO_PROXY"] = "127.0.0.1,localhost"
os.environ["no_proxy"] = "127.0.0.1,localhost"


def binary() -> str:
    path = os.environ.get("MOEFOLD_BINARY") or str(ROOT / "build" / "moefold")
    if not os.path.exists(path):
        pytest.fail(f"moefold binary not found at {path}; build it or set MOEFOLD_BINARY")
    return path


# --- tokenizers -------------------------------------------------------------------------------


def _bytes_to_unicode():
    """GPT-2's byte <-> printable-character table used by byte-level BPE vocabularies."""
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return dict(zip(bs, map(chr, cs)))


BYTE_TO_CHAR = _bytes_to_unicode()
CHAR_TO_BYTE = {c: b for b, c in BYTE_TO_CHAR.items()}


def byte_level_tokenizer_json() -> dict:
    """A byte-level BPE with one token per byte (ids 0..255 in byte order), a few merges, and the
    ChatML special tokens. Every multibyte character is split across tokens."""
    vocab = {BYTE_TO_CHAR[b]: b for b in range(256)}
    merges = []
    for a, b in [("h", "e"), ("t", "h"), ("i", "n")]:
        vocab[a + b] = len(vocab)
        merges.append(f"{a} {b}")
    specials = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
    added = []
    for s in specials:
        added.append({"id": len(vocab) + len(added), "content": s, "single_word": False, "lstrip": False,
                      "rstrip": False, "normalized": False, "special": True})
    return {
        "version": "1.0",
        "truncation": None,
        "padding": None,
        "added_tokens": added,
        "normalizer": None,
        "pre_tokenizer": {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": False, "use_regex": True},
        "post_processor": {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": False, "use_regex": True},
        "decoder": {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": False, "use_regex": True},
        "model": {"type": "BPE", "dropout": None, "unk_token": None, "continuing_subword_prefix": None,
                  "end_of_word_suffix": None, "fuse_unk": False, "byte_fallback": False, "ignore_merges": False,
                  "vocab": vocab, "merges": merges},
    }


class TokenTable:
    """id -> bytes for a byte-level tokenizer.json (what the server's decoder produces)."""

    def __init__(self, tok: dict):
        self.bytes = {}
        for text, i in tok["model"]["vocab"].items():
            self.bytes[i] = bytes(CHAR_TO_BYTE[c] for c in text)
        self.special = set()
        for t in tok["added_tokens"]:
            self.bytes[t["id"]] = t["content"].encode()
            if t.get("special"):
                self.special.add(t["id"])
        self.ids = {t["content"]: t["id"] for t in tok["added_tokens"]}
        self.vocab_size = max(self.bytes) + 1

    def decode(self, ids, skip_special=True) -> str:
        data = b"".join(self.bytes[i] for i in ids if not (skip_special and i in self.special))
        return data.decode("utf-8", errors="replace")


# --- model directories ------------------------------------------------------------------------


def write_model_dir(path: pathlib.Path, tok: dict) -> TokenTable:
    table = TokenTable(tok)
    path.mkdir(parents=True, exist_ok=True)
    (path / "tokenizer.json").write_text(json.dumps(tok))
    (path / "tokenizer_config.json").write_text(json.dumps({"chat_template": CHATML, "eos_token": "<|im_end|>"}))
    text = {
        "vocab_size": table.vocab_size, "hidden_size": 48, "num_hidden_layers": 4, "num_attention_heads": 4,
        "num_key_value_heads": 2, "head_dim": 16, "rms_norm_eps": 1e-6, "max_position_embeddings": MAX_MODEL_LEN,
        "intermediate_size": 64, "tie_word_embeddings": False, "rope_theta": 10000.0,
        "layer_types": ["linear_attention", "full_attention", "linear_attention", "full_attention"],
        "linear_num_key_heads": 2, "linear_num_value_heads": 4, "linear_key_head_dim": 8,
        "linear_value_head_dim": 12, "linear_conv_kernel_dim": 4,
        "rope_parameters": {"rope_type": "default", "rope_theta": 1e7, "partial_rotary_factor": 0.25},
        "shared_expert_intermediate_size": 24, "num_experts": 8, "num_experts_per_tok": 2,
        "moe_intermediate_size": 16, "norm_topk_prob": True, "eos_token_id": table.ids["<|im_end|>"],
    }
    (path / "config.json").write_text(json.dumps({"model_type": "qwen3_5_moe", "text_config": text}))
    return table


@pytest.fixture(scope="session")
def model(tmp_path_factory):
    """(directory, TokenTable) of the tiny model with the fixture Qwen-style tokenizer."""
    tok = json.loads(FIXTURE_TOKENIZER.read_text())
    d = tmp_path_factory.mktemp("models") / "tiny-moe"
    return d, write_model_dir(d, tok)


@pytest.fixture(scope="session")
def byte_model(tmp_path_factory):
    """(directory, TokenTable) of the tiny model with a one-token-per-byte tokenizer."""
    d = tmp_path_factory.mktemp("models") / "tiny-bytes"
    return d, write_model_dir(d, byte_level_tokenizer_json())


# --- servers ----------------------------------------------------------------------------------


class Server:
    """A running `moefold serve` process."""

    def __init__(self, model_dir, *args, log_dir=None, load_format="dummy"):
        cmd = [binary(), "serve", "--model", str(model_dir), "--load-format", load_format, "--seed", "7",
               "--host", "127.0.0.1", "--port", "0", *map(str, args)]
        self.log = open(os.path.join(log_dir or str(model_dir), f"server-{time.time_ns()}.log"), "w+")
        self.proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=self.log, text=True)
        self.port = None
        line = []
        reader = threading.Thread(target=lambda: line.append(self.proc.stdout.readline()), daemon=True)
        reader.start()
        reader.join(60)
        if not line or "listening on http://" not in line[0]:
            self.stop()
            self.log.seek(0)
            raise RuntimeError(f"server did not start: {line} {self.log.read()}")
        self.port = int(line[0].strip().rsplit(":", 1)[1])
        self.url = f"http://127.0.0.1:{self.port}"
        self._local = threading.local()
        for _ in range(100):
            try:
                if self.http.get(self.url + "/health", timeout=2).status_code == 200:
                    break
            except requests.ConnectionError:
                time.sleep(0.05)
        else:
            self.stop()
            raise RuntimeError("server never became healthy")

    @property
    def http(self) -> requests.Session:
        """A requests session of the calling thread (sessions are not shared between threads)."""
        if not hasattr(self._local, "session"):
            self._local.session = requests.Session()
            self._local.session.trust_env = False
        return self._local.session

    def post(self, path, body, **kw):
        return self.http.post(self.url + path, json=body, timeout=kw.pop("timeout", 120), **kw)

    def metrics_text(self) -> str:
        return self.http.get(self.url + "/metrics", timeout=10).text

    def openai(self):
        import httpx
        import openai

        return openai.OpenAI(base_url=self.url + "/v1", api_key="unused", max_retries=0, timeout=120,
                             http_client=httpx.Client(trust_env=False, timeout=120))

    def stop(self):
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)
        self.log.close()


@pytest.fixture(scope="session")
def start_server():
    """Factory: start_server(model_dir, *extra_args) -> Server; all are stopped at session end."""
    servers = []

    def start(model_dir, *args, **kw):
        s = Server(model_dir, *args, **kw)
        servers.append(s)
        return s

    yield start
    for s in servers:
        s.stop()


@pytest.fixture(scope="session")
def server(model, start_server):
    """The default server: 32 sequences, the tiny model with the fixture tokenizer."""
    return start_server(model[0], "--max-num-seqs", 32, "--max-queue", 1024, "--served-model-name", "tiny-moe")
