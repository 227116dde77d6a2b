// --kv-cache-dtype, vLLM's flag and names, for every command that configures a KV cache (generate,
// chat, logits, serve, bench offline, profile; drift's --a- / --b- forms): auto (the model's dtype:
// fp32 pages on the CPU backend, bf16 on the GPU), bfloat16, fp8 / fp8_e4m3 (float8_e4m3fn pages with a
// scale per layer and KV head: the checkpoint's k_scale / v_scale, else 1; runtime/kv_cache.h,
// docs/fp8.md).
#pragma once
#include <CLI/CLI.hpp>
#include <string>

namespace moefold {

/// Adds `name` (default "--kv-cache-dtype") to `c`, writing the choice into `dtype` (parse it with
/// parse_kv_cache_dtype, runtime/kv_cache.h).
inline CLI::Option* add_kv_cache_dtype_option(CLI::App* c, std::string& dtype,
                                              const std::string& name = "--kv-cache-dtype",
                                              const std::string& what = "KV cache") {
  return c
      ->add_option(name, dtype,
                   what + " element type: auto (the model's: fp32 on the CPU backend, bf16 on the GPU) | bfloat16 | "
                          "fp8 | fp8_e4m3 (float8_e4m3fn, a scale per layer and KV head; twice the tokens of bf16)")
      ->check(CLI::IsMember({"auto", "bfloat16", "fp8", "fp8_e4m3"}))
      ->default_str("auto");
}

}  // namespace moefold
