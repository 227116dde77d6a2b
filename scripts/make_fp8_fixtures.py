#!/usr/bin/env python3
"""Block-scaled FP8 checkpoints in the released layout (Qwen3.x-FP8, DeepSeek-V3 style) from bf16 ones.

numpy only (no torch, no safetensors package): safetensors files are read and written directly, and
float8_e4m3fn rounding is done in numpy (round to nearest even, saturating at 448).

Format written (what `quantization_config: {quant_method: fp8, weight_block_size: [128, 128]}` means):
every quantised weight W [.., R, C] is stored as F8_E4M3 `name` plus `name_scale_inv`
[.., ceil(R/128), ceil(C/128)] (BF16 or F32), W ~= W8 * scale_inv per 128 x 128 block (partial blocks at
the edges), scale_inv = max|block| / 448 (rounded to the scale dtype first), W8 = e4m3(W / scale_inv).
Kept in bf16 as the release does: embeddings, lm_head, norms, the router (mlp.gate), shared_expert_gate,
linear_attn.in_proj_a / in_proj_b / conv1d / A_log / dt_bias, and every non-language-model tensor.

Usage:
  python3 scripts/make_fp8_fixtures.py                 # the committed fixtures under tests/fixtures/fp8/
  python3 scripts/make_fp8_fixtures.py --src models/smollm2-135m-instruct --out /tmp/smollm2_fp8 \\
      [--experts per_expert|fused|as_is] [--scale-dtype bf16|f32] [--dequantized-out /tmp/smollm2_deq]
--dequantized-out also writes the exact dequantisation (F32, W8 * scale_inv) as a plain checkpoint.
"""
import argparse
import json
import os
import re
import shutil
import struct
import sys

import numpy as np

BLOCK = 128
E4M3_MAX = 448.0

# ---------------------------------------------------------------- safetensors I/O (numpy only)

_NP = {"F32": np.float32, "F16": np.float16, "I32": np.int32, "I64": np.int64, "U8": np.uint8,
       "F8_E4M3": np.uint8, "BF16": np.uint16}


def bf16_to_f32(u16):
    return (u16.astype(np.uint32) << 16).view(np.float32)


def f32_to_bf16(f):
    """Round to nearest even; NaN stays NaN."""
    u = np.ascontiguousarray(f, dtype=np.float32).view(np.uint32).astype(np.uint64)
    r = ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype(np.uint16)
    nan = np.isnan(f)
    if nan.any():
        r[nan] = ((u[nan] >> 16) | 0x40).astype(np.uint16)
    return r


def read_safetensors(path):
    """{name: (dtype string, shape, raw numpy array in its storage type)}, in file order."""
    with open(path, "rb") as f:
        data = f.read()
    n = struct.unpack("<Q", data[:8])[0]
    header = json.loads(data[8:8 + n])
    base = 8 + n
    out = {}
    for name, e in header.items():
        if name == "__metadata__":
            continue
        a, b = e["data_offsets"]
        arr = np.frombuffer(data[base + a:base + b], dtype=_NP[e["dtype"]]).reshape(e["shape"])
        out[name] = (e["dtype"], list(e["shape"]), arr)
    return out


def read_checkpoint(d):
    idx = os.path.join(d, "model.safetensors.index.json")
    files = sorted(set(json.load(open(idx))["weight_map"].values())) if os.path.exists(idx) else \
        sorted(f for f in os.listdir(d) if f.endswith(".safetensors"))
    out = {}
    for f in files:
        out.update(read_safetensors(os.path.join(d, f)))
    return out


def write_safetensors(path, tensors):
    """tensors: {name: (dtype string, numpy array)} written in sorted name order."""
    header, offset, blobs = {}, 0, []
    for name in sorted(tensors):
        dt, arr = tensors[name]
        raw = np.ascontiguousarray(arr).tobytes()
        header[name] = {"dtype": dt, "shape": list(arr.shape), "data_offsets": [offset, offset + len(raw)]}
        offset += len(raw)
        blobs.append(raw)
    h = json.dumps(header, separators=(",", ":")).encode()
    h += b" " * ((8 - len(h) % 8) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)))
        f.write(h)
        for b in blobs:
            f.write(b)


def to_f32(dt, arr):
    if dt == "BF16":
        return bf16_to_f32(arr)
    if dt in ("F32", "F16"):
        return arr.astype(np.float32)
    raise ValueError(f"cannot quantise a {dt} tensor")

# ---------------------------------------------------------------- float8_e4m3fn


def _e4m3_table():
    codes = np.arange(0x7F, dtype=np.int64)  # non-negative finite codes 0 .. 0x7e, increasing values
    e, m = codes >> 3, codes & 7
    return np.where(e == 0, m * 2.0 ** -9, (1.0 + m / 8.0) * 2.0 ** (e - 7)).astype(np.float32)


E4M3_VALUES = _e4m3_table()


def f32_to_e4m3(x):
    """fp32 array -> e4m3fn codes (uint8): round to nearest even, saturating to +-448."""
    x = np.asarray(x, dtype=np.float32)
    a = np.abs(x).astype(np.float64)
    _, e = np.frexp(a)  # a = m 2^e, m in [0.5, 1)
    step = np.where(e - 1 >= -6, np.ldexp(1.0, e - 4), 2.0 ** -9)  # 3 mantissa bits; subnormal spacing 2^-9
    q = np.minimum(np.rint(a / step) * step, E4M3_MAX)  # exact scalings; rint = ties to even
    code = np.searchsorted(E4M3_VALUES, q.astype(np.float32)).astype(np.uint8)
    return np.where(np.signbit(x), code | 0x80, code).astype(np.uint8)


def e4m3_to_f32(code):
    v = E4M3_VALUES[(code & 0x7F).astype(np.int64)]
    return np.where(code & 0x80, -v, v).astype(np.float32)


def quantize_blocks(w, scale_dtype):
    """w [.., R, C] fp32 -> (codes uint8 [.., R, C], scale_inv fp32 [.., ceil(R/128), ceil(C/128)] rounded to
    scale_dtype, scale storage array)."""
    R, C = w.shape[-2], w.shape[-1]
    br, bc = -(-R // BLOCK), -(-C // BLOCK)
    pad = np.zeros(w.shape[:-2] + (br * BLOCK, bc * BLOCK), np.float32)
    pad[..., :R, :C] = np.abs(w)
    amax = pad.reshape(w.shape[:-2] + (br, BLOCK, bc, BLOCK)).max(axis=(-3, -1))
    scale = np.where(amax > 0, amax / np.float32(E4M3_MAX), np.float32(1.0)).astype(np.float32)
    if scale_dtype == "bf16":
        stored = f32_to_bf16(scale)
        scale = bf16_to_f32(stored)
    else:
        stored = scale
    full = np.repeat(np.repeat(scale, BLOCK, axis=-2), BLOCK, axis=-1)[..., :R, :C]
    codes = f32_to_e4m3((w / full).astype(np.float32))
    return codes, scale, stored


def dequantize_blocks(codes, scale):
    R, C = codes.shape[-2], codes.shape[-1]
    full = np.repeat(np.repeat(scale, BLOCK, axis=-2), BLOCK, axis=-1)[..., :R, :C]
    return (e4m3_to_f32(codes) * full).astype(np.float32)

# ---------------------------------------------------------------- layout


KEEP = re.compile(r"(embed_tokens|lm_head|norm|mlp\.gate\.weight|shared_expert_gate|in_proj_a\.|in_proj_b\.|"
                  r"in_proj_ba\.|conv1d|A_log|dt_bias)")


def quantisable(name, shape):
    if name.startswith(("model.visual.", "mtp.")) or len(shape) < 2:
        return False
    if KEEP.search(name):
        return False
    return name.endswith(".weight") or name.endswith("experts.gate_up_proj") or name.endswith("experts.down_proj")


def relayout(tensors, experts):
    """Expert tensors into per-expert (released Qwen3.6-FP8) or fused form; other tensors untouched."""
    out = dict(tensors)
    fused = re.compile(r"^(.*mlp\.experts\.)(gate_up_proj|down_proj)$")
    per = re.compile(r"^(.*mlp\.experts\.)(\d+)\.(gate_proj|up_proj|down_proj)\.weight$")
    if experts == "per_expert":
        for name in [n for n in tensors if fused.match(n)]:
            pre, kind = fused.match(name).groups()
            dt, _, arr = out.pop(name)
            for e in range(arr.shape[0]):
                if kind == "down_proj":
                    out[f"{pre}{e}.down_proj.weight"] = (dt, list(arr[e].shape), arr[e])
                else:
                    i = arr.shape[1] // 2
                    out[f"{pre}{e}.gate_proj.weight"] = (dt, [i, arr.shape[2]], arr[e, :i])
                    out[f"{pre}{e}.up_proj.weight"] = (dt, [i, arr.shape[2]], arr[e, i:])
    elif experts == "fused":
        groups = {}
        for name in [n for n in tensors if per.match(n)]:
            pre, e, kind = per.match(name).groups()
            groups.setdefault(pre, {})[(int(e), kind)] = out.pop(name)
        for pre, g in groups.items():
            n_e = 1 + max(e for e, _ in g)
            dt = g[(0, "gate_proj")][0]
            gu = np.stack([np.concatenate([g[(e, "gate_proj")][2], g[(e, "up_proj")][2]]) for e in range(n_e)])
            dn = np.stack([g[(e, "down_proj")][2] for e in range(n_e)])
            out[pre + "gate_up_proj"] = (dt, list(gu.shape), gu)
            out[pre + "down_proj"] = (dt, list(dn.shape), dn)
    return out


def convert(src, out, experts="as_is", scale_dtype="bf16", dequantized_out=None):
    cfg = json.load(open(os.path.join(src, "config.json")))
    tensors = relayout(read_checkpoint(src), experts)
    q_out, d_out, kept = {}, {}, []
    for name, (dt, shape, arr) in tensors.items():
        if not quantisable(name, shape):
            q_out[name] = (dt, arr)
            d_out[name] = (dt, arr)
            if len(shape) >= 2 and not name.startswith(("model.visual.", "mtp.")):
                kept.append(name)
            continue
        w = to_f32(dt, arr)
        codes, scale, stored = quantize_blocks(w, scale_dtype)
        q_out[name] = ("F8_E4M3", codes)
        q_out[name + "_scale_inv"] = ("BF16" if scale_dtype == "bf16" else "F32", stored)
        d_out[name] = ("F32", dequantize_blocks(codes, scale))
    cfg["quantization_config"] = {"activation_scheme": "dynamic", "fmt": "e4m3", "quant_method": "fp8",
                                  "weight_block_size": [BLOCK, BLOCK],
                                  "modules_to_not_convert": sorted(k[:-len(".weight")] if k.endswith(".weight")
                                                                   else k for k in kept)}
    for d, tens, c in ((out, q_out, cfg), (dequantized_out, d_out, None)):
        if d is None:
            continue
        os.makedirs(d, exist_ok=True)
        for f in os.listdir(d):
            if f.endswith(".safetensors") or f == "model.safetensors.index.json":
                os.remove(os.path.join(d, f))
        conf = c if c is not None else {k: v for k, v in cfg.items() if k != "quantization_config"}
        with open(os.path.join(d, "config.json"), "w") as f:
            json.dump(conf, f, indent=2)
            f.write("\n")
        for extra in ("generation_config.json", "tokenizer.json", "tokenizer_config.json"):
            if os.path.exists(os.path.join(src, extra)):
                shutil.copy(os.path.join(src, extra), os.path.join(d, extra))
        write_safetensors(os.path.join(d, "model.safetensors"), tens)


# The committed fixtures: (source fixture, output name, expert layout, scale dtype).
FIXTURES = [
    ("qwen3_5_moe", "qwen3_5_moe_per_expert_bf16", "per_expert", "bf16"),  # as Qwen3.6-35B-A3B-FP8 ships
    ("qwen3_5_moe", "qwen3_5_moe_fused_f32", "fused", "f32"),
    ("qwen3_moe", "qwen3_moe_per_expert_f32", "per_expert", "f32"),
    ("qwen3_moe", "qwen3_moe_fused_bf16", "fused", "bf16"),
]


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--src")
    ap.add_argument("--out")
    ap.add_argument("--experts", default="as_is", choices=["as_is", "per_expert", "fused"])
    ap.add_argument("--scale-dtype", default="bf16", choices=["bf16", "f32"])
    ap.add_argument("--dequantized-out")
    a = ap.parse_args()
    if a.src:
        if not a.out:
            sys.exit("--src needs --out")
        convert(a.src, a.out, a.experts, a.scale_dtype, a.dequantized_out)
        return
    root = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "fixtures")
    for src, name, experts, sd in FIXTURES:
        convert(os.path.join(root, src), os.path.join(root, "fp8", name), experts, sd)
        print("wrote", os.path.join("tests/fixtures/fp8", name))


if __name__ == "__main__":
    main()
