// Value semantics (see value.h): truthiness, printing, JSON, JavaScript's equalities and the
// reference's ordering.
#include "format/jinja/value.h"

#include <algorithm>
#include <cmath>

#include "core/error.h"
#include "format/jinja/js_number.h"
#include "format/jinja/js_text.h"
#include "format/utf8.h"

namespace sluice::jinja {

namespace {

// Nesting deeper than any real data; a namespace made to contain itself gets here.
constexpr int kJsonDepthMax = 256;

// The JavaScript type of a value's payload, for the equality algorithms.
enum class JsType { undefined, null, boolean, number, string, object };

JsType js_type(const Value& v) {
  switch (v.kind()) {
    case ValueKind::undefined: return JsType::undefined;
    case ValueKind::null: return JsType::null;
    case ValueKind::boolean: return JsType::boolean;
    case ValueKind::integer: case ValueKind::floating: return JsType::number;
    case ValueKind::string: return JsType::string;
    default: return JsType::object;
  }
}

// A primitive in IsLooselyEqual: a number or a string (booleans become numbers first,
// objects their ToPrimitive string).
struct Primitive {
  bool is_number;
  double number;
  std::string text;
};

bool loose_equals_primitive(const Primitive& a, const Primitive& b) {
  if (a.is_number && b.is_number) return a.number == b.number;
  if (!a.is_number && !b.is_number) return a.text == b.text;
  const double x = a.is_number ? a.number : js_string_to_number(a.text);
  const double y = b.is_number ? b.number : js_string_to_number(b.text);
  return x == y;
}

// ToPrimitive of an object payload: Array.prototype.toString for lists, "[object Map]" for
// dicts; nullopt for a function (its JavaScript source text, which never equals a value).
std::optional<std::string> to_primitive(const Value& v) {
  if (v.is_array()) return js_string(v);
  if (v.is(ValueKind::function)) return std::nullopt;
  return std::string("[object Map]");
}

std::string repeat(std::string_view s, size_t n) {
  std::string out;
  out.reserve(s.size() * n);
  for (size_t i = 0; i < n; ++i) out += s;
  return out;
}

// ICU root collation's order of printable ASCII (what localeCompare gives in node), letters
// paired: one primary weight per character, case only on a tie.
constexpr std::string_view kAsciiCollation =
    "\t\n\v\f\r _-,;:!?.'\"()[]{}@*/\\&#%`^+<=>|~$0123456789aAbBcCdDeEfFgGhHiIjJkKlLmMnNoOpPqQrRsStTuUvVwWxXyYzZ";

struct CollationKey {
  std::vector<uint32_t> primary;
  std::vector<uint8_t> tertiary;
};

CollationKey collation_key(std::string_view s) {
  CollationKey key;
  for (size_t i = 0; i < s.size();) {
    const auto b = static_cast<uint8_t>(s[i]);
    if (b < 0x80) {
      const size_t at = kAsciiCollation.find(static_cast<char>(b));
      ++i;
      if (at == std::string_view::npos) continue;  // other control characters are ignorable
      const bool letter = std::isalpha(b);
      const size_t first_letter = kAsciiCollation.find('a');
      key.primary.push_back(static_cast<uint32_t>(letter ? first_letter + (at - first_letter) / 2 : at));
      key.tertiary.push_back(letter && std::isupper(b) ? 1 : 0);
      continue;
    }
    size_t len = 0;
    const uint32_t cp = utf8_decode(s, i, &len);
    key.primary.push_back(0x10000 + cp);
    key.tertiary.push_back(0);
    i += len;
  }
  return key;
}

}  // namespace

const char* value_kind_name(ValueKind kind) {
  switch (kind) {
    case ValueKind::undefined: return "undefined";
    case ValueKind::null: return "none";
    case ValueKind::boolean: return "boolean";
    case ValueKind::integer: return "integer";
    case ValueKind::floating: return "float";
    case ValueKind::string: return "string";
    case ValueKind::array: return "list";
    case ValueKind::tuple: return "tuple";
    case ValueKind::object: return "dict";
    case ValueKind::kwargs: return "keyword arguments";
    case ValueKind::ns: return "namespace";
    case ValueKind::function: return "function";
  }
  return "?";
}

std::string a_kind(ValueKind kind) {
  if (kind == ValueKind::undefined || kind == ValueKind::null) return value_kind_name(kind);
  const std::string name = value_kind_name(kind);
  return (name[0] == 'i' ? "an " : "a ") + name;
}

const Value* Dict::find(std::string_view key) const {
  const auto it = index_.find(key);
  return it == index_.end() ? nullptr : &entries_[it->second].second;
}

void Dict::set(const std::string& key, Value value) {
  const auto [it, inserted] = index_.try_emplace(key, entries_.size());
  if (inserted) entries_.emplace_back(key, std::move(value));
  else entries_[it->second].second = std::move(value);
}

void Dict::clear() {
  entries_.clear();
  index_.clear();
}

bool Value::same_object(const Value& other) const {
  if (kind_ != other.kind_) return false;
  return ref_ == other.ref_;  // the shared_ptrs compare by address
}

bool truthy(const Value& v) {
  switch (v.kind()) {
    case ValueKind::undefined: case ValueKind::null: return false;
    case ValueKind::boolean: return v.boolean();
    case ValueKind::integer: case ValueKind::floating: return v.number() != 0 && !std::isnan(v.number());
    case ValueKind::string: return !v.str().empty();
    case ValueKind::array: case ValueKind::tuple: return !v.array().empty();
    case ValueKind::object: case ValueKind::kwargs: return !v.dict().empty();
    case ValueKind::ns: case ValueKind::function: return true;
  }
  return false;
}

bool js_truthy(const Value& v) {
  if (js_type(v) == JsType::object) return true;
  return truthy(v);
}

std::string display(const Value& v) {
  switch (v.kind()) {
    case ValueKind::undefined: return "undefined";
    case ValueKind::null: return "null";
    case ValueKind::boolean: return v.boolean() ? "true" : "false";
    case ValueKind::integer: return js_number_to_string(v.number());
    case ValueKind::floating: return js_float_to_string(v.number());
    case ValueKind::string: return v.str();
    case ValueKind::function: eval_fail("cannot print a function (a macro or method that was not called?)");
    default: return to_json(v, {}, false);
  }
}

std::string js_string(const Value& v) {
  switch (v.kind()) {
    case ValueKind::integer: case ValueKind::floating: return js_number_to_string(v.number());
    case ValueKind::array: case ValueKind::tuple: {
      std::string out;
      bool first = true;
      for (const Value& item : v.array()) {
        if (!first) out += ',';
        first = false;
        out += display(item);
      }
      return out;
    }
    case ValueKind::object: case ValueKind::kwargs: case ValueKind::ns: return "[object Map]";
    case ValueKind::function: eval_fail("cannot turn a function into a string (a macro or method that was not called?)");
    default: return display(v);
  }
}

std::string to_json(const Value& v, const JsonOptions& options, bool undefined_as_null, int depth) {
  if (depth > kJsonDepthMax) eval_fail("cannot convert to JSON: nested too deeply (a namespace that contains itself?)");
  switch (v.kind()) {
    case ValueKind::null: return "null";
    case ValueKind::undefined: return undefined_as_null ? "null" : "undefined";
    case ValueKind::boolean: return v.boolean() ? "true" : "false";
    case ValueKind::integer: case ValueKind::floating:
      return std::isfinite(v.number()) ? js_number_to_string(v.number()) : "null";
    case ValueKind::string: return json_quote(v.str(), options.ensure_ascii);
    case ValueKind::array: case ValueKind::object: case ValueKind::ns: break;
    default: eval_fail("cannot convert ", a_kind(v.kind()), " to JSON");
  }
  const double indent = options.indent.value_or(0);
  if (indent < 0 || indent > 1000) eval_fail("tojson: indent ", js_number_to_string(indent), " is out of range");
  std::string item_separator = ", ", key_separator = ": ";
  if (options.separators) {
    item_separator = options.separators->first;
    key_separator = options.separators->second;
  } else if (indent != 0) {
    item_separator = ",";  // Python's json.dumps with an indent: no space before the newline
  }
  const std::string indent_text(static_cast<size_t>(indent), ' ');
  const std::string base_padding = std::string("\n").append(repeat(indent_text, static_cast<size_t>(depth)));
  const std::string child_padding = base_padding + indent_text;
  std::vector<std::string> parts;
  if (v.is(ValueKind::array)) {
    for (const Value& item : v.array()) parts.push_back(to_json(item, options, undefined_as_null, depth + 1));
    if (indent == 0 || parts.empty()) {
      std::string out = "[";
      for (size_t i = 0; i < parts.size(); ++i) out += (i ? item_separator : "") + parts[i];
      return out + "]";
    }
    std::string out = "[" + child_padding;
    for (size_t i = 0; i < parts.size(); ++i) out += (i ? item_separator + child_padding : "") + parts[i];
    return out + base_padding + "]";
  }
  std::vector<const std::pair<std::string, Value>*> entries;
  for (const auto& e : v.dict().entries()) entries.push_back(&e);
  if (options.sort_keys)
    std::stable_sort(entries.begin(), entries.end(),
                     [](const auto* a, const auto* b) { return locale_compare(a->first, b->first) < 0; });
  for (const auto* e : entries) {
    std::string part = json_quote(e->first, options.ensure_ascii) + key_separator +
                       to_json(e->second, options, undefined_as_null, depth + 1);
    parts.push_back(indent != 0 ? child_padding + part : part);
  }
  std::string out = "{";
  for (size_t i = 0; i < parts.size(); ++i) out += (i ? item_separator : "") + parts[i];
  if (indent != 0 && !parts.empty()) out += base_padding;
  return out + "}";
}

bool loose_equals(const Value& a, const Value& b) {
  const JsType ta = js_type(a), tb = js_type(b);
  if (ta == tb) return strict_equals(a, b);
  const auto nullish = [](JsType t) { return t == JsType::undefined || t == JsType::null; };
  if (nullish(ta) || nullish(tb)) return nullish(ta) && nullish(tb);
  // Booleans become numbers, objects their primitive string; then number / string compare.
  const auto primitive = [](const Value& v, JsType t) -> std::optional<Primitive> {
    if (t == JsType::boolean || t == JsType::number) return Primitive{true, v.number(), {}};
    if (t == JsType::string) return Primitive{false, 0, v.str()};
    const auto text = to_primitive(v);
    if (!text) return std::nullopt;
    return Primitive{false, 0, *text};
  };
  if (ta == JsType::object && tb == JsType::object) return a.same_object(b);
  const auto pa = primitive(a, ta), pb = primitive(b, tb);
  if (!pa || !pb) return false;
  return loose_equals_primitive(*pa, *pb);
}

bool strict_equals(const Value& a, const Value& b) {
  const JsType ta = js_type(a), tb = js_type(b);
  if (ta != tb) return false;
  switch (ta) {
    case JsType::undefined: case JsType::null: return true;
    case JsType::boolean: case JsType::number: return a.number() == b.number();
    case JsType::string: return a.str() == b.str();
    case JsType::object: return a.same_object(b);
  }
  return false;
}

bool same_value_zero(const Value& a, const Value& b) {
  if (js_type(a) == JsType::number && js_type(b) == JsType::number && std::isnan(a.number()) && std::isnan(b.number()))
    return true;
  return strict_equals(a, b);
}

int compare_values(const Value& a, const Value& b, bool case_sensitive) {
  if (a.is_null() && b.is_null()) return 0;
  if (a.is_null() || b.is_null())
    eval_fail("cannot compare ", value_kind_name(a.kind()), " with ", value_kind_name(b.kind()));
  if (a.is_undefined() && b.is_undefined()) return 0;
  if (a.is_undefined() || b.is_undefined())
    eval_fail("cannot compare ", value_kind_name(a.kind()), " with ", value_kind_name(b.kind()));
  const auto numeric = [](const Value& v) { return v.is_number() || v.is(ValueKind::boolean); };
  if (numeric(a) && numeric(b)) return a.number() < b.number() ? -1 : (a.number() > b.number() ? 1 : 0);
  if (a.kind() != b.kind())
    eval_fail("cannot compare different types: ", value_kind_name(a.kind()), " and ", value_kind_name(b.kind()));
  if (!a.is_string()) eval_fail("cannot compare values of type ", value_kind_name(a.kind()));
  if (case_sensitive) return utf16_compare(a.str(), b.str());
  return utf16_compare(js_to_lower(a.str()), js_to_lower(b.str()));
}

int locale_compare(std::string_view a, std::string_view b) {
  const CollationKey ka = collation_key(a), kb = collation_key(b);
  if (ka.primary != kb.primary) return ka.primary < kb.primary ? -1 : 1;
  if (ka.tertiary != kb.tertiary) return ka.tertiary < kb.tertiary ? -1 : 1;
  return 0;
}

}  // namespace sluice::jinja
