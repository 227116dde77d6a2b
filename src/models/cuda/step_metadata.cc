// One arena for a step's int32 inputs (contract: step_metadata.h).
#include "models/cuda/step_metadata.h"

#include <cuda_runtime.h>

#include "core/error.h"
#include "ops/cuda/cuda_check.h"

namespace moefold::cuda {

namespace {
constexpr int64_t kAlignWords = 16;  // 64-byte aligned fields
int64_t round_up(int64_t n) { return (n + kAlignWords - 1) / kAlignWords * kAlignWords; }
}  // namespace

StepMetadata::~StepMetadata() {
  if (copied_) cudaEventDestroy(copied_);
  if (host_) cudaFreeHost(host_);
}

std::array<int64_t, StepMetadata::kFields> StepMetadata::sizes(Dims d, int64_t counts) {
  std::array<int64_t, kFields> s{};
  s[Counts] = counts;
  s[Ids] = d.rows;
  s[Positions] = d.rows;
  s[LogitsRows] = d.rows;
  s[StateSlots] = d.seqs;
  s[CuSeqlens] = d.seqs + 1;
  s[ContextLens] = d.seqs;
  s[BlockTables] = d.seqs * d.table_stride;
  return s;
}

void StepMetadata::reserve(Dims max, int64_t counts) {
  MOEFOLD_CHECK(max.rows >= 0 && max.seqs >= 0 && max.table_stride >= 0 && counts > 0,
                "step metadata: bad dims {} x {} x {}", max.rows, max.seqs, max.table_stride);
  max_ = max;
  counts_ = counts;
  int64_t words = 0;
  for (int64_t n : sizes(max, counts)) words += round_up(n);
  capacity_ = size_t(words);
  arena_ = DeviceBuffer<int32_t>(capacity_);
  dev_base_ = arena_.data();
  if (host_) cudaFreeHost(host_);
  host_ = nullptr;
  MOEFOLD_CUDA_CHECK(cudaMallocHost(&host_, capacity_ * sizeof(int32_t)));
  if (!copied_) MOEFOLD_CUDA_CHECK(cudaEventCreateWithFlags(&copied_, cudaEventDisableTiming));
  pending_ = false;
  begin(max);
}

void StepMetadata::begin(Dims d) {
  MOEFOLD_CHECK(host_ != nullptr, "step metadata: begin() before reserve()");
  MOEFOLD_CHECK(d.rows >= 0 && d.rows <= max_.rows && d.seqs >= 0 && d.seqs <= max_.seqs && d.table_stride >= 0 &&
                    d.table_stride <= max_.table_stride,
                "step metadata: a step of {} rows, {} sequences and {} table entries each exceeds the reserved "
                "{} x {} x {}",
                d.rows, d.seqs, d.table_stride, max_.rows, max_.seqs, max_.table_stride);
  if (pending_) {
    MOEFOLD_CUDA_CHECK(cudaEventSynchronize(copied_));  // the last copy has read the mirror
    pending_ = false;
  }
  size_ = sizes(d, counts_);
  int64_t at = 0;
  for (int f = 0; f < kFields; ++f) {
    offset_[size_t(f)] = at;
    at += round_up(size_[size_t(f)]);
  }
  words_ = at;
}

void StepMetadata::upload(cudaStream_t stream) {
  MOEFOLD_CUDA_CHECK(cudaMemcpyAsync(dev_base_, host_, size_t(words_) * sizeof(int32_t), cudaMemcpyHostToDevice, stream));
  MOEFOLD_CUDA_CHECK(cudaEventRecord(copied_, stream));
  pending_ = true;
}

}  // namespace moefold::cuda
