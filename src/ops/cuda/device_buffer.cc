#include "ops/cuda/device_buffer.h"

#include "core/dtype.h"
#include "core/error.h"
#include "ops/cuda/cuda_check.h"
#include "ops/cuda/launch_scope.h"

namespace moefold::cuda {

namespace {
// Glue: uploads (batch metadata, weights at load), downloads (logits), fills. A synchronous copy
// (stream null, async false) is timed on the legacy default stream.
const prof::Kernel kH2D{"cudaMemcpyAsync:h2d", prof::Category::Glue};
const prof::Kernel kD2H{"cudaMemcpyAsync:d2h", prof::Category::Glue};
const prof::Kernel kMemset{"cudaMemsetAsync", prof::Category::Glue};
}  // namespace

void* device_alloc(size_t bytes) {
  if (bytes == 0) return nullptr;
  void* p = nullptr;
  cudaError_t e = cudaMalloc(&p, bytes);
  if (e != cudaSuccess) {
    cudaGetLastError();  // clear the sticky-free allocation error
    size_t free_b = 0, total_b = 0;
    cudaMemGetInfo(&free_b, &total_b);
    fail("cudaMalloc of {} bytes failed ({}); {} of {} bytes free", bytes, cudaGetErrorString(e), free_b, total_b);
  }
  return p;
}

void device_free(void* p) noexcept {
  if (p) cudaFree(p);  // errors here are from earlier asynchronous faults; never throw from a destructor
}

void copy_to_device(void* dst, const void* src, size_t bytes, cudaStream_t stream, bool async) {
  if (bytes == 0) return;
  LaunchScope launch(kH2D, async ? stream : nullptr, prof::Work{double(bytes), 0});
  if (async) {
    MOEFOLD_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyHostToDevice, stream));
  } else {
    MOEFOLD_CUDA_CHECK(cudaMemcpy(dst, src, bytes, cudaMemcpyHostToDevice));
  }
}

void copy_to_host(void* dst, const void* src, size_t bytes, cudaStream_t stream, bool async) {
  if (bytes == 0) return;
  LaunchScope launch(kD2H, async ? stream : nullptr, prof::Work{double(bytes), 0});
  if (async) {
    MOEFOLD_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToHost, stream));
  } else {
    MOEFOLD_CUDA_CHECK(cudaMemcpy(dst, src, bytes, cudaMemcpyDeviceToHost));
  }
}

void fill_device_bytes(void* dst, int byte, size_t bytes, cudaStream_t stream) {
  if (bytes == 0) return;
  LaunchScope launch(kMemset, stream, prof::Work{double(bytes), 0});
  MOEFOLD_CUDA_CHECK(cudaMemsetAsync(dst, byte, bytes, stream));
}

void throw_range_error(size_t offset, size_t n, size_t size) {
  fail("device buffer range [{}, {}) is outside its {} elements", offset, offset + n, size);
}

std::vector<__nv_bfloat16> to_bf16_host(std::span<const float> x) {
  std::vector<__nv_bfloat16> out(x.size());
  for (size_t i = 0; i < x.size(); ++i) {
    __nv_bfloat16_raw r;
    r.x = f32_to_bf16(x[i]);
    out[i] = __nv_bfloat16(r);
  }
  return out;
}

std::vector<float> bf16_to_f32_host(std::span<const __nv_bfloat16> x) {
  std::vector<float> out(x.size());
  for (size_t i = 0; i < x.size(); ++i) {
    const __nv_bfloat16_raw r = x[i];
    out[i] = bf16_to_f32(r.x);
  }
  return out;
}

DeviceBuffer<__nv_bfloat16> to_device_bf16(std::span<const float> host) {
  return to_device(to_bf16_host(host));
}

std::vector<float> download_f32(const DeviceBuffer<__nv_bfloat16>& d) { return bf16_to_f32_host(d.download()); }

}  // namespace moefold::cuda
