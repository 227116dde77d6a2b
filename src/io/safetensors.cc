#include "io/safetensors.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
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
  convert_to_f32(dtype, data, out.data(), out.size());
  return out;
}

std::string shape_str(const std::vector<int64_t>& shape) {
  std::string s = "[";
  for (size_t i = 0; i < shape.size(); ++i) s += (i ? ", " : "") + std::to_string(shape[i]);
  return s + "]";
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
  auto* base = static_cast<const uint8_t*>(map_);
  uint64_t hlen = 0;
  std::memcpy(&hlen, base, 8);
  if (hlen > size_ - 8)
    fail("'{}': truncated safetensors header (header says {} bytes, file has {} after the length)", path,
         hlen, size_ - 8);
  json header;
  try {
    header = json::parse(reinterpret_cast<const char*>(base + 8), reinterpret_cast<const char*>(base + 8 + hlen));
  } catch (const json::exception& e) {
    fail("'{}': malformed safetensors header JSON: {}", path, e.what());
  }
  if (!header.is_object()) fail("'{}': safetensors header is not a JSON object", path);
  const size_t data_start = 8 + hlen, data_size = size_ - data_start;
  for (auto& [name, info] : header.items()) {
    if (name == "__metadata__") continue;
    try {
      TensorView t;
      t.name = name;
      t.dtype = dtype_from_safetensors(info.at("dtype").get<std::string>());
      t.shape = info.at("shape").get<std::vector<int64_t>>();
      auto off = info.at("data_offsets").get<std::vector<uint64_t>>();
      if (off.size() != 2 || off[0] > off[1] || off[1] > data_size)
        fail("data_offsets out of range (data section is {} bytes)", data_size);
      t.nbytes = size_t(off[1] - off[0]);
      if (size_t(t.numel()) * dtype_size(t.dtype) != t.nbytes)
        fail("{} x {} needs {} bytes but data_offsets span {}", dtype_name(t.dtype), shape_str(t.shape),
             size_t(t.numel()) * dtype_size(t.dtype), t.nbytes);
      t.data = base + data_start + off[0];
      tensors_.emplace(name, std::move(t));
    } catch (const json::exception& e) {
      fail("'{}': bad header entry for tensor '{}': {}", path, name, e.what());
    } catch (const Error& e) {
      fail("'{}': tensor '{}': {}", path, name, e.what());
    }
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
