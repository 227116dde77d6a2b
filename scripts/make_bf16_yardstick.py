#!/usr/bin/env python3
"""How far transformers' own bf16 forward lands from each fixture's reference logits.

The yardstick for "within bf16 tolerance of the transformers reference": for every fixture under
tests/fixtures/<family>/ and every prompt in its reference.json, load the stored checkpoint with
transformers in bfloat16 (as users run it: from_pretrained(dtype=torch.bfloat16), eager attention,
eager experts), run the prompt with use_cache=False and record the relative error
||logits - ref|| / ||ref|| against the stored reference logits, twice:

  rel_err         the plain bf16 run (its own routing; in a tiny random MoE some top-k decisions flip)
  rel_err_pinned  routing pinned: every MoE router uses the experts the fp64 reference chose (the
                  softmax weights of those experts are still computed in the bf16 run), the same
                  pinning moefold's GPU test applies (src/runtime/routed_experts.h)

and writes them into reference.json as prompts[i]["transformers_bf16"]. Nothing else is changed.

Usage (system python3 with torch, transformers==5.17.0, numpy):
    python3 scripts/make_bf16_yardstick.py [--fixtures tests/fixtures]
"""

from __future__ import annotations

import argparse
import importlib.util
import json
from pathlib import Path

import numpy as np
import torch

HERE = Path(__file__).resolve().parent


def load_make_fixtures():
    spec = importlib.util.spec_from_file_location("make_fixtures", HERE / "make_fixtures.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def routers(model):
    return [m for m in model.modules() if type(m).__name__.endswith("TopKRouter")]


class Pin:
    """Captures each router's chosen experts (capture mode) or forces them (replay mode)."""

    def __init__(self, model):
        self.rs = routers(model)
        self.captured: list[torch.Tensor] = []
        self.replay: list[torch.Tensor] | None = None
        for i, r in enumerate(self.rs):
            orig = r.forward

            def fwd(hidden_states, _r=r, _orig=orig, _i=i):
                logits, scores, idx = _orig(hidden_states)
                if self.replay is None:
                    self.captured.append(idx.clone())
                    return logits, scores, idx
                idx = self.replay[_i]
                probs = torch.softmax(logits, dtype=torch.float, dim=-1)
                top = probs.gather(-1, idx)
                if getattr(_r, "norm_topk_prob", True):
                    top = top / top.sum(dim=-1, keepdim=True)
                return logits, top.to(logits.dtype), idx

            r.forward = fwd


@torch.no_grad()
def logits_of(model, ids):
    out = model(input_ids=torch.tensor([ids], dtype=torch.long), use_cache=False)
    return out.logits[0].to(torch.float64)


def rel_err(a: torch.Tensor, ref: torch.Tensor) -> float:
    return float(torch.linalg.norm(a - ref) / torch.linalg.norm(ref))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--fixtures", default=str(HERE.parent / "tests" / "fixtures"))
    args = ap.parse_args()
    mf = load_make_fixtures()
    torch.manual_seed(0)
    for ref_path in sorted(Path(args.fixtures).glob("*/reference.json")):
        d = ref_path.parent
        ref = json.loads(ref_path.read_text())
        cls = mf.MODEL_CLASS[ref["family"]]
        kw = dict(attn_implementation="eager", experts_implementation="eager")
        m64 = cls.from_pretrained(str(d), dtype=torch.float64, **kw).eval()
        m16 = cls.from_pretrained(str(d), dtype=torch.bfloat16, **kw).eval()
        pin64, pin16 = Pin(m64), Pin(m16)
        for p in ref["prompts"]:
            ids = p["ids"]
            expect = torch.from_numpy(np.load(d / p["logits"]).astype(np.float64))
            pin64.captured = []
            got64 = logits_of(m64, ids)
            pin16.replay = None
            plain = logits_of(m16, ids)
            pin16.replay = pin64.captured if pin64.rs else None
            pinned = logits_of(m16, ids) if pin64.rs else plain
            pin16.replay = None
            p["transformers_bf16"] = {"rel_err": rel_err(plain, expect), "rel_err_pinned": rel_err(pinned, expect)}
            print(f"{ref['family']:18s} T={len(ids):4d} fp64 {rel_err(got64, expect):.1e}  bf16 {p['transformers_bf16']['rel_err']:.3e}"
                  f"  bf16 pinned {p['transformers_bf16']['rel_err_pinned']:.3e}")
        ref["transformers_bf16_note"] = ("prompts[i].transformers_bf16: relative error of transformers' own bf16 forward "
                                         "(dtype=bfloat16, eager) vs the stored logits, plain and with routing pinned to "
                                         "the fp64 reference's experts; made by scripts/make_bf16_yardstick.py")
        ref_path.write_text(json.dumps(ref, indent=1) + "\n")


if __name__ == "__main__":
    main()
