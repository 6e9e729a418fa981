// The interpreter's statements and expressions (see interpreter.h); filters are in
// filters.cpp. Each evaluate_* mirrors the reference's method of the same node, including
// what it lets through (`undefined.x` is undefined) and what it refuses (`'a' < 'b'`).
#include "format/jinja/interpreter.h"

#include <cmath>

#include "core/error.h"
#include "format/jinja/builtins.h"
#include "format/jinja/js_text.h"

namespace sluice::jinja {

namespace {

// Nested evaluations (expression depth plus macro recursion) beyond which a render stops:
// far above real templates, well inside an 8 MiB stack.
constexpr int kEvalDepthMax = 1000;

// {% break %} / {% continue %}: unwound to the nearest loop, through macro calls too (as the
// reference's exceptions are).
struct LoopBreak {
  int line;
};
struct LoopContinue {
  int line;
};

// The Error of a failed construct: "line N: reason". Out of line, as eval_fail (value.h).
[[noreturn, gnu::noinline, gnu::cold]] void fail_at(int line, const std::string& reason) {
  fail(Status::invalid_argument, "line ", line, ": ", reason);
}

bool numeric_like(const Value& v) { return v.is_number() || v.is(ValueKind::boolean); }

// Python-style slicing of n items (the reference's utils.slice): the indexes taken.
std::vector<size_t> slice_indexes(size_t size, const Value& start_v, const Value& stop_v, const Value& step_v) {
  const double n = static_cast<double>(size);
  const double step = step_v.is_undefined() ? 1 : step_v.number();
  const double direction = std::isnan(step) ? NAN : (step > 0 ? 1 : (step < 0 ? -1 : 0));
  double start, stop;
  if (direction >= 0) {
    start = start_v.is_undefined() ? 0 : start_v.number();
    start = start < 0 ? std::max(n + start, 0.0) : std::min(start, n);
    stop = stop_v.is_undefined() ? n : stop_v.number();
    stop = stop < 0 ? std::max(n + stop, 0.0) : std::min(stop, n);
  } else {
    start = start_v.is_undefined() ? n - 1 : start_v.number();
    start = start < 0 ? std::max(n + start, -1.0) : std::min(start, n - 1);
    stop = stop_v.is_undefined() ? -1 : stop_v.number();
    stop = stop < -1 ? std::max(n + stop, -1.0) : std::min(stop, n - 1);
  }
  std::vector<size_t> out;
  for (double i = start; direction * i < direction * stop; i += step) out.push_back(static_cast<size_t>(i));
  return out;
}

// What a callee is called in messages: its name when it has one.
std::string describe_callee(const Node& callee) {
  if (callee.kind == NodeKind::identifier) return "'" + as<TextNode>(callee).text + "'";
  if (callee.kind == NodeKind::member && !as<Member>(callee).computed &&
      as<Member>(callee).property->kind == NodeKind::identifier)
    return "'." + as<TextNode>(*as<Member>(callee).property).text + "'";
  return "the expression";
}

}  // namespace

Value Env::lookup(const std::string& name) const {
  for (const Env* e = this; e; e = e->parent_.get()) {
    const auto it = e->vars_.find(name);
    if (it != e->vars_.end()) return it->second;
  }
  return Value();
}

std::string Interpreter::run(const Program& program, const EnvPtr& global) {
  try {
    return evaluate_block(program.body, global);
  } catch (const LoopBreak& b) {
    fail_at(b.line, "{% break %} outside a loop");
  } catch (const LoopContinue& c) {
    fail_at(c.line, "{% continue %} outside a loop");
  } catch (const EvalError& e) {
    fail(Status::invalid_argument, e.reason);
  }
}

Value Interpreter::evaluate(const Node* node, const EnvPtr& env) {
  if (!node) return Value();
  struct DepthGuard {
    explicit DepthGuard(int& d) : depth(d) { ++depth; }
    ~DepthGuard() { --depth; }
    int& depth;
  } guard(depth_);
  try {
    if (depth_ > kEvalDepthMax) eval_fail("the template nests or recurses too deeply");
    return evaluate_node(*node, env);
  } catch (const EvalError& e) {
    fail_at(node->line, e.reason);
  }
}

std::string Interpreter::evaluate_block(const NodeList& statements, const EnvPtr& env) {
  std::string out;
  for (const NodePtr& statement : statements) {
    const Value v = evaluate(statement.get(), env);
    if (v.is_null() || v.is_undefined()) continue;
    try {
      if (v.is_string()) out += v.str();
      else out += display(v);
    } catch (const EvalError& e) {
      fail_at(statement->line, e.reason);
    }
  }
  return out;
}

Value Interpreter::evaluate_node(const Node& node, const EnvPtr& env) {
  switch (node.kind) {
    case NodeKind::program: return Value::string(evaluate_block(as<Program>(node).body, env));
    case NodeKind::set_statement: return evaluate_set(as<Set>(node), env);
    case NodeKind::if_statement: {
      const auto& n = as<If>(node);
      return Value::string(evaluate_block(truthy(evaluate(n.test.get(), env)) ? n.body : n.alternate, env));
    }
    case NodeKind::for_statement: return evaluate_for(as<For>(node), env);
    case NodeKind::macro: return evaluate_macro(as<Macro>(node), env);
    case NodeKind::call_statement: return evaluate_call_statement(as<CallStatement>(node), env);
    case NodeKind::filter_statement: {
      const auto& n = as<FilterStatement>(node);
      return apply_filter(Value::string(evaluate_block(n.body, env)), *n.filter, env);
    }
    case NodeKind::break_statement: throw LoopBreak{node.line};
    case NodeKind::continue_statement: throw LoopContinue{node.line};
    case NodeKind::comment: return Value::null();
    case NodeKind::integer_literal: return Value::integer(as<NumberLiteral>(node).value);
    case NodeKind::float_literal: return Value::floating(as<NumberLiteral>(node).value);
    case NodeKind::string_literal: return Value::string(as<TextNode>(node).text);
    case NodeKind::array_literal: case NodeKind::tuple_literal: {
      Array items;
      for (const NodePtr& item : as<ListLiteral>(node).items) items.push_back(evaluate(item.get(), env));
      return Value::array(std::move(items), node.kind == NodeKind::tuple_literal ? ValueKind::tuple : ValueKind::array);
    }
    case NodeKind::object_literal: return evaluate_object_literal(as<ObjectLiteral>(node), env);
    case NodeKind::identifier: {
      const std::string& name = as<TextNode>(node).text;
      if (name == "namespace" && !env->has_own(name)) return namespace_builtin_;
      return env->lookup(name);
    }
    case NodeKind::call: return evaluate_call(as<Call>(node), env);
    case NodeKind::member: return evaluate_member(as<Member>(node), env);
    case NodeKind::unary: return evaluate_unary(as<Unary>(node), env);
    case NodeKind::binary: return evaluate_binary(as<Binary>(node), env);
    case NodeKind::filter: {
      const auto& n = as<Filter>(node);
      return apply_filter(evaluate(n.operand.get(), env), *n.filter, env);
    }
    case NodeKind::test: return evaluate_test(as<Test>(node), env);
    case NodeKind::select: {
      const auto& n = as<Select>(node);
      if (!truthy(evaluate(n.test.get(), env))) return Value();
      return evaluate(n.lhs.get(), env);
    }
    case NodeKind::ternary: {
      const auto& n = as<Ternary>(node);
      return truthy(evaluate(n.condition.get(), env)) ? evaluate(n.if_true.get(), env) : evaluate(n.if_false.get(), env);
    }
    case NodeKind::slice: case NodeKind::keyword_argument: case NodeKind::spread: case NodeKind::keyword_spread:
      break;
  }
  eval_fail("unexpected ", node_kind_name(node.kind), " here");
}

Value Interpreter::evaluate_object_literal(const ObjectLiteral& node, const EnvPtr& env) {
  Dict d;
  for (const auto& [key_node, value_node] : node.entries) {
    const Value key = evaluate(key_node.get(), env);
    if (!key.is_string()) eval_fail("dict keys must be strings, got ", a_kind(key.kind()));
    d.set(key.str(), evaluate(value_node.get(), env));
  }
  return Value::dict(std::move(d));
}

Value Interpreter::evaluate_binary(const Binary& node, const EnvPtr& env) {
  const std::string& op = node.op;
  const Value left = evaluate(node.left.get(), env);
  if (op == "and") return truthy(left) ? evaluate(node.right.get(), env) : left;
  if (op == "or") return truthy(left) ? left : evaluate(node.right.get(), env);
  const Value right = evaluate(node.right.get(), env);
  if (op == "==") return Value::boolean(loose_equals(left, right));
  if (op == "!=") return Value::boolean(!loose_equals(left, right));
  const bool membership = op == "in" || op == "not in";
  if (left.is_undefined() || right.is_undefined()) {
    // `x in undefined` is false (and `not in` true); everything else on undefined fails.
    if (right.is_undefined() && membership) return Value::boolean(op == "not in");
    eval_fail("cannot apply '", op, "' to an undefined value (", left.is_undefined() ? "left" : "right", " side)");
  }
  if (left.is_null() || right.is_null()) eval_fail("cannot apply '", op, "' to none");
  if (op == "~") return Value::string(js_string(left) + js_string(right));
  if (op == "**" && numeric_like(left) && numeric_like(right)) {
    const double a = left.number(), b = right.number();
    if (a == 0 && b < 0) eval_fail("0.0 cannot be raised to a negative power");
    // JavaScript's **, where C's pow differs: NaN exponents and 1 ** Infinity give NaN.
    const double result = (std::isnan(b) || (std::abs(a) == 1 && std::isinf(b))) ? NAN : std::pow(a, b);
    if (!std::isfinite(result)) eval_fail("exponentiation result is not a finite real number");
    const bool is_float = left.is(ValueKind::floating) || right.is(ValueKind::floating) || b < 0;
    return is_float ? Value::floating(result) : Value::integer(result);
  }
  if (left.is_number() && right.is_number()) {
    const double a = left.number(), b = right.number();
    const bool is_float = left.is(ValueKind::floating) || right.is(ValueKind::floating);
    const auto number = [is_float](double x) { return is_float ? Value::floating(x) : Value::integer(x); };
    if (op == "+") return number(a + b);
    if (op == "-") return number(a - b);
    if (op == "*") return number(a * b);
    if (op == "/") return Value::floating(a / b);
    if (op == "//") return number(std::floor(a / b));
    if (op == "%") return number(std::fmod(a, b));  // JavaScript's %: the sign of the dividend
    if (op == "<") return Value::boolean(a < b);
    if (op == ">") return Value::boolean(a > b);
    if (op == ">=") return Value::boolean(a >= b);
    if (op == "<=") return Value::boolean(a <= b);
  } else if (left.is_array() && right.is_array()) {
    if (op == "+") {
      Array items = left.array();
      items.insert(items.end(), right.array().begin(), right.array().end());
      return Value::array(std::move(items));
    }
  } else if (right.is_array() && membership) {
    bool found = false;
    for (const Value& item : right.array()) found = found || strict_equals(item, left);
    return Value::boolean(op == "in" ? found : !found);
  }
  if ((left.is_string() || right.is_string()) && op == "+") return Value::string(js_string(left) + js_string(right));
  if (left.is_string() && right.is_string() && membership) {
    const bool found = right.str().find(left.str()) != std::string::npos;
    return Value::boolean(op == "in" ? found : !found);
  }
  if (left.is_string() && right.is_object() && membership) {
    const bool found = right.dict().find(left.str()) != nullptr;
    return Value::boolean(op == "in" ? found : !found);
  }
  eval_fail("unsupported operator '", op, "' between ", a_kind(left.kind()), " and ", a_kind(right.kind()));
}

Value Interpreter::evaluate_unary(const Unary& node, const EnvPtr& env) {
  const Value argument = evaluate(node.argument.get(), env);
  if (node.op == "not") return Value::boolean(!truthy(argument));
  if (!numeric_like(argument)) eval_fail("unary '", node.op, "' needs a number, got ", a_kind(argument.kind()));
  const double result = (node.op == "-" ? -1 : 1) * argument.number();
  return argument.is(ValueKind::floating) ? Value::floating(result) : Value::integer(result);
}

Value Interpreter::evaluate_member(const Member& node, const EnvPtr& env) {
  const Value object = evaluate(node.object.get(), env);
  Value property;
  if (node.computed) {
    if (node.property->kind == NodeKind::slice) return evaluate_slice(object, as<Slice>(*node.property), env);
    property = evaluate(node.property.get(), env);
  } else if (node.property->kind == NodeKind::integer_literal) {
    property = Value::integer(as<NumberLiteral>(*node.property).value);
  } else {
    property = Value::string(as<TextNode>(*node.property).text);
  }
  if (object.is_attribute_container()) {
    if (!property.is_string()) eval_fail(a_kind(object.kind()), " is indexed by strings, not by ", a_kind(property.kind()));
    if (const Value* v = object.dict().find(property.str())) return *v;
    return object.is_object() ? dict_method(object, property.str()) : Value();
  }
  if (object.is_array() || object.is_string()) {
    if (property.is(ValueKind::integer)) {
      if (object.is_string()) {
        const auto c = js_char_at(object.str(), property.number());
        return c ? Value::string(*c) : Value();
      }
      // Array.prototype.at: negative counts from the end, NaN is 0.
      const double n = static_cast<double>(object.array().size());
      double k = std::isnan(property.number()) ? 0 : std::trunc(property.number());
      if (k < 0) k += n;
      if (k < 0 || k >= n) return Value();
      return object.array()[static_cast<size_t>(k)];
    }
    if (property.is_string()) return object.is_string() ? string_member(object, property.str()) : array_member(object, property.str());
    eval_fail(a_kind(object.kind()), " is indexed by integers or names, not by ", a_kind(property.kind()));
  }
  if (!property.is_string()) eval_fail("cannot index ", a_kind(object.kind()), " with ", a_kind(property.kind()));
  return Value();  // numbers, booleans, none, undefined and functions have no attributes
}

Value Interpreter::evaluate_slice(const Value& object, const Slice& node, const EnvPtr& env) {
  if (!object.is_array() && !object.is_string()) eval_fail("cannot slice ", a_kind(object.kind()));
  const Value start = evaluate(node.start.get(), env);
  const Value stop = evaluate(node.stop.get(), env);
  const Value step = evaluate(node.step.get(), env);
  for (const Value* v : {&start, &stop, &step})
    if (!v->is(ValueKind::integer) && !v->is_undefined()) eval_fail("slice bounds must be integers, got ", a_kind(v->kind()));
  if (object.is_array()) {
    Array out;
    for (size_t i : slice_indexes(object.array().size(), start, stop, step)) out.push_back(object.array()[i]);
    return Value::array(std::move(out));
  }
  const std::vector<std::string> chars = code_points(object.str());  // strings slice by code point
  std::string out;
  for (size_t i : slice_indexes(chars.size(), start, stop, step)) out += chars[i];
  return Value::string(std::move(out));
}

std::pair<std::vector<Value>, Dict> Interpreter::evaluate_arguments(const NodeList& args, const EnvPtr& env) {
  std::vector<Value> positional;
  Dict keywords;
  for (const NodePtr& a : args) {
    if (a->kind == NodeKind::spread) {
      const Value v = evaluate(as<Spread>(*a).argument.get(), env);
      if (!v.is_array()) eval_fail("cannot unpack ", a_kind(v.kind()), " with *");
      positional.insert(positional.end(), v.array().begin(), v.array().end());
    } else if (a->kind != NodeKind::keyword_argument && a->kind != NodeKind::keyword_spread) {
      positional.push_back(evaluate(a.get(), env));
    }
  }
  const auto add = [&](const std::string& key, Value v) {
    if (keywords.find(key)) eval_fail("got multiple values for keyword argument '", key, "'");
    keywords.set(key, std::move(v));
  };
  for (const NodePtr& a : args) {
    if (a->kind == NodeKind::keyword_argument) {
      add(as<KeywordArgument>(*a).key, evaluate(as<KeywordArgument>(*a).value.get(), env));
    } else if (a->kind == NodeKind::keyword_spread) {
      const Value v = evaluate(as<Spread>(*a).argument.get(), env);
      if (!v.is_object()) eval_fail("the argument after ** must be a dict, not ", a_kind(v.kind()));
      for (const auto& [key, value] : v.dict().entries()) add(key, value);
    }
  }
  return {std::move(positional), std::move(keywords)};
}

Value Interpreter::evaluate_call(const Call& node, const EnvPtr& env) {
  auto [args, kwargs] = evaluate_arguments(node.args, env);
  if (!kwargs.empty()) args.push_back(Value::dict(std::move(kwargs), ValueKind::kwargs));
  const Value fn = evaluate(node.callee.get(), env);
  if (!fn.is(ValueKind::function))
    eval_fail("cannot call ", describe_callee(*node.callee), ": it is ", a_kind(fn.kind()), ", not a function");
  return fn.function()(args, env);
}

Value Interpreter::evaluate_test(const Test& node, const EnvPtr& env) {
  const Value operand = evaluate(node.operand.get(), env);
  const TestFunction test = find_test(node.name);
  if (!test) eval_fail("unknown test '", node.name, "'");
  const bool result = test(operand, nullptr);
  return Value::boolean(node.negate ? !result : result);
}

Value Interpreter::evaluate_set(const Set& node, const EnvPtr& env) {
  const Value rhs = node.value ? evaluate(node.value.get(), env) : Value::string(evaluate_block(node.body, env));
  const Node& target = *node.assignee;
  if (target.kind == NodeKind::identifier) {
    env->set(as<TextNode>(target).text, rhs);
  } else if (target.kind == NodeKind::tuple_literal) {
    const NodeList& names = as<ListLiteral>(target).items;
    if (!rhs.is_array()) eval_fail("cannot unpack ", a_kind(rhs.kind()), " in set");
    if (rhs.array().size() != names.size())
      eval_fail("too ", names.size() > rhs.array().size() ? "few" : "many", " items to unpack in set (",
                    rhs.array().size(), " for ", names.size(), " names)");
    for (size_t i = 0; i < names.size(); ++i) {
      if (names[i]->kind != NodeKind::identifier) eval_fail("cannot unpack into something that is not a name in set");
      env->set(as<TextNode>(*names[i]).text, rhs.array()[i]);
    }
  } else if (target.kind == NodeKind::member) {
    const auto& member = as<Member>(target);
    const Value object = evaluate(member.object.get(), env);
    if (!object.is(ValueKind::ns)) eval_fail("cannot set an attribute of ", a_kind(object.kind()), " (only of a namespace)");
    // The reference takes the property's name even for ns[x]; a literal ns['x'] it refuses.
    if (member.property->kind != NodeKind::identifier) eval_fail("cannot assign to a namespace member that is not a name");
    object.dict().set(as<TextNode>(*member.property).text, rhs);
  } else {
    eval_fail("cannot assign to a ", node_kind_name(target.kind));
  }
  return Value::null();
}

Value Interpreter::evaluate_for(const For& node, const EnvPtr& env) {
  const auto scope = std::make_shared<Env>(env);
  const Node* test = nullptr;
  Value iterable;
  if (node.iterable->kind == NodeKind::select) {
    iterable = evaluate(as<Select>(*node.iterable).lhs.get(), scope);
    test = as<Select>(*node.iterable).test.get();
  } else {
    iterable = evaluate(node.iterable.get(), scope);
  }
  if (!iterable.is_array() && !iterable.is_object())
    eval_fail("cannot loop over ", a_kind(iterable.kind()), " (a list or a dict is needed)");
  if (iterable.is_object()) iterable = dict_keys(iterable);

  const Node& target = *node.loop_variable;
  const auto check_unpack = [&](const Value& item) {
    if (target.kind != NodeKind::tuple_literal) return;
    const size_t names = as<ListLiteral>(target).items.size();
    if (!item.is(ValueKind::array)) eval_fail("cannot unpack ", a_kind(item.kind()), " into the loop variables");
    if (item.array().size() != names)
      eval_fail("too ", names > item.array().size() ? "few" : "many", " items to unpack (", item.array().size(),
                    " for ", names, " loop variables)");
  };
  const auto bind = [&](const Value& item, Env& into) {
    if (target.kind == NodeKind::identifier) {
      into.set(as<TextNode>(target).text, item);
      return;
    }
    const NodeList& names = as<ListLiteral>(target).items;
    for (size_t j = 0; j < names.size(); ++j) {
      if (names[j]->kind != NodeKind::identifier) eval_fail("cannot unpack into a ", node_kind_name(names[j]->kind));
      into.set(as<TextNode>(*names[j]).text, item.array()[j]);
    }
  };

  // Every item is checked, and filtered by the loop's condition, before the body runs.
  Array items;
  for (const Value& item : iterable.array()) {
    check_unpack(item);
    if (test) {
      const auto loop_scope = std::make_shared<Env>(scope);
      bind(item, *loop_scope);
      if (!truthy(evaluate(test, loop_scope))) continue;
    }
    items.push_back(item);
  }

  std::string out;
  bool no_iteration = true;
  const size_t n = items.size();
  for (size_t i = 0; i < n; ++i) {
    Dict loop;
    loop.set("index", Value::integer(static_cast<double>(i + 1)));
    loop.set("index0", Value::integer(static_cast<double>(i)));
    loop.set("revindex", Value::integer(static_cast<double>(n - i)));
    loop.set("revindex0", Value::integer(static_cast<double>(n - i - 1)));
    loop.set("first", Value::boolean(i == 0));
    loop.set("last", Value::boolean(i == n - 1));
    loop.set("length", Value::integer(static_cast<double>(n)));
    loop.set("previtem", i > 0 ? items[i - 1] : Value());
    loop.set("nextitem", i + 1 < n ? items[i + 1] : Value());
    scope->set("loop", Value::dict(std::move(loop)));
    bind(items[i], *scope);
    // A break or continue drops what this pass had rendered, and the pass does not count as
    // an iteration for the else block: the reference's behaviour.
    try {
      out += evaluate_block(node.body, scope);
    } catch (const LoopContinue&) {
      continue;
    } catch (const LoopBreak&) {
      break;
    }
    no_iteration = false;
  }
  if (no_iteration) out += evaluate_block(node.default_block, scope);
  return Value::string(std::move(out));
}

void Interpreter::bind_arguments(const std::string& who, const NodeList& parameters, SpecialArguments special,
                                 std::vector<Value> args, const EnvPtr& scope) {
  Dict kwargs;
  if (!args.empty() && args.back().is(ValueKind::kwargs)) {
    kwargs = args.back().dict();
    args.pop_back();
  }
  std::vector<std::string> consumed;
  std::vector<std::pair<std::string, const Node*>> pending_defaults;
  for (size_t i = 0; i < parameters.size(); ++i) {
    const Node& p = *parameters[i];
    const std::string& name = p.kind == NodeKind::identifier ? as<TextNode>(p).text : as<KeywordArgument>(p).key;
    const Node* fallback = p.kind == NodeKind::keyword_argument ? as<KeywordArgument>(p).value.get() : nullptr;
    std::optional<Value> value;
    if (i < args.size()) value = args[i];
    if (!value) {
      const bool already = std::find(consumed.begin(), consumed.end(), name) != consumed.end();
      if (const Value* kw = kwargs.find(name); kw && !already) {
        value = *kw;
        consumed.push_back(name);
      }
    }
    if (!value && fallback) pending_defaults.emplace_back(name, fallback);
    scope->set(name, value.value_or(Value()));
  }
  Dict remaining;
  for (const auto& [key, v] : kwargs.entries())
    if (std::find(consumed.begin(), consumed.end(), key) == consumed.end()) remaining.set(key, v);
  if (special.kwargs) scope->set("kwargs", Value::dict(std::move(remaining)));
  else if (!remaining.empty()) eval_fail("macro ", who, " takes no keyword argument '", remaining.entries()[0].first, "'");
  if (special.varargs) {
    Array extra;
    for (size_t i = parameters.size(); i < args.size(); ++i) extra.push_back(args[i]);
    scope->set("varargs", Value::array(std::move(extra)));
  } else if (args.size() > parameters.size()) {
    eval_fail("macro ", who, " takes not more than ", parameters.size(), " argument(s)");
  }
  for (const auto& [name, fallback] : pending_defaults) scope->set(name, evaluate(fallback, scope));
}

Value Interpreter::evaluate_macro(const Macro& node, const EnvPtr& env) {
  // The AST outlives every render, so the closure may hold the node.
  env->set(node.name, Value::function([this, &node](std::vector<Value>& args, const EnvPtr& scope) {
    const auto macro_scope = std::make_shared<Env>(scope);
    bind_arguments("'" + node.name + "'", node.parameters, node.special, args, macro_scope);
    return Value::string(evaluate_block(node.body, macro_scope));
  }));
  return Value::null();
}

Value Interpreter::evaluate_call_statement(const CallStatement& node, const EnvPtr& env) {
  // caller(): an anonymous macro over the block's body, in the block's own environment.
  const Value caller = Value::function([this, &node, env](std::vector<Value>& args, const EnvPtr&) {
    const auto block_scope = std::make_shared<Env>(env);
    bind_arguments("None", node.caller_parameters, node.special, args, block_scope);
    return Value::string(evaluate_block(node.body, block_scope));
  });
  const auto& call = as<Call>(*node.call);
  auto [args, kwargs] = evaluate_arguments(call.args, env);
  args.push_back(Value::dict(std::move(kwargs), ValueKind::kwargs));  // always, even when empty
  const Value fn = evaluate(call.callee.get(), env);
  if (!fn.is(ValueKind::function))
    eval_fail("cannot call ", describe_callee(*call.callee), ": it is ", a_kind(fn.kind()), ", not a function");
  const auto call_scope = std::make_shared<Env>(env);
  call_scope->set("caller", caller);
  return fn.function()(args, call_scope);
}

}  // namespace sluice::jinja
