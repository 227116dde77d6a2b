// Chat templates: renders a model's own Jinja chat template (as shipped in tokenizer_config.json
// or chat_template.jinja) the way Hugging Face transformers' apply_chat_template does, so the
// prompt string matches transformers byte for byte. See docs/chat_templates.md.
#pragma once

#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>

#include "text/jinja_template.h"

namespace moefold {

/// A model's chat template(s) plus the special tokens the template may reference.
///
/// JSON arguments are nlohmann::ordered_json because key order is observable: templates print
/// tool specs and tool-call arguments with `tojson`, and transformers keeps the caller's order.
class ChatTemplate {
 public:
  using Json = nlohmann::ordered_json;

  /// Loads the template(s) of a Hugging Face model directory, with transformers' precedence:
  /// `chat_template.jinja` and `additional_chat_templates/*.jinja` files win over the
  /// `chat_template` entry of tokenizer_config.json, which may be a string or a list of
  /// {name, template}. Special tokens (bos_token, eos_token, unk_token, sep_token, pad_token,
  /// cls_token, mask_token; strings or AddedToken objects) come from tokenizer_config.json.
  /// Throws moefold::Error if no template is found or a template does not parse.
  static ChatTemplate from_model_dir(const std::string& dir);

  /// Builds a chat template from template source. `special_tokens` is an object of extra
  /// template variables (e.g. {"bos_token": "<s>"}).
  static ChatTemplate from_string(const std::string& source, const Json& special_tokens = Json::object());

  /// Renders a conversation.
  ///  - messages: array of {role, content, ...}; content may be a string or a list of parts,
  ///    assistant messages may carry tool_calls / reasoning_content, tool results use role "tool".
  ///  - tools: array of OpenAI-style function specs, or null for none (the template then sees
  ///    `tools` = None, as with transformers).
  ///  - add_generation_prompt: append the assistant turn header.
  ///  - kwargs: object of extra template variables (enable_thinking, preserve_thinking, ...);
  ///    they override special tokens of the same name.
  /// With several named templates, "tool_use" is used when tools are given, else "default".
  /// Throws moefold::Error naming the template line for template errors (incl. raise_exception), and
  /// jinja::TemplateLimitError when rendering goes over limits() (see set_limits).
  std::string render(const Json& messages, const Json& tools, bool add_generation_prompt,
                     const Json& kwargs = Json::object()) const;

  /// Convenience overload for nlohmann::json arguments. nlohmann::json sorts object keys, so
  /// `tojson` output (tool specs, tool-call arguments) follows alphabetical key order rather
  /// than the caller's; prefer the ordered_json overload when byte-exactness with transformers
  /// matters.
  std::string render(const nlohmann::json& messages, const nlohmann::json& tools, bool add_generation_prompt,
                     const nlohmann::json& kwargs) const;

  /// Same, choosing a named template explicitly.
  std::string render_named(const std::string& name, const Json& messages, const Json& tools,
                           bool add_generation_prompt, const Json& kwargs = Json::object()) const;

  /// Template source by name ("default" for the single or default template), or nullptr.
  const std::string* source(const std::string& name = "default") const;
  /// Special-token variables passed to every render.
  const Json& special_tokens() const { return special_tokens_; }

  /// Budgets of every render (time, output size, list sizes, nesting of templates and request data);
  /// going over one throws jinja::TemplateLimitError, a moefold::Error whose message starts with
  /// "chat template:" and names the limit (the server answers 400).
  void set_limits(const jinja::RenderLimits& limits) { limits_ = limits; }
  const jinja::RenderLimits& limits() const { return limits_; }

 private:
  struct Entry {
    std::string source;
    std::shared_ptr<const jinja::Template> compiled;
  };
  void add(const std::string& name, const std::string& source);
  const Entry& pick(const Json& tools) const;
  std::string render_entry(const Entry& e, const Json& messages, const Json& tools, bool add_generation_prompt,
                           const Json& kwargs) const;

  std::map<std::string, Entry> templates_;
  Json special_tokens_ = Json::object();
  jinja::RenderLimits limits_;
};

}  // namespace moefold
