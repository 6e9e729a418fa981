// Filters (`x | name` and `x | name(args)`), as the reference's applyFilter dispatches them:
// first the filters of any value (safe, tojson, and in call form join, int, float, default),
// then by the operand's kind. A filter the reference does not know for that kind is an error
// naming both.
#include <algorithm>
#include <cmath>

#include "core/error.h"
#include "format/jinja/builtins.h"
#include "format/jinja/interpreter.h"
#include "format/jinja/js_number.h"
#include "format/jinja/js_text.h"

namespace sluice::jinja {

namespace {

// A member of a list as Array.prototype.join writes it: none and undefined as "", the rest
// by JavaScript's ToString.
std::string join_piece(const Value& v) {
  if (v.is_null() || v.is_undefined()) return {};
  return js_string(v);
}

std::string join_list(const Value& list, std::string_view separator) {
  std::string out;
  bool first = true;
  for (const Value& item : list.array()) {
    if (!first) out += separator;
    first = false;
    out += join_piece(item);
  }
  return out;
}

// "a.b.0": keys of dicts and namespaces, integer indexes of lists; undefined as soon as a
// step does not exist (the reference's getAttributeValue).
Value attribute_value(const Value& item, const std::string& path) {
  Value v = item;
  size_t start = 0;
  while (true) {
    const size_t dot = path.find('.', start);
    const std::string part = path.substr(start, dot == std::string::npos ? std::string::npos : dot - start);
    if (v.is_attribute_container()) {
      const Value* found = v.dict().find(part);
      v = found ? *found : Value();
    } else if (v.is_array()) {
      const double index = js_parse_int(part);
      if (std::isnan(index) || index < 0 || index >= static_cast<double>(v.array().size())) return Value();
      v = v.array()[static_cast<size_t>(index)];
    } else {
      return Value();
    }
    if (dot == std::string::npos) return v;
    start = dot + 1;
  }
}

std::string indent_lines(std::string_view text, const std::string& indent, bool first, bool blank) {
  const std::vector<std::string> lines = js_split(text, "\n");
  std::string out;
  for (size_t i = 0; i < lines.size(); ++i) {
    if (i > 0) out += '\n';
    const bool skip = (!first && i == 0) || (!blank && lines[i].empty());
    if (!skip) out += indent;
    out += lines[i];
  }
  return out;
}

// The argument at `index`, else the keyword `name`, else `fallback` (args[i] ?? kwargs.get(name) ?? fallback).
Value argument(const std::vector<Value>& args, size_t index, const Dict& kwargs, const char* name, Value fallback) {
  if (index < args.size()) return args[index];
  if (name)
    if (const Value* v = kwargs.find(name)) return *v;
  return fallback;
}

[[noreturn]] void unknown_filter(const std::string& name, const Value& operand) {
  eval_fail("unknown filter '", name, "' for ", a_kind(operand.kind()));
}

}  // namespace

Value Interpreter::apply_filter(const Value& operand, const Node& filter, const EnvPtr& env) {
  if (filter.kind == NodeKind::identifier) return apply_plain_filter(operand, as<TextNode>(filter).text);
  if (filter.kind == NodeKind::call) {
    const auto& call = as<Call>(filter);
    if (call.callee->kind != NodeKind::identifier) eval_fail("unknown filter: ", node_kind_name(call.callee->kind));
    return apply_call_filter(operand, call, as<TextNode>(*call.callee).text, env);
  }
  eval_fail("unknown filter: ", node_kind_name(filter.kind));
}

Value Interpreter::apply_plain_filter(const Value& operand, const std::string& name) {
  if (name == "safe") return operand;
  if (name == "tojson") return Value::string(to_json(operand, {}));
  if (operand.is_array()) {
    const Array& items = operand.array();
    if (name == "list") return operand;
    if (name == "first" || name == "last") {
      // The reference hands back JavaScript's undefined here, which fails wherever it is used.
      if (items.empty()) eval_fail("'", name, "' of an empty list");
      return name == "first" ? items.front() : items.back();
    }
    if (name == "length") return Value::integer(static_cast<double>(items.size()));
    if (name == "reverse") return Value::array(Array(items.rbegin(), items.rend()));
    if (name == "sort") {
      Array sorted = items;
      std::stable_sort(sorted.begin(), sorted.end(),
                       [](const Value& a, const Value& b) { return compare_values(a, b, false) < 0; });
      return Value::array(std::move(sorted));
    }
    if (name == "join") return Value::string(join_list(operand, ""));
    if (name == "string") return Value::string(to_json(operand, {}, false));
    if (name == "unique") {
      Array out;
      for (const Value& item : items) {
        bool seen = false;
        for (const Value& o : out) seen = seen || same_value_zero(o, item);
        if (!seen) out.push_back(item);
      }
      return Value::array(std::move(out));
    }
    unknown_filter(name, operand);
  }
  if (operand.is_string()) {
    const std::string& s = operand.str();
    if (name == "length") return Value::integer(static_cast<double>(utf16_length(s)));
    if (name == "upper") return Value::string(js_to_upper(s));
    if (name == "lower") return Value::string(js_to_lower(s));
    if (name == "title") return Value::string(js_title(s));
    if (name == "capitalize") return Value::string(js_capitalize(s));
    if (name == "trim") return Value::string(std::string(js_trim(s)));
    if (name == "indent") return Value::string(indent_lines(s, "    ", false, false));
    if (name == "join" || name == "string") return operand;
    if (name == "int") {
      const double v = js_parse_int(s);
      return Value::integer(std::isnan(v) ? 0 : v);
    }
    if (name == "float") {
      const double v = js_parse_float(s);
      return Value::floating(std::isnan(v) ? 0 : v);
    }
    unknown_filter(name, operand);
  }
  if (operand.is_number()) {
    if (name == "abs") return operand.is(ValueKind::integer) ? Value::integer(std::abs(operand.number())) : Value::floating(std::abs(operand.number()));
    if (name == "int") return Value::integer(std::floor(operand.number()));  // floor, as the reference
    if (name == "float") return Value::floating(operand.number());
    if (name == "string") return Value::string(display(operand));
    unknown_filter(name, operand);
  }
  if (operand.is_object()) {
    if (name == "items") return dict_items(operand);
    if (name == "length") return Value::integer(static_cast<double>(operand.dict().size()));
    const Value method = dict_method(operand, name);  // keys, values, dictsort, ...
    if (method.is(ValueKind::function)) {
      std::vector<Value> no_args;
      return method.function()(no_args, nullptr);
    }
    unknown_filter(name, operand);
  }
  if (operand.is(ValueKind::boolean)) {
    if (name == "bool") return operand;
    if (name == "int") return Value::integer(operand.boolean() ? 1 : 0);
    if (name == "float") return Value::floating(operand.boolean() ? 1 : 0);
    if (name == "string") return Value::string(operand.boolean() ? "true" : "false");
    unknown_filter(name, operand);
  }
  eval_fail("cannot apply the filter '", name, "' to ", a_kind(operand.kind()));
}

Value Interpreter::apply_call_filter(const Value& operand, const Call& call, const std::string& name, const EnvPtr& env) {
  if (name == "tojson") return filter_tojson(operand, evaluate_arguments(call.args, env).second);
  if (name == "join") {
    if (!operand.is_string() && !operand.is_array()) eval_fail("cannot apply the filter 'join' to ", a_kind(operand.kind()));
    const auto [args, kwargs] = evaluate_arguments(call.args, env);
    const Value separator = argument(args, 0, kwargs, "separator", Value::string(""));
    if (!separator.is_string()) eval_fail("join: the separator must be a string");
    if (operand.is_array()) return Value::string(join_list(operand, separator.str()));
    std::string out;
    bool first = true;
    for (const std::string& c : code_points(operand.str())) {
      if (!first) out += separator.str();
      first = false;
      out += c;
    }
    return Value::string(std::move(out));
  }
  if (name == "int" || name == "float") {
    const bool is_int = name == "int";
    const auto [args, kwargs] = evaluate_arguments(call.args, env);
    const Value fallback = argument(args, 0, kwargs, "default", is_int ? Value::integer(0) : Value::floating(0));
    if (operand.is_string()) {
      const double v = is_int ? js_parse_int(operand.str()) : js_parse_float(operand.str());
      if (std::isnan(v)) return fallback;
      return is_int ? Value::integer(v) : Value::floating(v);
    }
    if (operand.is_number()) return operand;
    if (operand.is(ValueKind::boolean)) return is_int ? Value::integer(operand.boolean()) : Value::floating(operand.boolean());
    eval_fail("cannot apply the filter '", name, "' to ", a_kind(operand.kind()));
  }
  if (name == "default") {
    const auto [args, kwargs] = evaluate_arguments(call.args, env);
    const Value fallback = args.size() > 0 ? args[0] : Value::string("");
    const Value boolean = argument(args, 1, kwargs, "boolean", Value::boolean(false));
    if (!boolean.is(ValueKind::boolean)) eval_fail("default: the second argument (boolean) must be a boolean");
    if (operand.is_undefined() || (boolean.boolean() && !truthy(operand))) return fallback;
    return operand;
  }
  if (operand.is_array()) {
    if (name == "sort") {
      auto [args, kwargs] = evaluate_arguments(call.args, env);
      return filter_sort(operand, std::move(args), kwargs);
    }
    if (name == "selectattr" || name == "rejectattr") return filter_select_attribute(operand, call, name == "selectattr", env);
    if (name == "map") {
      const Dict kwargs = evaluate_arguments(call.args, env).second;
      const Value* attribute = kwargs.find("attribute");
      if (!attribute) eval_fail("map: only map(attribute=...) is supported");
      if (!attribute->is_string()) eval_fail("map: attribute must be a string");
      const Value* fallback = kwargs.find("default");
      Array out;
      for (const Value& item : operand.array()) {
        if (!item.is_attribute_container()) eval_fail("map(attribute=...): the list holds ", a_kind(item.kind()), ", not a dict");
        Value v = attribute_value(item, attribute->str());
        if (v.is_undefined() && fallback) v = *fallback;
        out.push_back(std::move(v));
      }
      return Value::array(std::move(out));
    }
    unknown_filter(name, operand);
  }
  if (operand.is_string()) {
    if (name == "indent") {
      const auto [args, kwargs] = evaluate_arguments(call.args, env);
      const Value width = argument(args, 0, kwargs, "width", Value::integer(4));
      if (!width.is(ValueKind::integer)) eval_fail("indent: width must be an integer");
      if (width.number() < 0 || width.number() > 1000) eval_fail("indent: width ", js_number_to_string(width.number()), " is out of range");
      const bool first = js_truthy(argument(args, 1, kwargs, "first", Value::boolean(false)));
      const bool blank = js_truthy(argument(args, 2, kwargs, "blank", Value::boolean(false)));
      return Value::string(indent_lines(operand.str(), std::string(static_cast<size_t>(width.number()), ' '), first, blank));
    }
    if (name == "replace") {
      auto [args, kwargs] = evaluate_arguments(call.args, env);
      args.push_back(Value::dict(std::move(kwargs), ValueKind::kwargs));
      return string_member(operand, "replace").function()(args, env);
    }
    unknown_filter(name, operand);
  }
  if (operand.is_object()) {
    const Value method = dict_method(operand, name);
    if (!method.is(ValueKind::function)) unknown_filter(name, operand);
    auto [args, kwargs] = evaluate_arguments(call.args, env);
    if (!kwargs.empty()) args.push_back(Value::dict(std::move(kwargs), ValueKind::kwargs));
    return method.function()(args, env);
  }
  eval_fail("cannot apply the filter '", name, "' to ", a_kind(operand.kind()));
}

Value Interpreter::filter_sort(const Value& operand, std::vector<Value> args, const Dict& kwargs) {
  const Value reverse = argument(args, 0, kwargs, "reverse", Value::boolean(false));
  if (!reverse.is(ValueKind::boolean)) eval_fail("sort: reverse must be a boolean");
  const Value case_sensitive = argument(args, 1, kwargs, "case_sensitive", Value::boolean(false));
  if (!case_sensitive.is(ValueKind::boolean)) eval_fail("sort: case_sensitive must be a boolean");
  const Value attribute = argument(args, 2, kwargs, "attribute", Value::null());
  if (!attribute.is_string() && !attribute.is(ValueKind::integer) && !attribute.is_null())
    eval_fail("sort: attribute must be a string, an integer or none");
  const auto key = [&](const Value& item) {
    if (attribute.is_null()) return item;
    return attribute_value(item, attribute.is_string() ? attribute.str() : js_number_to_string(attribute.number()));
  };
  Array sorted = operand.array();
  std::stable_sort(sorted.begin(), sorted.end(), [&](const Value& a, const Value& b) {
    const int r = compare_values(key(a), key(b), case_sensitive.boolean());
    return (reverse.boolean() ? -r : r) < 0;
  });
  return Value::array(std::move(sorted));
}

Value Interpreter::filter_select_attribute(const Value& operand, const Call& call, bool select, const EnvPtr& env) {
  const char* name = select ? "selectattr" : "rejectattr";
  for (const Value& item : operand.array())
    if (!item.is_attribute_container()) eval_fail(name, " can only be applied to a list of dicts, not to one holding ", a_kind(item.kind()));
  for (const NodePtr& a : call.args)
    if (a->kind != NodeKind::string_literal) eval_fail("the arguments of ", name, " must be string literals");
  std::vector<Value> args;
  for (const NodePtr& a : call.args) args.push_back(evaluate(a.get(), env));
  TestFunction test = nullptr;
  if (args.size() > 1) {
    test = find_test(args[1].str());
    if (!test) eval_fail(name, ": unknown test '", args[1].str(), "'");
  }
  const Value* test_argument = args.size() > 2 ? &args[2] : nullptr;
  Array out;
  for (const Value& item : operand.array()) {
    if (args.empty()) eval_fail(name, " needs the name of an attribute");
    const Value* v = item.dict().find(args[0].str());
    const bool result = v ? (test ? test(*v, test_argument) : truthy(*v)) : false;
    if (result == select) out.push_back(item);
  }
  return Value::array(std::move(out));
}

Value Interpreter::filter_tojson(const Value& operand, const Dict& kwargs) {
  JsonOptions options;
  if (const Value* indent = kwargs.find("indent")) {
    if (!indent->is(ValueKind::integer) && !indent->is_null()) eval_fail("tojson: indent must be an integer or none");
    if (indent->is(ValueKind::integer)) options.indent = indent->number();
  }
  if (const Value* ascii = kwargs.find("ensure_ascii")) {
    if (!ascii->is(ValueKind::boolean)) eval_fail("tojson: ensure_ascii must be a boolean");
    options.ensure_ascii = ascii->boolean();
  }
  if (const Value* sort = kwargs.find("sort_keys")) {
    if (!sort->is(ValueKind::boolean)) eval_fail("tojson: sort_keys must be a boolean");
    options.sort_keys = sort->boolean();
  }
  if (const Value* separators = kwargs.find("separators")) {
    if (separators->is_array()) {
      const Array& s = separators->array();
      if (s.size() != 2 || !s[0].is_string() || !s[1].is_string()) eval_fail("tojson: separators must be a pair of strings");
      options.separators = std::make_pair(s[0].str(), s[1].str());
    } else if (!separators->is_null()) {
      eval_fail("tojson: separators must be a pair of strings");
    }
  }
  return Value::string(to_json(operand, options));
}

}  // namespace sluice::jinja
