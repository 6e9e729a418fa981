// find_special_arguments (ast.h): does a macro or call block read `kwargs` or `varargs`
// before declaring them? A port of the reference's findAccessedSpecialMacroArguments, which
// follows Jinja's own visiting order: a name counts as read only if no loop variable, set,
// parameter or nested macro parameter of that name was met before it.
#include <string_view>

#include "format/jinja/ast.h"

namespace sluice::jinja {

namespace {

class SpecialArgumentScan {
 public:
  void declare(std::string_view name) {
    if (name == "kwargs") declared_.kwargs = true;
    if (name == "varargs") declared_.varargs = true;
  }
  void declare_parameter(const Node& p) {
    declare(p.kind == NodeKind::identifier ? std::string_view(as<TextNode>(p).text) : std::string_view(as<KeywordArgument>(p).key));
  }
  void declare_target(const Node& target) {
    if (target.kind == NodeKind::identifier) declare(as<TextNode>(target).text);
    if (target.kind == NodeKind::tuple_literal)
      for (const NodePtr& item : as<ListLiteral>(target).items) declare_target(*item);
  }
  void visit_defaults(const NodeList& parameters) {
    for (const NodePtr& p : parameters)
      if (p->kind == NodeKind::keyword_argument) visit(as<KeywordArgument>(*p).value.get());
  }
  // A filter's name is syntax, not a variable read; only a call's arguments are visited.
  void visit_filter(const Node& filter) {
    if (filter.kind == NodeKind::call) visit(as<Call>(filter).args);
  }
  void visit(const NodeList& nodes) {
    for (const NodePtr& n : nodes) visit(n.get());
  }
  void visit(const Node* node);

  SpecialArguments accessed;

 private:
  SpecialArguments declared_;
};

void SpecialArgumentScan::visit(const Node* node) {
  if (!node) return;
  switch (node->kind) {
    case NodeKind::for_statement: {
      const auto& n = as<For>(*node);
      declare_target(*n.loop_variable);
      if (n.iterable->kind == NodeKind::select) {
        // Jinja visits a loop's condition after its body and else block.
        visit(as<Select>(*n.iterable).lhs.get());
        visit(n.body);
        visit(n.default_block);
        visit(as<Select>(*n.iterable).test.get());
        return;
      }
      visit(n.iterable.get());
      visit(n.body);
      visit(n.default_block);
      return;
    }
    case NodeKind::set_statement: {
      const auto& n = as<Set>(*node);
      declare_target(*n.assignee);
      visit(n.value.get());
      visit(n.body);
      return;
    }
    case NodeKind::macro: {
      const auto& n = as<Macro>(*node);
      for (const NodePtr& p : n.parameters) declare_parameter(*p);
      visit_defaults(n.parameters);
      visit(n.body);
      return;
    }
    case NodeKind::call_statement: {
      const auto& n = as<CallStatement>(*node);
      visit(n.call.get());
      for (const NodePtr& p : n.caller_parameters) declare_parameter(*p);
      visit_defaults(n.caller_parameters);
      visit(n.body);
      return;
    }
    case NodeKind::filter_statement: {
      const auto& n = as<FilterStatement>(*node);
      visit(n.body);
      visit_filter(*n.filter);
      return;
    }
    case NodeKind::identifier: {
      const std::string& name = as<TextNode>(*node).text;
      if (name == "kwargs" && !declared_.kwargs) accessed.kwargs = true;
      if (name == "varargs" && !declared_.varargs) accessed.varargs = true;
      return;
    }
    case NodeKind::member: {
      const auto& n = as<Member>(*node);
      visit(n.object.get());
      if (n.computed) visit(n.property.get());
      return;
    }
    case NodeKind::filter: {
      const auto& n = as<Filter>(*node);
      visit(n.operand.get());
      visit_filter(*n.filter);
      return;
    }
    case NodeKind::test:
      visit(as<Test>(*node).operand.get());
      return;
    case NodeKind::select:
      visit(as<Select>(*node).test.get());
      visit(as<Select>(*node).lhs.get());
      return;
    case NodeKind::keyword_argument:
      visit(as<KeywordArgument>(*node).value.get());
      return;
    // The rest: every child in the order of the node's fields.
    case NodeKind::program:
      visit(as<Program>(*node).body);
      return;
    case NodeKind::if_statement:
      visit(as<If>(*node).test.get());
      visit(as<If>(*node).body);
      visit(as<If>(*node).alternate);
      return;
    case NodeKind::call:
      visit(as<Call>(*node).callee.get());
      visit(as<Call>(*node).args);
      return;
    case NodeKind::array_literal: case NodeKind::tuple_literal:
      visit(as<ListLiteral>(*node).items);
      return;
    case NodeKind::object_literal:
      for (const auto& [key, value] : as<ObjectLiteral>(*node).entries) {
        visit(key.get());
        visit(value.get());
      }
      return;
    case NodeKind::binary:
      visit(as<Binary>(*node).left.get());
      visit(as<Binary>(*node).right.get());
      return;
    case NodeKind::unary:
      visit(as<Unary>(*node).argument.get());
      return;
    case NodeKind::slice:
      visit(as<Slice>(*node).start.get());
      visit(as<Slice>(*node).stop.get());
      visit(as<Slice>(*node).step.get());
      return;
    case NodeKind::spread: case NodeKind::keyword_spread:
      visit(as<Spread>(*node).argument.get());
      return;
    case NodeKind::ternary:
      visit(as<Ternary>(*node).condition.get());
      visit(as<Ternary>(*node).if_true.get());
      visit(as<Ternary>(*node).if_false.get());
      return;
    case NodeKind::break_statement: case NodeKind::continue_statement: case NodeKind::comment:
    case NodeKind::integer_literal: case NodeKind::float_literal: case NodeKind::string_literal:
      return;
  }
}

}  // namespace

SpecialArguments find_special_arguments(const NodeList& parameters, const NodeList& body) {
  SpecialArgumentScan scan;
  // The block's own parameters are declared first; their defaults are not scanned.
  for (const NodePtr& p : parameters) scan.declare_parameter(*p);
  scan.visit(body);
  return scan.accessed;
}

}  // namespace sluice::jinja
