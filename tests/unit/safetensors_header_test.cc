// The safetensors header parser (issue 11, item 7): every way an untrusted header can lie about where
// its tensors are is rejected with a clear message, before any tensor byte is read.
#include <gtest/gtest.h>

#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "core/error.h"
#include "io/safetensors.h"

using namespace moefold;
using json = nlohmann::json;

namespace {

/// An in-memory .safetensors image: length, header, `data_bytes` bytes of data.
std::vector<uint8_t> image(const json& header, size_t data_bytes) {
  std::string h = header.dump();
  std::vector<uint8_t> out(8 + h.size() + data_bytes, 0);
  uint64_t n = h.size();
  std::memcpy(out.data(), &n, 8);
  std::memcpy(out.data() + 8, h.data(), h.size());
  return out;
}

/// The error of opening the image as a file (the path checkpoints take), or "" if it is accepted.
std::string error_of(const json& header, size_t data_bytes) {
  auto img = image(header, data_bytes);
  std::string path = (std::filesystem::temp_directory_path() / ("moefold_st_" + std::to_string(::getpid()))).string();
  std::ofstream(path, std::ios::binary).write(reinterpret_cast<const char*>(img.data()), std::streamsize(img.size()));
  std::string msg;
  try {
    SafetensorsFile f(path);
  } catch (const Error& e) {
    msg = e.what();
  }
  std::filesystem::remove(path);
  return msg;
}

json entry(const char* dtype, json shape, uint64_t begin, uint64_t end) {
  return {{"dtype", dtype}, {"shape", shape}, {"data_offsets", {begin, end}}};
}

TEST(SafetensorsHeader, AcceptsAWellFormedImage) {
  json h = {{"__metadata__", {{"format", "pt"}}}, {"a", entry("F32", {2, 2}, 0, 16)}, {"b", entry("BF16", {3}, 16, 22)},
            {"empty", entry("F32", {0, 7}, 22, 22)}};
  auto img = image(h, 22);
  auto t = parse_safetensors(img.data(), img.size(), "t.safetensors");
  ASSERT_EQ(t.size(), 3u);
  EXPECT_EQ(t.at("b").nbytes, 6u);
  EXPECT_EQ(t.at("b").data, img.data() + img.size() - 6);
  EXPECT_TRUE(t.at("empty").to_f32().empty());
}

TEST(SafetensorsHeader, OverlappingTensorsAreRejected) {
  std::string msg = error_of({{"a", entry("F32", {4}, 0, 16)}, {"b", entry("F32", {2}, 8, 16)}}, 16);
  EXPECT_NE(msg.find("tensors 'a' and 'b' overlap"), std::string::npos) << msg;
}

TEST(SafetensorsHeader, TensorsAllAtOffsetZeroAreRejected) {
  std::string msg = error_of({{"a", entry("F32", {2}, 0, 8)}, {"b", entry("F32", {2}, 0, 8)}, {"c", entry("F32", {2}, 0, 8)}}, 8);
  EXPECT_NE(msg.find("overlap"), std::string::npos) << msg;
}

TEST(SafetensorsHeader, NegativeAndNonIntegerShapesAreRejected) {
  std::string msg = error_of({{"a", entry("F32", {-1, -4}, 0, 16)}}, 16);
  EXPECT_NE(msg.find("tensor 'a': shape holds a negative value -1"), std::string::npos) << msg;
  msg = error_of({{"a", entry("F32", {2.5}, 0, 8)}}, 8);
  EXPECT_NE(msg.find("shape must hold integers"), std::string::npos) << msg;
}

TEST(SafetensorsHeader, ByteCountsThatOverflowAreRejected) {
  // 2^62 x 4 elements: the element count wraps a 64-bit product.
  std::string msg = error_of({{"a", entry("F32", {uint64_t(1) << 62, 4}, 0, 0)}}, 0);
  EXPECT_NE(msg.find("more elements than fit in 64 bits"), std::string::npos) << msg;
  // 2^62 elements of 4 bytes: the byte count wraps.
  msg = error_of({{"a", entry("F32", {uint64_t(1) << 62}, 0, 0)}}, 0);
  EXPECT_NE(msg.find("more bytes than fit in 64 bits"), std::string::npos) << msg;
}

TEST(SafetensorsHeader, OffsetsPastTheFileAreRejected) {
  std::string msg = error_of({{"a", entry("F32", {2}, 8, 16)}}, 8);
  EXPECT_NE(msg.find("data_offsets [8, 16] out of range (data section is 8 bytes)"), std::string::npos) << msg;
  msg = error_of({{"a", entry("F32", {2}, 8, 0)}}, 8);
  EXPECT_NE(msg.find("out of range"), std::string::npos) << msg;
  json h = {{"a", {{"dtype", "F32"}, {"shape", {1}}, {"data_offsets", {-4, 0}}}}};
  msg = error_of(h, 8);
  EXPECT_NE(msg.find("data_offsets holds a negative value -4"), std::string::npos) << msg;
}

TEST(SafetensorsHeader, DtypeSizeMismatchIsRejected) {
  std::string msg = error_of({{"a", entry("BF16", {3}, 0, 4)}}, 4);
  EXPECT_NE(msg.find("BF16 x [3] needs 6 bytes but data_offsets span 4"), std::string::npos) << msg;
}

TEST(SafetensorsHeader, MalformedEntriesNameTheTensor) {
  EXPECT_NE(error_of({{"a", 5}}, 0).find("tensor 'a': header entry is not an object"), std::string::npos);
  EXPECT_NE(error_of({{"a", {{"dtype", "F32"}, {"shape", {1}}}}}, 4).find("has no 'data_offsets'"), std::string::npos);
  EXPECT_NE(error_of({{"a", {{"dtype", 3}, {"shape", {1}}, {"data_offsets", {0, 4}}}}}, 4).find("dtype must be a string"),
            std::string::npos);
  EXPECT_NE(error_of({{"a", {{"dtype", "F32"}, {"shape", {1}}, {"data_offsets", {0}}}}}, 4).find("two integers"),
            std::string::npos);
}

TEST(SafetensorsHeader, TruncatedImagesAreRejected) {
  uint8_t tiny[4] = {};
  EXPECT_THROW(parse_safetensors(tiny, sizeof tiny, "t"), Error);
  auto img = image({{"a", entry("F32", {1}, 0, 4)}}, 4);
  uint64_t huge = UINT64_MAX;
  std::memcpy(img.data(), &huge, 8);
  try {
    parse_safetensors(img.data(), img.size(), "t");
    FAIL() << "accepted a header length past the file";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("truncated safetensors header"), std::string::npos) << e.what();
  }
}

}  // namespace
