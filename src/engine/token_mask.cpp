// Token masks (token_mask.h): the vocabulary trie, the lazily built DFA, masks by state.
#include "engine/token_mask.h"

#include <algorithm>
#include <numeric>

#include "core/error.h"

namespace sluice {

TokenVocabulary::TokenVocabulary(const Tokenizer& tok) {
  const int32_t n = tok.vocab_size();
  bytes_.resize(static_cast<size_t>(n));
  special_.assign(static_cast<size_t>(n), 0);
  std::vector<int32_t> order;
  for (int32_t id = 0; id < n; ++id) {
    try {
      bytes_[static_cast<size_t>(id)] = tok.token_text(id);
    } catch (const Error&) {
      continue;  // a gap in the vocabulary
    }
    if (tok.is_special(id)) {
      special_[static_cast<size_t>(id)] = 1;
      special_ids_.emplace(bytes_[static_cast<size_t>(id)], id);
      continue;
    }
    if (!bytes_[static_cast<size_t>(id)].empty()) order.push_back(id);
  }
  std::sort(order.begin(), order.end(), [&](int32_t a, int32_t b) {
    const int c = bytes_[static_cast<size_t>(a)].compare(bytes_[static_cast<size_t>(b)]);
    return c < 0 || (c == 0 && a < b);
  });
  // Preorder nodes from the sorted strings: a token adds a node for each byte past its
  // common prefix with the previous one; open[d] is the node at depth d on the current path.
  nodes_.push_back({});
  std::vector<uint32_t> open{0};
  const std::string* prev = nullptr;
  for (int32_t id : order) {
    const std::string& s = bytes_[static_cast<size_t>(id)];
    size_t common = 0;
    if (prev)
      while (common < s.size() && common < prev->size() && s[common] == (*prev)[common]) ++common;
    // Close the nodes deeper than the common prefix.
    while (open.size() > common + 1) {
      nodes_[open.back()].end = static_cast<uint32_t>(nodes_.size());
      nodes_[open.back()].sub_tok_end = static_cast<uint32_t>(tokens_.size());
      open.pop_back();
    }
    for (size_t d = common; d < s.size(); ++d) {
      Node node;
      node.byte = static_cast<uint8_t>(s[d]);
      node.depth = static_cast<uint16_t>(std::min<size_t>(d + 1, 65535));
      node.tok_begin = node.tok_end = static_cast<uint32_t>(tokens_.size());
      open.push_back(static_cast<uint32_t>(nodes_.size()));
      nodes_.push_back(node);
    }
    Node& last = nodes_[open.back()];
    if (last.tok_end != tokens_.size()) last.tok_begin = static_cast<uint32_t>(tokens_.size());
    tokens_.push_back(id);
    last.tok_end = static_cast<uint32_t>(tokens_.size());
    max_depth_ = std::max(max_depth_, static_cast<int>(s.size()));
    prev = &s;
  }
  while (!open.empty()) {
    nodes_[open.back()].end = static_cast<uint32_t>(nodes_.size());
    nodes_[open.back()].sub_tok_end = static_cast<uint32_t>(tokens_.size());
    open.pop_back();
  }
  // Bytes below each node, children before parents (reverse preorder).
  below_.assign(nodes_.size(), ByteSet{});
  for (size_t i = nodes_.size(); i-- > 0;)
    for (size_t c = i + 1; c < nodes_[i].end; c = nodes_[c].end) {
      for (size_t w = 0; w < 4; ++w) below_[i][w] |= below_[c][w];
      below_[i][nodes_[c].byte >> 6] |= uint64_t{1} << (nodes_[c].byte & 63);
    }
  SLUICE_CHECK(max_depth_ < 65535, Status::invalid_argument, "a token of ", max_depth_, " bytes");
}

std::optional<int32_t> TokenVocabulary::find(const std::string& text) const {
  const auto it = special_ids_.find(text);
  if (it == special_ids_.end()) return std::nullopt;
  return it->second;
}

// ---- GrammarMatcher ----

GrammarMatcher::GrammarMatcher(std::shared_ptr<const Grammar> grammar, std::shared_ptr<const TokenVocabulary> vocab,
                               std::vector<int32_t> specials)
    : grammar_(std::move(grammar)), vocab_(std::move(vocab)), specials_(std::move(specials)) {
  std::lock_guard<std::mutex> lk(mu_);
  intern({});  // 0: dead
}

int32_t GrammarMatcher::intern(Grammar::State s) {
  std::string key;
  for (const Grammar::Stack& st : s) {  // each stack: its size, then its positions
    const int32_t n = static_cast<int32_t>(st.size());
    key.append(reinterpret_cast<const char*>(&n), sizeof n);
    key.append(reinterpret_cast<const char*>(st.data()), st.size() * sizeof(int32_t));
  }
  auto [it, fresh] = ids_.emplace(std::move(key), static_cast<int32_t>(states_.size()));
  if (fresh) {
    next_bytes_.push_back(grammar_->next_bytes(s));
    states_.push_back(std::move(s));
    trans_.resize(trans_.size() + 256, -1);
  }
  return it->second;
}

int32_t GrammarMatcher::step(int32_t state, uint8_t byte) {
  const size_t at = static_cast<size_t>(state) * 256 + byte;
  if (trans_[at] >= 0) return trans_[at];
  const bool alive = byte_in(next_bytes_[static_cast<size_t>(state)], byte);
  const int32_t next = alive ? intern(grammar_->advance(states_[static_cast<size_t>(state)], byte)) : 0;
  trans_[at] = next;  // after intern: trans_ may have grown
  return next;
}

int32_t GrammarMatcher::initial() {
  std::lock_guard<std::mutex> lk(mu_);
  return intern(grammar_->initial());
}

int32_t GrammarMatcher::advance_bytes(int32_t state, const std::string& bytes) {
  std::lock_guard<std::mutex> lk(mu_);
  for (unsigned char b : bytes) {
    if (state == 0) break;
    state = step(state, b);
  }
  return state;
}

int32_t GrammarMatcher::advance(int32_t state, int32_t token) {
  if (token < 0 || token >= vocab_->size()) return 0;
  return advance_bytes(state, vocab_->bytes(token));
}

bool GrammarMatcher::complete(int32_t state) {
  std::lock_guard<std::mutex> lk(mu_);
  return Grammar::complete(states_[static_cast<size_t>(state)]);
}

bool GrammarMatcher::can_continue(int32_t state) {
  std::lock_guard<std::mutex> lk(mu_);
  return Grammar::can_continue(states_[static_cast<size_t>(state)]);
}

size_t GrammarMatcher::n_states() {
  std::lock_guard<std::mutex> lk(mu_);
  return states_.size();
}

uint64_t GrammarMatcher::masks_computed() {
  std::lock_guard<std::mutex> lk(mu_);
  return walks_;
}

bool GrammarMatcher::loops_on(int32_t state, const ByteSet& set) {
  for (size_t w = 0; w < 4; ++w)
    for (uint64_t bits = set[w]; bits != 0; bits &= bits - 1) {
      const uint8_t b = static_cast<uint8_t>(w * 64 + static_cast<size_t>(__builtin_ctzll(bits)));
      if (step(state, b) != state) return false;
    }
  return true;
}

std::shared_ptr<const std::vector<uint64_t>> GrammarMatcher::walk(int32_t state) {
  ++walks_;
  auto bits = std::make_shared<std::vector<uint64_t>>((static_cast<size_t>(vocab_->size()) + 63) / 64, 0);
  const auto& nodes = vocab_->nodes();
  const auto& toks = vocab_->node_tokens();
  std::vector<int32_t> at(static_cast<size_t>(vocab_->max_depth()) + 1);
  at[0] = state;
  // Preorder: a node's parent state is at[depth - 1]; a dead prefix skips its subtree.
  for (size_t i = 1; i < nodes.size();) {
    const TokenVocabulary::Node& n = nodes[i];
    const int32_t s = step(at[n.depth - 1u], n.byte);
    if (s == 0) {
      i = n.end;
      continue;
    }
    at[n.depth] = s;
    if (n.end > i + 1 && loops_on(s, vocab_->below(i))) {  // the whole subtree is allowed
      for (uint32_t k = n.tok_begin; k < n.sub_tok_end; ++k) {
        const int32_t t = toks[k];
        (*bits)[static_cast<size_t>(t) >> 6] |= uint64_t{1} << (t & 63);
      }
      i = n.end;
      continue;
    }
    for (uint32_t k = n.tok_begin; k < n.tok_end; ++k) {
      const int32_t t = toks[k];
      (*bits)[static_cast<size_t>(t) >> 6] |= uint64_t{1} << (t & 63);
    }
    ++i;
  }
  for (int32_t t : specials_) {
    int32_t s = state;
    for (unsigned char b : vocab_->bytes(t)) {
      s = step(s, b);
      if (s == 0) break;
    }
    if (s != 0) (*bits)[static_cast<size_t>(t) >> 6] |= uint64_t{1} << (t & 63);
  }
  return bits;
}

std::shared_ptr<const std::vector<uint64_t>> GrammarMatcher::mask(int32_t state) {
  std::lock_guard<std::mutex> lk(mu_);
  if (const auto it = masks_.find(state); it != masks_.end()) return it->second;
  if (masks_.size() >= 1024) masks_.clear();  // ~20 MB at 150k tokens; recomputed on demand
  auto bits = walk(state);
  masks_.emplace(state, bits);
  return bits;
}

// ---- GrammarConstraint ----

GrammarConstraint::GrammarConstraint(std::shared_ptr<GrammarMatcher> matcher, std::optional<int32_t> eos_id)
    : matcher_(std::move(matcher)), eos_(eos_id), state_(matcher_->initial()) {
  complete_ = matcher_->complete(state_);
  can_continue_ = matcher_->can_continue(state_);
}

const std::vector<uint64_t>& GrammarConstraint::allowed() {
  const auto mask = matcher_->mask(state_);
  bits_ = *mask;
  if (complete_ && eos_) {
    const size_t w = static_cast<size_t>(*eos_) >> 6;
    if (w >= bits_.size()) bits_.resize(w + 1, 0);
    bits_[w] |= uint64_t{1} << (*eos_ & 63);
  }
  return bits_;
}

void GrammarConstraint::accept(int32_t token) {
  if (eos_ && token == *eos_) {
    ended_ = true;
    return;
  }
  state_ = matcher_->advance(state_, token);
  complete_ = matcher_->complete(state_);
  can_continue_ = matcher_->can_continue(state_);
}

bool GrammarConstraint::must_end() const { return ended_ || !can_continue_; }

bool GrammarConstraint::complete() const { return complete_; }

}  // namespace sluice
