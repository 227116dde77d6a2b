#include "io/safetensors.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <set>

#include "core/error.h"

namespace moefold {

namespace fs = std::filesystem;
using json = nlohmann::json;

int64_t TensorView::numel() const {
  int64_t n = 1;
  for (auto d : shape) n *= d;
  return n;
}

std::vector<float> TensorView::to_f32() const {
  std::vector<float> out(static_cast<size_t>(numel()));
  if (out.empty()) return out;  // an empty vector's data() may be null: memcpy must not see it
  convert_to_f32(dtype, data, out.data(), out.size());
  return out;
}

std::string shape_str(const std::vector<int64_t>& shape) {
  std::string s = "[";
  for (size_t i = 0; i < shape.size(); ++i) s += (i ? ", " : "") + std::to_string(shape[i]);
  return s + "]";
}

namespace {

/// A header value that must be a non-negative JSON integer no larger than `max`.
uint64_t header_uint(const json& v, const char* field, uint64_t max) {
  if (v.is_number_unsigned() && v.get<uint64_t>() <= max) return v.get<uint64_t>();
  if (v.is_number_integer() && !v.is_number_unsigned())
    fail("{} holds a negative value {}", field, v.get<int64_t>());
  if (v.is_number_unsigned()) fail("{} value {} is too large", field, v.get<uint64_t>());
  fail("{} must hold integers, not {}", field, v.dump());
}

/// One header entry {dtype, shape, data_offsets} checked against a data section of `data_size` bytes.
TensorView parse_entry(const std::string& name, const json& info, size_t data_size, uint64_t& begin) {
  if (!info.is_object()) fail("header entry is not an object");
  for (const char* key : {"dtype", "shape", "data_offsets"})
    if (!info.contains(key)) fail("header entry has no '{}'", key);
  const json& dt = info["dtype"];
  const json& sh = info["shape"];
  const json& of = info["data_offsets"];
  if (!dt.is_string()) fail("dtype must be a string, not {}", dt.dump());
  if (!sh.is_array()) fail("shape must be an array, not {}", sh.dump());
  if (!of.is_array() || of.size() != 2) fail("data_offsets must be an array of two integers");
  TensorView t;
  t.name = name;
  t.dtype = dtype_from_safetensors(dt.get<std::string>());
  uint64_t numel = 1;
  for (const json& d : sh) {
    uint64_t v = header_uint(d, "shape", uint64_t(INT64_MAX));
    t.shape.push_back(int64_t(v));
    if (__builtin_mul_overflow(numel, v, &numel) || numel > uint64_t(INT64_MAX))
      fail("shape {} has more elements than fit in 64 bits", sh.dump());
  }
  uint64_t need = 0;
  if (__builtin_mul_overflow(numel, uint64_t(dtype_size(t.dtype)), &need))
    fail("{} x {} needs more bytes than fit in 64 bits", dtype_name(t.dtype), shape_str(t.shape));
  begin = header_uint(of[0], "data_offsets", UINT64_MAX);
  const uint64_t end = header_uint(of[1], "data_offsets", UINT64_MAX);
  if (begin > end || end > data_size)
    fail("data_offsets [{}, {}] out of range (data section is {} bytes)", begin, end, data_size);
  t.nbytes = size_t(end - begin);
  if (need != t.nbytes)
    fail("{} x {} needs {} bytes but data_offsets span {}", dtype_name(t.dtype), shape_str(t.shape), need, t.nbytes);
  return t;
}

}  // namespace

std::map<std::string, TensorView> parse_safetensors(const uint8_t* base, size_t size, const std::string& path) {
  if (size < 8) fail("'{}' is not a safetensors file: {} bytes, too short for the 8-byte header length", path, size);
  uint64_t hlen = 0;
  std::memcpy(&hlen, base, 8);
  if (hlen > size - 8)
    fail("'{}': truncated safetensors header (header says {} bytes, file has {} after the length)", path,
         hlen, size - 8);
  json header;
  try {
    header = json::parse(reinterpret_cast<const char*>(base + 8), reinterpret_cast<const char*>(base + 8 + hlen));
  } catch (const json::exception& e) {
    fail("'{}': malformed safetensors header JSON: {}", path, e.what());
  }
  if (!header.is_object()) fail("'{}': safetensors header is not a JSON object", path);
  const size_t data_start = 8 + size_t(hlen), data_size = size - data_start;
  std::map<std::string, TensorView> tensors;
  std::vector<std::pair<uint64_t, const TensorView*>> ranges;  // (begin offset, tensor) of non-empty tensors
  for (auto& [name, info] : header.items()) {
    if (name == "__metadata__") continue;
    try {
      uint64_t begin = 0;
      TensorView t = parse_entry(name, info, data_size, begin);
      t.data = base + data_start + begin;
      auto it = tensors.emplace(name, std::move(t)).first;
      if (it->second.nbytes) ranges.emplace_back(begin, &it->second);
    } catch (const Error& e) {
      fail("'{}': tensor '{}': {}", path, name, e.what());
    }
  }
  std::sort(ranges.begin(), ranges.end(), [](const auto& a, const auto& b) { return a.first < b.first; });
  for (size_t i = 1; i < ranges.size(); ++i) {
    const auto& [prev_begin, prev] = ranges[i - 1];
    if (ranges[i].first < prev_begin + prev->nbytes)
      fail("'{}': tensors '{}' and '{}' overlap (bytes [{}, {}) and [{}, {}) of the data section)", path, prev->name,
           ranges[i].second->name, prev_begin, prev_begin + prev->nbytes, ranges[i].first,
           ranges[i].first + ranges[i].second->nbytes);
  }
  return tensors;
}

SafetensorsFile::SafetensorsFile(const std::string& path) : path_(path) {
  int fd = ::open(path.c_str(), O_RDONLY);
  if (fd < 0) fail("cannot open safetensors file '{}'", path);
  struct stat st {};
  ::fstat(fd, &st);
  size_ = size_t(st.st_size);
  if (size_ < 8) {
    ::close(fd);
    fail("'{}' is not a safetensors file: {} bytes, too short for the 8-byte header length", path, size_);
  }
  map_ = ::mmap(nullptr, size_, PROT_READ, MAP_PRIVATE, fd, 0);
  ::close(fd);
  if (map_ == MAP_FAILED) {
    map_ = nullptr;
    fail("cannot mmap '{}'", path);
  }
  try {
    tensors_ = parse_safetensors(static_cast<const uint8_t*>(map_), size_, path);
  } catch (...) {
    ::munmap(map_, size_);
    map_ = nullptr;
    throw;
  }
}

SafetensorsFile::~SafetensorsFile() {
  if (map_) ::munmap(map_, size_);
}

Checkpoint::Checkpoint(const std::string& dir) {
  if (!fs::is_directory(dir)) fail("model directory '{}' does not exist", dir);
  std::vector<std::string> shards;
  fs::path index = fs::path(dir) / "model.safetensors.index.json";
  if (fs::exists(index)) {
    std::ifstream f(index);
    json j;
    try {
      j = json::parse(f);
    } catch (const json::exception& e) {
      fail("'{}': malformed JSON: {}", index.string(), e.what());
    }
    std::set<std::string> uniq;
    for (auto& [name, file] : j.at("weight_map").items()) uniq.insert(file.get<std::string>());
    for (auto& s : uniq) {
      if (!fs::exists(fs::path(dir) / s)) fail("shard '{}' named by {} is missing", s, index.string());
      shards.push_back((fs::path(dir) / s).string());
    }
  } else {
    for (auto& e : fs::directory_iterator(dir))
      if (e.path().extension() == ".safetensors") shards.push_back(e.path().string());
    std::sort(shards.begin(), shards.end());
  }
  if (shards.empty()) fail("no .safetensors files in '{}'", dir);
  for (auto& s : shards) {
    files_.push_back(std::make_unique<SafetensorsFile>(s));
    for (auto& [name, t] : files_.back()->tensors()) {
      if (index_.count(name)) fail("tensor '{}' appears in two shards of '{}'", name, dir);
      index_[name] = &t;
    }
  }
}

const TensorView& Checkpoint::get(const std::string& name) const {
  auto it = index_.find(name);
  if (it == index_.end()) fail("tensor '{}' is missing from the checkpoint", name);
  return *it->second;
}

std::vector<std::string> Checkpoint::names() const {
  std::vector<std::string> out;
  for (auto& [n, _] : index_) out.push_back(n);
  return out;
}

void write_safetensors(const std::string& path, const std::vector<TensorView>& tensors) {
  json header = json::object();
  uint64_t off = 0;
  for (auto& t : tensors) {
    header[t.name] = {{"dtype", std::string(dtype_name(t.dtype))}, {"shape", t.shape}, {"data_offsets", {off, off + t.nbytes}}};
    off += t.nbytes;
  }
  std::string h = header.dump();
  while (h.size() % 8) h += ' ';
  std::ofstream f(path, std::ios::binary);
  if (!f) fail("cannot write '{}'", path);
  uint64_t hlen = h.size();
  f.write(reinterpret_cast<const char*>(&hlen), 8);
  f.write(h.data(), std::streamsize(h.size()));
  for (auto& t : tensors) f.write(static_cast<const char*>(t.data), std::streamsize(t.nbytes));
}

}  // namespace moefold
