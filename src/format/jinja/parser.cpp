// The parser (see parser.h): a port of parser.ts, function for function. Precedence from the
// loosest: a if b else c, or, and, not, comparisons and in, + - ~, * / // %, **, is, |,
// unary + -, calls and members, primaries. Nesting is capped (kParseDepthMax) so that a
// hostile template cannot overflow the stack.
#include "format/jinja/parser.h"

#include <initializer_list>
#include <set>
#include <string_view>

#include "core/error.h"

namespace sluice::jinja {

namespace {

// Far beyond any real template (they nest a handful of levels); each level is a few frames.
constexpr int kParseDepthMax = 300;
// Operators in one left-folded chain (a + b + c ..., x.a.b ..., x | f | g ...): each one is a
// level of the tree that evaluation and destruction recurse through.
constexpr int kChainMax = 1000;

enum class ArgumentMode { call, parameters };

class Parser {
 public:
  explicit Parser(const std::vector<Token>& tokens) : tokens_(tokens) {}

  std::unique_ptr<Program> run() {
    auto program = std::make_unique<Program>(1);
    while (current_ < tokens_.size()) program->body.push_back(parse_any(nullptr));
    return program;
  }

 private:
  [[noreturn]] void error(const std::string& reason) const {
    int line = 1;
    if (current_ < tokens_.size()) line = tokens_[current_].line;
    else if (!tokens_.empty()) line = tokens_.back().line;
    fail(Status::invalid_argument, "line ", line, ": ", reason);
  }
  int line() const { return current_ < tokens_.size() ? tokens_[current_].line : (tokens_.empty() ? 1 : tokens_.back().line); }

  const Token& expect(TokenType type, std::string_view what) {
    if (current_ >= tokens_.size()) error(str("expected ", what, ", got the end of the template"));
    const Token& t = tokens_[current_++];
    if (t.type != type) {
      --current_;
      error(str("expected ", what, ", got ", describe(t)));
    }
    return t;
  }
  std::string describe_current() const {
    return current_ < tokens_.size() ? describe(tokens_[current_]) : std::string("the end of the template");
  }
  static std::string describe(const Token& t) {
    std::string v = t.value.size() > 40 ? t.value.substr(0, 40) + "..." : t.value;
    for (char& c : v)
      if (c == '\n' || c == '\r') c = ' ';
    return str(token_type_name(t.type), " '", v, "'");
  }
  void expect_identifier(std::string_view name) {
    if (!is_identifier({name})) error(str("expected '", name, "'"));
    ++current_;
  }
  bool is(std::initializer_list<TokenType> types) const {
    if (current_ + types.size() > tokens_.size()) return false;
    size_t i = current_;
    for (TokenType t : types)
      if (tokens_[i++].type != t) return false;
    return true;
  }
  bool is(TokenType type) const { return is({type}); }
  bool is_identifier(std::initializer_list<std::string_view> names) const {
    if (current_ + names.size() > tokens_.size()) return false;
    size_t i = current_;
    for (std::string_view n : names) {
      if (tokens_[i].type != TokenType::identifier || tokens_[i].value != n) return false;
      ++i;
    }
    return true;
  }
  bool is_statement(std::initializer_list<std::string_view> names) const {
    if (current_ + 1 >= tokens_.size()) return false;
    if (tokens_[current_].type != TokenType::open_statement || tokens_[current_ + 1].type != TokenType::identifier)
      return false;
    for (std::string_view n : names)
      if (tokens_[current_ + 1].value == n) return true;
    return false;
  }

  // A block body: statements until one of `ends` ({% endif %}, ...); `opened` names the
  // block for the error when the template ends first.
  NodeList parse_body(std::initializer_list<std::string_view> ends, std::string_view opened, int opened_line) {
    NodeList body;
    const std::string closing = str("end", opened);
    while (!is_statement(ends)) {
      if (current_ >= tokens_.size())
        error(str("{% ", opened, " %} of line ", opened_line, " is never closed (no {% ", closing, " %})"));
      body.push_back(parse_any(&opened));
    }
    return body;
  }

  // Counts one more link of a left-folded chain.
  void chain_link(int& links) const {
    if (++links > kChainMax) error(str("an expression chains more than ", kChainMax, " operators"));
  }

  struct DepthGuard {
    explicit DepthGuard(Parser& p) : parser(p) {
      if (++parser.depth_ > kParseDepthMax) parser.error("the template nests too deeply");
    }
    ~DepthGuard() { --parser.depth_; }
    Parser& parser;
  };

  NodePtr parse_any(const std::string_view* inside);
  NodePtr parse_statement();
  NodePtr parse_set();
  std::unique_ptr<If> parse_if(int line);
  NodePtr parse_macro(int line);
  NodePtr parse_for(int line);
  NodePtr parse_call_block(int line);
  NodePtr parse_filter_block(int line);
  NodePtr parse_expression_sequence(bool primary);
  NodePtr parse_expression() { return parse_if_expression(); }
  NodePtr parse_if_expression();
  NodePtr parse_logical_or();
  NodePtr parse_logical_and();
  NodePtr parse_logical_not();
  NodePtr parse_comparison();
  NodePtr parse_additive();
  NodePtr parse_multiplicative();
  NodePtr parse_power();
  NodePtr parse_test();
  NodePtr parse_filter();
  NodePtr parse_unary_sign();
  NodePtr parse_call_member();
  NodePtr parse_call(NodePtr callee);
  NodeList parse_args(ArgumentMode mode);
  NodeList parse_arguments_list(ArgumentMode mode);
  NodePtr parse_member_arguments(int line);
  NodePtr parse_member(NodePtr object);
  NodePtr parse_primary();

  const std::vector<Token>& tokens_;
  size_t current_ = 0;
  int depth_ = 0;
};

NodePtr Parser::parse_any(const std::string_view* inside) {
  DepthGuard guard(*this);
  if (current_ >= tokens_.size()) error("unexpected end of the template");
  const Token& t = tokens_[current_];
  switch (t.type) {
    case TokenType::comment:
      ++current_;
      return std::make_unique<TextNode>(NodeKind::comment, t.line, t.value);
    case TokenType::text:
      ++current_;
      return std::make_unique<TextNode>(NodeKind::string_literal, t.line, t.value);
    case TokenType::open_statement:
      return parse_statement();
    case TokenType::open_expression: {
      ++current_;
      NodePtr e = parse_expression();
      expect(TokenType::close_expression, "'}}'");
      return e;
    }
    default:
      error(str("unexpected ", describe(t), inside ? str(" inside {% ", *inside, " %}") : std::string()));
  }
}

NodePtr Parser::parse_statement() {
  const int start = line();
  expect(TokenType::open_statement, "'{%'");
  if (current_ >= tokens_.size()) error("expected a statement name after '{%', got the end of the template");
  if (tokens_[current_].type != TokenType::identifier) error(str("expected a statement name after '{%', got ", describe(tokens_[current_])));
  const std::string name = tokens_[current_].value;
  ++current_;
  if (name == "set") return parse_set();
  if (name == "if") {
    NodePtr result = parse_if(start);
    expect(TokenType::open_statement, "'{%'");
    expect_identifier("endif");
    expect(TokenType::close_statement, "'%}'");
    return result;
  }
  if (name == "macro") return parse_macro(start);
  if (name == "for") return parse_for(start);
  if (name == "call") return parse_call_block(start);
  if (name == "filter") return parse_filter_block(start);
  if (name == "break" || name == "continue") {
    expect(TokenType::close_statement, "'%}'");
    return std::make_unique<Node>(name == "break" ? NodeKind::break_statement : NodeKind::continue_statement, start);
  }
  --current_;
  error(str("unknown statement {% ", name, " %}"));
}

NodePtr Parser::parse_set() {
  auto node = std::make_unique<Set>(line());
  node->assignee = parse_expression_sequence(false);
  if (is(TokenType::equals)) {
    ++current_;
    node->value = parse_expression_sequence(false);
  } else {
    expect(TokenType::close_statement, "'%}' or '='");
    node->body = parse_body({"endset"}, "set", node->line);
    expect(TokenType::open_statement, "'{%'");
    expect_identifier("endset");
  }
  expect(TokenType::close_statement, "'%}'");
  return node;
}

std::unique_ptr<If> Parser::parse_if(int start) {
  auto node = std::make_unique<If>(start);
  node->test = parse_expression();
  expect(TokenType::close_statement, "'%}'");
  node->body = parse_body({"elif", "else", "endif"}, "if", start);
  if (is_statement({"elif"})) {
    const int elif_line = line();
    current_ += 2;
    node->alternate.push_back(parse_if(elif_line));
  } else if (is_statement({"else"})) {
    current_ += 2;
    expect(TokenType::close_statement, "'%}'");
    node->alternate = parse_body({"endif"}, "if", start);
  }
  return node;
}

NodePtr Parser::parse_macro(int start) {
  auto node = std::make_unique<Macro>(start);
  NodePtr name = parse_primary();
  if (name->kind != NodeKind::identifier) error("expected the macro's name after {% macro");
  node->name = as<TextNode>(*name).text;
  node->parameters = parse_args(ArgumentMode::parameters);
  expect(TokenType::close_statement, "'%}'");
  node->body = parse_body({"endmacro"}, "macro", start);
  expect(TokenType::open_statement, "'{%'");
  expect_identifier("endmacro");
  expect(TokenType::close_statement, "'%}'");
  node->special = find_special_arguments(node->parameters, node->body);
  return node;
}

NodePtr Parser::parse_for(int start) {
  auto node = std::make_unique<For>(start);
  node->loop_variable = parse_expression_sequence(true);
  const NodeKind k = node->loop_variable->kind;
  if (k != NodeKind::identifier && k != NodeKind::tuple_literal)
    error(str("expected a name or names for the loop variable, got ", node_kind_name(k)));
  if (!is_identifier({"in"})) error("expected 'in' after the loop variable");
  ++current_;
  node->iterable = parse_expression();
  expect(TokenType::close_statement, "'%}'");
  node->body = parse_body({"endfor", "else"}, "for", start);
  if (is_statement({"else"})) {
    current_ += 2;
    expect(TokenType::close_statement, "'%}'");
    node->default_block = parse_body({"endfor"}, "for", start);
  }
  expect(TokenType::open_statement, "'{%'");
  expect_identifier("endfor");
  expect(TokenType::close_statement, "'%}'");
  return node;
}

NodePtr Parser::parse_call_block(int start) {
  auto node = std::make_unique<CallStatement>(start);
  if (is(TokenType::open_paren)) {
    node->has_caller_parameters = true;
    node->caller_parameters = parse_args(ArgumentMode::parameters);
  }
  NodePtr callee = parse_primary();
  if (callee->kind != NodeKind::identifier) error("expected a name after {% call");
  auto call = std::make_unique<Call>(callee->line);
  call->callee = std::move(callee);
  call->args = parse_args(ArgumentMode::call);
  node->call = std::move(call);
  expect(TokenType::close_statement, "'%}'");
  node->body = parse_body({"endcall"}, "call", start);
  expect(TokenType::open_statement, "'{%'");
  expect_identifier("endcall");
  expect(TokenType::close_statement, "'%}'");
  node->special = find_special_arguments(node->caller_parameters, node->body);
  return node;
}

NodePtr Parser::parse_filter_block(int start) {
  auto node = std::make_unique<FilterStatement>(start);
  NodePtr filter = parse_primary();
  if (filter->kind == NodeKind::identifier && is(TokenType::open_paren)) filter = parse_call(std::move(filter));
  node->filter = std::move(filter);
  expect(TokenType::close_statement, "'%}'");
  node->body = parse_body({"endfilter"}, "filter", start);
  expect(TokenType::open_statement, "'{%'");
  expect_identifier("endfilter");
  expect(TokenType::close_statement, "'%}'");
  return node;
}

NodePtr Parser::parse_expression_sequence(bool primary) {
  const int start = line();
  NodePtr first = primary ? parse_primary() : parse_expression();
  if (!is(TokenType::comma)) return first;
  auto tuple = std::make_unique<ListLiteral>(NodeKind::tuple_literal, start);
  tuple->items.push_back(std::move(first));
  while (true) {
    ++current_;  // the comma
    tuple->items.push_back(primary ? parse_primary() : parse_expression());
    if (!is(TokenType::comma)) break;
  }
  return tuple;
}

NodePtr Parser::parse_if_expression() {
  DepthGuard guard(*this);
  NodePtr a = parse_logical_or();
  if (!is_identifier({"if"})) return a;
  const int start = line();
  ++current_;
  NodePtr test = parse_logical_or();
  if (is_identifier({"else"})) {
    ++current_;
    auto node = std::make_unique<Ternary>(start);
    node->condition = std::move(test);
    node->if_true = std::move(a);
    node->if_false = parse_if_expression();
    return node;
  }
  auto node = std::make_unique<Select>(start);
  node->lhs = std::move(a);
  node->test = std::move(test);
  return node;
}

NodePtr Parser::parse_logical_or() {
  NodePtr left = parse_logical_and();
  int links = 0;
  while (is_identifier({"or"})) {
    chain_link(links);
    auto node = std::make_unique<Binary>(line(), "or");
    ++current_;
    node->left = std::move(left);
    node->right = parse_logical_and();
    left = std::move(node);
  }
  return left;
}

NodePtr Parser::parse_logical_and() {
  NodePtr left = parse_logical_not();
  int links = 0;
  while (is_identifier({"and"})) {
    chain_link(links);
    auto node = std::make_unique<Binary>(line(), "and");
    ++current_;
    node->left = std::move(left);
    node->right = parse_logical_not();
    left = std::move(node);
  }
  return left;
}

NodePtr Parser::parse_logical_not() {
  // `not not x`: the recursion takes every further `not`. The loop is the reference's: in
  // `not a not b` its second turn replaces the first (`not b`).
  NodePtr result;
  while (is_identifier({"not"})) {
    DepthGuard guard(*this);
    auto node = std::make_unique<Unary>(line(), "not");
    ++current_;
    node->argument = parse_logical_not();
    result = std::move(node);
  }
  return result ? std::move(result) : parse_comparison();
}

NodePtr Parser::parse_comparison() {
  // Membership and comparison share one level, left to right.
  NodePtr left = parse_additive();
  int links = 0;
  while (true) {
    std::string op;
    const int op_line = line();
    if (is_identifier({"not", "in"})) {
      op = "not in";
      current_ += 2;
    } else if (is_identifier({"in"})) {
      op = "in";
      ++current_;
    } else if (is(TokenType::comparison_binary_operator)) {
      op = tokens_[current_++].value;
    } else {
      break;
    }
    chain_link(links);
    auto node = std::make_unique<Binary>(op_line, op);
    node->left = std::move(left);
    node->right = parse_additive();
    left = std::move(node);
  }
  return left;
}

NodePtr Parser::parse_additive() {
  NodePtr left = parse_multiplicative();
  int links = 0;
  while (is(TokenType::additive_binary_operator)) {
    chain_link(links);
    auto node = std::make_unique<Binary>(line(), tokens_[current_++].value);
    node->left = std::move(left);
    node->right = parse_multiplicative();
    left = std::move(node);
  }
  return left;
}

NodePtr Parser::parse_multiplicative() {
  NodePtr left = parse_power();
  int links = 0;
  while (is(TokenType::multiplicative_binary_operator)) {
    chain_link(links);
    auto node = std::make_unique<Binary>(line(), tokens_[current_++].value);
    node->left = std::move(left);
    node->right = parse_power();
    left = std::move(node);
  }
  return left;
}

NodePtr Parser::parse_power() {
  // Left-associative, as in Jinja: 2 ** 3 ** 2 is (2 ** 3) ** 2.
  NodePtr left = parse_test();
  int links = 0;
  while (is(TokenType::exponentiation_binary_operator)) {
    chain_link(links);
    auto node = std::make_unique<Binary>(line(), tokens_[current_++].value);
    node->left = std::move(left);
    node->right = parse_test();
    left = std::move(node);
  }
  return left;
}

NodePtr Parser::parse_test() {
  NodePtr operand = parse_filter();
  int links = 0;
  while (is_identifier({"is"})) {
    chain_link(links);
    auto node = std::make_unique<Test>(line());
    ++current_;
    if (is_identifier({"not"})) {
      node->negate = true;
      ++current_;
    }
    if (!is(TokenType::identifier)) error(str("expected the name of a test after 'is', got ", describe_current()));
    NodePtr name = parse_primary();
    node->name = as<TextNode>(*name).text;
    node->operand = std::move(operand);
    operand = std::move(node);
  }
  return operand;
}

NodePtr Parser::parse_filter() {
  NodePtr operand = parse_unary_sign();
  int links = 0;
  while (is(TokenType::pipe)) {
    chain_link(links);
    auto node = std::make_unique<Filter>(line());
    ++current_;
    if (!is(TokenType::identifier)) error(str("expected the name of a filter after '|', got ", describe_current()));
    NodePtr filter = parse_primary();
    if (is(TokenType::open_paren)) filter = parse_call(std::move(filter));
    node->operand = std::move(operand);
    node->filter = std::move(filter);
    operand = std::move(node);
  }
  return operand;
}

NodePtr Parser::parse_unary_sign() {
  if (current_ < tokens_.size()) {
    const Token& t = tokens_[current_];
    if ((t.type == TokenType::unary_operator || t.type == TokenType::additive_binary_operator) &&
        (t.value == "-" || t.value == "+")) {
      DepthGuard guard(*this);
      auto node = std::make_unique<Unary>(t.line, t.value);
      ++current_;
      node->argument = parse_unary_sign();
      return node;
    }
  }
  return parse_call_member();
}

NodePtr Parser::parse_call_member() {
  NodePtr member = parse_member(parse_primary());
  if (is(TokenType::open_paren)) return parse_call(std::move(member));
  return member;
}

NodePtr Parser::parse_call(NodePtr callee) {
  DepthGuard guard(*this);
  auto call = std::make_unique<Call>(callee->line);
  call->callee = std::move(callee);
  call->args = parse_args(ArgumentMode::call);
  NodePtr expression = parse_member(std::move(call));
  if (is(TokenType::open_paren)) expression = parse_call(std::move(expression));
  return expression;
}

NodeList Parser::parse_args(ArgumentMode mode) {
  expect(TokenType::open_paren, "'(' of an argument list");
  NodeList args = parse_arguments_list(mode);
  expect(TokenType::close_paren, "')' closing the argument list");
  return args;
}

NodeList Parser::parse_arguments_list(ArgumentMode mode) {
  NodeList args;
  std::set<std::string> names;
  bool saw_keyword = false, saw_spread = false;
  while (!is(TokenType::close_paren)) {
    if (current_ >= tokens_.size()) error("expected ')' closing the argument list, got the end of the template");
    const bool keyword_spread = is(TokenType::exponentiation_binary_operator);
    const bool positional_spread = is(TokenType::multiplicative_binary_operator) && tokens_[current_].value == "*";
    if (mode == ArgumentMode::parameters && (keyword_spread || positional_spread))
      error("argument unpacking (* or **) is not allowed in parameter declarations");
    if (keyword_spread) {
      auto node = std::make_unique<Spread>(NodeKind::keyword_spread, line());
      ++current_;
      node->argument = parse_expression();
      args.push_back(std::move(node));
      if (is(TokenType::comma)) ++current_;
      if (!is(TokenType::close_paren)) error("'**' must be applied to the last argument");
      break;
    }
    NodePtr argument;
    if (positional_spread) {
      if (saw_spread) error("only one '*' argument unpacking is allowed");
      saw_spread = true;
      auto node = std::make_unique<Spread>(NodeKind::spread, line());
      ++current_;
      node->argument = parse_expression();
      argument = std::move(node);
    } else {
      argument = parse_expression();
      if (is(TokenType::equals)) {
        ++current_;
        if (argument->kind != NodeKind::identifier)
          error(mode == ArgumentMode::parameters ? "expected a name for the parameter" : "expected a name for the keyword argument");
        auto kw = std::make_unique<KeywordArgument>(argument->line);
        kw->key = as<TextNode>(*argument).text;
        kw->value = parse_expression();
        argument = std::move(kw);
      }
      if (mode == ArgumentMode::parameters) {
        if (argument->kind != NodeKind::identifier && argument->kind != NodeKind::keyword_argument)
          error("expected a name for the parameter");
        const std::string& name = argument->kind == NodeKind::identifier ? as<TextNode>(*argument).text
                                                                         : as<KeywordArgument>(*argument).key;
        if (!names.insert(name).second) error(str("duplicate parameter name '", name, "'"));
      }
      if (argument->kind == NodeKind::keyword_argument) {
        saw_keyword = true;
      } else if (saw_keyword) {
        error(mode == ArgumentMode::call ? "positional arguments must come before keyword arguments"
                                         : "a parameter without a default follows one with a default");
      } else if (saw_spread) {
        error("positional arguments must not follow '*' argument unpacking");
      }
    }
    args.push_back(std::move(argument));
    if (is(TokenType::comma)) ++current_;
  }
  return args;
}

NodePtr Parser::parse_member_arguments(int start) {
  // x[a], and the slices x[:2], x[1:], x[1:2], x[::-1], x[1:2:3].
  std::vector<NodePtr> slices;
  bool is_slice = false;
  while (!is(TokenType::close_square_bracket)) {
    if (current_ >= tokens_.size()) error("expected ']', got the end of the template");
    if (is(TokenType::colon)) {
      slices.push_back(nullptr);
      ++current_;
      is_slice = true;
    } else {
      slices.push_back(parse_expression());
      if (is(TokenType::colon)) {
        ++current_;
        is_slice = true;
      }
    }
  }
  if (slices.empty()) error("expected an index or a slice inside '[]'");
  if (!is_slice) return std::move(slices[0]);  // x[a b] reads x[a], as the reference does
  if (slices.size() > 3) error("a slice takes at most 3 parts (start:stop:step)");
  auto node = std::make_unique<Slice>(start);
  slices.resize(3);
  node->start = std::move(slices[0]);
  node->stop = std::move(slices[1]);
  node->step = std::move(slices[2]);
  return node;
}

NodePtr Parser::parse_member(NodePtr object) {
  int links = 0;
  while (is(TokenType::dot) || is(TokenType::open_square_bracket)) {
    chain_link(links);
    auto node = std::make_unique<Member>(line());
    node->computed = tokens_[current_].type == TokenType::open_square_bracket;
    ++current_;
    if (node->computed) {
      node->property = parse_member_arguments(node->line);
      expect(TokenType::close_square_bracket, "']'");
    } else {
      node->property = parse_primary();
      if (node->property->kind != NodeKind::identifier && node->property->kind != NodeKind::integer_literal)
        error("expected a name or an integer after '.'");
    }
    node->object = std::move(object);
    object = std::move(node);
  }
  return object;
}

NodePtr Parser::parse_primary() {
  DepthGuard guard(*this);
  if (current_ >= tokens_.size()) error("expected an expression, got the end of the template");
  const Token& t = tokens_[current_++];
  switch (t.type) {
    case TokenType::numeric_literal: {
      const double v = std::strtod(t.value.c_str(), nullptr);
      const bool is_float = t.value.find('.') != std::string::npos;
      return std::make_unique<NumberLiteral>(is_float ? NodeKind::float_literal : NodeKind::integer_literal, t.line, v);
    }
    case TokenType::string_literal: {
      std::string value = t.value;  // adjacent literals concatenate: 'a' "b" is "ab"
      while (is(TokenType::string_literal)) value += tokens_[current_++].value;
      return std::make_unique<TextNode>(NodeKind::string_literal, t.line, std::move(value));
    }
    case TokenType::identifier:
      return std::make_unique<TextNode>(NodeKind::identifier, t.line, t.value);
    case TokenType::open_paren: {
      NodePtr e = parse_expression_sequence(false);
      expect(TokenType::close_paren, "')'");
      return e;
    }
    case TokenType::open_square_bracket: {
      auto node = std::make_unique<ListLiteral>(NodeKind::array_literal, t.line);
      while (!is(TokenType::close_square_bracket)) {
        if (current_ >= tokens_.size()) error("expected ']' closing the list, got the end of the template");
        node->items.push_back(parse_expression());
        if (is(TokenType::comma)) ++current_;
      }
      ++current_;
      return node;
    }
    case TokenType::open_curly_bracket: {
      auto node = std::make_unique<ObjectLiteral>(t.line);
      while (!is(TokenType::close_curly_bracket)) {
        if (current_ >= tokens_.size()) error("expected '}' closing the dict, got the end of the template");
        NodePtr key = parse_expression();
        expect(TokenType::colon, "':' between a key and its value");
        NodePtr value = parse_expression();
        node->entries.emplace_back(std::move(key), std::move(value));
        if (is(TokenType::comma)) ++current_;
      }
      ++current_;
      return node;
    }
    default:
      --current_;
      error(str("unexpected ", describe(t)));
  }
}

}  // namespace

const char* node_kind_name(NodeKind kind) {
  switch (kind) {
    case NodeKind::program: return "Program";
    case NodeKind::if_statement: return "If";
    case NodeKind::for_statement: return "For";
    case NodeKind::break_statement: return "Break";
    case NodeKind::continue_statement: return "Continue";
    case NodeKind::set_statement: return "Set";
    case NodeKind::macro: return "Macro";
    case NodeKind::comment: return "Comment";
    case NodeKind::call_statement: return "CallStatement";
    case NodeKind::filter_statement: return "FilterStatement";
    case NodeKind::member: return "MemberExpression";
    case NodeKind::call: return "CallExpression";
    case NodeKind::identifier: return "Identifier";
    case NodeKind::integer_literal: return "IntegerLiteral";
    case NodeKind::float_literal: return "FloatLiteral";
    case NodeKind::string_literal: return "StringLiteral";
    case NodeKind::array_literal: return "ArrayLiteral";
    case NodeKind::tuple_literal: return "TupleLiteral";
    case NodeKind::object_literal: return "ObjectLiteral";
    case NodeKind::binary: return "BinaryExpression";
    case NodeKind::filter: return "FilterExpression";
    case NodeKind::select: return "SelectExpression";
    case NodeKind::test: return "TestExpression";
    case NodeKind::unary: return "UnaryExpression";
    case NodeKind::slice: return "SliceExpression";
    case NodeKind::keyword_argument: return "KeywordArgumentExpression";
    case NodeKind::spread: return "SpreadExpression";
    case NodeKind::keyword_spread: return "KeywordSpreadExpression";
    case NodeKind::ternary: return "Ternary";
  }
  return "?";
}

std::unique_ptr<Program> parse(const std::vector<Token>& tokens) { return Parser(tokens).run(); }

}  // namespace sluice::jinja
