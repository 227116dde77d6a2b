// Per-kernel exposed time from kernel records (contract: kernel_timeline.h).
#include "core/kernel_timeline.h"

#include <algorithm>
#include <cstdio>
#include <map>
#include <nlohmann/json.hpp>
#include <tuple>

#include "core/error.h"

namespace moefold::prof {

namespace {

/// The windows sorted by begin (checked: each ends after it begins, none overlaps), and each window's
/// kernels (those starting inside it) sorted by start, then end.
struct StepKernels {
  std::vector<StepWindow> win;
  std::vector<std::vector<const KernelRecord*>> by_step;
  /// The window holding time t, or -1.
  int64_t window_of(int64_t t) const {
    auto it = std::upper_bound(win.begin(), win.end(), t, [](int64_t x, const StepWindow& w) { return x < w.begin_ns; });
    if (it == win.begin()) return -1;
    --it;
    return t < it->end_ns ? int64_t(it - win.begin()) : -1;
  }
};

StepKernels step_kernels(std::span<const KernelRecord> records, std::span<const StepWindow> steps) {
  StepKernels sk;
  sk.win.assign(steps.begin(), steps.end());
  auto& win = sk.win;
  std::sort(win.begin(), win.end(), [](const StepWindow& a, const StepWindow& b) { return a.begin_ns < b.begin_ns; });
  for (size_t i = 0; i < win.size(); ++i) {
    MOEFOLD_CHECK(win[i].end_ns >= win[i].begin_ns, "kernel timeline: a step window ends before it begins");
    MOEFOLD_CHECK(i == 0 || win[i].begin_ns >= win[i - 1].end_ns, "kernel timeline: step windows overlap");
  }
  sk.by_step.resize(win.size());
  for (const KernelRecord& r : records) {
    if (const int64_t w = sk.window_of(r.start_ns); w >= 0) sk.by_step[size_t(w)].push_back(&r);
  }
  for (auto& ks : sk.by_step)
    std::sort(ks.begin(), ks.end(), [](const KernelRecord* a, const KernelRecord* b) {
      return a->start_ns != b->start_ns ? a->start_ns < b->start_ns : a->end_ns < b->end_ns;
    });
  return sk;
}

}  // namespace

TimelineSummary summarize_timeline(std::span<const KernelRecord> records, std::span<const StepWindow> steps,
                                   std::span<const HostCall> host_calls) {
  const StepKernels sk = step_kernels(records, steps);
  const auto& win = sk.win;
  const auto& by_step = sk.by_step;
  using Key = std::tuple<std::string, std::array<int32_t, 3>, std::array<int32_t, 3>>;
  struct Acc {
    int32_t registers = 0;
    int64_t calls = 0;
    double duration_ns = 0, exposed_ns = 0;
  };
  std::map<Key, Acc> acc;
  TimelineSummary s;
  double wall = 0, span = 0, gap = 0, kernels = 0, graph = 0;
  for (size_t i = 0; i < win.size(); ++i) {
    const auto& ks = by_step[i];
    if (ks.empty()) continue;
    ++s.steps;
    int64_t frontier = ks.front()->start_ns;
    const int64_t first = frontier;
    for (const KernelRecord* k : ks) {
      if (k->start_ns > frontier) {
        gap += double(k->start_ns - frontier);
        frontier = k->start_ns;
      }
      const int64_t exposed = std::max<int64_t>(0, k->end_ns - frontier);
      frontier = std::max(frontier, k->end_ns);
      Acc& a = acc[Key{k->name, k->grid, k->block}];
      a.registers = k->registers;
      a.calls += 1;
      a.duration_ns += double(k->end_ns - k->start_ns);
      a.exposed_ns += double(exposed);
      graph += k->in_graph ? 1 : 0;
    }
    kernels += double(ks.size());
    span += double(frontier - first);
    wall += double(std::max(win[i].end_ns, frontier) - win[i].begin_ns);
  }
  if (s.steps == 0) return s;
  const double n = s.steps;
  s.wall_us = wall / n / 1e3;
  s.span_us = span / n / 1e3;
  s.gap_us = gap / n / 1e3;
  s.host_us = s.wall_us - s.span_us;
  s.kernels = kernels / n;
  s.graph_kernels = graph / n;
  for (const auto& [key, a] : acc) {
    TimelineRow row;
    std::tie(row.name, row.grid, row.block) = key;
    row.registers = a.registers;
    row.calls = a.calls;
    row.calls_per_step = double(a.calls) / n;
    row.mean_duration_us = a.duration_ns / double(a.calls) / 1e3;
    row.exposed_us_per_step = a.exposed_ns / n / 1e3;
    row.exposed_share = s.wall_us > 0 ? row.exposed_us_per_step / s.wall_us : 0;
    s.rows.push_back(std::move(row));
  }
  std::stable_sort(s.rows.begin(), s.rows.end(), [](const TimelineRow& a, const TimelineRow& b) {
    return a.exposed_us_per_step > b.exposed_us_per_step;
  });
  std::map<std::string, std::pair<int64_t, double>> calls;  // name -> (calls, ns)
  for (const HostCall& c : host_calls) {
    const int64_t w = sk.window_of(c.start_ns);
    if (w < 0 || by_step[size_t(w)].empty()) continue;
    auto& [count, ns] = calls[c.name];
    count += 1;
    ns += double(c.end_ns - c.start_ns);
  }
  for (const auto& [name, cn] : calls) {
    s.host_calls.push_back({name, double(cn.first) / n, cn.second / double(cn.first) / 1e3, cn.second / n / 1e3});
    s.host_call_us += cn.second / n / 1e3;
  }
  std::stable_sort(s.host_calls.begin(), s.host_calls.end(),
                   [](const HostCallRow& a, const HostCallRow& b) { return a.us_per_step > b.us_per_step; });
  return s;
}

namespace {

void erase_all(std::string& s, std::string_view what) {
  for (size_t p = s.find(what); p != std::string::npos; p = s.find(what, p)) s.erase(p, what.size());
}

std::string cut(std::string s, size_t max_len) {
  if (s.size() > max_len && max_len >= 3) s = s.substr(0, max_len - 3) + "...";
  return s;
}

}  // namespace

std::string shorten_kernel_name(std::string_view demangled, size_t max_len) {
  std::string s(demangled);
  erase_all(s, "(anonymous namespace)::");
  erase_all(s, "moefold::cuda::");
  erase_all(s, "moefold::");
  if (s.rfind("void ", 0) == 0) s.erase(0, 5);
  // The parameter list: the first '(' outside template brackets (demangled signatures only).
  int depth = 0;
  for (size_t i = 0; i < s.size(); ++i) {
    if (s[i] == '<') ++depth;
    if (s[i] == '>') --depth;
    if (s[i] == '(' && depth == 0 && i > 0) {
      s.erase(i);
      break;
    }
  }
  return cut(std::move(s), max_len);
}

std::string format_timeline(const TimelineSummary& s, int rows) {
  std::string out;
  char line[512];
  if (s.steps == 0) return "kernel timeline: no kernel ran inside the traced steps\n";
  std::snprintf(line, sizeof line,
                "kernel timeline over %d steps (means per step): wall %.1f us = GPU span %.1f us (kernels %.1f "
                "exposed + %.1f idle between them) + %.1f us host; %.0f kernels (%.0f in graphs)\n",
                s.steps, s.wall_us, s.span_us, s.span_us - s.gap_us, s.gap_us, s.host_us, s.kernels,
                s.graph_kernels);
  out += line;
  std::snprintf(line, sizeof line, "  %-60s %-13s %5s %4s %7s %9s %11s %7s\n", "kernel", "grid", "block", "reg",
                "calls", "dur us", "exposed us", "share");
  out += line;
  double rest_exposed = 0, rest_calls = 0;
  int shown = 0;
  for (const TimelineRow& r : s.rows) {
    if (shown >= rows) {
      rest_exposed += r.exposed_us_per_step;
      rest_calls += r.calls_per_step;
      continue;
    }
    ++shown;
    char grid[48];
    if (r.grid[2] > 1) {
      std::snprintf(grid, sizeof grid, "%dx%dx%d", r.grid[0], r.grid[1], r.grid[2]);
    } else if (r.grid[1] > 1) {
      std::snprintf(grid, sizeof grid, "%dx%d", r.grid[0], r.grid[1]);
    } else {
      std::snprintf(grid, sizeof grid, "%d", r.grid[0]);
    }
    std::snprintf(line, sizeof line, "  %-60.60s %-13s %5d %4d %7.1f %9.2f %11.1f %6.1f%%\n", r.name.c_str(), grid,
                  r.block[0] * r.block[1] * r.block[2], r.registers, r.calls_per_step, r.mean_duration_us,
                  r.exposed_us_per_step, 100.0 * r.exposed_share);
    out += line;
  }
  if (rest_calls > 0) {
    std::snprintf(line, sizeof line, "  %-60s %-13s %5s %4s %7.1f %9s %11.1f %6.1f%%\n", "(the other kernels)", "", "",
                  "", rest_calls, "", rest_exposed, s.wall_us > 0 ? 100.0 * rest_exposed / s.wall_us : 0.0);
    out += line;
  }
  std::snprintf(line, sizeof line, "  %-60s %-13s %5s %4s %7s %9s %11.1f %6.1f%%\n", "(idle between kernels)", "",
                "", "", "", "", s.gap_us, s.wall_us > 0 ? 100.0 * s.gap_us / s.wall_us : 0.0);
  out += line;
  std::snprintf(line, sizeof line, "  %-60s %-13s %5s %4s %7s %9s %11.1f %6.1f%%\n",
                "(host: before the first kernel, after the last)", "", "", "", "", "", s.host_us,
                s.wall_us > 0 ? 100.0 * s.host_us / s.wall_us : 0.0);
  out += line;
  if (!s.host_calls.empty()) {
    std::snprintf(line, sizeof line, "host: %.1f us a step inside CUDA runtime calls\n  %-40s %7s %9s %11s\n",
                  s.host_call_us, "runtime call", "calls", "mean us", "us a step");
    out += line;
    for (const HostCallRow& c : s.host_calls) {
      std::snprintf(line, sizeof line, "  %-40.40s %7.1f %9.2f %11.1f\n", c.name.c_str(), c.calls_per_step, c.mean_us,
                    c.us_per_step);
      out += line;
    }
  }
  return out;
}

nlohmann::json timeline_to_json(const TimelineSummary& s) {
  nlohmann::json rows = nlohmann::json::array();
  for (const TimelineRow& r : s.rows) {
    rows.push_back({{"kernel", r.name},
                    {"grid", r.grid},
                    {"block", r.block},
                    {"registers", r.registers},
                    {"calls", r.calls},
                    {"calls_per_step", r.calls_per_step},
                    {"mean_duration_us", r.mean_duration_us},
                    {"exposed_us_per_step", r.exposed_us_per_step},
                    {"exposed_share", r.exposed_share}});
  }
  nlohmann::json host = nlohmann::json::array();
  for (const HostCallRow& c : s.host_calls)
    host.push_back({{"call", c.name}, {"calls_per_step", c.calls_per_step}, {"mean_us", c.mean_us},
                    {"us_per_step", c.us_per_step}});
  return {{"steps", s.steps},         {"wall_us", s.wall_us}, {"span_us", s.span_us}, {"host_calls", host},
          {"idle_between_us", s.gap_us}, {"host_us", s.host_us}, {"kernels_per_step", s.kernels},
          {"graph_kernels_per_step", s.graph_kernels}, {"kernels", rows}};
}

std::string timeline_csv(std::span<const KernelRecord> records, std::span<const StepWindow> steps, int max_steps) {
  const StepKernels sk = step_kernels(records, steps);
  std::string out = "step,index,kernel,grid,start_us,end_us,gap_us,exposed_us\n";
  char line[160];
  int step = 0;
  for (const auto& ks : sk.by_step) {
    if (ks.empty()) continue;
    if (step >= max_steps) break;
    const int64_t first = ks.front()->start_ns;
    int64_t frontier = first;
    for (size_t i = 0; i < ks.size(); ++i) {
      const KernelRecord& k = *ks[i];
      const int64_t gap = std::max<int64_t>(0, k.start_ns - frontier);
      frontier = std::max(frontier, k.start_ns);
      const int64_t exposed = std::max<int64_t>(0, k.end_ns - frontier);
      frontier = std::max(frontier, k.end_ns);
      std::string name = k.name;
      for (size_t p = name.find('"'); p != std::string::npos; p = name.find('"', p + 2)) name.insert(p, 1, '"');
      std::snprintf(line, sizeof line, "%d,%zu,", step, i);
      out += line;
      out += '"' + name + '"';
      std::snprintf(line, sizeof line, ",%dx%dx%d,%.3f,%.3f,%.3f,%.3f\n", k.grid[0], k.grid[1], k.grid[2],
                    double(k.start_ns - first) / 1e3, double(k.end_ns - first) / 1e3, double(gap) / 1e3,
                    double(exposed) / 1e3);
      out += line;
    }
    ++step;
  }
  return out;
}

}  // namespace moefold::prof
