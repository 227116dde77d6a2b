// Iterative nesting-depth walk (contract: json_depth.h).
#include "server/json_depth.h"

#include <utility>
#include <vector>

namespace moefold::server {

int json_depth(const nlohmann::ordered_json& v, int stop_above) {
  if (!v.is_structured()) return 0;
  int deepest = 0;
  std::vector<std::pair<const nlohmann::ordered_json*, int>> todo{{&v, 1}};  // containers only
  while (!todo.empty()) {
    const auto [node, depth] = todo.back();
    todo.pop_back();
    if (depth > deepest) deepest = depth;
    if (deepest > stop_above) return deepest;
    for (const auto& child : *node)  // array elements or object values
      if (child.is_structured()) todo.emplace_back(&child, depth + 1);
  }
  return deepest;
}

}  // namespace moefold::server
