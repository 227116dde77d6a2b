// Inline-PTX wrappers for sm_80+ tensor-core kernels (private to src/ops/cuda): shared-memory
// addresses, ldmatrix, mma.sync m16n8k16 bf16 with fp32 accumulate, and cp.async. Semantics: the PTX ISA
// (https://docs.nvidia.com/cuda/parallel-thread-execution/), sections on ldmatrix, mma and cp.async.
#pragma once
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>

namespace moefold::cuda::ptx {

/// An L2 access policy (createpolicy): evict_first when `first` (data read once a step, such as
/// streamed weights, so that it leaves the L2 to what is reused: activations, metadata, code), else
/// evict_normal.
__device__ __forceinline__ uint64_t l2_policy(bool first) {
  uint64_t p;
  if (first)
    asm("createpolicy.fractional.L2::evict_first.b64 %0, 1.0;\n" : "=l"(p));
  else
    asm("createpolicy.fractional.L2::evict_normal.b64 %0, 1.0;\n" : "=l"(p));
  return p;
}

/// 16 bytes at global p (16-byte aligned), for data read once (weights streamed by the decode
/// kernels): the non-coherent read-only path, no L1 allocation, 256-byte L2 prefetch, and an L2
/// evict_first policy so that the stream does not push out of L2 what the step reuses (l2_hint.h).
__device__ __forceinline__ uint4 ld_stream16(const void* p) {
  const uint64_t policy = l2_policy(true);
  uint4 v;
  asm("ld.global.nc.L1::no_allocate.L2::cache_hint.L2::256B.v4.u32 {%0,%1,%2,%3}, [%4], %5;\n"
      : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
      : "l"(p), "l"(policy));
  return v;
}

/// The shared-memory (state space) address of a generic pointer into shared memory.
__device__ __forceinline__ uint32_t smem_u32(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

/// ldmatrix .x4: four 8x8 b16 matrices from shared memory, one row address per lane.
__device__ __forceinline__ void ldmatrix_x4(uint32_t (&r)[4], const void* p) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(smem_u32(p)));
}

/// ldmatrix .x4 .trans: the same, each 8x8 matrix transposed.
__device__ __forceinline__ void ldmatrix_x4_trans(uint32_t (&r)[4], const void* p) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(smem_u32(p)));
}

/// c += a (16x16, row) * b (16x8, col), bf16 inputs, fp32 accumulate (mma.sync m16n8k16).
__device__ __forceinline__ void mma_bf16_16816(float (&c)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
      "{%0,%1,%2,%3};\n"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

/// 16-byte asynchronous global -> shared copy (cp.async.cg, L2 only).
__device__ __forceinline__ void cp_async16(void* dst, const void* src) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(smem_u32(dst)), "l"(src));
}

/// The same with a source size: `valid` false copies nothing and zero-fills the 16 bytes.
__device__ __forceinline__ void cp_async16(void* dst, const void* src, bool valid) {
  const int n = valid ? 16 : 0;
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(smem_u32(dst)), "l"(src), "r"(n));
}

/// cp_async16 with a source size and an L2 cache policy from l2_policy().
__device__ __forceinline__ void cp_async16(void* dst, const void* src, bool valid, uint64_t policy) {
  const int n = valid ? 16 : 0;
  asm volatile("cp.async.cg.shared.global.L2::cache_hint [%0], [%1], 16, %2, %3;\n" ::"r"(smem_u32(dst)), "l"(src),
               "r"(n), "l"(policy));
}

__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::); }

/// Waits for every committed cp.async group (a compiler memory barrier as well).
__device__ __forceinline__ void cp_async_wait_all() { asm volatile("cp.async.wait_all;\n" ::: "memory"); }

/// Waits until at most N committed cp.async groups are pending.
template <int N>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N));
}


// ---- sm_90: mbarriers, the bulk tensor copy engine (TMA), named barriers, register reallocation ----
// Semantics: the PTX ISA sections "mbarrier", "cp.async.bulk.tensor", "bar / barrier" and "setmaxnreg".

/// Initialises the mbarrier at shared address `bar` for `count` arrivals per phase.
__device__ __forceinline__ void mbar_init(uint32_t bar, uint32_t count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(bar), "r"(count) : "memory");
}

/// Makes mbarrier initialisations visible to the async proxy (the copy engine); follow with a barrier.
__device__ __forceinline__ void fence_mbar_init() { asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory"); }

/// One arrival (release semantics: this thread's earlier writes are visible to the waiters).
__device__ __forceinline__ void mbar_arrive(uint32_t bar) {
  asm volatile("mbarrier.arrive.release.cta.shared::cta.b64 _, [%0];\n" ::"r"(bar) : "memory");
}

/// One arrival that also expects `bytes` more bytes of asynchronous copies in this phase.
__device__ __forceinline__ void mbar_arrive_expect_tx(uint32_t bar, uint32_t bytes) {
  asm volatile("mbarrier.arrive.expect_tx.release.cta.shared::cta.b64 _, [%0], %1;\n" ::"r"(bar), "r"(bytes) : "memory");
}

/// Spins until the phase of parity `parity` of the mbarrier has completed (acquire semantics).
__device__ __forceinline__ void mbar_wait(uint32_t bar, uint32_t parity) {
  asm volatile(
      "{\n.reg .pred p;\n"
      "WAIT_%=:\n"
      "mbarrier.try_wait.parity.acquire.cta.shared::cta.b64 p, [%0], %1;\n"
      "@!p bra WAIT_%=;\n}\n" ::"r"(bar),
      "r"(parity)
      : "memory");
}

/// Bulk tensor copy of one box at coordinates (c0, c1, c2) of the 3-D tensor map `map` (a
/// __grid_constant__ kernel parameter) to shared address `dst`; completes `bytes` on mbarrier `bar`.
__device__ __forceinline__ void tma_load_3d(uint32_t dst, const void* map, uint32_t bar, int c0, int c1, int c2) {
  asm volatile(
      "cp.async.bulk.tensor.3d.shared::cluster.global.tile.mbarrier::complete_tx::bytes [%0], [%1, {%3, %4, %5}], [%2];\n" ::"r"(dst),
      "l"(reinterpret_cast<uint64_t>(map)), "r"(bar), "r"(c0), "r"(c1), "r"(c2)
      : "memory");
}

/// Named barrier `id` (1..15) over `count` threads (a multiple of 32): wait, or arrive without waiting.
__device__ __forceinline__ void named_sync(int id, int count) {
  asm volatile("bar.sync %0, %1;\n" ::"r"(id), "r"(count) : "memory");
}
__device__ __forceinline__ void named_arrive(int id, int count) {
  asm volatile("bar.arrive %0, %1;\n" ::"r"(id), "r"(count) : "memory");
}

/// Register reallocation between warpgroups (sm_90a; the kernel needs a register cap at entry).
template <int N>
__device__ __forceinline__ void setmaxnreg_inc() {
  asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(N));
}
template <int N>
__device__ __forceinline__ void setmaxnreg_dec() {
  asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(N));
}

}  // namespace moefold::cuda::ptx
