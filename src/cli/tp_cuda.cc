#include "cli/tp_cuda.h"

#if defined(MOEFOLD_HAVE_CUDA) && defined(MOEFOLD_HAVE_NCCL)
#include <memory>
#include <vector>

#include "models/cuda/cuda_tp_executor.h"
#include "parallel/nccl_communicator.h"
#endif

namespace moefold {

#if defined(MOEFOLD_HAVE_CUDA) && defined(MOEFOLD_HAVE_NCCL)
namespace {
/// One NCCL communicator per device (ncclCommInitAll from this thread), owned by the group.
CudaTpGroup nccl_group(const std::vector<int>& devices) {
  auto comms = std::make_shared<std::vector<std::unique_ptr<Communicator>>>(make_nccl_communicators(devices));
  CudaTpGroup g;
  for (auto& c : *comms) g.comms.push_back(c.get());
  g.devices = devices;
  g.owner = std::move(comms);
  return g;
}
}  // namespace

void register_nccl_tp_backend() { set_nccl_group_factory(&nccl_group); }
#else
void register_nccl_tp_backend() {}
#endif

}  // namespace moefold
