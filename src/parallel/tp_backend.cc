#include "parallel/tp_backend.h"

#include <string_view>

#include "core/error.h"

namespace moefold {

TpCommBackend choose_tp_backend(int ranks, int visible_gpus, const char* env) {
  MOEFOLD_CHECK(ranks >= 2, "choose_tp_backend: {} ranks (a tensor-parallel group has at least 2)", ranks);
  const std::string_view v = env ? env : "";
  MOEFOLD_CHECK(v.empty() || v == "0" || v == "1", "{}={}: expected 0 or 1", kTpSingleDeviceEnv, v);
  if (v == "1") return TpCommBackend::SingleDevice;
  MOEFOLD_CHECK(ranks <= visible_gpus,
                "--tensor-parallel-size {} --device cuda needs {} GPUs (one per rank, NCCL); {} visible. {}=1 runs "
                "every rank on GPU 0 over the single-device test communicator (for tests: all shards in one GPU's "
                "memory, no speed-up)",
                ranks, ranks, visible_gpus, kTpSingleDeviceEnv);
  return TpCommBackend::Nccl;
}

std::string to_string(TpCommBackend b) { return b == TpCommBackend::Nccl ? "nccl" : "single-device"; }

}  // namespace moefold
