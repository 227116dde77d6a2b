// A step's int32 inputs (token ids, positions, logits rows, state slots, cu_seqlens, context lengths,
// the device counts and the block tables) in one device arena with a pinned host mirror, so that a step
// uploads them with one copy instead of one pageable copy each.
//
// The arena's layout is a function of the step's dims only (rows, sequences, block-table stride): a
// CUDA graph captured for some dims bakes that layout's addresses, and every step replayed on it lays
// the arena out the same way. The counts always sit at the arena's start.
#pragma once
#include <cuda_runtime_api.h>

#include <array>
#include <cstddef>
#include <cstdint>

#include "ops/cuda/device_buffer.h"

namespace moefold::cuda {

class StepMetadata {
 public:
  enum Field { Counts, Ids, Positions, LogitsRows, StateSlots, CuSeqlens, ContextLens, BlockTables, kFields };
  /// Rows, sequences and block-table entries per sequence that a layout covers.
  struct Dims {
    int64_t rows = 0;
    int64_t seqs = 0;
    int64_t table_stride = 0;
  };

  StepMetadata() = default;
  ~StepMetadata();
  StepMetadata(const StepMetadata&) = delete;
  StepMetadata& operator=(const StepMetadata&) = delete;

  /// Allocates room for every layout up to `max` (each dim) and `counts` device counts. Throws
  /// moefold::Error (CUDA) when out of memory.
  void reserve(Dims max, int64_t counts);

  /// Lays the arena out for dims `d` (each within reserve's) and waits until the previous upload has
  /// left the host mirror; the host fields may then be written. Throws moefold::Error past reserve's dims.
  void begin(Dims d);
  /// Field `f` of the current layout: on the device (stable until the next begin() with other dims) and
  /// in the host mirror (written before upload()).
  int32_t* device(Field f) const { return arena_.data() == nullptr ? nullptr : dev_base_ + offset_[f]; }
  int32_t* host(Field f) const { return host_ + offset_[f]; }
  /// Elements of field `f` in the current layout.
  int64_t size(Field f) const { return size_[f]; }

  /// Copies the current layout (host mirror) to the device on `stream`, in one copy.
  void upload(cudaStream_t stream);

 private:
  static std::array<int64_t, kFields> sizes(Dims d, int64_t counts);
  DeviceBuffer<int32_t> arena_;
  int32_t* dev_base_ = nullptr;
  int32_t* host_ = nullptr;  // pinned
  size_t capacity_ = 0;      // words
  Dims max_;
  int64_t counts_ = 0;
  std::array<int64_t, kFields> offset_{}, size_{};
  int64_t words_ = 0;
  cudaEvent_t copied_ = nullptr;
  bool pending_ = false;
};

}  // namespace moefold::cuda
