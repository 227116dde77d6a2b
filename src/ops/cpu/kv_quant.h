// Element conversions of the FP8 KV cache (--kv-cache-dtype fp8): float8_e4m3fn (OCP FP8: no
// infinities, 0x7f / 0xff NaN, largest finite 448) with one dequantisation scale per (layer, KV head),
// vLLM's convention: stored = e4m3(x / scale), value = e4m3 * scale. The GPU kernels compute the same
// two fp32 operations (an IEEE division, round to nearest even, then the conversion; one multiply),
// so a page stored on either backend dequantises to the same fp32 values.
#pragma once
#include <cstdint>

namespace moefold::cpu {

inline constexpr float kKvFp8Max = 448.0f;  ///< largest finite float8_e4m3fn

/// e4m3(x / scale), round to nearest even; |x / scale| > 448 and infinities saturate to +-448 (0x7e /
/// 0xfe) and set *saturated (when not null); NaN stores NaN (0x7f) and does not count as saturated.
/// Precondition: scale is finite and > 0.
uint8_t kv_fp8_store(float x, float scale, bool* saturated = nullptr);

/// The fp32 value of a stored e4m3 byte: exact e4m3 -> fp32, times `scale` (one fp32 multiply).
float kv_fp8_load(uint8_t q, float scale);

/// The exact fp32 value of every e4m3 byte (a 256-entry table; NaN for 0x7f and 0xff).
const float* kv_fp8_table();

}  // namespace moefold::cpu
