#!/usr/bin/env python3
"""transformers' greedy generation on the converted SmolLM2-135M-Instruct, the reference that
tests/e2e/test_smollm2.py holds moefold to (token for token, five chat prompts x 32 tokens).

    python3 scripts/convert_gguf.py --out models/smollm2-135m-instruct
    python3 scripts/make_smollm2_reference.py --model models/smollm2-135m-instruct

The prompts are rendered with the model's chat template and tokenized by transformers; the model is
loaded in float32 from the converted safetensors exactly as stored; generation is greedy with no
stopping at EOS: generation_config's eos is cleared, so exactly 32 new
tokens come out with nothing suppressed (moefold runs with --ignore-eos). Writes tests/fixtures/smollm2/greedy_reference.json.
"""
import argparse
import json
from pathlib import Path

import torch
import transformers

PROMPTS = [
    "What is the capital of France?",
    "Write one sentence about the ocean.",
    "List three primary colours.",
    "How many legs does a spider have?",
    "Give me a tip for learning to code.",
]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="models/smollm2-135m-instruct")
    ap.add_argument("--out", default=str(Path(__file__).resolve().parent.parent / "tests/fixtures/smollm2/greedy_reference.json"))
    args = ap.parse_args()
    tok = transformers.AutoTokenizer.from_pretrained(args.model)
    model = transformers.AutoModelForCausalLM.from_pretrained(args.model, dtype=torch.float32).eval()
    model.generation_config.eos_token_id = None
    cases = []
    for p in PROMPTS:
        text = tok.apply_chat_template([{"role": "user", "content": p}], tokenize=False, add_generation_prompt=True)
        ids = tok(text, add_special_tokens=False)["input_ids"]
        with torch.no_grad():
            # An explicit all-ones mask: without it, generate() masks every prompt token equal to the pad id
            # (<|im_end|> here) once eos is cleared.
            x = torch.tensor([ids])
            out = model.generate(x, attention_mask=torch.ones_like(x), max_new_tokens=32, do_sample=False)
        new = out[0, len(ids):].tolist()
        # Top-1 minus top-2 logit at each generated position (teacher-forced), to tell real
        # disagreements from near-ties that fp32 summation order alone can flip.
        with torch.no_grad():
            logits = model(torch.tensor([ids + new[:-1]])).logits[0, len(ids) - 1:]
        top2 = logits.topk(2, dim=-1).values
        margins = (top2[:, 0] - top2[:, 1]).tolist()
        cases.append({"prompt": p, "prompt_ids": ids, "greedy": new, "margins": margins, "text": tok.decode(new)})
        print(repr(p), "->", repr(tok.decode(new)))
    Path(args.out).write_text(json.dumps({"transformers": transformers.__version__, "torch": torch.__version__,
                                          "max_new_tokens": 32, "cases": cases}, indent=1) + "\n")


if __name__ == "__main__":
    main()
