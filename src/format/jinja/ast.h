// The syntax tree of a template, node for node the one @huggingface/jinja's parser builds
// (ast.ts). Statements and expressions share one base: the interpreter switches on `kind`.
// Every node keeps the template line it starts on, for error messages.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

namespace sluice::jinja {

enum class NodeKind : uint8_t {
  program, if_statement, for_statement, break_statement, continue_statement, set_statement,
  macro, comment, call_statement, filter_statement,
  member, call, identifier, integer_literal, float_literal, string_literal, array_literal,
  tuple_literal, object_literal, binary, filter, select, test, unary, slice, keyword_argument,
  spread, keyword_spread, ternary,
};

// The reference's type name ("MemberExpression", ...), for messages.
const char* node_kind_name(NodeKind kind);

struct Node {
  Node(NodeKind k, int l) : kind(k), line(l) {}
  virtual ~Node() = default;
  NodeKind kind;
  int line;
};
using NodePtr = std::unique_ptr<Node>;
using NodeList = std::vector<NodePtr>;

// Which of the special names a macro or call block reads before declaring them (Jinja binds
// `kwargs` / `varargs` only then; otherwise extra arguments are an error).
struct SpecialArguments {
  bool kwargs = false, varargs = false;
};

struct Program : Node {
  explicit Program(int l) : Node(NodeKind::program, l) {}
  NodeList body;
};
struct If : Node {
  explicit If(int l) : Node(NodeKind::if_statement, l) {}
  NodePtr test;
  NodeList body, alternate;  // alternate: the else block, or one nested If for an elif
};
struct For : Node {
  explicit For(int l) : Node(NodeKind::for_statement, l) {}
  NodePtr loop_variable;  // Identifier or TupleLiteral
  NodePtr iterable;       // a Select for `for x in xs if cond`
  NodeList body, default_block;
};
struct Set : Node {
  explicit Set(int l) : Node(NodeKind::set_statement, l) {}
  NodePtr assignee;  // Identifier, TupleLiteral or MemberExpression
  NodePtr value;     // null for a {% set x %}...{% endset %} block
  NodeList body;
};
struct Macro : Node {
  explicit Macro(int l) : Node(NodeKind::macro, l) {}
  std::string name;
  NodeList parameters;  // Identifier or KeywordArgument (with its default)
  NodeList body;
  SpecialArguments special;
};
struct CallStatement : Node {
  explicit CallStatement(int l) : Node(NodeKind::call_statement, l) {}
  NodePtr call;  // a Call whose callee is an Identifier
  bool has_caller_parameters = false;
  NodeList caller_parameters;
  NodeList body;
  SpecialArguments special;
};
struct FilterStatement : Node {
  explicit FilterStatement(int l) : Node(NodeKind::filter_statement, l) {}
  NodePtr filter;  // Identifier or Call
  NodeList body;
};
struct Member : Node {
  explicit Member(int l) : Node(NodeKind::member, l) {}
  NodePtr object, property;  // property: a Slice, any expression (computed), or an Identifier / IntegerLiteral
  bool computed = false;
};
struct Call : Node {
  explicit Call(int l) : Node(NodeKind::call, l) {}
  NodePtr callee;
  NodeList args;
};
// Identifier, StringLiteral (also the template's text) and Comment carry `text`.
struct TextNode : Node {
  TextNode(NodeKind k, int l, std::string t) : Node(k, l), text(std::move(t)) {}
  std::string text;
};
struct NumberLiteral : Node {  // integer_literal or float_literal
  NumberLiteral(NodeKind k, int l, double v) : Node(k, l), value(v) {}
  double value;
};
struct ListLiteral : Node {  // array_literal or tuple_literal
  ListLiteral(NodeKind k, int l) : Node(k, l) {}
  NodeList items;
};
struct ObjectLiteral : Node {
  explicit ObjectLiteral(int l) : Node(NodeKind::object_literal, l) {}
  std::vector<std::pair<NodePtr, NodePtr>> entries;
};
struct Binary : Node {
  Binary(int l, std::string op_) : Node(NodeKind::binary, l), op(std::move(op_)) {}
  std::string op;  // "and", "or", "in", "not in", "==", "+", "~", "//", "**", ...
  NodePtr left, right;
};
struct Filter : Node {
  explicit Filter(int l) : Node(NodeKind::filter, l) {}
  NodePtr operand, filter;  // filter: Identifier or Call (anything else fails at render)
};
struct Select : Node {
  explicit Select(int l) : Node(NodeKind::select, l) {}
  NodePtr lhs, test;
};
struct Test : Node {
  explicit Test(int l) : Node(NodeKind::test, l) {}
  NodePtr operand;
  bool negate = false;
  std::string name;
};
struct Unary : Node {
  Unary(int l, std::string op_) : Node(NodeKind::unary, l), op(std::move(op_)) {}
  std::string op;  // "not", "-", "+"
  NodePtr argument;
};
struct Slice : Node {
  explicit Slice(int l) : Node(NodeKind::slice, l) {}
  NodePtr start, stop, step;  // each may be null
};
struct KeywordArgument : Node {
  explicit KeywordArgument(int l) : Node(NodeKind::keyword_argument, l) {}
  std::string key;
  NodePtr value;
};
struct Spread : Node {  // spread (*x) or keyword_spread (**x)
  Spread(NodeKind k, int l) : Node(k, l) {}
  NodePtr argument;
};
struct Ternary : Node {
  explicit Ternary(int l) : Node(NodeKind::ternary, l) {}
  NodePtr condition, if_true, if_false;
};

// The node as its concrete type (the caller has checked `kind`).
template <typename T>
const T& as(const Node& n) {
  return static_cast<const T&>(n);
}

// Scans a macro's (or call block's) body for `kwargs` / `varargs` reads that come before a
// declaration, in Jinja's visiting order (special_args.cpp).
SpecialArguments find_special_arguments(const NodeList& parameters, const NodeList& body);

}  // namespace sluice::jinja
