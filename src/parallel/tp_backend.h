// Which communicator a CUDA tensor-parallel group runs over (docs/architecture.md, "Tensor and expert
// parallelism"): NCCL with one GPU per rank when the host has enough visible GPUs, or, only when asked
// for explicitly (MOEFOLD_TP_SINGLE_DEVICE=1), every rank on GPU 0 over the single-device test
// communicator (parallel/device_communicator.h). Never silently the latter: it is a test backend (all
// shards in one GPU's memory, the ranks' kernels time-sliced), not a way to run a model.
#pragma once
#include <string>

namespace moefold {

enum class TpCommBackend {
  Nccl,          ///< rank r on GPU r, NCCL (NCCL_NVLS_ENABLE=0)
  SingleDevice,  ///< every rank on GPU 0, the single-device communicator
};

/// The environment variable that selects TpCommBackend::SingleDevice.
inline constexpr const char* kTpSingleDeviceEnv = "MOEFOLD_TP_SINGLE_DEVICE";

/// The backend for `ranks` (>= 2) tensor-parallel ranks on a host with `visible_gpus` GPUs, given the
/// value of MOEFOLD_TP_SINGLE_DEVICE (`single_device_env`, nullptr when unset): "1" selects
/// SingleDevice (whatever the GPU count); otherwise Nccl when ranks <= visible_gpus. Throws Error
/// naming the counts and the variable when there are fewer GPUs than ranks and the variable is not
/// "1", or when it is set to anything but "0" or "1".
TpCommBackend choose_tp_backend(int ranks, int visible_gpus, const char* single_device_env);

/// "nccl" or "single-device".
std::string to_string(TpCommBackend b);

}  // namespace moefold
