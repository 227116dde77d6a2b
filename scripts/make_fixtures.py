#!/usr/bin/env python3
"""Generate the tiny reference fixtures under tests/fixtures/<family>/.

Every fixture is a complete, tiny, randomly initialised HF-style checkpoint directory
(config.json, generation_config.json, bf16 *.safetensors in the *released* tensor layout)
plus reference.json and float32 logits (*.npy) computed by HF transformers on CPU.

Nothing is downloaded: every model is built from a config written here.

Usage (system python3 with torch, transformers==5.17.0, safetensors, numpy):
    python3 scripts/make_fixtures.py                   # all families -> tests/fixtures/
    python3 scripts/make_fixtures.py --family qwen3_5_moe --out /tmp/fx

Reference computation rule: references are computed from the checkpoint EXACTLY AS STORED.
After the bf16 safetensors are written, the model is reloaded from the fixture directory with
dtype=torch.float64, attn_implementation="eager", experts_implementation="eager", so every weight
is the bf16-rounded value held in fp64. All forwards that produce stored numbers run with
use_cache=False (full sequence each time). Note that HF's kernels still do a few steps in fp32
even in an fp64 model (see FP32_ISLANDS below); the stored logits are therefore "fp64 with fp32
islands", accurate to ~1e-5 absolute, which is far below any tolerance an fp32/bf16 engine needs.
"""

from __future__ import annotations

import argparse
import hashlib
import importlib
import json
import math
import os
import platform
import shutil
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from safetensors import safe_open
from safetensors.torch import save_file

import transformers
from transformers import (
    AutoConfig,
    LlamaForCausalLM,
    Qwen3ForCausalLM,
    Qwen3MoeForCausalLM,
    Qwen3NextForCausalLM,
    Qwen3_5MoeForCausalLM,
    Qwen3_5MoeForConditionalGeneration,
)

REPO = Path(__file__).resolve().parent.parent
REAL_QWEN36_CONFIG = REPO / "configs" / "qwen3.6-35b-a3b" / "config.json"

PROMPT_LENGTHS = [1, 2, 63, 64, 65, 130]
N_GREEDY = 16
VOCAB = 384
# Hidden 128 and expert intermediate 64: the smallest sizes the GPU MoE kernels' tiles take
# (H % 128 == 0, I % 64 == 0, as in every released MoE model), so the same fixtures check the GPU too.
HIDDEN = 128
MOE_I = 64
EPS = 1e-6

FP32_ISLANDS = [
    "RMSNorm (all variants) normalises in fp32 (x.float()/x.to(float32)), then casts back to the activation dtype",
    "zero-centred RMSNorm (qwen3_5_moe, qwen3_next): y = (norm_fp32(x) * (1 + w.float())).type_as(x)",
    "plain RMSNorm (qwen3_moe, qwen3, llama, GDN gated norm): y = w * norm_fp32(x).to(input_dtype)",
    "GDN gated norm: silu(z) evaluated on z.to(float32), result cast back to input dtype",
    "RoPE: inv_freq is an fp32 buffer; angles pos*inv_freq, cos and sin are computed in fp32, then cast to the activation dtype",
    "eager attention: softmax(scores, dtype=float32) then cast back to the activation dtype",
    "MoE router: softmax(router_logits, dtype=float32), top-k on the fp32 probabilities, renormalised in fp32, then cast to the activation dtype",
    "Gated DeltaNet core (chunked and recurrent): q, k, v, g, beta cast to fp32; l2norm(q), l2norm(k) (eps 1e-6, inside rsqrt), q *= dk^-0.5, state in fp32; output cast back",
    "GDN decay: g = -exp(A_log.float()) * softplus(a.float() + dt_bias) (dt_bias in model dtype, so fp64 here), then cast to fp32 inside the kernel",
]

# ---------------------------------------------------------------------------------------------
# Family definitions
# ---------------------------------------------------------------------------------------------

FAMILIES = ["qwen3_5_moe", "qwen3_5_moe_text", "qwen3_next", "qwen3_moe", "qwen3", "llama"]

HYBRID = {"qwen3_5_moe", "qwen3_5_moe_text", "qwen3_next"}
ZERO_CENTRED_NORM_CLASSES = {"Qwen3_5MoeRMSNorm", "Qwen3NextRMSNorm"}
PLAIN_NORM_CLASSES = {"Qwen3_5MoeRMSNormGated", "Qwen3NextRMSNormGated", "Qwen3MoeRMSNorm", "Qwen3RMSNorm", "LlamaRMSNorm"}

SEEDS = {f: 1000 + i for i, f in enumerate(FAMILIES)}


def family_config(family: str) -> dict:
    """The config.json each fixture ships (written verbatim). Formats:
    qwen3_5_moe        - released Qwen3.6-35B-A3B config.json with tiny sizes (nested text_config, v5 rope_parameters)
    qwen3_5_moe_text   - flat text-only config as transformers 5.17 save_pretrained writes it (model_type qwen3_5_moe_text)
    qwen3_next         - released (v4.5x-era) Qwen3-Next style: top-level rope_theta/partial_rotary_factor, no layer_types
    qwen3_moe          - released (v4.5x-era) Qwen3-MoE style: top-level rope_theta, num_experts, torch_dtype
    qwen3, llama       - transformers 5.17 save_pretrained style (rope_parameters, dtype)
    """
    if family == "qwen3_5_moe":
        cfg = json.loads(REAL_QWEN36_CONFIG.read_text())
        tc = cfg["text_config"]
        n_layers = 4
        tc.update(
            vocab_size=VOCAB,
            hidden_size=HIDDEN,
            num_hidden_layers=n_layers,
            layer_types=["linear_attention" if (i + 1) % 2 else "full_attention" for i in range(n_layers)],
            full_attention_interval=2,
            num_attention_heads=4,
            num_key_value_heads=2,
            head_dim=32,
            max_position_embeddings=4096,
            linear_num_key_heads=2,
            linear_num_value_heads=4,
            linear_key_head_dim=16,
            linear_value_head_dim=32,
            linear_conv_kernel_dim=4,
            num_experts=16,
            num_experts_per_tok=4,
            moe_intermediate_size=MOE_I,
            shared_expert_intermediate_size=MOE_I,
            rms_norm_eps=EPS,
            eos_token_id=383,
        )
        # rotary dim = 32 * 0.25 = 8 -> 4 frequencies; mrope_section must sum to 4 (real: [11,11,10] sums to 32)
        tc["rope_parameters"] = dict(
            rope_type="default", rope_theta=1e7, partial_rotary_factor=0.25, mrope_section=[2, 1, 1], mrope_interleaved=True
        )
        cfg["vision_config"].update(
            depth=1,
            hidden_size=32,
            out_hidden_size=HIDDEN,
            num_heads=2,
            intermediate_size=64,
            patch_size=4,
            spatial_merge_size=2,
            temporal_patch_size=2,
            in_channels=3,
            num_position_embeddings=16,
        )
        return cfg
    if family == "qwen3_5_moe_text":
        n_layers = 6
        return {
            "architectures": ["Qwen3_5MoeForCausalLM"],
            "model_type": "qwen3_5_moe_text",
            "attention_bias": False,
            "attention_dropout": 0.0,
            "attn_output_gate": True,
            "bos_token_id": None,
            "dtype": "bfloat16",
            "eos_token_id": 383,
            "full_attention_interval": 3,
            "head_dim": 32,
            "hidden_act": "silu",
            "hidden_size": HIDDEN,
            "initializer_range": 0.02,
            "layer_types": ["linear_attention" if (i + 1) % 3 else "full_attention" for i in range(n_layers)],
            "linear_conv_kernel_dim": 4,
            "linear_key_head_dim": 32,
            "linear_num_key_heads": 2,
            "linear_num_value_heads": 4,
            "linear_value_head_dim": 16,
            "mamba_ssm_dtype": "float32",
            "max_position_embeddings": 4096,
            "moe_intermediate_size": MOE_I,
            "mtp_num_hidden_layers": 1,
            "mtp_use_dedicated_embeddings": False,
            "num_attention_heads": 4,
            "num_experts": 8,
            "num_experts_per_tok": 2,
            "num_hidden_layers": n_layers,
            "num_key_value_heads": 1,
            "output_router_logits": False,
            "pad_token_id": None,
            "rms_norm_eps": EPS,
            "rope_parameters": {
                "mrope_interleaved": True,
                "mrope_section": [2, 1, 1],
                "partial_rotary_factor": 0.25,
                "rope_theta": 10000000.0,
                "rope_type": "default",
            },
            "router_aux_loss_coef": 0.001,
            "shared_expert_intermediate_size": MOE_I,
            "tie_word_embeddings": False,
            "transformers_version": transformers.__version__,
            "use_cache": True,
            "vocab_size": VOCAB,
        }
    if family == "qwen3_next":
        return {
            "architectures": ["Qwen3NextForCausalLM"],
            "attention_bias": False,
            "attention_dropout": 0.0,
            "bos_token_id": 380,
            "decoder_sparse_step": 1,
            "eos_token_id": 381,
            "full_attention_interval": 2,
            "head_dim": 32,
            "hidden_act": "silu",
            "hidden_size": HIDDEN,
            "initializer_range": 0.02,
            "intermediate_size": 128,
            "linear_conv_kernel_dim": 4,
            "linear_key_head_dim": 16,
            "linear_num_key_heads": 2,
            "linear_num_value_heads": 4,
            "linear_value_head_dim": 32,
            "max_position_embeddings": 4096,
            "mlp_only_layers": [],
            "model_type": "qwen3_next",
            "moe_intermediate_size": MOE_I,
            "norm_topk_prob": True,
            "num_attention_heads": 4,
            "num_experts": 16,
            "num_experts_per_tok": 4,
            "num_hidden_layers": 4,
            "num_key_value_heads": 2,
            "output_router_logits": False,
            "partial_rotary_factor": 0.25,
            "rms_norm_eps": EPS,
            "rope_scaling": None,
            "rope_theta": 1000000.0,
            "router_aux_loss_coef": 0.001,
            "shared_expert_intermediate_size": MOE_I,
            "tie_word_embeddings": False,
            "torch_dtype": "bfloat16",
            "transformers_version": "4.57.0.dev0",
            "use_cache": True,
            "use_sliding_window": False,
            "vocab_size": VOCAB,
        }
    if family == "qwen3_moe":
        return {
            "architectures": ["Qwen3MoeForCausalLM"],
            "attention_bias": False,
            "attention_dropout": 0.0,
            "bos_token_id": 380,
            "decoder_sparse_step": 1,
            "eos_token_id": 380,
            "head_dim": 32,
            "hidden_act": "silu",
            "hidden_size": HIDDEN,
            "initializer_range": 0.02,
            "intermediate_size": 192,
            "max_position_embeddings": 4096,
            "max_window_layers": 4,
            "mlp_only_layers": [],
            "model_type": "qwen3_moe",
            "moe_intermediate_size": MOE_I,
            "norm_topk_prob": True,
            "num_attention_heads": 4,
            "num_experts": 8,
            "num_experts_per_tok": 2,
            "num_hidden_layers": 4,
            "num_key_value_heads": 1,
            "output_router_logits": False,
            "rms_norm_eps": EPS,
            "rope_scaling": None,
            "rope_theta": 1000000.0,
            "router_aux_loss_coef": 0.001,
            "sliding_window": None,
            "tie_word_embeddings": False,
            "torch_dtype": "bfloat16",
            "transformers_version": "4.51.0",
            "use_cache": True,
            "use_sliding_window": False,
            "vocab_size": VOCAB,
        }
    if family == "qwen3":
        n_layers = 4
        return {
            "architectures": ["Qwen3ForCausalLM"],
            "attention_bias": False,
            "attention_dropout": 0.0,
            "bos_token_id": 380,
            "dtype": "bfloat16",
            "eos_token_id": 381,
            "head_dim": 64,  # != hidden / heads (32), as in the real Qwen3 models
            "hidden_act": "silu",
            "hidden_size": HIDDEN,
            "initializer_range": 0.02,
            "intermediate_size": 160,
            "layer_types": ["full_attention"] * n_layers,
            "max_position_embeddings": 4096,
            "max_window_layers": n_layers,
            "model_type": "qwen3",
            "num_attention_heads": 4,
            "num_hidden_layers": n_layers,
            "num_key_value_heads": 2,
            "pad_token_id": None,
            "rms_norm_eps": EPS,
            "rope_parameters": {"rope_theta": 1000000.0, "rope_type": "default"},
            "sliding_window": None,
            "tie_word_embeddings": True,
            "transformers_version": transformers.__version__,
            "use_cache": True,
            "use_sliding_window": False,
            "vocab_size": VOCAB,
        }
    if family == "llama":
        return {
            "architectures": ["LlamaForCausalLM"],
            "attention_bias": False,
            "attention_dropout": 0.0,
            "bos_token_id": 1,
            "dtype": "bfloat16",
            "eos_token_id": 3,
            "head_dim": 32,  # the smallest head_dim the GPU attention kernels take
            "hidden_act": "silu",
            "hidden_size": HIDDEN,
            "initializer_range": 0.02,
            "intermediate_size": 176,
            "max_position_embeddings": 4096,
            "mlp_bias": False,
            "model_type": "llama",
            "num_attention_heads": 4,
            "num_hidden_layers": 4,
            "num_key_value_heads": 2,
            "pad_token_id": None,
            "pretraining_tp": 1,
            "rms_norm_eps": EPS,
            "rope_parameters": {"rope_theta": 500000.0, "rope_type": "default"},
            "tie_word_embeddings": False,
            "transformers_version": transformers.__version__,
            "use_cache": True,
            "vocab_size": VOCAB,
        }
    raise ValueError(family)


def generation_config(family: str, cfg: dict) -> dict:
    tc = cfg.get("text_config", cfg)
    eos = tc.get("eos_token_id")
    if family in ("qwen3_5_moe", "qwen3_5_moe_text"):
        # released: eos [<|im_end|>, <|endoftext|>] = [248046, 248044]; tiny: [383, 381] (ids that no stored greedy
        # continuation produces, so an engine that stops at EOS still yields all 16 tokens)
        return {"bos_token_id": None, "eos_token_id": [383, 381], "pad_token_id": 381,
                "transformers_version": transformers.__version__}
    return {"bos_token_id": cfg.get("bos_token_id"), "eos_token_id": eos, "transformers_version": transformers.__version__}


MODEL_CLASS = {
    "qwen3_5_moe": Qwen3_5MoeForConditionalGeneration,
    "qwen3_5_moe_text": Qwen3_5MoeForCausalLM,
    "qwen3_next": Qwen3NextForCausalLM,
    "qwen3_moe": Qwen3MoeForCausalLM,
    "qwen3": Qwen3ForCausalLM,
    "llama": LlamaForCausalLM,
}

# Experts layout on disk: "fused" = experts.gate_up_proj [E,2I,H] + experts.down_proj [E,H,I] (released Qwen3.5/3.6 bf16);
# "per_expert" = experts.{e}.{gate,up,down}_proj.weight (Qwen3-Next, Qwen3-MoE releases, Qwen3.5 FP8 releases).
EXPERT_LAYOUT = {"qwen3_5_moe": "fused", "qwen3_5_moe_text": "per_expert", "qwen3_next": "per_expert", "qwen3_moe": "per_expert"}

# qwen3_5_moe_text stores linear_attn.A_log and linear_attn.norm.weight in F32 (as the released Qwen3.5
# checkpoints do, per design doc section 3); everything else in every fixture is BF16.
F32_SUFFIXES = {"qwen3_5_moe_text": ("linear_attn.A_log", "linear_attn.norm.weight")}

N_SHARDS = {"qwen3_moe": 3}


# ---------------------------------------------------------------------------------------------
# Expected checkpoint layout (independent of HF: written from the design doc, sections 3, 9, 10)
# ---------------------------------------------------------------------------------------------


def expected_text_tensors(family: str, cfg: dict) -> dict[str, tuple]:
    tc = cfg.get("text_config", cfg)
    H, V, L = tc["hidden_size"], tc["vocab_size"], tc["num_hidden_layers"]
    P = "model.language_model." if family == "qwen3_5_moe" else "model."
    out = {P + "embed_tokens.weight": (V, H), P + "norm.weight": (H,)}
    if not tc.get("tie_word_embeddings", False):
        out["lm_head.weight"] = (V, H)
    nh, nkv = tc["num_attention_heads"], tc["num_key_value_heads"]
    hd = tc.get("head_dim") or H // nh
    if family in HYBRID:
        layer_types = tc.get("layer_types") or [
            "linear_attention" if (i + 1) % tc["full_attention_interval"] else "full_attention" for i in range(L)
        ]
    else:
        layer_types = ["full_attention"] * L
    for i in range(L):
        p = f"{P}layers.{i}."
        out[p + "input_layernorm.weight"] = (H,)
        out[p + "post_attention_layernorm.weight"] = (H,)
        if layer_types[i] == "linear_attention":
            hk, hv = tc["linear_num_key_heads"], tc["linear_num_value_heads"]
            dk, dv = tc["linear_key_head_dim"], tc["linear_value_head_dim"]
            kd, vd = hk * dk, hv * dv
            a = p + "linear_attn."
            if family == "qwen3_next":
                out[a + "in_proj_qkvz.weight"] = (2 * kd + 2 * vd, H)
                out[a + "in_proj_ba.weight"] = (2 * hv, H)
            else:
                out[a + "in_proj_qkv.weight"] = (2 * kd + vd, H)
                out[a + "in_proj_z.weight"] = (vd, H)
                out[a + "in_proj_b.weight"] = (hv, H)
                out[a + "in_proj_a.weight"] = (hv, H)
            out[a + "conv1d.weight"] = (2 * kd + vd, 1, tc["linear_conv_kernel_dim"])
            out[a + "dt_bias"] = (hv,)
            out[a + "A_log"] = (hv,)
            out[a + "norm.weight"] = (dv,)
            out[a + "out_proj.weight"] = (H, vd)
        else:
            a = p + "self_attn."
            gated = family in HYBRID
            out[a + "q_proj.weight"] = (nh * hd * (2 if gated else 1), H)
            out[a + "k_proj.weight"] = (nkv * hd, H)
            out[a + "v_proj.weight"] = (nkv * hd, H)
            out[a + "o_proj.weight"] = (H, nh * hd)
            if family != "llama":
                out[a + "q_norm.weight"] = (hd,)
                out[a + "k_norm.weight"] = (hd,)
        m = p + "mlp."
        if family in EXPERT_LAYOUT:
            E, I = tc["num_experts"], tc["moe_intermediate_size"]
            out[m + "gate.weight"] = (E, H)
            if EXPERT_LAYOUT[family] == "fused":
                out[m + "experts.gate_up_proj"] = (E, 2 * I, H)
                out[m + "experts.down_proj"] = (E, H, I)
            else:
                for e in range(E):
                    out[m + f"experts.{e}.gate_proj.weight"] = (I, H)
                    out[m + f"experts.{e}.up_proj.weight"] = (I, H)
                    out[m + f"experts.{e}.down_proj.weight"] = (H, I)
            if family in HYBRID:
                Is = tc["shared_expert_intermediate_size"]
                out[m + "shared_expert.gate_proj.weight"] = (Is, H)
                out[m + "shared_expert.up_proj.weight"] = (Is, H)
                out[m + "shared_expert.down_proj.weight"] = (H, Is)
                out[m + "shared_expert_gate.weight"] = (1, H)
        else:
            I = tc["intermediate_size"]
            out[m + "gate_proj.weight"] = (I, H)
            out[m + "up_proj.weight"] = (I, H)
            out[m + "down_proj.weight"] = (H, I)
    return out


def mtp_tensors(cfg: dict, gen: torch.Generator) -> dict[str, torch.Tensor]:
    """A tiny MTP block in the released naming (design doc section 3, 'MTP module'): every mtp.* name of the
    release except the routed experts (mtp.layers.0.mlp.experts.gate_up_proj / down_proj, omitted for size).
    HF ignores these (_keys_to_ignore_on_load_unexpected = ['^mtp.*']); the engine must skip them too.
    Values are random and never used by any reference."""
    tc = cfg["text_config"]
    H, nh, nkv, hd = tc["hidden_size"], tc["num_attention_heads"], tc["num_key_value_heads"], tc["head_dim"]
    E, I, Is = tc["num_experts"], tc["moe_intermediate_size"], tc["shared_expert_intermediate_size"]
    shapes = {
        "mtp.fc.weight": (H, 2 * H),
        "mtp.pre_fc_norm_embedding.weight": (H,),
        "mtp.pre_fc_norm_hidden.weight": (H,),
        "mtp.norm.weight": (H,),
        "mtp.layers.0.input_layernorm.weight": (H,),
        "mtp.layers.0.post_attention_layernorm.weight": (H,),
        "mtp.layers.0.self_attn.q_proj.weight": (nh * hd * 2, H),
        "mtp.layers.0.self_attn.k_proj.weight": (nkv * hd, H),
        "mtp.layers.0.self_attn.v_proj.weight": (nkv * hd, H),
        "mtp.layers.0.self_attn.o_proj.weight": (H, nh * hd),
        "mtp.layers.0.self_attn.q_norm.weight": (hd,),
        "mtp.layers.0.self_attn.k_norm.weight": (hd,),
        "mtp.layers.0.mlp.gate.weight": (E, H),
        "mtp.layers.0.mlp.shared_expert.gate_proj.weight": (Is, H),
        "mtp.layers.0.mlp.shared_expert.up_proj.weight": (Is, H),
        "mtp.layers.0.mlp.shared_expert.down_proj.weight": (H, Is),
        "mtp.layers.0.mlp.shared_expert_gate.weight": (1, H),
    }
    out = {}
    for k, s in shapes.items():
        std = 0.1 if len(s) == 1 else 1.0 / math.sqrt(s[-1])
        out[k] = (torch.randn(s, generator=gen) * std).to(torch.bfloat16)
    return out


# ---------------------------------------------------------------------------------------------
# Randomisation
# ---------------------------------------------------------------------------------------------


@torch.no_grad()
def randomize(model: torch.nn.Module, family: str, gen: torch.Generator) -> None:
    def normal(p, std, mean=0.0):
        p.copy_(torch.randn(p.shape, generator=gen, dtype=torch.float32) * std + mean)

    def uniform(p, lo, hi):
        p.copy_(torch.rand(p.shape, generator=gen, dtype=torch.float32) * (hi - lo) + lo)

    tied = bool(getattr(model.config.get_text_config(), "tie_word_embeddings", False))
    done = set()
    # norms first, by module class (zero-centred 1+w vs plain w)
    for mname, mod in model.named_modules():
        cls = type(mod).__name__
        if cls in ZERO_CENTRED_NORM_CLASSES:
            normal(mod.weight, 0.1)  # used as (1 + w)
            done.add(f"{mname}.weight")
        elif cls in PLAIN_NORM_CLASSES:
            normal(mod.weight, 0.1, mean=1.0)
            done.add(f"{mname}.weight")
        elif isinstance(mod, torch.nn.LayerNorm):  # vision tower
            normal(mod.weight, 0.1, mean=1.0)
            normal(mod.bias, 0.02)
            done.update({f"{mname}.weight", f"{mname}.bias"})
    for name, p in model.named_parameters():
        if name in done:
            continue
        if ".visual." in name or name.startswith("model.visual."):
            normal(p, 0.05)
        elif name.endswith("linear_attn.A_log"):
            # A = exp(A_log) in (0.02, 0.6); with softplus(a + dt_bias) in ~(0.1, 3) the per-step decay
            # exp(g) = exp(-A * softplus(.)) spreads over roughly (0.2, 1)
            p.copy_(torch.log(torch.rand(p.shape, generator=gen) * 0.58 + 0.02))
        elif name.endswith("linear_attn.dt_bias"):
            uniform(p, -1.0, 0.5)
        elif name.endswith("conv1d.weight"):
            normal(p, 0.5)  # fan-in = kernel 4
        elif name.endswith("embed_tokens.weight"):
            # untied: N(0,1) rows; tied (qwen3): the matrix is also the lm_head, so scale it like one (otherwise the
            # logits are dominated by the current token's own embedding and greedy just repeats the input)
            normal(p, 1.5 / math.sqrt(p.shape[1]) if tied else 1.0)
        elif name.endswith("mlp.gate.weight"):
            normal(p, 2.0 / math.sqrt(p.shape[1]))  # router logits std ~2: peaked but not degenerate
        elif name.endswith("shared_expert_gate.weight"):
            normal(p, 1.0 / math.sqrt(p.shape[1]))
        elif name.endswith("experts.gate_up_proj") or name.endswith("experts.down_proj"):
            normal(p, 1.2 / math.sqrt(p.shape[2]))  # [E, out, in]
        elif name.endswith("lm_head.weight"):
            normal(p, 1.5 / math.sqrt(p.shape[1]))
        elif p.ndim == 2:
            normal(p, 1.2 / math.sqrt(p.shape[1]))
        else:
            raise RuntimeError(f"randomize: no rule for parameter {name} {tuple(p.shape)}")
        done.add(name)


# ---------------------------------------------------------------------------------------------
# Saving in the released layout
# ---------------------------------------------------------------------------------------------


def checkpoint_tensors(model: torch.nn.Module, family: str, cfg: dict, gen: torch.Generator) -> dict[str, torch.Tensor]:
    """Map the HF module state to the released on-disk names (bf16; F32 where F32_SUFFIXES says)."""
    sd = {k: v.detach().float().cpu().contiguous() for k, v in model.state_dict().items()}
    tc = cfg.get("text_config", cfg)
    if tc.get("tie_word_embeddings", False):
        sd.pop("lm_head.weight")  # tied: not stored (as released Qwen3 small models)
    out = {}
    for k, v in sd.items():
        if EXPERT_LAYOUT.get(family) == "per_expert" and k.endswith("mlp.experts.gate_up_proj"):
            base = k[: -len("gate_up_proj")]
            I = v.shape[1] // 2
            for e in range(v.shape[0]):  # HF fused layout: per expert rows [0, I) = gate, [I, 2I) = up
                out[f"{base}{e}.gate_proj.weight"] = v[e, :I].contiguous()
                out[f"{base}{e}.up_proj.weight"] = v[e, I:].contiguous()
        elif EXPERT_LAYOUT.get(family) == "per_expert" and k.endswith("mlp.experts.down_proj"):
            base = k[: -len("down_proj")]
            for e in range(v.shape[0]):
                out[f"{base}{e}.down_proj.weight"] = v[e].contiguous()
        else:
            out[k] = v
    f32 = F32_SUFFIXES.get(family, ())
    out = {k: (v if k.endswith(f32) and f32 else v.to(torch.bfloat16)).contiguous() for k, v in out.items()}
    if family == "qwen3_5_moe":
        out.update(mtp_tensors(cfg, gen))
    return out


def write_checkpoint(tensors: dict[str, torch.Tensor], outdir: Path, n_shards: int) -> list[str]:
    names = sorted(tensors)
    meta = {"format": "pt"}
    if n_shards <= 1:
        save_file({k: tensors[k] for k in names}, str(outdir / "model.safetensors"), metadata=meta)
        return ["model.safetensors"]
    # split by cumulative bytes, keeping the sorted order
    sizes = [tensors[k].numel() * tensors[k].element_size() for k in names]
    total = sum(sizes)
    bounds, acc, cur = [], 0, []
    shards = []
    for k, s in zip(names, sizes):
        cur.append(k)
        acc += s
        if acc >= total * (len(shards) + 1) / n_shards and len(shards) < n_shards - 1:
            shards.append(cur)
            cur = []
    shards.append(cur)
    assert len(shards) == n_shards and all(shards)
    files, weight_map = [], {}
    for i, keys in enumerate(shards):
        fn = f"model-{i + 1:05d}-of-{n_shards:05d}.safetensors"
        save_file({k: tensors[k] for k in keys}, str(outdir / fn), metadata=meta)
        files.append(fn)
        weight_map.update({k: fn for k in keys})
    index = {
        "metadata": {"total_parameters": sum(tensors[k].numel() for k in names), "total_size": total},
        "weight_map": dict(sorted(weight_map.items())),
    }
    (outdir / "model.safetensors.index.json").write_text(json.dumps(index, indent=2) + "\n")
    return files


def read_checkpoint(outdir: Path) -> dict[str, torch.Tensor]:
    out = {}
    for fn in sorted(outdir.glob("*.safetensors")):
        with safe_open(str(fn), "pt") as f:
            for k in f.keys():
                assert k not in out, f"duplicate tensor {k}"
                out[k] = f.get_tensor(k)
    idx = outdir / "model.safetensors.index.json"
    if idx.exists():
        wm = json.loads(idx.read_text())["weight_map"]
        assert set(wm) == set(out), "index weight_map does not match shard contents"
        for k, fn in wm.items():
            with safe_open(str(outdir / fn), "pt") as f:
                assert k in f.keys(), f"{k} not in {fn}"
    return out


# ---------------------------------------------------------------------------------------------
# Checks
# ---------------------------------------------------------------------------------------------


def check_layout(family: str, cfg: dict, stored: dict[str, torch.Tensor]) -> None:
    exp = expected_text_tensors(family, cfg)
    text_keys = {k for k in stored if not k.startswith("model.visual.") and not k.startswith("mtp.")}
    missing = sorted(set(exp) - text_keys)
    extra = sorted(text_keys - set(exp))
    assert not missing and not extra, f"{family}: layout mismatch: missing={missing[:8]} extra={extra[:8]}"
    for k, s in exp.items():
        assert tuple(stored[k].shape) == s, f"{family}: {k} has shape {tuple(stored[k].shape)}, expected {s}"
    f32 = F32_SUFFIXES.get(family, ())
    for k, v in stored.items():
        want = torch.float32 if (f32 and k.endswith(f32)) else torch.bfloat16
        assert v.dtype == want, f"{k}: dtype {v.dtype}, want {want}"
    if family == "qwen3_5_moe":
        assert any(k.startswith("model.visual.") for k in stored), "no model.visual.* tensors"
        assert any(k.startswith("mtp.") for k in stored), "no mtp.* tensors"
    else:
        assert not any(k.startswith(("model.visual.", "mtp.")) for k in stored)


@torch.no_grad()
def check_loaded_weights(model, family: str, cfg: dict, stored: dict[str, torch.Tensor]) -> None:
    """Every parameter of the reloaded fp64 model must equal the stored value exactly (guards against HF silently
    re-initialising a weight it could not map)."""
    sd = model.state_dict()
    tc = cfg.get("text_config", cfg)
    used = set()
    for k, v in sd.items():
        if k == "lm_head.weight" and tc.get("tie_word_embeddings", False):
            emb = "model.embed_tokens.weight"
            assert torch.equal(v, sd[emb]), "tied lm_head differs from embed_tokens"
            continue
        if k.endswith("mlp.experts.gate_up_proj") and EXPERT_LAYOUT.get(family) == "per_expert":
            base = k[: -len("gate_up_proj")]
            E = v.shape[0]
            ref = torch.stack(
                [torch.cat([stored[f"{base}{e}.gate_proj.weight"], stored[f"{base}{e}.up_proj.weight"]], 0) for e in range(E)]
            )
            used.update({f"{base}{e}.{w}_proj.weight" for e in range(E) for w in ("gate", "up")})
        elif k.endswith("mlp.experts.down_proj") and EXPERT_LAYOUT.get(family) == "per_expert":
            base = k[: -len("down_proj")]
            ref = torch.stack([stored[f"{base}{e}.down_proj.weight"] for e in range(v.shape[0])])
            used.update({f"{base}{e}.down_proj.weight" for e in range(v.shape[0])})
        else:
            assert k in stored, f"model parameter {k} not in checkpoint"
            ref = stored[k]
            used.add(k)
        assert v.dtype == torch.float64, f"{k} loaded as {v.dtype}"
        assert tuple(v.shape) == tuple(ref.shape), f"{k}: {tuple(v.shape)} vs {tuple(ref.shape)}"
        assert torch.equal(v, ref.to(torch.float64)), f"{k}: loaded value differs from stored value"
    leftover = sorted(set(stored) - used)
    assert all(k.startswith("mtp.") for k in leftover), f"stored tensors not used by HF: {leftover[:8]}"
    if family == "qwen3_5_moe":
        assert leftover, "expected mtp.* tensors to be ignored"
    # RoPE buffers: never bf16, and equal to the fp64 formula to fp32 precision
    rp = tc.get("rope_parameters") or {}
    theta = rp.get("rope_theta", tc.get("rope_theta"))
    prf = rp.get("partial_rotary_factor", tc.get("partial_rotary_factor", 1.0))
    hd = tc.get("head_dim") or tc["hidden_size"] // tc["num_attention_heads"]
    rd = int(hd * prf)
    want = theta ** (-torch.arange(0, rd, 2, dtype=torch.float64) / rd)
    n_checked = 0
    for name, buf in model.named_buffers():
        if name.endswith("inv_freq") and ".visual." not in name:
            assert buf.dtype in (torch.float32, torch.float64), f"{name} is {buf.dtype}"
            assert torch.allclose(buf.double(), want, rtol=1e-6, atol=0), f"{name}: {buf} vs {want}"
            n_checked += 1
    assert n_checked >= 1, "no RoPE inv_freq buffer found"


def assert_no_fast_kernels() -> None:
    """The reference must come from HF's torch code paths (no fla / causal_conv1d / hub kernels)."""
    for mod in ("fla", "causal_conv1d", "kernels"):
        try:
            importlib.import_module(mod)
        except Exception:
            continue
        raise RuntimeError(f"module {mod} is importable; uninstall it so HF uses its torch reference kernels")


class PathCounter:
    """Counts which GDN / conv kernels HF's modeling code calls (patched into the module globals)."""

    NAMES = ("torch_chunk_gated_delta_rule", "torch_recurrent_gated_delta_rule", "causal_conv1d_fn", "causal_conv1d_update")

    def __init__(self, module):
        self.module = module
        self.counts = {n: 0 for n in self.NAMES}
        self.chunk_lengths = []
        self.orig = {}
        for n in self.NAMES:
            f = getattr(module, n)
            self.orig[n] = f
            setattr(module, n, self._wrap(n, f))

    def _wrap(self, n, f):
        def w(*a, **k):
            self.counts[n] += 1
            if n == "torch_chunk_gated_delta_rule":
                self.chunk_lengths.append(a[0].shape[1])
            return f(*a, **k)

        return w

    def reset(self):
        self.counts = {n: 0 for n in self.NAMES}
        self.chunk_lengths = []


def modeling_module(family):
    return {
        "qwen3_5_moe": "transformers.models.qwen3_5_moe.modeling_qwen3_5_moe",
        "qwen3_5_moe_text": "transformers.models.qwen3_5_moe.modeling_qwen3_5_moe",
        "qwen3_next": "transformers.models.qwen3_next.modeling_qwen3_next",
    }.get(family)


# ---------------------------------------------------------------------------------------------
# Independent re-implementation (cross-check only)
# ---------------------------------------------------------------------------------------------


@torch.no_grad()
def independent_logits(family: str, cfg: dict, W: dict, ids: list) -> torch.Tensor:
    """Independent pure-fp64 forward written from the design doc (sections 4, 9, 10), no HF modeling code and no
    fp32 islands; the GDN runs as the plain token-by-token recurrence. Used only as a cross-check of the HF
    references (it agrees to ~1e-5 abs, the size of HF's fp32 islands)."""
    tc = cfg.get("text_config", cfg)
    d = torch.float64
    W = {k: v.to(d) for k, v in W.items()}
    P = "model.language_model." if family == "qwen3_5_moe" else "model."
    H, L, eps = tc["hidden_size"], tc["num_hidden_layers"], tc["rms_norm_eps"]
    hybrid = family in ("qwen3_5_moe", "qwen3_5_moe_text", "qwen3_next")
    zc = hybrid  # zero-centred (1 + w) norms

    def rms(x, w, zero_centred=zc):
        y = x / torch.sqrt((x * x).mean(-1, keepdim=True) + eps)
        return y * ((1.0 + w) if zero_centred else w)

    rp = tc.get("rope_parameters") or {}
    theta = rp.get("rope_theta", tc.get("rope_theta"))
    prf = rp.get("partial_rotary_factor", tc.get("partial_rotary_factor", 1.0))
    if hybrid:
        lt = tc.get("layer_types") or ["linear_attention" if (i + 1) % tc["full_attention_interval"] else "full_attention" for i in range(L)]
    else:
        lt = ["full_attention"] * L
    T = len(ids)
    x = W[P + "embed_tokens.weight"][torch.tensor(ids)]
    pos = torch.arange(T, dtype=d)

    for i in range(L):
        p = f"{P}layers.{i}."
        h = rms(x, W[p + "input_layernorm.weight"])
        if lt[i] == "linear_attention":
            a_ = p + "linear_attn."
            Hk, Hv = tc["linear_num_key_heads"], tc["linear_num_value_heads"]
            dk, dv, K = tc["linear_key_head_dim"], tc["linear_value_head_dim"], tc["linear_conv_kernel_dim"]
            r = Hv // Hk
            if family == "qwen3_next":
                qkvz = (h @ W[a_ + "in_proj_qkvz.weight"].T).view(T, Hk, 2 * dk + 2 * r * dv)
                ba = (h @ W[a_ + "in_proj_ba.weight"].T).view(T, Hk, 2 * r)
                q, k, v, z = torch.split(qkvz, [dk, dk, r * dv, r * dv], dim=-1)
                b, a = torch.split(ba, [r, r], dim=-1)
                qkv = torch.cat([q.reshape(T, -1), k.reshape(T, -1), v.reshape(T, -1)], -1)
                z = z.reshape(T, Hv, dv)
                b, a = b.reshape(T, Hv), a.reshape(T, Hv)
            else:
                qkv = h @ W[a_ + "in_proj_qkv.weight"].T
                z = (h @ W[a_ + "in_proj_z.weight"].T).view(T, Hv, dv)
                b = h @ W[a_ + "in_proj_b.weight"].T
                a = h @ W[a_ + "in_proj_a.weight"].T
            cw = W[a_ + "conv1d.weight"][:, 0, :]  # [C, K]; cw[:, K-1] multiplies the current token
            padded = torch.cat([torch.zeros(K - 1, qkv.shape[1], dtype=d), qkv], 0)
            conv = sum(cw[:, j] * padded[j:j + T] for j in range(K))
            conv = conv * torch.sigmoid(conv)
            q, k, v = torch.split(conv, [Hk * dk, Hk * dk, Hv * dv], -1)
            q = q.view(T, Hk, dk).repeat_interleave(r, dim=1)
            k = k.view(T, Hk, dk).repeat_interleave(r, dim=1)
            v = v.view(T, Hv, dv)
            beta = torch.sigmoid(b)
            g = -torch.exp(W[a_ + "A_log"]) * F.softplus(a + W[a_ + "dt_bias"])
            q = q / torch.sqrt((q * q).sum(-1, keepdim=True) + 1e-6) * dk ** -0.5
            k = k / torch.sqrt((k * k).sum(-1, keepdim=True) + 1e-6)
            S = torch.zeros(Hv, dk, dv, dtype=d)
            o = torch.zeros(T, Hv, dv, dtype=d)
            for t in range(T):
                S = S * torch.exp(g[t])[:, None, None]
                m = torch.einsum("hkv,hk->hv", S, k[t])
                delta = beta[t][:, None] * (v[t] - m)
                S = S + k[t][:, :, None] * delta[:, None, :]
                o[t] = torch.einsum("hkv,hk->hv", S, q[t])
            on = o / torch.sqrt((o * o).mean(-1, keepdim=True) + eps) * W[a_ + "norm.weight"]
            on = on * (z * torch.sigmoid(z))
            mix = on.reshape(T, -1) @ W[a_ + "out_proj.weight"].T
        else:
            a_ = p + "self_attn."
            nh, nkv = tc["num_attention_heads"], tc["num_key_value_heads"]
            hd = tc.get("head_dim") or H // nh
            qp = h @ W[a_ + "q_proj.weight"].T
            if hybrid:
                qp = qp.view(T, nh, 2 * hd)
                q, gate = qp[..., :hd], qp[..., hd:].reshape(T, nh * hd)
            else:
                q = qp.view(T, nh, hd)
            k = (h @ W[a_ + "k_proj.weight"].T).view(T, nkv, hd)
            v = (h @ W[a_ + "v_proj.weight"].T).view(T, nkv, hd)
            if family != "llama":
                q = rms(q, W[a_ + "q_norm.weight"])
                k = rms(k, W[a_ + "k_norm.weight"])
            rd = int(hd * prf)
            inv = theta ** (-torch.arange(0, rd, 2, dtype=d) / rd)
            ang = pos[:, None] * inv[None, :]
            cos, sin = torch.cos(ang)[:, None, :], torch.sin(ang)[:, None, :]

            def rope(u):
                lo, hi, rest = u[..., : rd // 2], u[..., rd // 2: rd], u[..., rd:]
                return torch.cat([lo * cos - hi * sin, hi * cos + lo * sin, rest], -1)

            q, k = rope(q), rope(k)
            grp = nh // nkv
            k = k.repeat_interleave(grp, dim=1)
            v = v.repeat_interleave(grp, dim=1)
            s = torch.einsum("thd,shd->hts", q, k) * hd ** -0.5
            s = s.masked_fill(torch.triu(torch.ones(T, T, dtype=torch.bool), 1), float("-inf"))
            att = torch.softmax(s, -1)
            o = torch.einsum("hts,shd->thd", att, v).reshape(T, nh * hd)
            if hybrid:
                o = o * torch.sigmoid(gate)
            mix = o @ W[a_ + "o_proj.weight"].T
        x = x + mix
        h = rms(x, W[p + "post_attention_layernorm.weight"])
        m_ = p + "mlp."
        if m_ + "gate.weight" in W:
            E, kk = tc["num_experts"], tc["num_experts_per_tok"]
            probs = torch.softmax(h @ W[m_ + "gate.weight"].T, -1)
            topv, topi = torch.topk(probs, kk, -1)
            if family in ("qwen3_5_moe", "qwen3_5_moe_text") or tc.get("norm_topk_prob", False):
                topv = topv / topv.sum(-1, keepdim=True)
            out = torch.zeros_like(h)
            for e in range(E):
                if m_ + "experts.gate_up_proj" in W:
                    gu = W[m_ + "experts.gate_up_proj"][e]
                    I = gu.shape[0] // 2
                    wg, wu, wd = gu[:I], gu[I:], W[m_ + "experts.down_proj"][e]
                else:
                    wg, wu, wd = (W[m_ + f"experts.{e}.{n}_proj.weight"] for n in ("gate", "up", "down"))
                y = (F.silu(h @ wg.T) * (h @ wu.T)) @ wd.T
                wgt = (topv * (topi == e)).sum(-1, keepdim=True)
                out = out + wgt * y
            if m_ + "shared_expert_gate.weight" in W:
                se = m_ + "shared_expert."
                y = (F.silu(h @ W[se + "gate_proj.weight"].T) * (h @ W[se + "up_proj.weight"].T)) @ W[se + "down_proj.weight"].T
                out = out + torch.sigmoid(h @ W[m_ + "shared_expert_gate.weight"].T) * y
        else:
            out = (F.silu(h @ W[m_ + "gate_proj.weight"].T) * (h @ W[m_ + "up_proj.weight"].T)) @ W[m_ + "down_proj.weight"].T
        x = x + out
    x = rms(x, W[P + "norm.weight"])
    lm = W.get("lm_head.weight", W[P + "embed_tokens.weight"])
    return x @ lm.T


# ---------------------------------------------------------------------------------------------
# Reference computation
# ---------------------------------------------------------------------------------------------


@torch.no_grad()
def full_logits(model, ids: list[int]) -> torch.Tensor:
    x = torch.tensor([ids], dtype=torch.long)
    out = model(input_ids=x, use_cache=False)
    return out.logits[0].to(torch.float64)


def text_cfg(model):
    return model.config.text_config if hasattr(model.config, "text_config") else model.config


@torch.no_grad()
def routing_stats(model, ids: list[int]):
    """Capture router top-k choices per layer for one forward."""
    caps = {}
    hooks = []
    for name, mod in model.named_modules():
        if type(mod).__name__.endswith("TopKRouter"):
            def hook(m, inp, out, name=name):
                caps[name] = (out[1].detach().clone(), out[2].detach().clone())  # (scores, indices)
            hooks.append(mod.register_forward_hook(hook))
    full_logits(model, ids)
    for h in hooks:
        h.remove()
    return caps


@torch.no_grad()
def min_router_gap(model, ids: list[int], k: int) -> float:
    gaps = []
    hooks = []
    for name, mod in model.named_modules():
        if type(mod).__name__.endswith("TopKRouter"):
            def hook(m, inp, out):
                logits = out[0].double().sort(dim=-1, descending=True).values  # router logits
                gaps.append((logits[:, k - 1] - logits[:, k]).min().item())
            hooks.append(mod.register_forward_hook(hook))
    full_logits(model, ids)
    for h in hooks:
        h.remove()
    return min(gaps)


@torch.no_grad()
def decay_stats(model, ids: list[int]):
    vals = []
    hooks = []
    for name, mod in model.named_modules():
        if type(mod).__name__.endswith("GatedDeltaNet"):
            def hook(m, args, kwargs, out):
                hs = kwargs.get("hidden_states", args[0] if args else None)
                if hasattr(m, "in_proj_a"):
                    a = m.in_proj_a(hs)
                else:
                    qkvz, ba = m.in_proj_qkvz(hs), m.in_proj_ba(hs)
                    a = m.fix_query_key_value_ordering(qkvz, ba)[5]
                g = -m.A_log.float().exp() * torch.nn.functional.softplus(a.float() + m.dt_bias)
                vals.append(g.exp().flatten())
            hooks.append(mod.register_forward_hook(hook, with_kwargs=True))
    full_logits(model, ids)
    for h in hooks:
        h.remove()
    return torch.cat(vals) if vals else None


@torch.no_grad()
def cached_consistency(model, family, ids: list[int], cont: list[int], counter: PathCounter | None) -> dict:
    """HF self-consistency: prefill (cache) + one-token decode steps vs. the no-cache forward of the full sequence.
    Also a two-piece prefill (chunked prefill with an initial state). Returns max relative differences."""
    seq = ids + cont
    ref = full_logits(model, seq)  # [T, V], no cache
    scale = ref.abs().max().item()
    res = {}
    # (a) prefill + decode
    if counter:
        counter.reset()
    out = model(input_ids=torch.tensor([ids]), use_cache=True)
    cache = out.past_key_values
    got = [out.logits[0].double()]
    if counter:
        prefill_counts = dict(counter.counts)
        counter.reset()
    for t in cont:
        out = model(input_ids=torch.tensor([[t]]), past_key_values=cache, use_cache=True)
        cache = out.past_key_values
        got.append(out.logits[0].double())
    got = torch.cat(got, 0)
    res["prefill_decode_max_rel"] = ((got - ref).abs().max() / scale).item()
    if counter:
        n_lin = sum(1 for t in text_cfg(model).layer_types if t == "linear_attention")
        assert prefill_counts["torch_chunk_gated_delta_rule"] == n_lin and prefill_counts["torch_recurrent_gated_delta_rule"] == 0
        assert counter.counts["torch_recurrent_gated_delta_rule"] == n_lin * len(cont), counter.counts
        assert counter.counts["causal_conv1d_update"] == n_lin * len(cont), counter.counts
        assert counter.counts["torch_chunk_gated_delta_rule"] == 0, counter.counts
    # (b) two-piece prefill (second piece uses the chunked kernel with an initial state)
    cut = len(seq) // 2 + 3
    out1 = model(input_ids=torch.tensor([seq[:cut]]), use_cache=True)
    out2 = model(input_ids=torch.tensor([seq[cut:]]), past_key_values=out1.past_key_values, use_cache=True)
    got2 = torch.cat([out1.logits[0].double(), out2.logits[0].double()], 0)
    res["two_piece_prefill_max_rel"] = ((got2 - ref).abs().max() / scale).item()
    return res


def make_prompts(family: str) -> list[list[int]]:
    rng = np.random.RandomState(SEEDS[family] + 7)
    return [rng.randint(0, VOCAB, size=n).tolist() for n in PROMPT_LENGTHS]


@torch.no_grad()
def greedy_no_cache(model, ids: list[int], n: int):
    seq = list(ids)
    toks, margins = [], []
    for _ in range(n):
        last = full_logits(model, seq)[-1]
        top = torch.topk(last, 2)
        t = int(top.indices[0])
        toks.append(t)
        margins.append(float(top.values[0] - top.values[1]))
        seq.append(t)
    return toks, margins


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def build_family(family: str, root: Path) -> dict:
    print(f"\n=== {family} ===", flush=True)
    outdir = root / family
    if outdir.exists():
        shutil.rmtree(outdir)
    outdir.mkdir(parents=True)
    torch.manual_seed(SEEDS[family])
    gen = torch.Generator().manual_seed(SEEDS[family])

    cfg_json = family_config(family)
    (outdir / "config.json").write_text(json.dumps(cfg_json, indent=2) + "\n")
    (outdir / "generation_config.json").write_text(json.dumps(generation_config(family, cfg_json), indent=2) + "\n")

    # 1. build from the written config, randomise, save in the released layout
    hf_cfg = AutoConfig.from_pretrained(str(outdir))
    model = MODEL_CLASS[family](hf_cfg).float().eval()
    randomize(model, family, gen)
    tensors = checkpoint_tensors(model, family, cfg_json, gen)
    files = write_checkpoint(tensors, outdir, N_SHARDS.get(family, 1))
    del model

    # 2. check the on-disk layout against the released layout (design doc)
    stored = read_checkpoint(outdir)
    check_layout(family, cfg_json, stored)
    names = sorted(stored)
    print(f"{len(names)} tensors in {files}")
    for k in names:
        if ".experts." in k and not (".experts.0." in k or ".experts.gate_up_proj" in k or ".experts.down_proj" in k):
            continue
        if ".layers." in k and not any(f".layers.{i}." in k for i in (0, 1)) and not k.startswith("mtp."):
            continue
        print(f"  {k:70s} {str(list(stored[k].shape)):18s} {str(stored[k].dtype).replace('torch.', '')}")

    # 3. reload exactly as stored, in fp64, eager attention, eager experts
    model, info = MODEL_CLASS[family].from_pretrained(
        str(outdir),
        dtype=torch.float64,
        attn_implementation="eager",
        experts_implementation="eager",
        output_loading_info=True,
    )
    model.eval()
    assert not info["missing_keys"], f"missing keys on reload: {info['missing_keys']}"
    assert not info.get("mismatched_keys"), f"mismatched keys on reload: {info['mismatched_keys']}"
    unexpected = sorted(info["unexpected_keys"])
    assert all(k.startswith("mtp.") for k in unexpected), f"unexpected keys: {unexpected[:8]}"
    check_loaded_weights(model, family, cfg_json, stored)
    tc = text_cfg(model)
    assert tc._attn_implementation == "eager", tc._attn_implementation
    assert tc._experts_implementation in ("eager", None) or family not in EXPERT_LAYOUT, tc._experts_implementation
    # config sanity: what HF parsed from the config.json we wrote
    rp = tc.rope_parameters
    print(f"HF-parsed rope_parameters: {rp}; layer_types: {getattr(tc, 'layer_types', None)}")
    if family in HYBRID:
        assert abs(rp["partial_rotary_factor"] - 0.25) < 1e-12, rp
        assert sum(t == "linear_attention" for t in tc.layer_types) >= 2 and sum(t == "full_attention" for t in tc.layer_types) >= 2
    if family in EXPERT_LAYOUT:
        assert getattr(tc, "num_experts", None) in (8, 16) or getattr(tc, "num_local_experts", None) in (8, 16)

    counter = None
    if family in HYBRID:
        counter = PathCounter(importlib.import_module(modeling_module(family)))

    # 4. references
    prompts = make_prompts(family)
    prompt_refs = []
    eos_ids = set()
    gc = json.loads((outdir / "generation_config.json").read_text())
    for e in (gc.get("eos_token_id"), tc.eos_token_id):
        if isinstance(e, list):
            eos_ids.update(e)
        elif e is not None:
            eos_ids.add(e)
    for ids in prompts:
        T = len(ids)
        if counter:
            counter.reset()
        logits = full_logits(model, ids)
        if counter:
            n_lin = sum(1 for t in tc.layer_types if t == "linear_attention")
            # no cache => HF always takes the chunked GDN kernel (chunk 64, zero-padded), even for T=1
            assert counter.counts["torch_chunk_gated_delta_rule"] == n_lin, counter.counts
            assert counter.counts["torch_recurrent_gated_delta_rule"] == 0, counter.counts
            assert counter.counts["causal_conv1d_fn"] == n_lin and counter.counts["causal_conv1d_update"] == 0
            assert all(l == T for l in counter.chunk_lengths)
        assert logits.shape == (T, VOCAB)
        assert torch.isfinite(logits).all(), "non-finite logits"
        std = logits.std(dim=-1)
        assert (std > 1e-3).all(), "constant logits"
        assert std.mean() > 0.5, f"logit spread too small: mean std {std.mean():.3f}"
        fn = f"logits_T{T}.npy"
        arr = np.ascontiguousarray(logits.to(torch.float32).numpy())
        np.save(outdir / fn, arr)
        greedy, margins = greedy_no_cache(model, ids, N_GREEDY)
        assert greedy[0] == int(logits[-1].argmax())
        assert not (eos_ids & set(greedy)), f"EOS {eos_ids & set(greedy)} in a greedy continuation; pick other eos ids"
        entry = {"ids": ids, "logits": fn, "greedy": greedy, "greedy_margins": margins,
                 "greedy_contains_eos": bool(eos_ids & set(greedy))}
        prompt_refs.append(entry)
        print(
            f"T={T:3d}: logit std mean {std.mean():.3f} min {std.min():.3f}; |logit| max {logits.abs().max():.2f}; "
            f"greedy {greedy}; min margin {min(margins):.4f}; eos in greedy: {bool(eos_ids & set(greedy))}"
        )

    # 5. sanity checks
    checks = {}
    long_ids = prompts[PROMPT_LENGTHS.index(130)]
    if family in EXPERT_LAYOUT:
        caps = routing_stats(model, long_ids)
        E = tc.num_experts
        k = tc.num_experts_per_tok
        per_layer = {}
        for name, (scores, idx) in caps.items():
            distinct = int(idx.unique().numel())
            combos = len({tuple(sorted(r)) for r in idx.tolist()})
            spread = (scores.max(-1).values - scores.min(-1).values).mean().item()
            per_layer[name] = {"distinct_experts": distinct, "distinct_topk_sets": combos, "mean_topk_weight_spread": round(spread, 4)}
            assert distinct > E // 2, f"{name}: only {distinct} distinct experts of {E}"
            assert combos > 10, f"{name}: only {combos} distinct top-k sets"
            assert spread > 0.05, f"{name}: top-k weights near-uniform (mean max-min {spread:.3f})"
        checks["routing_T130"] = per_layer
        print(f"routing (E={E}, k={k}): " + "; ".join(f"{v['distinct_experts']}/{v['distinct_topk_sets']}/{v['mean_topk_weight_spread']}" for v in per_layer.values()))
    if family in HYBRID:
        d = decay_stats(model, long_ids)
        q = torch.quantile(d.float(), torch.tensor([0.0, 0.05, 0.5, 0.95, 1.0])).tolist()
        checks["gdn_decay_exp_g_quantiles_0_5_50_95_100"] = [round(x, 4) for x in q]
        print(f"GDN decay exp(g) quantiles (0,5,50,95,100%): {[round(x, 3) for x in q]}")
        assert q[1] < 0.6 and q[3] > 0.85 and q[0] > 0.05, q
    # cached-vs-uncached self-consistency (all families; required for the hybrids)
    cons = []
    for ids, ent in zip(prompts, prompt_refs):
        if len(ids) in (1, 65, 130):
            r = cached_consistency(model, family, ids, ent["greedy"][:-1], counter)
            r["prompt_len"] = len(ids)
            cons.append(r)
            print(f"cache self-consistency T={len(ids)}: {r}")
            assert r["prefill_decode_max_rel"] < 1e-4 and r["two_piece_prefill_max_rel"] < 1e-4, r
    checks["hf_cache_self_consistency"] = cons
    if family in EXPERT_LAYOUT:
        # Discrete-decision robustness: the smallest gap between the k-th and (k+1)-th router LOGIT over every layer
        # and every position the references touch (prompt + greedy continuation; causal, so one forward per prompt
        # covers all). An fp32 engine's router-logit error is ~1e-6, so a gap above 2e-5 cannot flip an expert choice.
        gaps = []
        for ids, ent in zip(prompts, prompt_refs):
            gaps.append(min_router_gap(model, ids + ent["greedy"][:-1], tc.num_experts_per_tok))
        checks["min_router_topk_logit_gap_per_prompt"] = [float(f"{g:.3e}") for g in gaps]
        print(f"min router top-k logit gap (l_k - l_k+1) per prompt: {[f'{g:.2e}' for g in gaps]}")
        assert min(gaps) > 2e-5, f"near-tied routing decision (logit gap {min(gaps):.2e}); change the seed"

    # 6. independent pure-fp64 implementation from the design doc vs. the stored HF logits
    indep = []
    for ids, ent in zip(prompts, prompt_refs):
        got = independent_logits(family, cfg_json, stored, ids)
        ref_np = torch.from_numpy(np.load(outdir / ent["logits"])).double()
        diff = (got - ref_np).abs().max().item()
        indep.append(float(f"{diff:.3e}"))
        assert diff < 1e-4 and torch.equal(got.argmax(-1), ref_np.argmax(-1)), (len(ids), diff)
    checks["independent_fp64_impl_max_abs_diff_per_prompt"] = indep
    print(f"independent fp64 implementation vs HF logits, max abs diff per prompt: {indep}")

    # 7. a cross-check for the VLM wrapper: the text-only CausalLM class on the same file gives the same logits
    if family == "qwen3_5_moe":
        lm = Qwen3_5MoeForCausalLM.from_pretrained(
            str(outdir), config=model.config.text_config, dtype=torch.float64,
            attn_implementation="eager", experts_implementation="eager")
        x = full_logits(lm, long_ids)
        ref = full_logits(model, long_ids)
        diff = (x - ref).abs().max().item()
        print(f"Qwen3_5MoeForCausalLM on the VLM checkpoint vs ForConditionalGeneration: max abs diff {diff:.3e}")
        assert diff < 1e-9, diff
        checks["causal_lm_vs_conditional_generation_max_abs"] = diff

    ref = {
        "family": family,
        "model_class": MODEL_CLASS[family].__name__,
        "checkpoint_files": files,
        "expert_layout": EXPERT_LAYOUT.get(family, "dense"),
        "versions": {
            "torch": torch.__version__,
            "transformers": transformers.__version__,
            "safetensors": importlib.import_module("safetensors").__version__,
            "numpy": np.__version__,
            "python": platform.python_version(),
        },
        "reference_dtype": "float64 weights/activations (bf16-rounded weights from the stored checkpoint), with HF's fp32 islands",
        "fp32_islands": FP32_ISLANDS,
        "attn_implementation": "eager",
        "experts_implementation": "eager",
        "no_cache_gdn_path": (
            "chunked (torch_chunk_gated_delta_rule, chunk 64, zero-padded to a multiple of 64) for every prompt length, "
            "including T=1, whenever use_cache=False" if family in HYBRID else None
        ),
        "eos_token_ids": sorted(eos_ids),
        "prompts": prompt_refs,
        "greedy_note": f"{N_GREEDY} tokens, argmax, each step re-runs the full sequence without a cache; greedy_margins = top1 - top2 logit; no EOS id appears in them (asserted), so EOS-stopping engines also produce all 16",
        "tolerance_note": (
            "logits were computed in fp64 from the bf16 weights as stored (fp32 islands listed above: error vs exact math "
            "~1e-5 abs). Suggested: fp32 engine path atol 2e-3 + rtol 1e-3 on logits; bf16-activation paths need ~5e-2..1e-1 "
            "abs (compare argmax only where the stored top1-top2 margin exceeds the tolerance). Greedy sequences should match "
            "exactly while every margin so far is larger than the engine's logit error."
        ),
        "checks": checks,
        "logits_sha256": {e["logits"]: sha256(outdir / e["logits"]) for e in prompt_refs},
    }
    (outdir / "reference.json").write_text(json.dumps(ref, indent=1) + "\n")
    size = sum(p.stat().st_size for p in outdir.iterdir())
    print(f"{family}: {size / 1e6:.2f} MB in {outdir}")
    return {"family": family, "bytes": size}


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default=str(REPO / "tests" / "fixtures"))
    ap.add_argument("--family", action="append", choices=FAMILIES)
    args = ap.parse_args()
    assert transformers.__version__ == "5.17.0", f"fixtures were defined against transformers 5.17.0, found {transformers.__version__}"
    assert_no_fast_kernels()
    torch.set_num_threads(max(1, min(8, os.cpu_count() or 1)))
    torch.use_deterministic_algorithms(True)
    root = Path(args.out)
    root.mkdir(parents=True, exist_ok=True)
    results = [build_family(f, root) for f in (args.family or FAMILIES)]
    print("\nsummary:", ", ".join(f"{r['family']} {r['bytes'] / 1e6:.2f} MB" for r in results),
          f"total {sum(r['bytes'] for r in results) / 1e6:.2f} MB")


if __name__ == "__main__":
    main()
