// CUPTI kernel records through a run-time loaded libcupti (contract: kernel_trace.h).
#include "ops/cuda/kernel_trace.h"

#include <cuda_runtime.h>
#include <cxxabi.h>
#include <dlfcn.h>

#include <atomic>
#include <cstdlib>
#include <mutex>

#include "core/error.h"
#include "ops/cuda/cuda_check.h"

#if __has_include(<cupti_activity.h>)
#include <cupti_activity.h>
#define MOEFOLD_HAVE_CUPTI_HEADERS 1
#endif

namespace moefold::cuda {

#ifndef MOEFOLD_HAVE_CUPTI_HEADERS

std::unique_ptr<KernelTrace> KernelTrace::start(bool) {
  fail("kernel trace: this binary was built without CUPTI's headers (cupti_activity.h)");
}
KernelTrace::~KernelTrace() = default;
int64_t KernelTrace::now() const { return 0; }
KernelTrace::Records KernelTrace::take() { return {}; }

#else

namespace {

using RegisterCallbacksFn = CUptiResult (*)(CUpti_BuffersCallbackRequestFunc, CUpti_BuffersCallbackCompleteFunc);
using KindFn = CUptiResult (*)(CUpti_ActivityKind);
using FlushAllFn = CUptiResult (*)(uint32_t);
using NextRecordFn = CUptiResult (*)(uint8_t*, size_t, CUpti_Activity**);
using DroppedFn = CUptiResult (*)(CUcontext, uint32_t, size_t*);
using TimestampFn = CUptiResult (*)(uint64_t*);
using ResultStringFn = CUptiResult (*)(CUptiResult, const char**);
using CallbackNameFn = CUptiResult (*)(CUpti_CallbackDomain, uint32_t, const char**);

struct Cupti {
  void* handle = nullptr;
  RegisterCallbacksFn register_callbacks = nullptr;
  KindFn enable = nullptr, disable = nullptr;
  FlushAllFn flush_all = nullptr;
  NextRecordFn next_record = nullptr;
  DroppedFn dropped = nullptr;
  TimestampFn timestamp = nullptr;
  ResultStringFn result_string = nullptr;
  CallbackNameFn callback_name = nullptr;

  void check(CUptiResult r, const char* what) const {
    if (r == CUPTI_SUCCESS) return;
    const char* msg = nullptr;
    if (result_string) result_string(r, &msg);
    fail("kernel trace: CUPTI ", what, " failed: ", msg ? msg : "unknown error", " (", int(r), ")");
  }
};

constexpr size_t kBufferBytes = size_t(8) << 20;

// CUPTI's callbacks are plain functions: the session's state is global (one session at a time).
std::mutex g_mu;
Cupti g_cupti;
KernelTrace::Records g_records;
bool g_host_calls = false;
size_t g_dropped = 0;
std::atomic<bool> g_active{false};

std::string demangle(const char* name) {
  if (!name) return "(unnamed)";
  int status = 0;
  char* d = abi::__cxa_demangle(name, nullptr, nullptr, &status);
  std::string out = status == 0 && d ? std::string(d) : std::string(name);
  std::free(d);
  return out;
}

const char* copy_kind(uint8_t k) {
  switch (k) {
    case CUPTI_ACTIVITY_MEMCPY_KIND_HTOD: return "HtoD";
    case CUPTI_ACTIVITY_MEMCPY_KIND_DTOH: return "DtoH";
    case CUPTI_ACTIVITY_MEMCPY_KIND_DTOD: return "DtoD";
    case CUPTI_ACTIVITY_MEMCPY_KIND_PTOP: return "PtoP";
    default: return "other";
  }
}

void CUPTIAPI buffer_requested(uint8_t** buffer, size_t* size, size_t* max_records) {
  *buffer = static_cast<uint8_t*>(std::aligned_alloc(8, kBufferBytes));
  *size = *buffer ? kBufferBytes : 0;
  *max_records = 0;
}

void CUPTIAPI buffer_completed(CUcontext ctx, uint32_t stream, uint8_t* buffer, size_t, size_t valid) {
  KernelTrace::Records got;
  CUpti_Activity* rec = nullptr;
  while (g_cupti.next_record(buffer, valid, &rec) == CUPTI_SUCCESS) {
    if (rec->kind == CUPTI_ACTIVITY_KIND_MEMCPY) {
      const auto* m = reinterpret_cast<const CUpti_ActivityMemcpy6*>(rec);
      prof::KernelRecord r;
      r.name = std::string("[memcpy ") + copy_kind(m->copyKind) + "]";
      r.start_ns = int64_t(m->start);
      r.end_ns = int64_t(m->end);
      r.in_graph = m->graphId != 0;
      got.gpu.push_back(std::move(r));
      continue;
    }
    if (rec->kind == CUPTI_ACTIVITY_KIND_MEMSET) {
      const auto* m = reinterpret_cast<const CUpti_ActivityMemset4*>(rec);
      prof::KernelRecord r;
      r.name = "[memset]";
      r.start_ns = int64_t(m->start);
      r.end_ns = int64_t(m->end);
      r.in_graph = m->graphId != 0;
      got.gpu.push_back(std::move(r));
      continue;
    }
    if (rec->kind == CUPTI_ACTIVITY_KIND_RUNTIME) {
      const auto* a = reinterpret_cast<const CUpti_ActivityAPI*>(rec);
      const char* name = nullptr;
      if (g_cupti.callback_name) g_cupti.callback_name(CUPTI_CB_DOMAIN_RUNTIME_API, a->cbid, &name);
      std::string n = name ? name : "runtime call " + std::to_string(a->cbid);
      if (const size_t v = n.find("_v"); v != std::string::npos) n.erase(v);  // cudaMemcpyAsync_v3020
      got.host.push_back({std::move(n), int64_t(a->start), int64_t(a->end)});
      continue;
    }
    if (rec->kind != CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL && rec->kind != CUPTI_ACTIVITY_KIND_KERNEL) continue;
    const auto* k = reinterpret_cast<const CUpti_ActivityKernel10*>(rec);
    prof::KernelRecord r;
    r.name = prof::shorten_kernel_name(demangle(k->name));
    r.start_ns = int64_t(k->start);
    r.end_ns = int64_t(k->end);
    r.grid = {k->gridX, k->gridY, k->gridZ};
    r.block = {k->blockX, k->blockY, k->blockZ};
    r.registers = k->registersPerThread;
    r.shared_bytes = k->staticSharedMemory + k->dynamicSharedMemory;
    r.in_graph = k->graphId != 0;
    got.gpu.push_back(std::move(r));
  }
  size_t dropped = 0;
  if (g_cupti.dropped) g_cupti.dropped(ctx, stream, &dropped);
  std::free(buffer);
  std::lock_guard<std::mutex> lock(g_mu);
  g_dropped += dropped;
  for (auto& r : got.gpu) g_records.gpu.push_back(std::move(r));
  for (auto& r : got.host) g_records.host.push_back(std::move(r));
}

void* open_cupti(std::string& loaded, std::string& tried) {
  std::vector<std::string> paths;
  if (const char* env = std::getenv("MOEFOLD_CUPTI_LIBRARY"); env && *env) paths.push_back(env);
  paths.push_back("libcupti.so.13");
  paths.push_back("libcupti.so");
#ifdef MOEFOLD_CUDA_LIBRARY_DIR
  paths.push_back(std::string(MOEFOLD_CUDA_LIBRARY_DIR) + "/libcupti.so");
#endif
  for (const char* dir : {"/usr/local/cuda/lib64", "/usr/local/cuda/lib", "/usr/local/cuda/extras/CUPTI/lib64"}) {
    paths.push_back(std::string(dir) + "/libcupti.so");
  }
  for (const std::string& p : paths) {
    if (void* h = dlopen(p.c_str(), RTLD_NOW | RTLD_LOCAL)) {
      loaded = p;
      return h;
    }
    tried += (tried.empty() ? "" : ", ") + p;
  }
  return nullptr;
}

template <class Fn>
Fn symbol(void* h, const char* name) {
  void* f = dlsym(h, name);
  MOEFOLD_CHECK(f != nullptr, "kernel trace: libcupti has no ", name);
  return reinterpret_cast<Fn>(f);
}

}  // namespace

std::unique_ptr<KernelTrace> KernelTrace::start(bool host_calls) {
  bool expected = false;
  MOEFOLD_CHECK(g_active.compare_exchange_strong(expected, true), "kernel trace: a trace is already recording");
  std::unique_ptr<KernelTrace> t(new KernelTrace());
  try {
    if (!g_cupti.handle) {
      std::string tried;
      void* h = open_cupti(t->library_, tried);
      MOEFOLD_CHECK(h != nullptr, "kernel trace: libcupti not found (tried ", tried,
                    "); set MOEFOLD_CUPTI_LIBRARY to its path");
      Cupti c;
      c.handle = h;
      c.register_callbacks = symbol<RegisterCallbacksFn>(h, "cuptiActivityRegisterCallbacks");
      c.enable = symbol<KindFn>(h, "cuptiActivityEnable");
      c.disable = symbol<KindFn>(h, "cuptiActivityDisable");
      c.flush_all = symbol<FlushAllFn>(h, "cuptiActivityFlushAll");
      c.next_record = symbol<NextRecordFn>(h, "cuptiActivityGetNextRecord");
      c.dropped = symbol<DroppedFn>(h, "cuptiActivityGetNumDroppedRecords");
      c.timestamp = symbol<TimestampFn>(h, "cuptiGetTimestamp");
      c.result_string = symbol<ResultStringFn>(h, "cuptiGetResultString");
      c.callback_name = symbol<CallbackNameFn>(h, "cuptiGetCallbackName");
      g_cupti = c;
      g_cupti.check(g_cupti.register_callbacks(buffer_requested, buffer_completed), "cuptiActivityRegisterCallbacks");
    }
    {
      std::lock_guard<std::mutex> lock(g_mu);
      g_records = {};
      g_dropped = 0;
    }
    MOEFOLD_CUDA_CHECK(cudaFree(nullptr));  // a context for CUPTI to attach to
    g_cupti.check(g_cupti.enable(CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL), "cuptiActivityEnable(CONCURRENT_KERNEL)");
    g_cupti.check(g_cupti.enable(CUPTI_ACTIVITY_KIND_MEMCPY), "cuptiActivityEnable(MEMCPY)");
    g_cupti.check(g_cupti.enable(CUPTI_ACTIVITY_KIND_MEMSET), "cuptiActivityEnable(MEMSET)");
    g_host_calls = host_calls;
    if (host_calls) g_cupti.check(g_cupti.enable(CUPTI_ACTIVITY_KIND_RUNTIME), "cuptiActivityEnable(RUNTIME)");
  } catch (...) {
    g_active = false;
    throw;
  }
  return t;
}

KernelTrace::~KernelTrace() {
  if (g_cupti.disable) {
    g_cupti.disable(CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL);
    g_cupti.disable(CUPTI_ACTIVITY_KIND_MEMCPY);
    g_cupti.disable(CUPTI_ACTIVITY_KIND_MEMSET);
    if (g_host_calls) g_cupti.disable(CUPTI_ACTIVITY_KIND_RUNTIME);
  }
  if (g_cupti.flush_all) g_cupti.flush_all(CUPTI_ACTIVITY_FLAG_FLUSH_FORCED);
  std::lock_guard<std::mutex> lock(g_mu);
  g_records = {};
  g_active = false;
}

int64_t KernelTrace::now() const {
  uint64_t t = 0;
  g_cupti.check(g_cupti.timestamp(&t), "cuptiGetTimestamp");
  return int64_t(t);
}

KernelTrace::Records KernelTrace::take() {
  MOEFOLD_CUDA_CHECK(cudaDeviceSynchronize());
  g_cupti.check(g_cupti.flush_all(CUPTI_ACTIVITY_FLAG_FLUSH_FORCED), "cuptiActivityFlushAll");
  std::lock_guard<std::mutex> lock(g_mu);
  MOEFOLD_CHECK(g_dropped == 0, "kernel trace: CUPTI dropped ", g_dropped,
                " kernel records (its buffers were full); trace fewer steps");
  Records out;
  std::swap(out, g_records);
  return out;
}

#endif

}  // namespace moefold::cuda
