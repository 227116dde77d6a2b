#include "models/kv_scales.h"

#include <cmath>
#include <optional>

#include "core/error.h"

namespace moefold {

namespace {

/// The first of `names` the checkpoint holds, loaded and repeated to [num_kv_heads]; empty if none.
std::vector<float> load_scale(WeightSource& src, const std::string& prefix, std::initializer_list<const char*> names,
                              int64_t num_kv_heads) {
  for (const char* n : names) {
    const std::string name = prefix + n;
    const std::optional<std::vector<int64_t>> shape = src.checkpoint_shape(name);
    if (!shape) continue;
    const bool scalar = shape->empty() || (shape->size() == 1 && (*shape)[0] == 1);
    MOEFOLD_CHECK(scalar || (shape->size() == 1 && (*shape)[0] == num_kv_heads),
                  "tensor '{}': an FP8 KV cache scale is a scalar or one per KV head ([{}]), not {} dims", name,
                  num_kv_heads, shape->size());
    std::vector<float> s = src.load({name, *shape, TensorRole::Bias});
    for (float x : s)
      MOEFOLD_CHECK(std::isfinite(x) && x > 0, "tensor '{}': FP8 KV cache scale {} is not finite and positive", name,
                    x);
    if (scalar) s.assign(size_t(num_kv_heads), s.at(0));
    return s;
  }
  return {};
}

}  // namespace

void load_kv_scales(WeightSource& src, const std::string& prefix, int64_t num_kv_heads, AttentionWeights& a) {
  a.k_scale = load_scale(src, prefix, {"k_scale", "k_proj.k_scale", "kv_scale"}, num_kv_heads);
  a.v_scale = load_scale(src, prefix, {"v_scale", "v_proj.v_scale", "kv_scale"}, num_kv_heads);
  MOEFOLD_CHECK(a.k_scale.empty() == a.v_scale.empty(), "'{}': the checkpoint has a {} but no {}", prefix,
                a.k_scale.empty() ? "v_scale" : "k_scale", a.k_scale.empty() ? "k_scale" : "v_scale");
}

}  // namespace moefold
