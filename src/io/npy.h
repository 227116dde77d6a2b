// NumPy .npy files (format version 1.0, little-endian, C order): float32 and int32 arrays.
// Format: https://numpy.org/doc/stable/reference/generated/numpy.lib.format.html
#pragma once
#include <cstdint>
#include <string>
#include <vector>

namespace moefold {

struct NpyArray {
  std::vector<int64_t> shape;
  std::vector<float> data;  ///< converted to fp32 (from <f4, <f8 or <i4)
};

/// Writes a float32 array of `shape` (product == data.size()). Throws Error on I/O failure.
void write_npy(const std::string& path, const std::vector<int64_t>& shape, const std::vector<float>& data);
/// Reads a float32/float64/int32 C-order array. Throws Error on a malformed or unsupported file.
NpyArray read_npy(const std::string& path);

}  // namespace moefold
