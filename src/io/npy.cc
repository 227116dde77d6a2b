#include "io/npy.h"

#include <cstring>
#include <fstream>
#include <regex>

#include "core/error.h"

namespace moefold {

void write_npy(const std::string& path, const std::vector<int64_t>& shape, const std::vector<float>& data) {
  std::string sh = "(";
  for (auto d : shape) sh += std::to_string(d) + ",";
  if (shape.size() > 1) sh.pop_back();
  sh += ")";
  std::string header = "{'descr': '<f4', 'fortran_order': False, 'shape': " + sh + ", }";
  while ((10 + header.size() + 1) % 64) header += ' ';
  header += '\n';
  std::ofstream f(path, std::ios::binary);
  if (!f) fail("cannot write '{}'", path);
  f.write("\x93NUMPY\x01\x00", 8);
  uint16_t hl = uint16_t(header.size());
  f.write(reinterpret_cast<const char*>(&hl), 2);
  f.write(header.data(), std::streamsize(header.size()));
  f.write(reinterpret_cast<const char*>(data.data()), std::streamsize(data.size() * 4));
  if (!f) fail("error writing '{}'", path);
}

NpyArray read_npy(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  if (!f) fail("cannot open '{}'", path);
  char magic[8];
  f.read(magic, 8);
  if (!f || std::memcmp(magic, "\x93NUMPY", 6) != 0) fail("'{}' is not a .npy file", path);
  uint32_t hl = 0;
  if (magic[6] == 1) {
    uint16_t h16;
    f.read(reinterpret_cast<char*>(&h16), 2);
    hl = h16;
  } else {
    f.read(reinterpret_cast<char*>(&hl), 4);
  }
  std::string header(hl, '\0');
  f.read(header.data(), hl);
  std::smatch m;
  if (!std::regex_search(header, m, std::regex("'descr':\\s*'([<|]?[a-z]\\d)'"))) fail("'{}': no descr", path);
  std::string descr = m[1];
  if (header.find("'fortran_order': True") != std::string::npos) fail("'{}': Fortran order not supported", path);
  if (!std::regex_search(header, m, std::regex("'shape':\\s*\\(([^)]*)\\)"))) fail("'{}': no shape", path);
  NpyArray a;
  std::string dims = m[1];
  std::regex num("\\d+");
  for (auto it = std::sregex_iterator(dims.begin(), dims.end(), num); it != std::sregex_iterator(); ++it)
    a.shape.push_back(std::stoll(it->str()));
  int64_t n = 1;
  for (auto d : a.shape) n *= d;
  a.data.resize(size_t(n));
  if (descr == "<f4" || descr == "f4") {
    f.read(reinterpret_cast<char*>(a.data.data()), std::streamsize(n * 4));
  } else if (descr == "<f8") {
    std::vector<double> d(static_cast<size_t>(n));
    f.read(reinterpret_cast<char*>(d.data()), std::streamsize(n * 8));
    for (int64_t i = 0; i < n; ++i) a.data[size_t(i)] = float(d[size_t(i)]);
  } else if (descr == "<i4") {
    std::vector<int32_t> d(static_cast<size_t>(n));
    f.read(reinterpret_cast<char*>(d.data()), std::streamsize(n * 4));
    for (int64_t i = 0; i < n; ++i) a.data[size_t(i)] = float(d[size_t(i)]);
  } else {
    fail("'{}': dtype {} not supported (float32, float64, int32)", path, descr);
  }
  if (!f) fail("'{}': truncated data", path);
  return a;
}

}  // namespace moefold
