#include "parallel/nccl_communicator.h"

#include <cuda_runtime_api.h>
#include <nccl.h>

#include <cstdlib>
#include <cstring>

#include "core/error.h"

namespace moefold {

namespace {

static_assert(sizeof(ncclUniqueId) == sizeof(NcclUniqueId), "NcclUniqueId must hold ncclUniqueId");

void check(ncclResult_t r, const char* what) {
  if (r != ncclSuccess) fail("NCCL {} failed: {} ({})", what, ncclGetErrorString(r), ncclGetLastError(nullptr));
}
void check_cuda(cudaError_t r, const char* what) {
  if (r != cudaSuccess) fail("{} failed: {}", what, cudaGetErrorString(r));
}

/// NVLink multicast off unless the user chose otherwise (setenv without overwrite).
void nvls_off() { setenv("NCCL_NVLS_ENABLE", "0", 0); }

class NcclCommunicator : public Communicator {
 public:
  NcclCommunicator(ncclComm_t c, int rank, int world, int device) : comm_(c), rank_(rank), world_(world), device_(device) {}
  ~NcclCommunicator() override {
    if (scratch_) cudaFree(scratch_);
    ncclCommDestroy(comm_);
  }
  int rank() const override { return rank_; }
  int world_size() const override { return world_; }
  std::string backend() const override { return "nccl"; }
  void set_stream(void* s) override { stream_ = static_cast<cudaStream_t>(s); }

  void all_reduce_sum(float* buf, int64_t n) override {
    if (n == 0) return;
    check(ncclAllReduce(buf, buf, size_t(n), ncclFloat32, ncclSum, comm_, stream_), "all_reduce");
  }
  void all_gather(const float* in, float* out, int64_t n) override {
    if (n == 0) return;
    check(ncclAllGather(in, out, size_t(n), ncclFloat32, comm_, stream_), "all_gather");
  }
  void reduce_scatter_sum(const float* in, float* out, int64_t n) override {
    if (n == 0) return;
    check(ncclReduceScatter(in, out, size_t(n), ncclFloat32, ncclSum, comm_, stream_), "reduce_scatter");
  }
  // Point-to-point sends and receives of one group call: NCCL's all-to-all-v.
  void all_to_all_v(const float* send, std::span<const int64_t> send_counts, std::span<const int64_t> send_offsets,
                    float* recv, std::span<const int64_t> recv_counts, std::span<const int64_t> recv_offsets) override {
    MOEFOLD_CHECK(send_counts.size() == size_t(world_) && send_offsets.size() == size_t(world_) &&
                      recv_counts.size() == size_t(world_) && recv_offsets.size() == size_t(world_),
                  "all_to_all_v: counts and offsets need {} entries (one per rank)", world_);
    check(ncclGroupStart(), "group start");
    for (int r = 0; r < world_; ++r) {
      if (send_counts[size_t(r)] > 0)
        check(ncclSend(send + send_offsets[size_t(r)], size_t(send_counts[size_t(r)]), ncclFloat32, r, comm_, stream_),
              "send");
      if (recv_counts[size_t(r)] > 0)
        check(ncclRecv(recv + recv_offsets[size_t(r)], size_t(recv_counts[size_t(r)]), ncclFloat32, r, comm_, stream_),
              "recv");
    }
    check(ncclGroupEnd(), "group end");
  }
  // A one-element all-reduce on a scratch word, waited for on the host.
  void barrier() override {
    if (!scratch_) check_cuda(cudaMalloc(reinterpret_cast<void**>(&scratch_), sizeof(float)), "cudaMalloc (barrier scratch)");
    check(ncclAllReduce(scratch_, scratch_, 1, ncclFloat32, ncclSum, comm_, stream_), "barrier");
    check_cuda(cudaStreamSynchronize(stream_), "cudaStreamSynchronize (barrier)");
  }

 private:
  ncclComm_t comm_;
  int rank_, world_, device_;
  cudaStream_t stream_ = nullptr;
  float* scratch_ = nullptr;
};

}  // namespace

NcclUniqueId nccl_unique_id() {
  nvls_off();
  ncclUniqueId id;
  check(ncclGetUniqueId(&id), "get unique id");
  NcclUniqueId out;
  std::memcpy(out.data(), &id, sizeof(id));
  return out;
}

std::unique_ptr<Communicator> make_nccl_communicator(const NcclUniqueId& id, int world_size, int rank, int device) {
  MOEFOLD_CHECK(world_size >= 1 && rank >= 0 && rank < world_size, "NCCL: rank {} of {} is out of range", rank,
                world_size);
  nvls_off();
  check_cuda(cudaSetDevice(device), "cudaSetDevice");
  ncclUniqueId nid;
  std::memcpy(&nid, id.data(), sizeof(nid));
  ncclComm_t c = nullptr;
  check(ncclCommInitRank(&c, world_size, nid, rank), "comm init rank");
  return std::make_unique<NcclCommunicator>(c, rank, world_size, device);
}

std::vector<std::unique_ptr<Communicator>> make_nccl_communicators(const std::vector<int>& devices) {
  MOEFOLD_CHECK(!devices.empty(), "NCCL: no devices given");
  nvls_off();
  std::vector<ncclComm_t> comms(devices.size());
  check(ncclCommInitAll(comms.data(), int(devices.size()), devices.data()), "comm init all");
  std::vector<std::unique_ptr<Communicator>> out;
  for (size_t i = 0; i < devices.size(); ++i)
    out.push_back(std::make_unique<NcclCommunicator>(comms[i], int(i), int(devices.size()), devices[i]));
  return out;
}

void nccl_set_stream(Communicator& comm, void* stream) {
  auto* n = dynamic_cast<NcclCommunicator*>(&comm);
  MOEFOLD_CHECK(n != nullptr, "nccl_set_stream: a {} communicator is not an NCCL one", comm.backend());
  n->set_stream(stream);
}

}  // namespace moefold
