// DeviceBuffer<T>: one plain cudaMalloc allocation of n elements of T, owned RAII-style (freed in
// the destructor, move-only), with synchronous and stream-ordered upload/download helpers. No
// managed memory, no pooling: allocate once (weights, KV pages, activation buckets), reuse.
//
//   DeviceBuffer<__nv_bfloat16> w = to_device_bf16(host_f32);   // fp32 host -> bf16 device (RNE)
//   DeviceBuffer<int32_t> ids(T); ids.upload(host_ids);         // synchronous copy
//   std::vector<float> back = download_f32(w);                   // bf16 device -> fp32 host
//
// Every failing CUDA call throws moefold::Error (cuda_check.h). Contents after construction are
// uninitialised; fill_bytes() sets every byte (0xFF in bf16/fp32 is NaN: the tests' poison).
#pragma once
#include <cuda_bf16.h>
#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>
#include <span>
#include <utility>
#include <vector>

namespace moefold::cuda {

/// Untyped helpers behind DeviceBuffer (device_buffer.cc). Sizes in bytes.
void* device_alloc(size_t bytes);  ///< cudaMalloc; nullptr for 0 bytes
void device_free(void* p) noexcept;
void copy_to_device(void* dst, const void* src, size_t bytes, cudaStream_t stream, bool async);
void copy_to_host(void* dst, const void* src, size_t bytes, cudaStream_t stream, bool async);
void fill_device_bytes(void* dst, int byte, size_t bytes, cudaStream_t stream);

template <class T>
class DeviceBuffer {
 public:
  DeviceBuffer() = default;
  /// Allocates n elements (uninitialised).
  explicit DeviceBuffer(size_t n) : ptr_(static_cast<T*>(device_alloc(n * sizeof(T)))), n_(n) {}
  ~DeviceBuffer() { device_free(ptr_); }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  DeviceBuffer(DeviceBuffer&& o) noexcept : ptr_(std::exchange(o.ptr_, nullptr)), n_(std::exchange(o.n_, 0)) {}
  DeviceBuffer& operator=(DeviceBuffer&& o) noexcept {
    if (this != &o) {
      device_free(ptr_);
      ptr_ = std::exchange(o.ptr_, nullptr);
      n_ = std::exchange(o.n_, 0);
    }
    return *this;
  }

  T* data() { return ptr_; }
  const T* data() const { return ptr_; }
  size_t size() const { return n_; }
  size_t bytes() const { return n_ * sizeof(T); }
  bool empty() const { return n_ == 0; }

  /// Copies host[0, n) to elements [offset, offset + n). Synchronous unless a stream is given
  /// with async = true (then `host` must stay alive until the stream reaches the copy).
  /// Throws Error if the range exceeds size().
  void upload(const T* host, size_t n, size_t offset = 0, cudaStream_t stream = nullptr, bool async = false) {
    check_range(offset, n);
    copy_to_device(ptr_ + offset, host, n * sizeof(T), stream, async);
  }
  void upload(std::span<const T> host, size_t offset = 0) { upload(host.data(), host.size(), offset); }
  void upload(const std::vector<T>& host, size_t offset = 0) { upload(host.data(), host.size(), offset); }

  /// Copies elements [offset, offset + n) to host[0, n); synchronous unless async.
  void download(T* host, size_t n, size_t offset = 0, cudaStream_t stream = nullptr, bool async = false) const {
    check_range(offset, n);
    copy_to_host(host, ptr_ + offset, n * sizeof(T), stream, async);
  }
  /// The whole buffer, synchronously.
  std::vector<T> download() const {
    std::vector<T> h(n_);
    download(h.data(), n_);
    return h;
  }

  /// Sets every byte to `byte` (stream-ordered; synchronous when stream is null and the caller
  /// synchronises). fill_bytes(0xFF) poisons bf16 / fp32 contents with NaN.
  void fill_bytes(int byte, cudaStream_t stream = nullptr) { fill_device_bytes(ptr_, byte, bytes(), stream); }

 private:
  void check_range(size_t offset, size_t n) const;
  T* ptr_ = nullptr;
  size_t n_ = 0;
};

[[noreturn]] void throw_range_error(size_t offset, size_t n, size_t size);

template <class T>
void DeviceBuffer<T>::check_range(size_t offset, size_t n) const {
  if (offset > n_ || n > n_ - offset) throw_range_error(offset, n, n_);
}

/// A device copy of a host vector.
template <class T>
DeviceBuffer<T> to_device(const std::vector<T>& host) {
  DeviceBuffer<T> d(host.size());
  d.upload(host);
  return d;
}

/// fp32 <-> bf16 (round-to-nearest-even, as moefold::f32_to_bf16) on the host side of a copy.
std::vector<__nv_bfloat16> to_bf16_host(std::span<const float> x);
std::vector<float> bf16_to_f32_host(std::span<const __nv_bfloat16> x);
/// bf16 device copy of fp32 host values.
DeviceBuffer<__nv_bfloat16> to_device_bf16(std::span<const float> host);
/// fp32 host copy of a bf16 device buffer (synchronous).
std::vector<float> download_f32(const DeviceBuffer<__nv_bfloat16>& d);

}  // namespace moefold::cuda
