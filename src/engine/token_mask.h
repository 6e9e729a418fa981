// Token masks for constrained sampling: which tokens of the whole vocabulary may come next
// under a grammar (engine/grammar.h), so that the sampler draws only among them.
//
// TokenVocabulary holds each token's bytes (byte-level BPE and SentencePiece vocabularies
// alike: Tokenizer::token_text) in a trie laid out in preorder. GrammarMatcher runs a grammar
// over those bytes as a DFA built lazily: each distinct recognizer state (a set of stacks) is
// interned once, and a transition (state, byte) is computed the first time it is taken. A
// state's mask is one walk of the trie, following transitions and skipping the subtree of every
// prefix that leads nowhere; masks are cached by state, so a state seen again (a long string's
// body, the same field of the next array item, the same schema in the next request) costs a
// lookup. Special tokens (<|im_end|>, ...) are left out of masks except those a grammar names
// (a tool-call format's markers); the end of sequence is allowed exactly where the grammar
// is complete.
//
// TokenConstraint is what the batch engine sees: the allowed tokens before each draw, the
// drawn token after it, and whether the output must end.
#pragma once

#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <unordered_map>
#include <vector>

#include "engine/grammar.h"
#include "format/tokenizer.h"

namespace sluice {

class TokenConstraint {
 public:
  virtual ~TokenConstraint() = default;
  // The tokens that may come next as bits (bit t of word t / 64; tokens past the words are
  // not allowed), the end of sequence among them where the output may end. Never empty
  // unless must_end().
  virtual const std::vector<uint64_t>& allowed() = 0;
  // The token drawn (the end of sequence included).
  virtual void accept(int32_t token) = 0;
  // Nothing but the end may follow: the engine ends the request.
  virtual bool must_end() const = 0;
};

inline bool mask_has(const std::vector<uint64_t>& bits, int64_t t) {
  return t >= 0 && static_cast<size_t>(t >> 6) < bits.size() && ((bits[static_cast<size_t>(t >> 6)] >> (t & 63)) & 1);
}

class TokenVocabulary {
 public:
  // ~0.1 s for 150k tokens; share one per tokenizer.
  explicit TokenVocabulary(const Tokenizer& tokenizer);

  struct Node {
    uint8_t byte = 0;
    uint16_t depth = 0;          // bytes from the root (1 for a first byte)
    uint32_t end = 0;            // the index past this node's subtree
    uint32_t tok_begin = 0, tok_end = 0;  // tokens whose bytes end here: tokens_[begin, end)
    uint32_t sub_tok_end = 0;    // the subtree's tokens: tokens_[tok_begin, sub_tok_end)
  };
  int32_t size() const { return static_cast<int32_t>(bytes_.size()); }
  const std::string& bytes(int32_t id) const { return bytes_[static_cast<size_t>(id)]; }
  bool special(int32_t id) const { return special_[static_cast<size_t>(id)] != 0; }
  const std::vector<Node>& nodes() const { return nodes_; }
  const std::vector<int32_t>& node_tokens() const { return tokens_; }
  // The bytes below a node (its descendants' bytes), to accept a whole subtree at once.
  const ByteSet& below(size_t node) const { return below_[node]; }
  int max_depth() const { return max_depth_; }
  std::optional<int32_t> find(const std::string& text) const;  // a special token by its content

 private:
  std::vector<std::string> bytes_;
  std::vector<uint8_t> special_;
  std::vector<Node> nodes_;     // preorder; nodes_[0] is the root (depth 0)
  std::vector<int32_t> tokens_;
  std::vector<ByteSet> below_;
  int max_depth_ = 0;
  std::unordered_map<std::string, int32_t> special_ids_;
};

class GrammarMatcher {
 public:
  // specials: special tokens the grammar may take by their content (tool-call markers).
  GrammarMatcher(std::shared_ptr<const Grammar> grammar, std::shared_ptr<const TokenVocabulary> vocab,
                 std::vector<int32_t> specials = {});

  int32_t initial();                         // a state id; 0 is the dead state
  int32_t advance(int32_t state, int32_t token);
  int32_t advance_bytes(int32_t state, const std::string& bytes);
  bool complete(int32_t state);
  bool can_continue(int32_t state);
  // The tokens (bytes only, no end of sequence) that keep the grammar alive from state.
  std::shared_ptr<const std::vector<uint64_t>> mask(int32_t state);

  const TokenVocabulary& vocab() const { return *vocab_; }
  size_t n_states();
  uint64_t masks_computed();  // trie walks (mask cache misses)

 private:
  int32_t intern(Grammar::State s);
  int32_t step(int32_t state, uint8_t byte);
  // Whether every byte of set leads from state back to state (a string's body: any token
  // made only of such bytes is allowed, and its subtree need not be walked).
  bool loops_on(int32_t state, const ByteSet& set);
  std::shared_ptr<const std::vector<uint64_t>> walk(int32_t state);

  std::shared_ptr<const Grammar> grammar_;
  std::shared_ptr<const TokenVocabulary> vocab_;
  std::vector<int32_t> specials_;
  std::mutex mu_;
  std::vector<Grammar::State> states_;
  std::vector<ByteSet> next_bytes_;  // per state: the bytes that lead somewhere
  std::vector<int32_t> trans_;  // [state * 256 + byte]: -1 not computed yet
  std::unordered_map<std::string, int32_t> ids_;
  std::unordered_map<int32_t, std::shared_ptr<const std::vector<uint64_t>>> masks_;
  uint64_t walks_ = 0;
};

// A request's walk through a grammar: TokenConstraint over a (shared) matcher.
class GrammarConstraint : public TokenConstraint {
 public:
  GrammarConstraint(std::shared_ptr<GrammarMatcher> matcher, std::optional<int32_t> eos_id);
  const std::vector<uint64_t>& allowed() override;
  void accept(int32_t token) override;
  bool must_end() const override;
  bool complete() const;

 private:
  std::shared_ptr<GrammarMatcher> matcher_;
  std::optional<int32_t> eos_;
  int32_t state_;
  bool complete_ = false, can_continue_ = true, ended_ = false;
  std::vector<uint64_t> bits_;
};

}  // namespace sluice
