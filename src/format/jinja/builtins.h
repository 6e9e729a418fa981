// What the reference provides besides operators and filters: the methods and properties of
// strings, lists and dicts (s.upper(), s.split(','), d.items(), s.length), the tests of
// `is` (defined, string, odd, ...), and the globals (range, namespace, raise_exception,
// strftime_now).
#pragma once

#include <ctime>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "format/jinja/value.h"

namespace sluice::jinja {

// The attribute `name` of a string / list (builtins only) and the builtin methods of a dict
// (get, items, keys, values, dictsort: read only when the dict has no such key); undefined
// when there is none.
Value string_member(const Value& s, const std::string& name);
Value array_member(const Value& a, const std::string& name);
Value dict_method(const Value& d, const std::string& name);

// d.items(), d.keys(), d.values(): new lists.
Value dict_items(const Value& d);
Value dict_keys(const Value& d);
Value dict_values(const Value& d);

// A test of `x is name`; `argument` is the second value selectattr passes (null when none).
using TestFunction = bool (*)(const Value& operand, const Value* argument);
TestFunction find_test(std::string_view name);

// The globals of every render.
Value range_function();
Value raise_exception_function();
Value strftime_now_function(std::function<std::string(std::string_view format)> strftime_now);
// namespace(...): each namespace created is also recorded in `created` so that the render can
// empty them at its end (a namespace holding itself would otherwise never be freed).
Value namespace_function(std::shared_ptr<std::vector<std::weak_ptr<Dict>>> created);

// The reference's strftime: %Y %m %d %b %B %H %M and %% (English month names); any other
// %x is kept as written.
std::string js_strftime(const std::tm& time, std::string_view format);

}  // namespace sluice::jinja
