// -tp N --device cuda over NCCL for the moefold binary: it registers the NCCL group factory of
// models/cuda/cuda_tp_executor.h when it is configured with -DMOEFOLD_LINK_NCCL=ON (libnccl is ~200 MB:
// the libraries and the GPU tests do not link it). Without it, -tp on CUDA runs only over the
// single-device test communicator (MOEFOLD_TP_SINGLE_DEVICE=1) and otherwise fails with that advice.
#pragma once

namespace moefold {

/// Registers the NCCL group factory when this binary links NCCL; otherwise does nothing.
void register_nccl_tp_backend();

}  // namespace moefold
