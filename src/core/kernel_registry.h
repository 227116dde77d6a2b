// The kernel registry: every kernel launch (GPU) and every op of the CPU forward names itself once,
// with a category, through a static handle; the registry counts launches per name, always. That
// count is the proof that a kernel ran (`--require-kernel NAME` on every command checks it), and the
// names and categories are what the profiler's kernel table is made of (core/profiler.h).
//
//   // at namespace scope in the file that launches the kernel (registered at static initialisation,
//   // so a kernel that never ran is still known by name):
//   const prof::Kernel kRmsNorm{"rms_norm_kernel", prof::Category::NormRope};
//   ...
//   prof::count(kRmsNorm);  // the hot path: one relaxed atomic increment (the timing scopes do it)
//
// Names are the kernel's (or the wrapped library call's) own name, so a reader can grep them; one
// kernel with several roles or tile configurations gets a ':variant' suffix
// (e.g. "attn_kernel:decode", "moe_gemm_kernel:gate_up:bm16"). CPU ops are prefixed "cpu::".
#pragma once
#include <atomic>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace moefold::prof {

/// Where time goes, as the kernel table groups it. Idle is not a kernel category: it is the time of the
/// profiled window that no kernel (or op) covers, measured from the timestamps (core/profiler.h).
enum class Category : uint8_t {
  RoutedExpertGemm,  ///< the grouped GEMMs of the routed experts
  DenseGemm,         ///< dense projections, shared expert, lm_head
  AttentionPrefill,  ///< softmax attention over a prompt chunk
  AttentionDecode,   ///< softmax attention, one query row per sequence
  DeltaNet,          ///< Gated DeltaNet gating and delta rule (chunked or recurrent)
  Conv,              ///< the DeltaNet's causal depthwise conv1d
  NormRope,          ///< RMSNorm variants, q/k norm, gated RMSNorm, RoPE
  MoeRouting,        ///< router logits, softmax/top-k, the expert plan, the combine (and shared-expert gate)
  Glue,              ///< copies and casts: uploads, downloads, memsets, gathers, KV-cache writes, bf16 rounding
  Sampling,          ///< token selection (GPU sampling kernels, the CPU sampler)
  Other,             ///< elementwise math that is none of the above (SwiGLU, residual adds, output gate)
  Communication,     ///< tensor / expert parallel collectives: all-reduce, all-gather, all-to-all
};
inline constexpr int kNumCategories = 12;

/// Machine name of a category ("routed_expert_gemm", "dense_gemm", ..., "other").
std::string_view category_name(Category c);
/// Human label of a category ("routed-expert GEMM", "dense GEMM", ...).
std::string_view category_label(Category c);

/// Largest number of distinct kernel names one process can register.
inline constexpr int kMaxKernels = 1024;

/// A registered kernel name. Construct one per launch site at namespace scope (static
/// initialisation registers it); constructing the same name with the same category again returns the
/// same entry. A name registered twice with different categories, or more than kMaxKernels names, is a
/// programming error: the process prints the reason and aborts (at start-up, so every test catches it).
class Kernel {
 public:
  Kernel(std::string_view name, Category category);
  int id() const { return id_; }

 private:
  int id_;
};

namespace detail {
/// Launch counts by kernel id (fixed storage: indexes stay valid while names are added).
extern std::atomic<int64_t> g_launch_counts[kMaxKernels];
}  // namespace detail

/// Counts one launch of `k` (thread-safe, relaxed; the timing scopes call it).
inline void count(const Kernel& k) { detail::g_launch_counts[k.id()].fetch_add(1, std::memory_order_relaxed); }

/// One registered kernel and its launch count since start-up (or the last reset_launch_counts()).
struct KernelInfo {
  int id = -1;
  std::string name;
  Category category = Category::Other;
  int64_t launches = 0;
};

/// Every registered kernel, in registration order.
std::vector<KernelInfo> registered_kernels();
/// The kernel named `name`; id -1 (and no launches) if no such name is registered.
KernelInfo find_kernel(std::string_view name);
/// Name and category of kernel `id` (0 <= id < number registered; Error otherwise).
KernelInfo kernel_info(int id);
/// Sets every launch count to zero (e.g. after a command's own roofline measurements).
void reset_launch_counts();

/// Throws moefold::Error unless every name is a registered kernel: "unknown kernel 'X' (known: ...)".
/// Call before a run, so that a typo fails at once.
void check_kernel_names(const std::vector<std::string>& names);
/// Throws moefold::Error naming the first kernel of `names` whose launch count is 0:
/// "kernel X never ran (ran: a, b, ...)", or an unknown name as check_kernel_names does.
void require_kernels_ran(const std::vector<std::string>& names);

}  // namespace moefold::prof
