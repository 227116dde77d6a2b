#include "models/memory_check.h"

#include <fstream>
#include <sstream>

#include "core/error.h"
#include "models/weight_loader.h"

namespace moefold {

namespace {

std::string slurp(const char* path) {
  std::ifstream f(path);
  if (!f) return {};
  std::ostringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

/// A byte count from a cgroup file ("max", empty or garbage: nullopt).
std::optional<int64_t> cgroup_bytes(const std::string& text) {
  std::istringstream in(text);
  int64_t v = -1;
  if (!(in >> v) || v < 0) return std::nullopt;
  return v;
}

std::string gib(int64_t bytes) { return fmt::format("{:.1f} GiB", double(bytes) / double(int64_t(1) << 30)); }

}  // namespace

std::optional<int64_t> available_memory_bytes(const std::string& meminfo, const std::string& cgroup_limit,
                                              const std::string& cgroup_usage) {
  std::istringstream in(meminfo);
  std::string key, unit;
  int64_t kib = -1;
  std::optional<int64_t> avail;
  while (in >> key >> kib) {
    std::getline(in, unit);
    if (key == "MemAvailable:") {
      avail = kib * 1024;
      break;
    }
  }
  if (!avail) return std::nullopt;
  auto limit = cgroup_bytes(cgroup_limit);
  // cgroup v1 reports "no limit" as a huge number (about 2^63 rounded to pages): treat as none.
  if (limit && *limit < (int64_t(1) << 60)) {
    int64_t left = *limit - cgroup_bytes(cgroup_usage).value_or(0);
    if (left < *avail) avail = std::max<int64_t>(left, 0);
  }
  return avail;
}

std::optional<int64_t> available_memory_bytes() {
  std::string limit = slurp("/sys/fs/cgroup/memory.max"), usage = slurp("/sys/fs/cgroup/memory.current");
  if (limit.empty()) {
    limit = slurp("/sys/fs/cgroup/memory/memory.limit_in_bytes");
    usage = slurp("/sys/fs/cgroup/memory/memory.usage_in_bytes");
  }
  return available_memory_bytes(slurp("/proc/meminfo"), limit, usage);
}

int64_t cpu_weight_bytes(const ModelConfig& cfg) { return count_params(cfg).total * 4; }

int64_t cpu_cache_bytes(const ModelConfig& cfg, int64_t num_blocks, int64_t block_size, int64_t num_slots,
                        int64_t kv_elem_bytes) {
  return num_blocks * block_size * cfg.kv_bytes_per_token(kv_elem_bytes) + num_slots * cfg.deltanet_state_bytes_per_seq(4);
}

void check_memory_fits(int64_t needed, std::optional<int64_t> available, const std::string& what,
                       bool gpu_runs_it) {
  if (!available || needed <= *available) return;
  fail("{} needs {} ({} bytes) but only {} ({} bytes) of memory is available (MemAvailable, cgroup limit); {}",
       what, gib(needed), needed, gib(*available), *available,
       gpu_runs_it ? "use a smaller model or --load-format dummy on a GPU (--device cuda)"
                   : "this family runs on the CPU backend only, so use a smaller config (fewer layers or experts)");
}

}  // namespace moefold
