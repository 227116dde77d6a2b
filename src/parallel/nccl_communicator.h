// The NCCL backend of Communicator (CUDA builds only: compiled and linked when MOEFOLD_CUDA=ON finds
// the toolkit, against the toolkit's NCCL). One rank per GPU, one thread or one process per rank,
// as vLLM and SGLang run it. Buffers are device pointers; every collective is enqueued on the rank's
// CUDA stream (set_stream) and returns without synchronising, so a caller may capture it in a CUDA
// graph. NVLink multicast (NVLS) is turned off at creation (NCCL_NVLS_ENABLE=0 unless the
// environment already sets it): on the shared GPU hosts it can take the machine down.
// Not yet run on several GPUs (none were lent when it was written): docs/architecture.md, TP/EP.
#pragma once
#include <array>
#include <cstdint>
#include <memory>
#include <vector>

#include "parallel/communicator.h"

namespace moefold {

/// ncclUniqueId's bytes (NCCL_UNIQUE_ID_BYTES), so that this header needs no nccl.h.
using NcclUniqueId = std::array<char, 128>;

/// A fresh id for one group: made by one rank and handed to every rank (by memory in one process,
/// by any channel between processes). Throws Error when NCCL fails.
NcclUniqueId nccl_unique_id();

/// The communicator of `rank` among `world_size` ranks that share `id`, on CUDA device `device`.
/// Collective over the ranks (each calls it, from its own thread or process). Throws Error naming
/// NCCL's message on failure.
std::unique_ptr<Communicator> make_nccl_communicator(const NcclUniqueId& id, int world_size, int rank, int device);

/// One communicator per listed device, made by one thread (ncclCommInitAll): rank i runs on
/// devices[i]. Throws Error on failure.
std::vector<std::unique_ptr<Communicator>> make_nccl_communicators(const std::vector<int>& devices);

/// Sets the CUDA stream (a cudaStream_t) on which `comm`'s collectives run; nullptr: the legacy
/// default stream. Throws Error if `comm` is not an NCCL communicator.
void nccl_set_stream(Communicator& comm, void* stream);

}  // namespace moefold
