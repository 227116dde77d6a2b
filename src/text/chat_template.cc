#include "text/chat_template.h"

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <vector>

#include "core/error.h"

namespace moefold {
namespace fs = std::filesystem;

namespace {

std::string read_file(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  if (!in) fail("cannot open {}", p.string());
  std::ostringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

/// The special-token attributes transformers passes to every chat template render.
constexpr const char* kSpecialTokenNames[] = {"bos_token", "eos_token", "unk_token", "sep_token",
                                              "pad_token", "cls_token", "mask_token"};

}  // namespace

void ChatTemplate::add(const std::string& name, const std::string& source) {
  try {
    templates_[name] = Entry{source, std::make_shared<const jinja::Template>(source)};
  } catch (const Error& e) {
    fail("chat template '{}': {}", name, e.what());
  }
}

ChatTemplate ChatTemplate::from_string(const std::string& source, const Json& special_tokens) {
  ChatTemplate t;
  t.add("default", source);
  if (!special_tokens.is_object()) fail("chat template special tokens must be a JSON object");
  t.special_tokens_ = special_tokens;
  return t;
}

ChatTemplate ChatTemplate::from_model_dir(const std::string& dir) {
  ChatTemplate t;
  fs::path root(dir);
  Json config = Json::object();
  fs::path config_path = root / "tokenizer_config.json";
  if (fs::exists(config_path)) {
    try {
      config = Json::parse(read_file(config_path));
    } catch (const Json::exception& e) {
      fail("{}: invalid JSON: {}", config_path.string(), e.what());
    }
  }
  for (const char* name : kSpecialTokenNames) {
    auto it = config.find(name);
    if (it == config.end() || it->is_null()) continue;
    if (it->is_string()) t.special_tokens_[name] = *it;
    else if (it->is_object() && it->contains("content") && (*it)["content"].is_string())
      t.special_tokens_[name] = (*it)["content"];
  }

  // Template files take priority over tokenizer_config.json entries (transformers' rule).
  fs::path file = root / "chat_template.jinja";
  if (fs::exists(file)) t.add("default", read_file(file));
  fs::path extra_dir = root / "additional_chat_templates";
  if (fs::is_directory(extra_dir)) {
    std::vector<fs::path> files;
    for (const auto& e : fs::directory_iterator(extra_dir))
      if (e.is_regular_file() && e.path().extension() == ".jinja") files.push_back(e.path());
    std::sort(files.begin(), files.end());
    for (const auto& f : files) t.add(f.stem().string(), read_file(f));
  }
  if (t.templates_.empty()) {
    auto it = config.find("chat_template");
    if (it != config.end() && it->is_string()) {
      t.add("default", it->get<std::string>());
    } else if (it != config.end() && it->is_array()) {
      for (const auto& entry : *it) {
        if (!entry.is_object() || !entry.contains("name") || !entry.contains("template") ||
            !entry["name"].is_string() || !entry["template"].is_string())
          fail("{}: chat_template list entries must be {{\"name\", \"template\"}} objects", config_path.string());
        t.add(entry["name"].get<std::string>(), entry["template"].get<std::string>());
      }
    }
  }
  if (t.templates_.empty()) fail("no chat template found in {}", dir);
  return t;
}

const std::string* ChatTemplate::source(const std::string& name) const {
  auto it = templates_.find(name);
  return it == templates_.end() ? nullptr : &it->second.source;
}

const ChatTemplate::Entry& ChatTemplate::pick(const Json& tools) const {
  if (templates_.size() == 1) return templates_.begin()->second;
  if (!tools.is_null()) {
    auto it = templates_.find("tool_use");
    if (it != templates_.end()) return it->second;
  }
  auto it = templates_.find("default");
  if (it == templates_.end()) fail("this model has several chat templates and none is named 'default'");
  return it->second;
}

std::string ChatTemplate::render(const Json& messages, const Json& tools, bool add_generation_prompt,
                                 const Json& kwargs) const {
  return render_entry(pick(tools), messages, tools, add_generation_prompt, kwargs);
}

std::string ChatTemplate::render(const nlohmann::json& messages, const nlohmann::json& tools,
                                 bool add_generation_prompt, const nlohmann::json& kwargs) const {
  return render(Json(messages), Json(tools), add_generation_prompt, Json(kwargs));
}

std::string ChatTemplate::render_named(const std::string& name, const Json& messages, const Json& tools,
                                       bool add_generation_prompt, const Json& kwargs) const {
  auto it = templates_.find(name);
  if (it == templates_.end()) fail("no chat template named '{}'", name);
  return render_entry(it->second, messages, tools, add_generation_prompt, kwargs);
}

std::string ChatTemplate::render_entry(const Entry& e, const Json& messages, const Json& tools,
                                       bool add_generation_prompt, const Json& kwargs) const {
  using jinja::Value;
  if (!messages.is_array()) fail("chat messages must be a JSON array");
  if (!tools.is_null() && !tools.is_array()) fail("chat tools must be a JSON array or null");
  if (!kwargs.is_null() && !kwargs.is_object()) fail("chat template kwargs must be a JSON object");
  jinja::LimitScope scope(limits_);  // request data is converted under the same limits as the render
  jinja::ValueDict ctx;
  // Same variables, in the same precedence, as transformers' apply_chat_template.
  for (auto it = special_tokens_.begin(); it != special_tokens_.end(); ++it) ctx.set(it.key(), Value::from_json(it.value()));
  if (kwargs.is_object())
    for (auto it = kwargs.begin(); it != kwargs.end(); ++it) ctx.set(it.key(), Value::from_json(it.value()));
  ctx.set("messages", Value::from_json(messages));
  ctx.set("tools", Value::from_json(tools));
  ctx.set("documents", Value::none());
  ctx.set("add_generation_prompt", Value(add_generation_prompt));
  try {
    return e.compiled->render(ctx, limits_);
  } catch (const jinja::TemplateLimitError& err) {
    if (std::strncmp(err.what(), "chat template", 13) == 0) throw;
    throw jinja::TemplateLimitError(fmt::format("chat template: {}", err.what()));
  } catch (const Error& err) {
    fail("chat template: {}", err.what());
  }
}

}  // namespace moefold
