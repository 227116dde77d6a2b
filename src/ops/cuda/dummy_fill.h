// Dummy weights generated on the GPU: the values of models/dummy_init.h (bit-identical to the host
// DummySource), rounded to bf16 in place, so `--load-format dummy` never builds the tensor on the host.
#pragma once
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "models/dummy_init.h"

namespace moefold::cuda {

/// out[i] = bf16(dummy_value(recipe, i)) for i in [0, n) (round to nearest even). out: [n] bf16 device
/// memory. Asynchronous on `stream`; throws moefold::Error on a launch error.
void dummy_fill_bf16(const DummyRecipe& recipe, __nv_bfloat16* out, int64_t n, cudaStream_t stream);

}  // namespace moefold::cuda
