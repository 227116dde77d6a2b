// DeepSeek-V4 config and checkpoint loading: FP8 (E8M0 128x128 block scales) and FP4 experts (two
// e2m1 per byte, per-32 E8M0 scales) decode to the values an independent decoder gives; damaged
// checkpoints and unsupported variants (V4.1) fail with a message naming the problem; inspect
// reports the published V4-Flash totals.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "core/dtype.h"
#include "core/error.h"
#include "fixture_util.h"
#include "io/deepseek_v4_config.h"
#include "io/model_config.h"
#include "io/safetensors.h"
#include "models/deepseek_v4.h"
#include "models/weight_loader.h"

using namespace moefold;
namespace fs = std::filesystem;
using json = nlohmann::json;

namespace {

const fs::path kFix = moefold::test::kSourceDir / "tests/fixtures/deepseek_v4";

struct Dir {
  fs::path path;
  explicit Dir(const std::string& n) : path(fs::temp_directory_path() / ("moefold_dsv4_" + n + "_" + std::to_string(::getpid()))) {
    fs::remove_all(path);
    fs::create_directories(path);
    fs::copy_file(kFix / "config.json", path / "config.json");
  }
  ~Dir() { fs::remove_all(path); }
};

/// Owned tensors to write with write_safetensors.
struct Tensors {
  std::vector<std::string> names;
  std::vector<DType> dtypes;
  std::vector<std::vector<int64_t>> shapes;
  std::vector<std::vector<uint8_t>> bytes;
  void add(const std::string& n, DType t, std::vector<int64_t> s, const void* p, size_t nb) {
    names.push_back(n);
    dtypes.push_back(t);
    shapes.push_back(std::move(s));
    bytes.emplace_back(static_cast<const uint8_t*>(p), static_cast<const uint8_t*>(p) + nb);
  }
  void add_f32(const std::string& n, std::vector<int64_t> s, const std::vector<float>& v) {
    add(n, DType::F32, std::move(s), v.data(), v.size() * 4);
  }
  void write(const fs::path& p) const {
    std::vector<TensorView> views;
    for (size_t i = 0; i < names.size(); ++i) {
      TensorView v;
      v.name = names[i];
      v.dtype = dtypes[i];
      v.shape = shapes[i];
      v.data = bytes[i].data();
      v.nbytes = bytes[i].size();
      views.push_back(v);
    }
    write_safetensors(p.string(), views);
  }
};

std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return "(no error)";
}

/// The fixture's tensors copied (all as stored, except those `skip` names), for damaging.
Tensors fixture_tensors(const std::function<bool(const std::string&)>& skip = {}) {
  Checkpoint ck(kFix.string());
  Tensors t;
  for (auto& n : ck.names()) {
    if (skip && skip(n)) continue;
    const TensorView& v = ck.get(n);
    t.add(n, v.dtype, v.shape, v.data, v.nbytes);
  }
  return t;
}

double e8m0(uint8_t b) { return std::ldexp(1.0, int(b) - 127); }  // independent of the engine's decoder

}  // namespace

TEST(DeepseekV4Loader, Fp8BlockAndFp4ExpertWeightsDecodeLikeAnIndependentDecoder) {
  const std::set<std::string> fp8 = {"layers.3.attn.wq_b.weight", "layers.1.attn.wkv.weight", "head.weight"};
  auto is_fp4 = [](const std::string& n) {  // w1 / w3 [16, 64]: rows of two 32-element scale groups
    return n.rfind("layers.2.ffn.experts.", 0) == 0 && n.find(".w2.") == std::string::npos;
  };
  Checkpoint ck(kFix.string());
  Tensors q, ref;  // q: FP8 / FP4 coded; ref: the same values decoded here, as F32
  static const double lut[16] = {0, 0.5, 1, 1.5, 2, 3, 4, 6, -0.0, -0.5, -1, -1.5, -2, -3, -4, -6};
  for (auto& n : ck.names()) {
    const TensorView& v = ck.get(n);
    if (fp8.count(n)) {
      auto w = v.to_f32();
      const int64_t R = v.shape[0], C = v.shape[1], br = (R + 127) / 128, bc = (C + 127) / 128;
      std::vector<uint8_t> sc(size_t(br * bc)), code(w.size());
      std::vector<float> dec(w.size());
      for (int64_t bi = 0; bi < br; ++bi)
        for (int64_t bj = 0; bj < bc; ++bj) {
          float mx = 0;
          for (int64_t i = bi * 128; i < std::min(R, bi * 128 + 128); ++i)
            for (int64_t j = bj * 128; j < std::min(C, bj * 128 + 128); ++j) mx = std::max(mx, std::fabs(w[i * C + j]));
          sc[bi * bc + bj] = uint8_t(127 + int(std::ceil(std::log2(mx / 448.0))));
        }
      for (int64_t i = 0; i < R; ++i)
        for (int64_t j = 0; j < C; ++j) {
          const double s = e8m0(sc[(i / 128) * bc + j / 128]);
          code[i * C + j] = f32_to_f8e4m3(float(w[i * C + j] / s));
          const int b = code[i * C + j], sign = b >> 7, ex = (b >> 3) & 15, man = b & 7;
          const double mag = ex == 0 ? std::ldexp(man, -9) : std::ldexp(1 + man / 8.0, ex - 7);
          dec[i * C + j] = float((sign ? -mag : mag) * s);
        }
      const std::string base = n.substr(0, n.size() - 7);
      q.add(n, DType::F8_E4M3, v.shape, code.data(), code.size());
      q.add(base + ".scale", DType::F8_E8M0, {br, bc}, sc.data(), sc.size());
      ref.add_f32(n, v.shape, dec);
    } else if (is_fp4(n)) {
      auto w = v.to_f32();
      const int64_t R = v.shape[0], C = v.shape[1];
      std::vector<uint8_t> sc(size_t(R * C / 32)), packed(size_t(R * C / 2), 0);
      std::vector<float> dec(w.size());
      for (int64_t i = 0; i < R; ++i)
        for (int64_t g = 0; g < C / 32; ++g) {
          float mx = 0;
          for (int64_t j = g * 32; j < g * 32 + 32; ++j) mx = std::max(mx, std::fabs(w[i * C + j]));
          sc[i * (C / 32) + g] = uint8_t(127 + int(std::ceil(std::log2(mx / 6.0))));
          const double s = e8m0(sc[i * (C / 32) + g]);
          for (int64_t j = g * 32; j < g * 32 + 32; ++j) {
            int best = 0;
            for (int c = 0; c < 16; ++c)
              if (std::fabs(lut[c] * s - w[i * C + j]) < std::fabs(lut[best] * s - w[i * C + j])) best = c;
            packed[(i * C + j) / 2] |= uint8_t(j % 2 ? best << 4 : best);
            dec[i * C + j] = float(lut[best] * s);
          }
        }
      const std::string base = n.substr(0, n.size() - 7);
      q.add(n, DType::I8, {R, C / 2}, packed.data(), packed.size());
      q.add(base + ".scale", DType::F8_E8M0, {R, C / 32}, sc.data(), sc.size());
      ref.add_f32(n, v.shape, dec);
    } else {
      q.add(n, v.dtype, v.shape, v.data, v.nbytes);
      ref.add(n, v.dtype, v.shape, v.data, v.nbytes);
    }
  }
  Dir dq("quant"), dr("ref");
  q.write(dq.path / "model.safetensors");
  ref.write(dr.path / "model.safetensors");
  auto mq = load_deepseek_v4(dq.path.string(), false), mr = load_deepseek_v4(dr.path.string(), false);
  std::vector<int32_t> ids(40);
  for (size_t i = 0; i < ids.size(); ++i) ids[i] = int32_t(2 + i * 11 % 120);
  Dsv4Cache cq = mq->new_cache(), cr = mr->new_cache();
  EXPECT_EQ(mq->forward(cq, ids), mr->forward(cr, ids));
}

TEST(DeepseekV4Loader, DamagedCheckpointsNameTheTensor) {
  {
    Dir d("missing");
    fixture_tensors([](const std::string& n) { return n == "layers.1.attn.compressor.ape"; })
        .write(d.path / "model.safetensors");
    EXPECT_NE(error_of([&] { load_deepseek_v4(d.path.string(), false); }).find("'layers.1.attn.compressor.ape' (shape [4, 64]"),
              std::string::npos);
  }
  {
    Dir d("shape");
    Tensors t = fixture_tensors([](const std::string& n) { return n == "layers.0.attn.wkv.weight"; });
    t.add_f32("layers.0.attn.wkv.weight", {31, 64}, std::vector<float>(31 * 64, 0.1f));
    t.write(d.path / "model.safetensors");
    const std::string e = error_of([&] { load_deepseek_v4(d.path.string(), false); });
    EXPECT_NE(e.find("'layers.0.attn.wkv.weight' has shape [31, 64]"), std::string::npos) << e;
  }
  {
    Dir d("extra");
    Tensors t = fixture_tensors();
    t.add_f32("layers.0.attn.surprise", {2}, {1, 2});
    t.add_f32("mtp.0.emb.weight", {2}, {1, 2});  // the MTP layer is skipped, not an error
    t.write(d.path / "model.safetensors");
    EXPECT_NE(error_of([&] { load_deepseek_v4(d.path.string(), false); }).find("'layers.0.attn.surprise'"),
              std::string::npos);
  }
  {
    Dir d("tid2eid");
    Tensors t = fixture_tensors([](const std::string& n) { return n == "layers.0.ffn.gate.tid2eid"; });
    std::vector<int32_t> ids(128 * 2, 0);
    ids[77] = 4;  // 4 experts: ids must be < 4
    t.add("layers.0.ffn.gate.tid2eid", DType::I32, {128, 2}, ids.data(), ids.size() * 4);
    t.write(d.path / "model.safetensors");
    EXPECT_NE(error_of([&] { load_deepseek_v4(d.path.string(), false); }).find("expert id 4 at element 77"),
              std::string::npos);
  }
}

TEST(DeepseekV4Loader, UnsupportedVariantsFailClearly) {
  json base = json::parse(std::ifstream(kFix / "config.json"));
  auto err = [&](const std::function<void(json&)>& edit) {
    json j = base;
    edit(j);
    return error_of([&] { ModelConfig::from_json(j); });
  };
  EXPECT_NE(err([](json& j) { j["engram_layer_ids"] = {1}; }).find("DeepSeek-V4.1"), std::string::npos);
  EXPECT_NE(err([](json& j) { j["compress_ratios"][1] = 2; }).find("compress_ratios[1] = 2 is not supported"),
            std::string::npos);
  EXPECT_NE(err([](json& j) { j.erase("compress_ratios"); }).find("compress_ratios"), std::string::npos);
  EXPECT_NE(err([](json& j) { j["compress_ratios"] = {0, 4}; }).find("2 entries but num_hidden_layers is 4"),
            std::string::npos);
  EXPECT_NE(err([](json& j) { j["num_key_value_heads"] = 2; }).find("num_key_value_heads must be 1"), std::string::npos);
  EXPECT_NE(err([](json& j) { j["o_groups"] = 3; }).find("not a multiple of o_groups 3"), std::string::npos);
  EXPECT_NE(err([](json& j) { j["scoring_func"] = "softmax"; }).find("scoring_func 'softmax'"), std::string::npos);
  EXPECT_NE(err([](json& j) { j.erase("q_lora_rank"); }).find("'q_lora_rank' is missing"), std::string::npos);
  EXPECT_EQ(err([](json&) {}), "(no error)");
}

TEST(DeepseekV4Loader, InspectReportsThePublishedV4FlashTotals) {
  ModelConfig c = ModelConfig::from_dir((moefold::test::kSourceDir / "configs/deepseek-v4-flash").string());
  ASSERT_EQ(c.family, Family::DeepseekV4);
  const ParamCounts p = count_params(c);
  // transformers 5.17 on the meta device: 284,332,230,231 parameters; the 40 non-hash layers' 256
  // correction biases (buffers there) make up the rest.
  EXPECT_EQ(p.total, 284332230231 + 40 * 256);
  EXPECT_NEAR(double(p.active_per_token) / 1e9, 13.27, 0.01);  // published: 284 B total, 13 B active
  const DeepseekV4Config& d = *c.deepseek_v4;
  EXPECT_EQ(d.compress_ratios.size(), 43u);
  EXPECT_TRUE(d.fp8_weights && d.fp4_experts);
  EXPECT_EQ(d.yarn_factor, 16);
}

TEST(DeepseekV4Loader, E8M0AndI8DtypesParse) {
  EXPECT_EQ(dtype_from_safetensors("F8_E8M0"), DType::F8_E8M0);
  EXPECT_EQ(dtype_from_safetensors("I8"), DType::I8);
  EXPECT_EQ(dtype_size(DType::F8_E8M0), 1u);
  EXPECT_EQ(f8e8m0_to_f32(127), 1.0f);
  EXPECT_EQ(f8e8m0_to_f32(130), 8.0f);
  EXPECT_EQ(f8e8m0_to_f32(0), std::ldexp(1.0f, -127));
  EXPECT_TRUE(std::isnan(f8e8m0_to_f32(0xff)));
}
