// Budgets of one chat-template render. A template comes from a checkpoint and the values it walks come
// from requests, so neither may hang the renderer, exhaust memory or overflow the stack: every loop
// step, every string or list built and every level of recursion is counted against RenderLimits, and
// going over throws TemplateLimitError (the server answers 400; the CLI prints the message).
//
// The limits of a render are installed per thread by a LimitScope (Template::render opens one with the
// limits it is given); builtins and filters consult them through the functions below, so no signature
// in the interpreter has to carry them. Outside a scope the defaults apply.
#pragma once
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

#include "core/error.h"

namespace moefold::jinja {

struct NamespaceObj;

/// What one render may use. Defaults are far above what real chat templates need (they render a
/// long conversation in milliseconds, and nest values a few levels deep).
struct RenderLimits {
  double max_seconds = 2.0;                ///< wall time of the render
  size_t max_output_bytes = size_t(16) << 20;  ///< rendered text, and any one string built on the way
  size_t max_list_items = size_t(1) << 20;     ///< any one list built on the way (list * n, request data, ...)
  int64_t max_range = 100000;              ///< items of one range()
  int max_depth = 400;                     ///< nested evaluation: expressions, blocks and macro calls
  int max_value_depth = 128;               ///< nesting of lists/dicts, request data included
};

/// A render went over one of its RenderLimits. Derives from moefold::Error, so callers that map
/// Error to a client error keep doing so; callers that care can catch this type.
class TemplateLimitError : public Error {
 public:
  using Error::Error;
};

/// Installs `limits` for the renders on this thread until destroyed (scopes nest; the innermost wins).
/// Namespaces created under the scope are emptied when it ends, which breaks reference cycles a
/// template can build (`{% set ns.self = ns %}`).
class LimitScope {
 public:
  explicit LimitScope(const RenderLimits& limits);
  ~LimitScope();
  LimitScope(const LimitScope&) = delete;
  LimitScope& operator=(const LimitScope&) = delete;

  struct State;  ///< the scope's limits, deadline and counters (jinja_limits.cc)

 private:
  State* prev_;
};

/// The limits in force on this thread.
const RenderLimits& current_limits();
/// Counts one evaluation step; every 1024 steps checks the clock. Throws TemplateLimitError past
/// max_seconds.
void tick();
/// Throws TemplateLimitError if a string of `bytes` bytes (about to be built) exceeds max_output_bytes.
/// `what` names the operation in the message, e.g. "string repetition".
void check_string_size(size_t bytes, const char* what);
/// Same for a list of `items` elements against max_list_items.
void check_list_size(size_t items, const char* what);
/// Registers a namespace created by the template (emptied when the scope ends).
void track_namespace(const std::shared_ptr<NamespaceObj>& ns);

/// RAII: one level of nested evaluation; throws TemplateLimitError past max_depth (or `limit` when given).
class DepthGuard {
 public:
  explicit DepthGuard(const char* what, int limit = 0);
  ~DepthGuard();
  DepthGuard(const DepthGuard&) = delete;
  DepthGuard& operator=(const DepthGuard&) = delete;
};

}  // namespace moefold::jinja
