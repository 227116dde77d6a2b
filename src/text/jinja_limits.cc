#include "text/jinja_limits.h"

#include "text/jinja_value.h"

namespace moefold::jinja {

struct LimitScope::State {
  RenderLimits limits;
  std::chrono::steady_clock::time_point deadline;
  uint64_t steps = 0;
  int depth = 0;
  std::vector<std::weak_ptr<NamespaceObj>> namespaces;
};

namespace {
thread_local LimitScope::State* g_state = nullptr;
const RenderLimits kDefaults{};
// Outside any scope: the defaults, no deadline, a per-thread depth counter.
thread_local int g_free_depth = 0;
}  // namespace

LimitScope::LimitScope(const RenderLimits& limits) : prev_(g_state) {
  auto* s = new State;
  s->limits = limits;
  s->deadline = std::chrono::steady_clock::now() +
                std::chrono::duration_cast<std::chrono::steady_clock::duration>(std::chrono::duration<double>(limits.max_seconds));
  s->depth = prev_ ? prev_->depth : g_free_depth;
  g_state = s;
}

LimitScope::~LimitScope() {
  State* s = g_state;
  for (auto& w : s->namespaces)
    if (auto ns = w.lock()) {
      // Move the attributes out first: destroying them may release this very namespace.
      ValueDict attrs = std::move(ns->attrs);
      ns->attrs.items.clear();
    }
  g_state = prev_;
  delete s;
}

const RenderLimits& current_limits() { return g_state ? g_state->limits : kDefaults; }

void tick() {
  if (!g_state || (++g_state->steps & 1023) != 0) return;
  if (std::chrono::steady_clock::now() > g_state->deadline)
    throw TemplateLimitError(fmt::format("chat template rendering exceeded its time budget of {} s",
                                         g_state->limits.max_seconds));
}

void check_string_size(size_t bytes, const char* what) {
  const size_t max = current_limits().max_output_bytes;
  if (bytes > max)
    throw TemplateLimitError(fmt::format("chat template: {} would build a string of {} bytes (limit {} bytes)", what,
                                         bytes, max));
}

void check_list_size(size_t items, const char* what) {
  const size_t max = current_limits().max_list_items;
  if (items > max)
    throw TemplateLimitError(fmt::format("chat template: {} would build a list of {} items (limit {})", what, items, max));
}

void track_namespace(const std::shared_ptr<NamespaceObj>& ns) {
  if (g_state) g_state->namespaces.push_back(ns);
}

DepthGuard::DepthGuard(const char* what, int limit) {
  int& d = g_state ? g_state->depth : g_free_depth;
  const int max = limit > 0 ? limit : current_limits().max_depth;
  if (++d > max) {
    --d;
    throw TemplateLimitError(fmt::format("chat template: {} nested more than {} levels deep", what, max));
  }
}

DepthGuard::~DepthGuard() { --(g_state ? g_state->depth : g_free_depth); }

}  // namespace moefold::jinja
