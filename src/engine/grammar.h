// Grammar: a context-free grammar over bytes, for constrained sampling (structured output, tool
// calls forced by tool_choice). Built from expressions (literals, byte sets, sequences,
// alternatives, bounded and unbounded repetition, references to named rules, which may
// recurse), compiled to flat rules, and recognized by a set of stacks, one per way the bytes
// so far can be read (as llama.cpp's GBNF recognizer does): a stack holds the element
// positions still to match, its top a byte set. A state is that set; it advances one byte at
// a time; a state with an empty stack has read a whole sentence. Left recursion and
// repetition of something that can be empty are refused when the grammar is built, so a
// state always expands in finite time.
#pragma once

#include <array>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

namespace sluice {

using ByteSet = std::array<uint64_t, 4>;  // bit b: byte b

ByteSet byte_range(uint8_t lo, uint8_t hi);
ByteSet byte_set_of(std::string_view bytes);
inline bool byte_in(const ByteSet& s, uint8_t b) { return (s[b >> 6] >> (b & 63)) & 1; }

struct GrammarExpr;
using GExpr = std::shared_ptr<const GrammarExpr>;

struct GrammarExpr {
  enum class Kind { bytes, literal, ref, seq, alt, repeat };
  Kind kind = Kind::seq;
  ByteSet set{};            // bytes
  std::string text;         // literal (its bytes in order)
  int rule = -1;            // ref
  std::vector<GExpr> items; // seq, alt; repeat: one
  int min = 0, max = -1;    // repeat: max -1 unbounded
};

// Expression constructors.
GExpr g_lit(std::string text);
GExpr g_bytes(const ByteSet& set);
GExpr g_seq(std::vector<GExpr> items);
GExpr g_alt(std::vector<GExpr> items);
GExpr g_repeat(GExpr item, int min, int max);  // max -1: unbounded
inline GExpr g_opt(GExpr e) { return g_repeat(std::move(e), 0, 1); }
inline GExpr g_star(GExpr e) { return g_repeat(std::move(e), 0, -1); }
GExpr g_ref(int rule);
inline GExpr g_empty() { return g_seq({}); }

class Grammar {
 public:
  enum class ElemKind : uint8_t { bytes, ref, end };
  struct Elem {
    ElemKind kind = ElemKind::end;
    int32_t arg = 0;  // bytes: index into sets_; ref: the rule
  };
  using Stack = std::vector<int32_t>;   // element positions; the top (back) is a byte set
  using State = std::vector<Stack>;     // sorted, without repeats; empty: nothing can follow

  State initial() const;
  State advance(const State& s, uint8_t byte) const;
  State advance(const State& s, std::string_view bytes) const;
  ByteSet next_bytes(const State& s) const;   // the bytes advance() does not kill s on
  static bool complete(const State& s);       // a whole sentence has been read
  static bool can_continue(const State& s);   // some byte may follow
  // Whether text is a sentence of the grammar.
  bool matches(std::string_view text) const;
  size_t n_elems() const { return elems_.size(); }

 private:
  friend class GrammarBuilder;
  friend struct GrammarCompiler;
  // Pushes pos unless it ends an alternative, then expands the top into byte-set tops.
  void push_expand(Stack& st, int32_t pos, State& out) const;
  void expand(Stack& st, State& out) const;
  static void normalize(State& s);

  std::vector<Elem> elems_;
  std::vector<ByteSet> sets_;
  std::vector<std::vector<int32_t>> rule_alts_;  // rule -> start positions of its alternatives
  std::vector<std::string> rule_names_;
  int32_t root_ = 0;
};

// Rules by name and expression; build() compiles them. Errors (a rule declared and never
// defined, left recursion, a repetition of something that can match nothing, a grammar over
// the size limit) are Error(invalid_argument) naming the rule.
class GrammarBuilder {
 public:
  int declare(const std::string& name);
  void define(int rule, GExpr e);
  int rule(const std::string& name, GExpr e) {
    const int r = declare(name);
    define(r, std::move(e));
    return r;
  }
  std::shared_ptr<const Grammar> build(int root, size_t max_elems = 4'000'000) const;

 private:
  std::vector<std::string> names_;
  std::vector<GExpr> defs_;
};

}  // namespace sluice
