// ChatTemplate and load_chat_template (see chat_template.h).
#include "format/chat_template.h"

#include "core/error.h"
#include "format/file_io.h"
#include "format/json_file.h"

namespace sluice {

namespace {

// A chat template or tokenizer_config.json is a few KB; 16 MiB is far beyond any.
constexpr uint64_t kTemplateFileMax = uint64_t{16} << 20;

// The variables render() sets itself; extra may not set them again.
constexpr const char* kRenderVariables[] = {"messages", "add_generation_prompt", "bos_token", "eos_token"};

template <typename Json>
void add_extra(const Json& extra, const char* field, jinja::Variables& vars) {
  SLUICE_CHECK(extra.is_object(), Status::invalid_argument, "ChatRenderOptions::", field, " must be a JSON object, not ", extra.type_name());
  for (auto it = extra.begin(); it != extra.end(); ++it) {
    for (const char* reserved : kRenderVariables)
      SLUICE_CHECK(it.key() != reserved, Status::invalid_argument, "ChatRenderOptions::", field, ": '", it.key(),
                   "' is set by render itself (pass it as the argument or option)");
    vars.emplace_back(it.key(), jinja::value_from_json(it.value(), it.key()));
  }
}

// bos_token / eos_token: a string, {"content": "..."} (an AddedToken), or absent / null.
std::string token_text(const nlohmann::json& config, const char* name, const std::filesystem::path& path) {
  const auto it = config.find(name);
  if (it == config.end() || it->is_null()) return {};
  if (it->is_string()) return it->get<std::string>();
  if (it->is_object() && it->contains("content") && (*it)["content"].is_string()) return (*it)["content"].get<std::string>();
  fail(Status::corrupt, path.string(), ": ", name, " must be a string or {\"content\": \"...\"}, not ", it->type_name());
}

// tokenizer_config.json's chat_template: nullopt when absent or null.
std::optional<std::string> config_template(const nlohmann::json& config, const std::filesystem::path& path) {
  const auto it = config.find("chat_template");
  if (it == config.end() || it->is_null()) return std::nullopt;
  if (it->is_string()) return it->get<std::string>();
  if (it->is_array()) {
    // [{"name": "default", "template": "..."}, {"name": "tool_use", ...}]: the default one.
    std::string names;
    for (const auto& entry : *it) {
      SLUICE_CHECK(entry.is_object() && entry.contains("name") && entry["name"].is_string() && entry.contains("template") &&
                       entry["template"].is_string(),
                   Status::corrupt, path.string(), ": chat_template: each entry of the list must be {\"name\": ..., \"template\": ...}");
      if (entry["name"] == "default") return entry["template"].get<std::string>();
      names += (names.empty() ? "" : ", ") + entry["name"].get<std::string>();
    }
    fail(Status::corrupt, path.string(), ": chat_template: the list has no template named \"default\" (it has: ", names, ")");
  }
  fail(Status::corrupt, path.string(), ": chat_template must be a string or a list of {name, template}, not ", it->type_name());
}

}  // namespace

ChatTemplate ChatTemplate::parse(std::string source) {
  ChatTemplate t;
  try {
    t.template_ = jinja::Template::parse(source);
  } catch (const Error& e) {
    fail(e.status(), "chat template: ", e.what());
  }
  t.source_ = std::move(source);
  return t;
}

std::string ChatTemplate::render_value(jinja::Value messages, const ChatRenderOptions& options) const {
  jinja::Variables vars;
  vars.emplace_back("messages", std::move(messages));
  vars.emplace_back("add_generation_prompt", jinja::Value::boolean(options.add_generation_prompt));
  vars.emplace_back("bos_token", jinja::value_from_json(nlohmann::json(options.bos_token), "bos_token"));
  vars.emplace_back("eos_token", jinja::value_from_json(nlohmann::json(options.eos_token), "eos_token"));
  add_extra(options.extra, "extra", vars);
  add_extra(options.extra_ordered, "extra_ordered", vars);
  jinja::RenderOptions render_options;
  if (options.date_text) {
    const std::string date = *options.date_text;
    render_options.strftime_now = [date](std::string_view) { return date; };
  }
  try {
    return template_.render(vars, render_options);
  } catch (const Error& e) {
    fail(e.status(), "chat template: ", e.what());
  }
}

std::string ChatTemplate::render(std::span<const ChatTurn> messages, const ChatRenderOptions& options) const {
  nlohmann::ordered_json list = nlohmann::ordered_json::array();
  for (const ChatTurn& turn : messages) list.push_back({{"role", turn.role}, {"content", turn.content}});
  return render_json(list, options);
}

std::string ChatTemplate::render_json(const nlohmann::json& messages, const ChatRenderOptions& options) const {
  SLUICE_CHECK(messages.is_array(), Status::invalid_argument, "chat messages must be a JSON array, not ", messages.type_name());
  return render_value(jinja::value_from_json(messages, "messages"), options);
}

std::string ChatTemplate::render_json(const nlohmann::ordered_json& messages, const ChatRenderOptions& options) const {
  SLUICE_CHECK(messages.is_array(), Status::invalid_argument, "chat messages must be a JSON array, not ", messages.type_name());
  return render_value(jinja::value_from_json(messages, "messages"), options);
}

std::optional<ModelChatTemplate> load_chat_template(const std::filesystem::path& dir) {
  const std::filesystem::path config_path = dir / "tokenizer_config.json";
  const std::filesystem::path jinja_path = dir / "chat_template.jinja";
  std::optional<std::string> source;
  std::filesystem::path source_path;
  std::string bos, eos;
  std::error_code ec;  // a directory we may not read shows as no file; the read names the problem
  if (std::filesystem::exists(config_path, ec)) {
    const nlohmann::json config = read_json_file(config_path);
    SLUICE_CHECK(config.is_object(), Status::corrupt, config_path.string(), ": expected a JSON object, got ", config.type_name());
    source = config_template(config, config_path);
    source_path = config_path;
    bos = token_text(config, "bos_token", config_path);
    eos = token_text(config, "eos_token", config_path);
  }
  if (!source && std::filesystem::exists(jinja_path, ec)) {
    source = read_file_bytes(jinja_path, kTemplateFileMax, "chat template");
    source_path = jinja_path;
  }
  if (!source) return std::nullopt;
  try {
    return ModelChatTemplate{ChatTemplate::parse(std::move(*source)), std::move(bos), std::move(eos)};
  } catch (const Error& e) {
    // "DIR/tokenizer_config.json: chat template: line 3: reason"
    fail(Status::corrupt, source_path.string(), ": ", e.what());
  }
}

}  // namespace sluice
