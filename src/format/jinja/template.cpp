// Template: lexer, parser and interpreter put together (see template.h), the globals every
// render starts with, and the conversion of JSON variables.
#include "format/jinja/template.h"

#include <algorithm>
#include <cmath>
#include <ctime>

#include "core/error.h"
#include "format/jinja/builtins.h"
#include "format/jinja/interpreter.h"
#include "format/jinja/lexer.h"
#include "format/jinja/parser.h"
#include "format/utf8.h"

namespace sluice::jinja {

namespace {

// A canonical array index ("0", "42", below 2^32 - 1), which JavaScript objects order first.
std::optional<uint64_t> array_index(const std::string& key) {
  if (key.empty() || key.size() > 10 || (key.size() > 1 && key[0] == '0')) return std::nullopt;
  uint64_t v = 0;
  for (char c : key) {
    if (c < '0' || c > '9') return std::nullopt;
    v = v * 10 + static_cast<uint64_t>(c - '0');
  }
  if (v >= 4294967295ULL) return std::nullopt;
  return v;
}

template <typename Json>
Value from_json(const Json& j, std::string_view what, int depth) {
  // nlohmann's parser nests this deep only for hostile input; the interpreter would not cope.
  if (depth > 256) fail(Status::invalid_argument, "template variable '", what, "' nests too deeply");
  switch (j.type()) {
    case nlohmann::json::value_t::null: return Value::null();
    case nlohmann::json::value_t::boolean: return Value::boolean(j.template get<bool>());
    case nlohmann::json::value_t::number_integer: return Value::integer(static_cast<double>(j.template get<int64_t>()));
    case nlohmann::json::value_t::number_unsigned: return Value::integer(static_cast<double>(j.template get<uint64_t>()));
    case nlohmann::json::value_t::number_float: {
      const double x = j.template get<double>();
      return std::isfinite(x) && std::trunc(x) == x ? Value::integer(x) : Value::floating(x);
    }
    case nlohmann::json::value_t::string: {
      const std::string& s = j.template get_ref<const std::string&>();
      if (const auto bad = utf8_find_invalid(s))
        fail(Status::invalid_argument, "template variable '", what, "': a string is not valid UTF-8 (", bad->reason,
             " at byte ", bad->offset, ")");
      return Value::string(s);
    }
    case nlohmann::json::value_t::array: {
      Array items;
      for (const auto& item : j) items.push_back(from_json(item, what, depth + 1));
      return Value::array(std::move(items));
    }
    case nlohmann::json::value_t::object: {
      std::vector<std::pair<uint64_t, const std::string*>> indexes;
      for (auto it = j.begin(); it != j.end(); ++it)
        if (const auto index = array_index(it.key())) indexes.emplace_back(*index, &it.key());
      std::sort(indexes.begin(), indexes.end());
      Dict d;
      for (const auto& [index, key] : indexes) d.set(*key, from_json(j.at(*key), what, depth + 1));
      for (auto it = j.begin(); it != j.end(); ++it)
        if (!array_index(it.key())) d.set(it.key(), from_json(it.value(), what, depth + 1));
      return Value::dict(std::move(d));
    }
    default:
      fail(Status::invalid_argument, "template variable '", what, "' holds a value that is not JSON (binary?)");
  }
}

std::string local_strftime(std::string_view format) {
  const std::time_t now = std::time(nullptr);
  std::tm local{};
  localtime_r(&now, &local);
  return js_strftime(local, format);
}

// Empties every namespace of a render when it ends: one holding itself (or a caller that
// holds its scope) would otherwise keep itself alive.
struct NamespaceSweep {
  std::shared_ptr<std::vector<std::weak_ptr<Dict>>> created = std::make_shared<std::vector<std::weak_ptr<Dict>>>();
  ~NamespaceSweep() {
    for (const auto& weak : *created)
      if (const auto ns = weak.lock()) ns->clear();
  }
};

}  // namespace

Template Template::parse(std::string_view source) {
  Template t;
  t.program_ = jinja::parse(tokenize(source));
  return t;
}

std::string Template::render(const Variables& variables, const RenderOptions& options) const {
  SLUICE_CHECK(program_, Status::invalid_argument, "render of a template that was never parsed");
  NamespaceSweep sweep;
  Interpreter interpreter(namespace_function(sweep.created));
  const auto global = std::make_shared<Env>();
  global->set("false", Value::boolean(false));
  global->set("true", Value::boolean(true));
  global->set("none", Value::null());
  global->set("raise_exception", raise_exception_function());
  global->set("range", range_function());
  global->set("strftime_now", strftime_now_function(options.strftime_now ? options.strftime_now : local_strftime));
  global->set("True", Value::boolean(true));
  global->set("False", Value::boolean(false));
  global->set("None", Value::null());
  for (const auto& [name, value] : variables) {
    if (name == "namespace" || global->has_own(name))
      fail(Status::invalid_argument, "template variable '", name, "' is already declared (a global, or given twice)");
    global->set(name, value);
  }
  return interpreter.run(*program_, global);
}

Value value_from_json(const nlohmann::json& j, std::string_view what) { return from_json(j, what, 0); }
Value value_from_json(const nlohmann::ordered_json& j, std::string_view what) { return from_json(j, what, 0); }

}  // namespace sluice::jinja
