// Kernel registry (contract: kernel_registry.h).
#include "core/kernel_registry.h"

#include <cstdio>
#include <cstdlib>
#include <mutex>

#include "core/error.h"

namespace moefold::prof {

namespace detail {
std::atomic<int64_t> g_launch_counts[kMaxKernels];  // constant-initialised to 0: usable during static init
}  // namespace detail

namespace {

struct Entry {
  std::string name;
  Category category;
};

struct Registry {
  std::mutex mu;
  std::vector<Entry> entries;  // index = kernel id
};

Registry& registry() {
  static Registry* r = new Registry;  // never destroyed: launches may happen during static destruction
  return *r;
}

std::string joined_names(const std::vector<KernelInfo>& ks, bool only_ran) {
  std::string s;
  for (const KernelInfo& k : ks) {
    if (only_ran && k.launches == 0) continue;
    if (!s.empty()) s += ", ";
    s += k.name;
  }
  return s.empty() ? "none" : s;
}

}  // namespace

std::string_view category_name(Category c) {
  switch (c) {
    case Category::RoutedExpertGemm: return "routed_expert_gemm";
    case Category::DenseGemm: return "dense_gemm";
    case Category::AttentionPrefill: return "attention_prefill";
    case Category::AttentionDecode: return "attention_decode";
    case Category::DeltaNet: return "deltanet";
    case Category::Conv: return "conv";
    case Category::NormRope: return "norm_rope";
    case Category::MoeRouting: return "moe_routing";
    case Category::Glue: return "glue";
    case Category::Sampling: return "sampling";
    case Category::Other: return "other";
    case Category::Communication: return "communication";
  }
  return "other";
}

std::string_view category_label(Category c) {
  switch (c) {
    case Category::RoutedExpertGemm: return "routed-expert GEMM";
    case Category::DenseGemm: return "dense GEMM";
    case Category::AttentionPrefill: return "attention prefill";
    case Category::AttentionDecode: return "attention decode";
    case Category::DeltaNet: return "DeltaNet";
    case Category::Conv: return "conv";
    case Category::NormRope: return "norm and rope";
    case Category::MoeRouting: return "MoE routing / plan / combine";
    case Category::Glue: return "glue (copies, casts)";
    case Category::Sampling: return "sampling";
    case Category::Other: return "other";
    case Category::Communication: return "communication";
  }
  return "other";
}

Kernel::Kernel(std::string_view name, Category category) {
  Registry& r = registry();
  std::lock_guard<std::mutex> lock(r.mu);
  for (size_t i = 0; i < r.entries.size(); ++i) {
    if (r.entries[i].name != name) continue;
    if (r.entries[i].category != category) {
      std::fprintf(stderr, "moefold: kernel '%.*s' registered with two categories (%.*s and %.*s)\n",
                   int(name.size()), name.data(), int(category_name(r.entries[i].category).size()),
                   category_name(r.entries[i].category).data(), int(category_name(category).size()),
                   category_name(category).data());
      std::abort();
    }
    id_ = int(i);
    return;
  }
  if (name.empty() || r.entries.size() >= size_t(kMaxKernels)) {
    std::fprintf(stderr, "moefold: cannot register kernel '%.*s' (empty name or more than %d kernels)\n",
                 int(name.size()), name.data(), kMaxKernels);
    std::abort();
  }
  id_ = int(r.entries.size());
  r.entries.push_back({std::string(name), category});
}

std::vector<KernelInfo> registered_kernels() {
  Registry& r = registry();
  std::lock_guard<std::mutex> lock(r.mu);
  std::vector<KernelInfo> out;
  out.reserve(r.entries.size());
  for (size_t i = 0; i < r.entries.size(); ++i)
    out.push_back({int(i), r.entries[i].name, r.entries[i].category,
                   detail::g_launch_counts[i].load(std::memory_order_relaxed)});
  return out;
}

KernelInfo find_kernel(std::string_view name) {
  Registry& r = registry();
  std::lock_guard<std::mutex> lock(r.mu);
  for (size_t i = 0; i < r.entries.size(); ++i)
    if (r.entries[i].name == name)
      return {int(i), r.entries[i].name, r.entries[i].category,
              detail::g_launch_counts[i].load(std::memory_order_relaxed)};
  return {};
}

KernelInfo kernel_info(int id) {
  Registry& r = registry();
  std::lock_guard<std::mutex> lock(r.mu);
  MOEFOLD_CHECK(id >= 0 && size_t(id) < r.entries.size(), "kernel id {} is not registered", id);
  return {id, r.entries[size_t(id)].name, r.entries[size_t(id)].category,
          detail::g_launch_counts[id].load(std::memory_order_relaxed)};
}

void reset_launch_counts() {
  for (auto& c : detail::g_launch_counts) c.store(0, std::memory_order_relaxed);
}

void check_kernel_names(const std::vector<std::string>& names) {
  for (const std::string& n : names)
    if (find_kernel(n).id < 0) fail("unknown kernel '{}' (known: {})", n, joined_names(registered_kernels(), false));
}

void require_kernels_ran(const std::vector<std::string>& names) {
  check_kernel_names(names);
  for (const std::string& n : names)
    if (find_kernel(n).launches == 0) fail("kernel {} never ran (ran: {})", n, joined_names(registered_kernels(), true));
}

}  // namespace moefold::prof
