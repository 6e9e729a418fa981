// Grammar: expressions compiled to flat rules; the stack-set recognizer (grammar.h).
#include "engine/grammar.h"

#include <algorithm>
#include <functional>
#include <map>

#include "core/error.h"

namespace sluice {

ByteSet byte_range(uint8_t lo, uint8_t hi) {
  ByteSet s{};
  for (int b = lo; b <= hi; ++b) s[b >> 6] |= uint64_t{1} << (b & 63);
  return s;
}

ByteSet byte_set_of(std::string_view bytes) {
  ByteSet s{};
  for (unsigned char b : bytes) s[b >> 6] |= uint64_t{1} << (b & 63);
  return s;
}

namespace {

GExpr make(GrammarExpr e) { return std::make_shared<const GrammarExpr>(std::move(e)); }

}  // namespace

GExpr g_lit(std::string text) {
  GrammarExpr e;
  e.kind = GrammarExpr::Kind::literal;
  e.text = std::move(text);
  return make(std::move(e));
}

GExpr g_bytes(const ByteSet& set) {
  GrammarExpr e;
  e.kind = GrammarExpr::Kind::bytes;
  e.set = set;
  return make(std::move(e));
}

GExpr g_seq(std::vector<GExpr> items) {
  if (items.size() == 1) return items[0];
  GrammarExpr e;
  e.kind = GrammarExpr::Kind::seq;
  e.items = std::move(items);
  return make(std::move(e));
}

GExpr g_alt(std::vector<GExpr> items) {
  if (items.size() == 1) return items[0];
  GrammarExpr e;
  e.kind = GrammarExpr::Kind::alt;
  e.items = std::move(items);
  return make(std::move(e));
}

GExpr g_repeat(GExpr item, int min, int max) {
  GrammarExpr e;
  e.kind = GrammarExpr::Kind::repeat;
  e.items = {std::move(item)};
  e.min = min;
  e.max = max;
  return make(std::move(e));
}

GExpr g_ref(int rule) {
  GrammarExpr e;
  e.kind = GrammarExpr::Kind::ref;
  e.rule = rule;
  return make(std::move(e));
}

// ---- building ----

int GrammarBuilder::declare(const std::string& name) {
  names_.push_back(name);
  defs_.push_back(nullptr);
  return static_cast<int>(names_.size()) - 1;
}

void GrammarBuilder::define(int rule, GExpr e) {
  SLUICE_CHECK(rule >= 0 && rule < static_cast<int>(defs_.size()), Status::invalid_argument, "grammar: no rule ", rule);
  defs_[static_cast<size_t>(rule)] = std::move(e);
}

namespace {

using Elem = Grammar::Elem;
using ElemKind = Grammar::ElemKind;

}  // namespace

struct GrammarCompiler {
  Grammar& g;
  size_t max_elems;
  std::map<ByteSet, int32_t> set_index;

  int32_t set_of(const ByteSet& s) {
    auto [it, fresh] = set_index.emplace(s, static_cast<int32_t>(g.sets_.size()));
    if (fresh) g.sets_.push_back(s);
    return it->second;
  }
  int new_rule(const std::string& name) {
    g.rule_alts_.emplace_back();
    g.rule_names_.push_back(name);
    return static_cast<int>(g.rule_alts_.size()) - 1;
  }
  void add_alt(int rule, const std::vector<Elem>& elems) {
    SLUICE_CHECK(g.elems_.size() + elems.size() + 1 <= max_elems, Status::invalid_argument,
                 "the grammar is too large (over ", max_elems, " elements); simplify the schema (long maxLength, "
                 "maxItems or many enum values)");
    g.rule_alts_[static_cast<size_t>(rule)].push_back(static_cast<int32_t>(g.elems_.size()));
    g.elems_.insert(g.elems_.end(), elems.begin(), elems.end());
    g.elems_.push_back({ElemKind::end, 0});
  }
  // The alternatives of e into rule.
  void define(int rule, const GExpr& e) {
    if (e->kind == GrammarExpr::Kind::alt) {
      for (const GExpr& item : e->items) {
        std::vector<Elem> elems;
        inline_into(item, elems, rule);
        add_alt(rule, elems);
      }
    } else {
      std::vector<Elem> elems;
      inline_into(e, elems, rule);
      add_alt(rule, elems);
    }
  }
  // A helper rule holding e.
  int helper(const GExpr& e, int owner) {
    const int r = new_rule(g.rule_names_[static_cast<size_t>(owner)] + "~");
    define(r, e);
    return r;
  }
  static bool simple(const GExpr& e) {
    return e->kind == GrammarExpr::Kind::bytes || e->kind == GrammarExpr::Kind::ref ||
           (e->kind == GrammarExpr::Kind::literal && e->text.size() <= 8);
  }
  // e's elements appended to out (one alternative); owner names helper rules.
  void inline_into(const GExpr& e, std::vector<Elem>& out, int owner) {
    switch (e->kind) {
      case GrammarExpr::Kind::bytes: out.push_back({ElemKind::bytes, set_of(e->set)}); return;
      case GrammarExpr::Kind::literal:
        for (unsigned char c : e->text) out.push_back({ElemKind::bytes, set_of(byte_set_of(std::string(1, static_cast<char>(c))))});
        return;
      case GrammarExpr::Kind::ref: out.push_back({ElemKind::ref, e->rule}); return;
      case GrammarExpr::Kind::seq:
        for (const GExpr& item : e->items) inline_into(item, out, owner);
        return;
      case GrammarExpr::Kind::alt: out.push_back({ElemKind::ref, helper(e, owner)}); return;
      case GrammarExpr::Kind::repeat: {
        const GExpr& item = e->items[0];
        SLUICE_CHECK(e->min >= 0 && (e->max < 0 || e->max >= e->min), Status::invalid_argument,
                     "grammar: repetition {", e->min, ",", e->max, "}");
        SLUICE_CHECK(e->min <= 100000 && e->max <= 100000, Status::invalid_argument,
                     "the grammar is too large (a repetition of up to ", std::max(e->min, e->max),
                     "); simplify the schema");
        // The unit: inline when small, else its own rule referenced each time.
        const GExpr unit = simple(item) ? item : g_ref(helper(item, owner));
        for (int i = 0; i < e->min; ++i) inline_into(unit, out, owner);
        if (e->max == e->min) return;
        if (e->max < 0) {  // star := unit star | ()
          const int star = new_rule(g.rule_names_[static_cast<size_t>(owner)] + "*");
          std::vector<Elem> loop;
          inline_into(unit, loop, owner);
          loop.push_back({ElemKind::ref, star});
          add_alt(star, loop);
          add_alt(star, {});
          out.push_back({ElemKind::ref, star});
          return;
        }
        // opt_k := unit opt_{k-1} | (), opt_0 empty.
        int inner = -1;
        for (int k = 1; k <= e->max - e->min; ++k) {
          const int r = new_rule(g.rule_names_[static_cast<size_t>(owner)] + "?");
          std::vector<Elem> one;
          inline_into(unit, one, owner);
          if (inner >= 0) one.push_back({ElemKind::ref, inner});
          add_alt(r, one);
          add_alt(r, {});
          inner = r;
        }
        out.push_back({ElemKind::ref, inner});
        return;
      }
    }
  }
};

std::shared_ptr<const Grammar> GrammarBuilder::build(int root, size_t max_elems) const {
  auto g = std::make_shared<Grammar>();
  GrammarCompiler c{*g, max_elems, {}};
  for (const std::string& n : names_) c.new_rule(n);  // user rules keep their ids
  for (size_t r = 0; r < defs_.size(); ++r) {
    SLUICE_CHECK(defs_[r] != nullptr, Status::invalid_argument, "grammar: rule '", names_[r], "' is never defined");
    c.define(static_cast<int>(r), defs_[r]);
  }
  SLUICE_CHECK(root >= 0 && root < static_cast<int>(defs_.size()), Status::invalid_argument, "grammar: no root rule");
  g->root_ = root;
  // Nullable rules (a fixpoint), then left recursion: an edge r -> s when s is referenced with
  // only nullable elements before it in one of r's alternatives.
  const size_t n_rules = g->rule_alts_.size();
  std::vector<char> nullable(n_rules, 0);
  for (bool changed = true; changed;) {
    changed = false;
    for (size_t r = 0; r < n_rules; ++r) {
      if (nullable[r]) continue;
      for (int32_t a : g->rule_alts_[r]) {
        bool all = true;
        for (int32_t p = a; g->elems_[p].kind != ElemKind::end && all; ++p)
          all = g->elems_[p].kind == ElemKind::ref && nullable[static_cast<size_t>(g->elems_[p].arg)];
        if (all) {
          nullable[r] = 1;
          changed = true;
          break;
        }
      }
    }
  }
  std::vector<std::vector<int32_t>> left(n_rules);
  for (size_t r = 0; r < n_rules; ++r)
    for (int32_t a : g->rule_alts_[r])
      for (int32_t p = a; g->elems_[p].kind == ElemKind::ref; ++p) {
        left[r].push_back(g->elems_[p].arg);
        if (!nullable[static_cast<size_t>(g->elems_[p].arg)]) break;
      }
  std::vector<char> mark(n_rules, 0);  // 0 new, 1 on the path, 2 done
  std::function<void(size_t)> visit = [&](size_t r) {
    mark[r] = 1;
    for (int32_t s : left[r]) {
      SLUICE_CHECK(mark[static_cast<size_t>(s)] != 1, Status::invalid_argument, "grammar: rule '", g->rule_names_[r],
                   "' is left-recursive or repeats something that can be empty (a $ref cycle that reads nothing?)");
      if (mark[static_cast<size_t>(s)] == 0) visit(static_cast<size_t>(s));
    }
    mark[r] = 2;
  };
  for (size_t r = 0; r < n_rules; ++r)
    if (mark[r] == 0) visit(r);
  return g;
}

// ---- recognizing ----

void Grammar::normalize(State& s) {
  std::sort(s.begin(), s.end());
  s.erase(std::unique(s.begin(), s.end()), s.end());
}

void Grammar::expand(Stack& st, State& out) const {
  if (st.empty() || elems_[static_cast<size_t>(st.back())].kind == ElemKind::bytes) {
    out.push_back(st);
    return;
  }
  const int32_t pos = st.back();
  const int32_t rule = elems_[static_cast<size_t>(pos)].arg;
  st.pop_back();
  if (elems_[static_cast<size_t>(pos) + 1].kind != ElemKind::end) st.push_back(pos + 1);
  for (int32_t a : rule_alts_[static_cast<size_t>(rule)]) {
    Stack copy = st;
    push_expand(copy, a, out);
  }
}

void Grammar::push_expand(Stack& st, int32_t pos, State& out) const {
  if (elems_[static_cast<size_t>(pos)].kind != ElemKind::end) st.push_back(pos);
  expand(st, out);
}

Grammar::State Grammar::initial() const {
  State out;
  Stack st{};
  for (int32_t a : rule_alts_[static_cast<size_t>(root_)]) {
    Stack copy = st;
    push_expand(copy, a, out);
  }
  normalize(out);
  return out;
}

Grammar::State Grammar::advance(const State& s, uint8_t byte) const {
  State out;
  for (const Stack& st : s) {
    if (st.empty()) continue;
    const int32_t pos = st.back();
    if (!byte_in(sets_[static_cast<size_t>(elems_[static_cast<size_t>(pos)].arg)], byte)) continue;
    Stack next(st.begin(), st.end() - 1);
    push_expand(next, pos + 1, out);
  }
  normalize(out);
  return out;
}

Grammar::State Grammar::advance(const State& s, std::string_view bytes) const {
  State cur = s;
  for (unsigned char b : bytes) {
    if (cur.empty()) break;
    cur = advance(cur, b);
  }
  return cur;
}

ByteSet Grammar::next_bytes(const State& s) const {
  ByteSet out{};
  for (const Stack& st : s)
    if (!st.empty()) {
      const ByteSet& set = sets_[static_cast<size_t>(elems_[static_cast<size_t>(st.back())].arg)];
      for (size_t w = 0; w < 4; ++w) out[w] |= set[w];
    }
  return out;
}

bool Grammar::complete(const State& s) {
  return std::any_of(s.begin(), s.end(), [](const Stack& st) { return st.empty(); });
}

bool Grammar::can_continue(const State& s) {
  return std::any_of(s.begin(), s.end(), [](const Stack& st) { return !st.empty(); });
}

bool Grammar::matches(std::string_view text) const { return complete(advance(initial(), text)); }

}  // namespace sluice
