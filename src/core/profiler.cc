// Profile windows, recording and the union-of-intervals summary (contract: profiler.h).
#include "core/profiler.h"

#include <algorithm>
#include <chrono>
#include <mutex>

#include "core/error.h"

namespace moefold::prof {

namespace detail {
std::atomic<bool> g_timing{false};
}  // namespace detail

namespace {

struct Session {
  std::mutex mu;
  bool open = false;
  int64_t start_ns = 0;
  int64_t excluded_ns = 0;  // the profiler's own flushes inside the window
  std::vector<TimedCall> calls;
  DeviceTimer* device = nullptr;
};

Session& session() {
  static Session* s = new Session;  // never destroyed (scopes may run during static destruction)
  return *s;
}

thread_local const StepFacts* t_step_facts = nullptr;

}  // namespace

int64_t host_now_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

void record(const TimedCall& call) {
  Session& s = session();
  std::lock_guard<std::mutex> lock(s.mu);
  if (s.open) s.calls.push_back(call);
}

void set_device_timer(DeviceTimer* timer) {
  Session& s = session();
  std::lock_guard<std::mutex> lock(s.mu);
  MOEFOLD_CHECK(!s.open, "set_device_timer: a profile window is open");
  s.device = timer;
}

DeviceTimer* device_timer() {
  Session& s = session();
  std::lock_guard<std::mutex> lock(s.mu);
  return s.device;
}

void begin_window() {
  Session& s = session();
  DeviceTimer* dev = nullptr;
  {
    std::lock_guard<std::mutex> lock(s.mu);
    MOEFOLD_CHECK(!s.open, "begin_window: a profile window is already open");
    s.calls.clear();
    s.excluded_ns = 0;
    dev = s.device;
  }
  // The device anchor waits for the device; take it outside the lock.
  const int64_t start = dev ? dev->begin() : host_now_ns();
  {
    std::lock_guard<std::mutex> lock(s.mu);
    s.start_ns = start;
    s.open = true;
  }
  detail::g_timing.store(true, std::memory_order_relaxed);
}

void flush() {
  DeviceTimer* dev = device_timer();
  if (!dev || !timing_active()) return;
  dev->sync();
  const int64_t t0 = host_now_ns();
  dev->resolve();
  const int64_t spent = host_now_ns() - t0;
  Session& s = session();
  std::lock_guard<std::mutex> lock(s.mu);
  if (s.open) s.excluded_ns += spent;
}

WindowProfile end_window() {
  Session& s = session();
  {
    std::lock_guard<std::mutex> lock(s.mu);
    MOEFOLD_CHECK(s.open, "end_window: no profile window is open");
  }
  DeviceTimer* dev = device_timer();
  if (dev) dev->sync();  // the window ends when the device has finished its work
  const int64_t end = host_now_ns();
  if (dev) {
    dev->resolve();
    dev->end();
  }
  detail::g_timing.store(false, std::memory_order_relaxed);
  std::vector<TimedCall> calls;
  int64_t start = 0, excluded = 0;
  {
    std::lock_guard<std::mutex> lock(s.mu);
    s.open = false;
    calls.swap(s.calls);
    start = s.start_ns;
    excluded = s.excluded_ns;
  }
  WindowProfile p = summarise(start, end - start, calls, excluded);
  p.timer = dev ? "steady_clock+" + dev->name() : "steady_clock";
  return p;
}

void abort_window() {
  Session& s = session();
  {
    std::lock_guard<std::mutex> lock(s.mu);
    if (!s.open) return;
  }
  DeviceTimer* dev = device_timer();
  if (dev) {
    try {
      dev->sync();
      dev->resolve();
      dev->end();
    } catch (const std::exception&) {
      // The window is being abandoned after an error; its timings are discarded anyway.
    }
  }
  detail::g_timing.store(false, std::memory_order_relaxed);
  std::lock_guard<std::mutex> lock(s.mu);
  s.open = false;
  s.calls.clear();
}

WindowProfile summarise(int64_t window_start_ns, int64_t span_ns, const std::vector<TimedCall>& calls,
                        int64_t excluded_ns) {
  WindowProfile p;
  const int64_t wall_ns = std::max<int64_t>(span_ns, 0);  // interval clipping uses the whole span
  excluded_ns = std::clamp<int64_t>(excluded_ns, 0, wall_ns);
  p.wall_s = double(wall_ns - excluded_ns) * 1e-9;
  p.excluded_s = double(excluded_ns) * 1e-9;
  // Per-kernel totals, indexed by kernel id.
  std::vector<KernelTime> by_id;
  auto slot = [&](int id) -> KernelTime& {
    if (size_t(id) >= by_id.size()) by_id.resize(size_t(id) + 1);
    KernelTime& k = by_id[size_t(id)];
    k.id = id;
    return k;
  };
  // Sweep over the clipped interval boundaries: +1 at a start, -1 at an end.
  struct Edge {
    int64_t t;
    int kernel;
    int delta;
  };
  std::vector<Edge> edges;
  edges.reserve(calls.size() * 2);
  for (const TimedCall& c : calls) {
    MOEFOLD_CHECK(c.kernel >= 0 && c.kernel < kMaxKernels, "profile: call of unknown kernel id {}", c.kernel);
    KernelTime& k = slot(c.kernel);
    ++k.calls;
    if (!c.timed) {
      ++k.untimed_calls;
      continue;
    }
    k.time_s += double(std::max<int64_t>(c.end_ns - c.start_ns, 0)) * 1e-9;
    k.work.bytes += c.work.bytes;
    k.work.flops += c.work.flops;
    const int64_t a = std::clamp<int64_t>(c.start_ns - window_start_ns, 0, wall_ns);
    const int64_t b = std::clamp<int64_t>(c.end_ns - window_start_ns, 0, wall_ns);
    if (b > a) {
      edges.push_back({a, c.kernel, +1});
      edges.push_back({b, c.kernel, -1});
    }
  }
  std::sort(edges.begin(), edges.end(), [](const Edge& x, const Edge& y) { return x.t < y.t; });
  std::vector<std::pair<int, int>> active;  // (kernel, open intervals of it)
  int open = 0;
  int64_t prev = 0, busy = 0;
  std::vector<double> excl_ns(by_id.size(), 0.0);
  for (const Edge& e : edges) {
    if (open > 0 && e.t > prev) {
      const double seg = double(e.t - prev);
      busy += e.t - prev;
      for (auto& [kid, n] : active) excl_ns[size_t(kid)] += seg * n / open;
    }
    prev = e.t;
    auto it = std::find_if(active.begin(), active.end(), [&](auto& a) { return a.first == e.kernel; });
    if (e.delta > 0) {
      if (it == active.end()) active.push_back({e.kernel, 1});
      else ++it->second;
      ++open;
    } else {
      if (--it->second == 0) active.erase(it);
      --open;
    }
  }
  // No call runs during the profiler's flushes (the device was synchronised before each), so the
  // excluded time comes out of the idle time only.
  busy = std::min(busy, wall_ns - excluded_ns);
  p.busy_s = double(busy) * 1e-9;
  p.idle_s = double(wall_ns - excluded_ns - busy) * 1e-9;
  for (KernelTime& k : by_id) {
    if (k.calls == 0) continue;
    const KernelInfo info = kernel_info(k.id);
    k.name = info.name;
    k.category = info.category;
    k.exclusive_s = excl_ns[size_t(k.id)] * 1e-9;
    p.kernels.push_back(std::move(k));
  }
  std::stable_sort(p.kernels.begin(), p.kernels.end(),
                   [](const KernelTime& a, const KernelTime& b) { return a.exclusive_s > b.exclusive_s; });
  return p;
}

const StepFacts* step_facts() { return t_step_facts; }

StepFactsScope::StepFactsScope(const StepFacts& facts) : prev_(t_step_facts) { t_step_facts = &facts; }
StepFactsScope::~StepFactsScope() { t_step_facts = prev_; }

}  // namespace moefold::prof
