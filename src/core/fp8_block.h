// Block-scaled FP8 weights, the format of the DeepSeek-V3 / Qwen3.x FP8 releases (HF "fp8" quant_method,
// weight_block_size [128, 128]): float8_e4m3fn values W8 and one scale per 128 x 128 block of every
// matrix, `weight_scale_inv`, with W = W8 * scale_inv; blocks at the right and bottom edges are partial
// when a dimension is not a multiple of 128. Quantisation (--quantization fp8) uses the same blocks with
// scale_inv = max |block| / 448 and W8 = e4m3(W / scale_inv), round to nearest even.
//
// In memory a tensor is held as rows x cols (all leading dims folded into rows: [E, R, C] is E * R rows)
// with its scales expanded per row: scale[r, kb] is the scale of the block holding row r and columns
// kb * 128 .. kb * 128 + 127. This one layout serves fused and per-expert experts, gate|up stacks whose
// parts are not multiples of 128, and the GPU kernels (a row's scales are contiguous).
#pragma once
#include <cstdint>
#include <vector>

namespace moefold {

inline constexpr int64_t kFp8BlockSize = 128;  ///< both block dims
inline constexpr float kFp8E4m3Max = 448.0f;   ///< largest finite float8_e4m3fn

/// A block-scaled FP8 matrix: q [rows, cols] e4m3fn bytes, scale [rows, col_blocks()] fp32.
struct Fp8Weight {
  int64_t rows = 0, cols = 0;
  std::vector<uint8_t> q;
  std::vector<float> scale;
  int64_t col_blocks() const { return (cols + kFp8BlockSize - 1) / kFp8BlockSize; }
  /// fp32 value of element (r, c): f8(q) * scale, one fp32 multiply (what the CPU backend computes with).
  float value(int64_t r, int64_t c) const;
};

/// From a checkpoint: `q` [mats, rows, cols] e4m3fn bytes, `block_scales` [mats, ceil(rows / 128),
/// ceil(cols / 128)] fp32. The result has mats * rows rows.
Fp8Weight fp8_from_blocks(const uint8_t* q, const float* block_scales, int64_t mats, int64_t rows, int64_t cols);

/// Quantises `w` [mats, rows, cols] (fp32) with 128 x 128 blocks per matrix: scale_inv = max |block| / 448
/// (1 for an all-zero block), q = e4m3(w / scale_inv) round-to-nearest-even. Throws Error on a non-finite
/// weight (its block would have no meaningful scale).
Fp8Weight fp8_quantize(const float* w, int64_t mats, int64_t rows, int64_t cols);

/// The dynamic activation quantisation of the FP8 releases (activation_scheme "dynamic", what an FP8
/// tensor-core GEMM's A operand sees), applied in place and dequantised again: x [T, K] per token and
/// 128-column block (1 x 128; the last block partial when K % 128 != 0): s = max |block| / 448 (fp32; 1 for
/// an all-zero block), x = f8(e4m3(x / s)) * s (one fp32 multiply). Non-finite values give NaN / saturate.
void fp8_fake_quantize_activations(float* x, int64_t T, int64_t K);

/// w[r, c] = Fp8Weight::value(r, c) for every element: [rows, cols] fp32.
std::vector<float> fp8_dequantize(const Fp8Weight& w);

/// Appends b's rows below a's (same cols; throws Error otherwise). An empty `a` becomes b.
void fp8_append_rows(Fp8Weight& a, const Fp8Weight& b);

/// Rows [r0, r0 + n) of `w` (a tensor-parallel shard of a column-parallel weight): scales are per row,
/// so any row range is exact. Throws Error for a range outside w.
Fp8Weight fp8_slice_rows(const Fp8Weight& w, int64_t r0, int64_t n);

/// Whether columns [c0, c0 + n) of a `cols`-wide weight keep whole scale blocks in the slice's own
/// 128-column grid: c0 a multiple of 128, or the slice lying inside one 128-wide block (a shard of
/// 64 or 32 columns of a shared block, as a 512-wide expert split 8 ways gives).
bool fp8_cols_sliceable(int64_t cols, int64_t c0, int64_t n);

/// Columns [c0, c0 + n) of `w` (a shard of a row-parallel weight): the slice's block kb takes the
/// scale of the source block holding its columns, so a shard inside a shared 128-wide block takes
/// that block's scale; dequantising the slice gives exactly the same values as slicing the
/// dequantised weight. Throws Error when !fp8_cols_sliceable (the slice would straddle two source
/// blocks inside one of its own) or the range is outside w.
Fp8Weight fp8_slice_cols(const Fp8Weight& w, int64_t c0, int64_t n);

}  // namespace moefold
