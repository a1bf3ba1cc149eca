// Grammar-constrained decoding: a context-free grammar over bytes, a
// matcher that follows generated text through it, and the token mask that
// says which tokens of a vocabulary may come next.
//
// The router keeps one Matcher per constrained choice, advances it with
// every sampled token's bytes, and sends the workers one mask per sampled
// position (LaneStep.allowed_tokens). A draft is cut at its first token the
// grammar refuses; the mask of each verify position is the one the matcher
// has after the drafts before it, so output is what plain decode gives.
#ifndef RINGLANE_ROUTER_GRAMMAR_GRAMMAR_H_
#define RINGLANE_ROUTER_GRAMMAR_GRAMMAR_H_

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "nlohmann/json.hpp"

namespace ringlane::router {
class Tokenizer;
}

namespace ringlane::router::grammar {

// A compiled grammar. Immutable; shared by every choice that uses it.
class Grammar;

// Builds grammars rule by rule; Build() compiles one rule as the start
// symbol. Not thread-safe; used once.
class GrammarBuilder {
 public:
  GrammarBuilder();
  ~GrammarBuilder();
  using Rule = int;

  Rule Literal(std::string_view bytes);
  Rule Seq(std::vector<Rule> parts);
  Rule Alt(std::vector<Rule> alternatives);
  // `part` between min and max times (max -1: unbounded).
  Rule Repeat(Rule part, int min, int max);
  // Any text (valid UTF-8) that does not contain `terminator`; the
  // terminator itself is not part of the rule.
  Rule TextUntil(std::string_view terminator);
  // The same, of min_chars to max_chars characters (max -1: unbounded);
  // when bounded, the text also leaves out the terminator's first byte.
  Rule TextUntil(std::string_view terminator, int min_chars, int max_chars);
  // Any JSON value / any JSON object (bounded whitespace, see FromJsonSchema).
  Rule JsonValue();
  Rule JsonObject();
  // A JSON value valid against `schema`. InvalidArgument naming
  // `field_path` + the schema's own path for what is not supported or
  // not a valid schema.
  absl::StatusOr<Rule> JsonSchema(const nlohmann::json& schema, std::string_view field_path);
  // The same for a schema parsed with nlohmann::ordered_json, whose object
  // properties keep their declaration order; a nlohmann::json schema has
  // its keys sorted, so its properties are emitted in key order.
  absl::StatusOr<Rule> JsonSchema(const nlohmann::ordered_json& schema,
                                  std::string_view field_path);

  std::shared_ptr<const Grammar> Build(Rule start);

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// response_format {"type": "json_object"}: one JSON object.
std::shared_ptr<const Grammar> JsonObjectGrammar();
// response_format json_schema: one JSON value valid against `schema`.
absl::StatusOr<std::shared_ptr<const Grammar>> JsonSchemaGrammar(const nlohmann::json& schema,
                                                                 std::string_view field_path);
absl::StatusOr<std::shared_ptr<const Grammar>> JsonSchemaGrammar(
    const nlohmann::ordered_json& schema, std::string_view field_path);

// Where generated text stands in a grammar. Copyable (a draft is checked on
// a copy).
class Matcher {
 public:
  explicit Matcher(std::shared_ptr<const Grammar> grammar);
  Matcher(const Matcher&);
  Matcher& operator=(const Matcher&);
  Matcher(Matcher&&) noexcept;
  Matcher& operator=(Matcher&&) noexcept;
  ~Matcher();

  // Feeds bytes; false, leaving the matcher as it was, when the grammar does
  // not allow them here.
  bool Advance(std::string_view bytes);
  bool CanAdvance(std::string_view bytes) const;
  // The text so far is a complete sentence (a stop token may follow).
  bool Accepting() const;
  // Accepting, and no byte may follow.
  bool Finished() const;

 private:
  friend class TokenMasker;
  struct State;
  std::shared_ptr<const Grammar> grammar_;
  std::unique_ptr<State> state_;
};

// A vocabulary as the bytes each token adds to the output text.
struct TokenVocabulary {
  // Bytes of token t in the middle of the output, and as the output's first
  // token (SentencePiece drops the dummy-prefix space there).
  std::vector<std::string> mid;
  std::vector<std::string> first;
  // Control tokens, skipped in output text: never allowed, except stop tokens.
  std::vector<bool> special;
  static absl::StatusOr<std::shared_ptr<const TokenVocabulary>> FromTokenizer(
      const Tokenizer& tokenizer);
};

// Computes masks of one vocabulary. Thread-safe after construction.
class TokenMasker {
 public:
  TokenMasker(std::shared_ptr<const TokenVocabulary> vocab, std::vector<int32_t> stop_ids);
  ~TokenMasker();

  // Bit t (byte t / 8, least significant bit first) set when token t may
  // come next: a non-special token whose bytes are non-empty and the
  // grammar allows, or a stop token when the matcher is accepting.
  // `at_start`: nothing generated yet (the `first` bytes apply).
  std::string Mask(const Matcher& m, bool at_start) const;
  bool Allows(const Matcher& m, bool at_start, int32_t token) const;
  // Advances `m` over the token's bytes (nothing for a stop token); false
  // when the grammar refuses it.
  bool Advance(Matcher* m, bool at_start, int32_t token) const;
  int32_t vocab_size() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace ringlane::router::grammar

#endif  // RINGLANE_ROUTER_GRAMMAR_GRAMMAR_H_
