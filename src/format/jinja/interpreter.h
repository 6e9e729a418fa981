// The interpreter: evaluates a parsed template in an environment, as @huggingface/jinja's
// Interpreter does (runtime.ts), so that the output matches it byte for byte. Environments
// nest (a loop body, a macro call); macros see the variables of the place they are called
// from, as in the reference. Errors are Error(invalid_argument) "line N: reason", N being
// the line of the innermost construct that failed.
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

#include "format/jinja/ast.h"
#include "format/jinja/value.h"

namespace sluice::jinja {

// A scope: its own variables and the scope around it.
class Env {
 public:
  explicit Env(EnvPtr parent = nullptr) : parent_(std::move(parent)) {}
  // The nearest definition, or undefined. (`namespace` is predefined in every scope, as in
  // the reference where each environment starts with it: the interpreter resolves it.)
  Value lookup(const std::string& name) const;
  void set(const std::string& name, Value value) { vars_[name] = std::move(value); }
  bool has_own(const std::string& name) const { return vars_.count(name) > 0; }

 private:
  EnvPtr parent_;
  std::unordered_map<std::string, Value> vars_;
};

class Interpreter {
 public:
  // `namespace_builtin`: the namespace() function, which every scope predefines.
  explicit Interpreter(Value namespace_builtin) : namespace_builtin_(std::move(namespace_builtin)) {}

  // Renders the program in `global` (which holds the globals and the template variables).
  std::string run(const Program& program, const EnvPtr& global);

  // Evaluates one node; a null node (an absent slice bound) is undefined.
  Value evaluate(const Node* node, const EnvPtr& env);

 private:
  Value evaluate_node(const Node& node, const EnvPtr& env);
  std::string evaluate_block(const NodeList& statements, const EnvPtr& env);
  Value evaluate_binary(const Binary& node, const EnvPtr& env);
  Value evaluate_unary(const Unary& node, const EnvPtr& env);
  Value evaluate_member(const Member& node, const EnvPtr& env);
  Value evaluate_slice(const Value& object, const Slice& node, const EnvPtr& env);
  Value evaluate_call(const Call& node, const EnvPtr& env);
  Value evaluate_object_literal(const ObjectLiteral& node, const EnvPtr& env);
  Value evaluate_set(const Set& node, const EnvPtr& env);
  Value evaluate_for(const For& node, const EnvPtr& env);
  Value evaluate_macro(const Macro& node, const EnvPtr& env);
  Value evaluate_call_statement(const CallStatement& node, const EnvPtr& env);
  Value evaluate_test(const Test& node, const EnvPtr& env);

  // The positional values (spreads expanded) and the keyword arguments of a call, all
  // positional ones evaluated first as in Python.
  std::pair<std::vector<Value>, Dict> evaluate_arguments(const NodeList& args, const EnvPtr& env);
  // Binds a macro's or call block's parameters in `scope` (defaults evaluated there, after
  // every name is bound); `who` names it in errors.
  void bind_arguments(const std::string& who, const NodeList& parameters, SpecialArguments special,
                      std::vector<Value> args, const EnvPtr& scope);

  // filters.cpp: `operand | filter` where filter is a name or a call.
  Value apply_filter(const Value& operand, const Node& filter, const EnvPtr& env);
  Value apply_plain_filter(const Value& operand, const std::string& name);
  Value apply_call_filter(const Value& operand, const Call& call, const std::string& name, const EnvPtr& env);
  Value filter_sort(const Value& operand, std::vector<Value> args, const Dict& kwargs);
  Value filter_select_attribute(const Value& operand, const Call& call, bool select, const EnvPtr& env);
  Value filter_tojson(const Value& operand, const Dict& kwargs);

  Value namespace_builtin_;
  int depth_ = 0;
};

}  // namespace sluice::jinja
