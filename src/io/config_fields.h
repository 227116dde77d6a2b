// The typed config.json field readers every family parser uses (defined in model_config.cc): each
// names the field and the bound it broke in its Error.
#pragma once
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace moefold::config_fields {

// Upper bounds of the sizes config.json may give: far above every released model, and small enough
// that every product the engine forms (parameter counts, tensor bytes, KV and state bytes) fits in
// int64 (worst case: experts x moe_intermediate x hidden x 3 x layers < 2^60).
inline constexpr int64_t kMaxVocab = int64_t(1) << 24, kMaxHidden = int64_t(1) << 16, kMaxLayers = 1024;
inline constexpr int64_t kMaxHeads = 1024, kMaxHeadDim = 4096, kMaxIntermediate = int64_t(1) << 20;
inline constexpr int64_t kMaxExperts = int64_t(1) << 14, kMaxMoeIntermediate = int64_t(1) << 18, kMaxConvKernel = 64;
inline constexpr int64_t kMaxPositions = INT32_MAX;

/// True when j has `key` and it is not null.
bool present(const nlohmann::json& j, const char* key);
/// An integer field in [lo, hi]; `def` when absent (nullopt: required). Throws Error naming the field.
int64_t int_field(const nlohmann::json& j, const char* key, std::optional<int64_t> def, int64_t lo, int64_t hi);
int64_t req_int(const nlohmann::json& j, const char* key, int64_t lo, int64_t hi);
int64_t opt_int(const nlohmann::json& j, const char* key, int64_t def, int64_t lo, int64_t hi);
/// A finite number in [lo, hi] (integers accepted), `def` when absent (nullopt: required).
double num_field(const nlohmann::json& j, const char* key, std::optional<double> def, double lo, double hi);
bool bool_field(const nlohmann::json& j, const char* key, bool def);
std::string str_field(const nlohmann::json& j, const char* key, const std::string& def);
/// eos_token_id: one token id or a list of them; anything else is an Error naming `where`.
std::vector<int32_t> ids_of(const nlohmann::json& v, const char* where);

}  // namespace moefold::config_fields
