// Runtime values of the interpreter, one kind per @huggingface/jinja RuntimeValue class:
// numbers are doubles (integer and float kinds both), strings are shared immutable UTF-8,
// lists and dicts are shared so that identity (what JavaScript's == compares for objects) is
// kept, and dicts keep insertion order. A namespace is the one mutable container.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <variant>
#include <vector>

#include "core/error.h"

namespace sluice::jinja {

enum class ValueKind : uint8_t {
  undefined,  // UndefinedValue: a missing variable, key or attribute
  null,       // NullValue: none
  boolean,
  integer,    // IntegerValue (a double holding an integral value, as in JavaScript)
  floating,   // FloatValue
  string,
  array,      // ArrayValue: a list
  tuple,      // TupleValue: (a, b) literals; an array that tojson and `is iterable` refuse
  object,     // ObjectValue: a dict (JSON objects, dict literals, loop, kwargs of a macro)
  kwargs,     // KeywordArgumentsValue: the keyword arguments of a call, passed last
  ns,         // NamespaceValue: namespace(...), whose attributes `set` may change
  function,   // FunctionValue: a macro, caller, builtin or method
};

// A short name of the kind for messages ("string", "list", "none", ...).
const char* value_kind_name(ValueKind kind);
// The same with an article, for messages: "a string", "an integer", "none", "undefined".
std::string a_kind(ValueKind kind);

class Value;
class Env;
using EnvPtr = std::shared_ptr<Env>;
using Array = std::vector<Value>;

// Insertion-ordered string-keyed map (JavaScript Map semantics: setting an existing key keeps
// its position).
class Dict {
 public:
  const Value* find(std::string_view key) const;
  void set(const std::string& key, Value value);
  size_t size() const { return entries_.size(); }
  bool empty() const { return entries_.empty(); }
  void clear();
  const std::vector<std::pair<std::string, Value>>& entries() const { return entries_; }

 private:
  // Looked up by string_view without a copy of the key (C++20 heterogeneous lookup).
  struct KeyHash {
    using is_transparent = void;
    size_t operator()(std::string_view s) const { return std::hash<std::string_view>{}(s); }
  };
  std::vector<std::pair<std::string, Value>> entries_;
  std::unordered_map<std::string, size_t, KeyHash, std::equal_to<>> index_;
};

// A callable: `args` holds the positional arguments, then (when the call had any) one value
// of kind kwargs with the keyword arguments, as the reference passes them. `scope` is the
// caller's environment (macros see the variables of the place they are called from).
using Function = std::function<Value(std::vector<Value>& args, const EnvPtr& scope)>;

class Value {
 public:
  Value() = default;  // undefined
  static Value null() { return Value(ValueKind::null); }
  static Value boolean(bool b) {
    Value v(ValueKind::boolean);
    v.number_ = b ? 1 : 0;
    return v;
  }
  static Value integer(double x) {
    Value v(ValueKind::integer);
    v.number_ = x;
    return v;
  }
  static Value floating(double x) {
    Value v(ValueKind::floating);
    v.number_ = x;
    return v;
  }
  static Value string(std::string s) {
    Value v(ValueKind::string);
    v.ref_ = std::make_shared<const std::string>(std::move(s));
    return v;
  }
  static Value array(Array items, ValueKind kind = ValueKind::array) {
    Value v(kind);
    v.ref_ = std::make_shared<const Array>(std::move(items));
    return v;
  }
  static Value dict(Dict d, ValueKind kind = ValueKind::object) {
    return dict(std::make_shared<Dict>(std::move(d)), kind);
  }
  static Value dict(std::shared_ptr<Dict> d, ValueKind kind) {
    Value v(kind);
    v.ref_ = std::move(d);
    return v;
  }
  static Value function(Function f) {
    Value v(ValueKind::function);
    v.ref_ = std::make_shared<const Function>(std::move(f));
    return v;
  }

  ValueKind kind() const { return kind_; }
  bool is(ValueKind k) const { return kind_ == k; }
  bool is_undefined() const { return kind_ == ValueKind::undefined; }
  bool is_null() const { return kind_ == ValueKind::null; }
  bool is_number() const { return kind_ == ValueKind::integer || kind_ == ValueKind::floating; }
  bool is_string() const { return kind_ == ValueKind::string; }
  // instanceof ArrayValue: a list or a tuple.
  bool is_array() const { return kind_ == ValueKind::array || kind_ == ValueKind::tuple; }
  // instanceof ObjectValue: a dict or keyword arguments (not a namespace).
  bool is_object() const { return kind_ == ValueKind::object || kind_ == ValueKind::kwargs; }
  // What attribute access reads keys of: dicts, keyword arguments and namespaces.
  bool is_attribute_container() const { return is_object() || kind_ == ValueKind::ns; }

  bool boolean() const { return number_ != 0; }
  double number() const { return number_; }
  const std::string& str() const { return *std::get<std::shared_ptr<const std::string>>(ref_); }
  const Array& array() const { return *std::get<std::shared_ptr<const Array>>(ref_); }
  Dict& dict() const { return *std::get<std::shared_ptr<Dict>>(ref_); }
  const std::shared_ptr<Dict>& dict_ptr() const { return std::get<std::shared_ptr<Dict>>(ref_); }
  const Function& function() const { return *std::get<std::shared_ptr<const Function>>(ref_); }

  // The same list, dict or function object (JavaScript's === on objects).
  bool same_object(const Value& other) const;

 private:
  explicit Value(ValueKind k) : kind_(k) {}

  ValueKind kind_ = ValueKind::undefined;
  double number_ = 0;  // booleans as 0 / 1, numbers
  std::variant<std::monostate, std::shared_ptr<const std::string>, std::shared_ptr<const Array>,
               std::shared_ptr<Dict>, std::shared_ptr<const Function>>
      ref_;
};

// An error inside evaluation: the interpreter adds the template line of the innermost node
// it was evaluating and throws it on as sluice::Error.
struct EvalError {
  std::string reason;
};
// Throws EvalError with the parts concatenated. Kept out of line (and cold) so that the
// message's string stream is not part of every evaluation frame: the interpreter recurses,
// and its frames decide how deep a template may nest.
template <typename... Args>
[[noreturn, gnu::noinline, gnu::cold]] void eval_fail(Args&&... parts) {
  throw EvalError{str(std::forward<Args>(parts)...)};
}

// __bool__: Python's truthiness as the reference defines it (empty lists and dicts are false;
// a namespace is always true).
bool truthy(const Value& v);
// !!value of the JavaScript payload: lists and dicts are always true.
bool js_truthy(const Value& v);

// toString() of the RuntimeValue: what {{ v }} prints (floats as 1.0, lists and dicts as
// JSON with "undefined" for undefined members). Functions cannot be printed.
std::string display(const Value& v);
// v.value.toString(), JavaScript's coercion of the payload: what `+` and `~` join (floats as
// 1, lists as their members' display joined with ",", dicts as "[object Map]").
std::string js_string(const Value& v);

struct JsonOptions {
  std::optional<double> indent;  // spaces per level; 0 or none: one line
  bool ensure_ascii = false;
  bool sort_keys = false;        // by localeCompare
  std::optional<std::pair<std::string, std::string>> separators;  // item, key
};
// The reference's toJSON: tojson's output, and (undefined_as_null false) how lists and
// dicts print.
std::string to_json(const Value& v, const JsonOptions& options, bool undefined_as_null = true, int depth = 0);

// JavaScript's == on the payloads (1 == true, "1" == 1, null == undefined, objects by
// identity, ["a"] == "a") and === (strict: same type and value, objects by identity).
bool loose_equals(const Value& a, const Value& b);
bool strict_equals(const Value& a, const Value& b);
// SameValueZero, the equality of JavaScript's Set (NaN equals NaN): the unique filter.
bool same_value_zero(const Value& a, const Value& b);

// compareRuntimeValues: numbers and booleans with each other, strings (lowered unless
// case_sensitive) in UTF-16 order, none with none, undefined with undefined; anything else
// is an error. -1, 0 or 1.
int compare_values(const Value& a, const Value& b, bool case_sensitive);

// String.prototype.localeCompare with the default (ICU root) collation, for ASCII keys:
// punctuation, then digits, then letters case-insensitively, lower case first on a tie.
// Non-ASCII characters sort after ASCII by code point (an approximation of ICU).
int locale_compare(std::string_view a, std::string_view b);

}  // namespace sluice::jinja
