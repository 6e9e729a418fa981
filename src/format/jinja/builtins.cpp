// Methods, tests and globals (see builtins.h), each mirroring the reference's runtime.ts:
// its argument checks, its JavaScript string functions (strip() ignores its argument, as
// trim() does), its return kinds.
#include "format/jinja/builtins.h"

#include <algorithm>
#include <cmath>

#include "core/error.h"
#include "format/jinja/js_number.h"
#include "format/jinja/js_text.h"
#include "format/utf8.h"

namespace sluice::jinja {

namespace {

// range() refuses lists longer than this instead of exhausting memory (the reference would
// try); chat templates count messages, not millions.
constexpr double kRangeLengthMax = 1e7;

Value string_function(const Value& s, std::string (*fn)(std::string_view)) {
  return Value::function([s, fn](std::vector<Value>&, const EnvPtr&) { return Value::string(fn(s.str())); });
}

std::string upper(std::string_view s) { return js_to_upper(s); }
std::string lower(std::string_view s) { return js_to_lower(s); }
std::string trim(std::string_view s) { return std::string(js_trim(s)); }
std::string trim_start(std::string_view s) { return std::string(js_trim_start(s)); }
std::string trim_end(std::string_view s) { return std::string(js_trim_end(s)); }
std::string title(std::string_view s) { return js_title(s); }
std::string capitalize(std::string_view s) { return js_capitalize(s); }

// startswith / endswith: a string or a list / tuple of strings.
Value affix_method(const Value& s, bool prefix) {
  return Value::function([s, prefix](std::vector<Value>& args, const EnvPtr&) {
    const char* name = prefix ? "startswith" : "endswith";
    if (args.empty()) eval_fail(name, "() requires an argument");
    const auto test = [&](const std::string& affix) {
      return prefix ? s.str().starts_with(affix) : s.str().ends_with(affix);
    };
    const Value& pattern = args[0];
    if (pattern.is_string()) return Value::boolean(test(pattern.str()));
    if (pattern.is_array()) {
      for (const Value& item : pattern.array()) {
        if (!item.is_string()) eval_fail(name, "(): the tuple's members must be strings");
        if (test(item.str())) return Value::boolean(true);
      }
      return Value::boolean(false);
    }
    eval_fail(name, "() takes a string or a tuple of strings, got ", a_kind(pattern.kind()));
  });
}

// Python's str.split(sep=None, maxsplit=-1), positional arguments only.
Value split_method(const Value& s) {
  return Value::function([s](std::vector<Value>& args, const EnvPtr&) {
    const Value sep = args.size() > 0 ? args[0] : Value::null();
    if (!sep.is_string() && !sep.is_null()) eval_fail("split(): the separator must be a string or none, got ", a_kind(sep.kind()));
    const Value maxsplit_value = args.size() > 1 ? args[1] : Value::integer(-1);
    if (!maxsplit_value.is(ValueKind::integer)) eval_fail("split(): maxsplit must be an integer");
    const double maxsplit = maxsplit_value.number();
    std::vector<std::string> parts;
    if (sep.is_null()) {
      // Runs of whitespace separate; none at the ends. With maxsplit, the rest stays whole.
      const std::string_view text = js_trim_start(s.str());
      for (size_t i = 0; i < text.size();) {
        if (size_t n = js_space_length(text, i)) {
          i += n;
          continue;
        }
        size_t end = i;
        while (end < text.size() && js_space_length(text, end) == 0) end += utf8_seq_len(static_cast<uint8_t>(text[end]));
        if (maxsplit != -1 && static_cast<double>(parts.size()) >= maxsplit) {
          parts.emplace_back(text.substr(i));
          break;
        }
        parts.emplace_back(text.substr(i, end - i));
        i = end;
      }
    } else {
      if (sep.str().empty()) eval_fail("split(): empty separator");
      parts = js_split(s.str(), sep.str());
      if (maxsplit != -1 && static_cast<double>(parts.size()) > maxsplit) {
        // result.push(result.splice(maxsplit).join(sep))
        const double n = static_cast<double>(parts.size());
        const size_t start = static_cast<size_t>(maxsplit < 0 ? std::max(n + maxsplit, 0.0) : std::min(maxsplit, n));
        std::string rest;
        for (size_t i = start; i < parts.size(); ++i) rest += (i > start ? sep.str() : "") + parts[i];
        parts.resize(start);
        parts.push_back(std::move(rest));
      }
    }
    Array out;
    for (std::string& p : parts) out.push_back(Value::string(std::move(p)));
    return Value::array(std::move(out));
  });
}

Value replace_method(const Value& s) {
  return Value::function([s](std::vector<Value>& args, const EnvPtr&) {
    if (args.size() < 2) eval_fail("replace() requires two arguments (old, new)");
    if (!args[0].is_string() || !args[1].is_string()) eval_fail("replace(): old and new must be strings");
    Value count = Value::null();
    if (args.size() > 2) {
      if (args[2].is(ValueKind::kwargs)) {
        const Value* c = args[2].dict().find("count");
        count = c ? *c : Value::null();
      } else {
        count = args[2];
      }
    }
    if (!count.is(ValueKind::integer) && !count.is_null()) eval_fail("replace(): count must be an integer or none");
    std::optional<double> n;
    if (!count.is_null()) n = count.number();
    return Value::string(js_replace(s.str(), args[0].str(), args[1].str(), n));
  });
}

Value dictsort_method(const Value& d) {
  return Value::function([d](std::vector<Value>& args, const EnvPtr&) {
    Dict kwargs;
    std::vector<Value> positional;
    for (const Value& a : args) {
      if (a.is(ValueKind::kwargs)) kwargs = a.dict();
      else positional.push_back(a);
    }
    const auto option = [&](size_t index, const char* name, Value fallback) {
      if (index < positional.size()) return positional[index];
      if (const Value* v = kwargs.find(name)) return *v;
      return fallback;
    };
    const Value case_sensitive = option(0, "case_sensitive", Value::boolean(false));
    if (!case_sensitive.is(ValueKind::boolean)) eval_fail("dictsort: case_sensitive must be a boolean");
    const Value by = option(1, "by", Value::string("key"));
    if (!by.is_string()) eval_fail("dictsort: by must be a string");
    if (by.str() != "key" && by.str() != "value") eval_fail("dictsort: by must be 'key' or 'value'");
    const Value reverse = option(2, "reverse", Value::boolean(false));
    if (!reverse.is(ValueKind::boolean)) eval_fail("dictsort: reverse must be a boolean");
    Array items = dict_items(d).array();
    const size_t index = by.str() == "key" ? 0 : 1;
    std::stable_sort(items.begin(), items.end(), [&](const Value& a, const Value& b) {
      const int r = compare_values(a.array()[index], b.array()[index], case_sensitive.boolean());
      return (reverse.boolean() ? -r : r) < 0;
    });
    return Value::array(std::move(items));
  });
}

bool test_boolean(const Value& v, const Value*) { return v.is(ValueKind::boolean); }
bool test_callable(const Value& v, const Value*) { return v.is(ValueKind::function); }
bool test_odd(const Value& v, const Value*) {
  if (!v.is(ValueKind::integer)) eval_fail("cannot test whether ", a_kind(v.kind()), " is odd");
  return std::fmod(v.number(), 2) != 0;
}
bool test_even(const Value& v, const Value*) {
  if (!v.is(ValueKind::integer)) eval_fail("cannot test whether ", a_kind(v.kind()), " is even");
  return std::fmod(v.number(), 2) == 0;
}
bool test_false(const Value& v, const Value*) { return v.is(ValueKind::boolean) && !v.boolean(); }
bool test_true(const Value& v, const Value*) { return v.is(ValueKind::boolean) && v.boolean(); }
bool test_none(const Value& v, const Value*) { return v.is_null(); }
bool test_string(const Value& v, const Value*) { return v.is_string(); }
bool test_number(const Value& v, const Value*) { return v.is_number(); }
bool test_integer(const Value& v, const Value*) { return v.is(ValueKind::integer); }
// The reference checks the exact type here: a tuple is not iterable, a dict neither.
bool test_iterable(const Value& v, const Value*) { return v.is(ValueKind::array) || v.is_string(); }
bool test_mapping(const Value& v, const Value*) { return v.is_object(); }
bool test_sequence(const Value& v, const Value*) { return v.is_array() || v.is_object() || v.is_string(); }
bool test_lower(const Value& v, const Value*) { return v.is_string() && v.str() == js_to_lower(v.str()); }
bool test_upper(const Value& v, const Value*) { return v.is_string() && v.str() == js_to_upper(v.str()); }
bool test_defined(const Value& v, const Value*) { return !v.is_undefined(); }
bool test_undefined(const Value& v, const Value*) { return v.is_undefined(); }
bool test_equal(const Value& v, const Value* other) {
  if (!other) eval_fail("the test eq / equalto needs a value to compare with (only selectattr can pass one)");
  return strict_equals(v, *other);
}

const char* const kMonthLong[] = {"January", "February", "March", "April", "May", "June",
                                  "July", "August", "September", "October", "November", "December"};
const char* const kMonthShort[] = {"Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec"};

std::string pad2(int n) { return n < 10 ? std::string("0").append(std::to_string(n)) : std::to_string(n); }

}  // namespace

Value string_member(const Value& s, const std::string& name) {
  if (name == "upper") return string_function(s, upper);
  if (name == "lower") return string_function(s, lower);
  if (name == "strip") return string_function(s, trim);
  if (name == "title") return string_function(s, title);
  if (name == "capitalize") return string_function(s, capitalize);
  if (name == "rstrip") return string_function(s, trim_end);
  if (name == "lstrip") return string_function(s, trim_start);
  if (name == "length") return Value::integer(static_cast<double>(utf16_length(s.str())));
  if (name == "startswith") return affix_method(s, true);
  if (name == "endswith") return affix_method(s, false);
  if (name == "split") return split_method(s);
  if (name == "replace") return replace_method(s);
  return Value();
}

Value array_member(const Value& a, const std::string& name) {
  if (name == "length") return Value::integer(static_cast<double>(a.array().size()));
  return Value();
}

Value dict_items(const Value& d) {
  Array out;
  for (const auto& [key, value] : d.dict().entries()) out.push_back(Value::array({Value::string(key), value}));
  return Value::array(std::move(out));
}

Value dict_keys(const Value& d) {
  Array out;
  for (const auto& entry : d.dict().entries()) out.push_back(Value::string(entry.first));
  return Value::array(std::move(out));
}

Value dict_values(const Value& d) {
  Array out;
  for (const auto& entry : d.dict().entries()) out.push_back(entry.second);
  return Value::array(std::move(out));
}

Value dict_method(const Value& d, const std::string& name) {
  if (name == "get") {
    return Value::function([d](std::vector<Value>& args, const EnvPtr&) {
      if (args.empty() || !args[0].is_string())
        eval_fail("get(): the key must be a string, got ", args.empty() ? std::string("nothing") : a_kind(args[0].kind()));
      if (const Value* v = d.dict().find(args[0].str())) return *v;
      return args.size() > 1 ? args[1] : Value::null();
    });
  }
  if (name == "items") return Value::function([d](std::vector<Value>&, const EnvPtr&) { return dict_items(d); });
  if (name == "keys") return Value::function([d](std::vector<Value>&, const EnvPtr&) { return dict_keys(d); });
  if (name == "values") return Value::function([d](std::vector<Value>&, const EnvPtr&) { return dict_values(d); });
  if (name == "dictsort") return dictsort_method(d);
  return Value();
}

TestFunction find_test(std::string_view name) {
  static const std::pair<std::string_view, TestFunction> tests[] = {
      {"boolean", test_boolean}, {"callable", test_callable}, {"odd", test_odd}, {"even", test_even},
      {"false", test_false}, {"true", test_true}, {"none", test_none}, {"string", test_string},
      {"number", test_number}, {"integer", test_integer}, {"iterable", test_iterable},
      {"mapping", test_mapping}, {"sequence", test_sequence}, {"lower", test_lower},
      {"upper", test_upper}, {"defined", test_defined}, {"undefined", test_undefined},
      {"equalto", test_equal}, {"eq", test_equal},
  };
  for (const auto& [n, fn] : tests)
    if (n == name) return fn;
  return nullptr;
}

Value range_function() {
  return Value::function([](std::vector<Value>& args, const EnvPtr&) {
    // range(stop) / range(start, stop[, step]), Python's, on JavaScript numbers.
    if (args.empty() || args.size() > 3) eval_fail("range() takes 1 to 3 numbers");
    for (const Value& a : args)
      if (!a.is_number()) eval_fail("range() takes numbers, got ", a_kind(a.kind()));
    double start = 0, stop = args[0].number(), step = 1;
    if (args.size() >= 2) start = args[0].number(), stop = args[1].number();
    if (args.size() == 3) step = args[2].number();
    if (step == 0) eval_fail("range() step must not be zero");
    const double length = std::ceil((stop - start) / step);
    if (length > kRangeLengthMax) eval_fail("range() of ", js_number_to_string(length), " numbers is too long");
    Array out;
    const auto push = [&](double i) { out.push_back(std::trunc(i) == i ? Value::integer(i) : Value::floating(i)); };
    if (step > 0)
      for (double i = start; i < stop; i += step) push(i);
    else
      for (double i = start; i > stop; i += step) push(i);
    return Value::array(std::move(out));
  });
}

Value raise_exception_function() {
  return Value::function([](std::vector<Value>& args, const EnvPtr&) -> Value {
    std::string message = args.empty() || args[0].is_undefined() ? std::string() : js_string(args[0]);
    std::string one_line;  // an error message is one line
    for (char c : message) {
      if (c == '\n') one_line += "\\n";
      else if (c != '\r') one_line += c;
    }
    eval_fail("raise_exception: " + one_line);
  });
}

Value strftime_now_function(std::function<std::string(std::string_view format)> strftime_now) {
  return Value::function([strftime_now](std::vector<Value>& args, const EnvPtr&) {
    if (args.empty() || !args[0].is_string()) eval_fail("strftime_now() takes a format string");
    return Value::string(strftime_now(args[0].str()));
  });
}

Value namespace_function(std::shared_ptr<std::vector<std::weak_ptr<Dict>>> created) {
  return Value::function([created](std::vector<Value>& args, const EnvPtr&) {
    std::vector<Value> positional = args;
    Dict kwargs;
    if (!positional.empty() && positional.back().is(ValueKind::kwargs)) {
      kwargs = positional.back().dict();
      positional.pop_back();
    }
    if (positional.size() > 1) eval_fail("namespace() takes at most 1 positional argument, got ", positional.size());
    auto entries = std::make_shared<Dict>();
    if (positional.size() == 1) {
      const Value& source = positional[0];
      if (source.is_object()) {
        for (const auto& [key, value] : source.dict().entries()) entries->set(key, value);
      } else if (source.is_array()) {
        for (const Value& pair : source.array()) {
          // [key, value] pairs; a two-character string counts as one too.
          std::vector<Value> kv;
          if (pair.is_array()) kv = pair.array();
          if (pair.is_string())
            for (std::string& c : code_points(pair.str())) kv.push_back(Value::string(std::move(c)));
          if (kv.size() != 2) eval_fail("namespace() takes a dict or a list of [key, value] pairs");
          if (!kv[0].is_string()) eval_fail("namespace(): keys must be strings");
          entries->set(kv[0].str(), kv[1]);
        }
      } else {
        eval_fail("namespace(): ", a_kind(source.kind()), " is not iterable");
      }
    }
    for (const auto& [key, value] : kwargs.entries()) entries->set(key, value);
    created->push_back(entries);
    return Value::dict(entries, ValueKind::ns);
  });
}

std::string js_strftime(const std::tm& time, std::string_view format) {
  std::string out;
  for (size_t i = 0; i < format.size(); ++i) {
    if (format[i] != '%' || i + 1 >= format.size()) {
      out += format[i];
      continue;
    }
    const char c = format[i + 1];
    switch (c) {
      case 'Y': out += std::to_string(time.tm_year + 1900); break;
      case 'm': out += pad2(time.tm_mon + 1); break;
      case 'd': out += pad2(time.tm_mday); break;
      case 'b': out += kMonthShort[time.tm_mon]; break;
      case 'B': out += kMonthLong[time.tm_mon]; break;
      case 'H': out += pad2(time.tm_hour); break;
      case 'M': out += pad2(time.tm_min); break;
      case '%': out += '%'; break;
      default: out += '%'; continue;  // not a token: the % stays, the next character is read as usual
    }
    ++i;
  }
  return out;
}

}  // namespace sluice::jinja
