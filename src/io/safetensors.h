// Safetensors checkpoints: one file (mmap) or a sharded directory with model.safetensors.index.json.
// Format: https://github.com/huggingface/safetensors (8-byte little-endian header length, JSON header
// of {name: {dtype, shape, data_offsets}}, then the raw little-endian tensor bytes).
#pragma once
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "core/dtype.h"

namespace moefold {

/// A read-only view of one stored tensor; `data` stays valid while the owning file is open.
struct TensorView {
  std::string name;
  DType dtype;
  std::vector<int64_t> shape;
  const void* data = nullptr;
  size_t nbytes = 0;
  int64_t numel() const;
  /// Copies the tensor into fp32 (exact for F32/BF16/F16/F8_E4M3); throws for integer dtypes.
  std::vector<float> to_f32() const;
};

/// "[a, b, c]" for messages.
std::string shape_str(const std::vector<int64_t>& shape);

/// Parses a whole .safetensors image held in memory (`data`, `size` bytes: the 8-byte header length,
/// the JSON header, the data section) into tensor views pointing into `data`. `what` names the file in
/// messages. Throws Error on a truncated or malformed header, an entry that is not {dtype, shape,
/// data_offsets}, negative or non-integer dims, an element or byte count that overflows, offsets
/// outside the data section, a dtype x shape byte count that differs from the offsets' span, or two
/// tensors whose byte ranges overlap. Untrusted input: never crashes, never reads outside `data`.
std::map<std::string, TensorView> parse_safetensors(const uint8_t* data, size_t size, const std::string& what);

/// One memory-mapped .safetensors file (parsed with parse_safetensors). Throws Error on a truncated or malformed header,
/// out-of-range offsets, or a dtype/shape/byte-count mismatch.
class SafetensorsFile {
 public:
  explicit SafetensorsFile(const std::string& path);
  ~SafetensorsFile();
  SafetensorsFile(const SafetensorsFile&) = delete;
  SafetensorsFile& operator=(const SafetensorsFile&) = delete;

  const std::map<std::string, TensorView>& tensors() const { return tensors_; }
  const std::string& path() const { return path_; }

 private:
  std::string path_;
  void* map_ = nullptr;
  size_t size_ = 0;
  std::map<std::string, TensorView> tensors_;
};

/// All tensors of a checkpoint directory (model.safetensors, or the shards named by
/// model.safetensors.index.json, or every *.safetensors file when there is no index).
class Checkpoint {
 public:
  /// Opens `dir`; throws Error if it holds no safetensors file or a shard named by the index is missing.
  explicit Checkpoint(const std::string& dir);
  bool has(const std::string& name) const { return index_.count(name) != 0; }
  /// The tensor `name`; throws Error naming it if absent.
  const TensorView& get(const std::string& name) const;
  std::vector<std::string> names() const;

 private:
  std::vector<std::unique_ptr<SafetensorsFile>> files_;
  std::map<std::string, const TensorView*> index_;
};

/// Writes tensors to one .safetensors file (used by tests and tools). Each entry: name, dtype,
/// shape and raw bytes of exactly numel * dtype_size bytes.
void write_safetensors(const std::string& path, const std::vector<TensorView>& tensors);

}  // namespace moefold
