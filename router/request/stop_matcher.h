#ifndef RINGLANE_ROUTER_REQUEST_STOP_MATCHER_H_
#define RINGLANE_ROUTER_REQUEST_STOP_MATCHER_H_

// Stop conditions of one choice: stop strings on the text side, stop token ids
// and EOS on the token side.

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/types/span.h"

namespace ringlane::router {

// Most stop strings one request may give (OpenAI's limit, and
// GenerateRequest.stop's documented one).
inline constexpr int kMaxStopStrings = 4;

// Finds stop strings in a choice's streamed text and decides what may be sent
// to the client now. Fed the increments of an incremental detokenizer (whole
// UTF-8 characters), it returns the text that can no longer become part of a
// stop string and holds back the longest tail that is still the start of one.
// When a stop string completes, even one split across several increments, the
// text before it is released and the stop string itself never is; the choice
// is then over and later Feed calls return nothing. Matching is on bytes:
// with valid UTF-8 on both sides a match can only start and end on character
// boundaries, so released text stays valid UTF-8.
//
// When several stop strings could match, the one that completes first in the
// text wins (that is where token-by-token generation would have stopped); of
// those completing at the same byte, the longest (it starts earliest). So with
// "ab" and "abc", "abc" never matches.
//
// One per choice, used by the thread that streams that choice; not
// thread-safe. Each byte fed costs O(number of stop strings) amortized.
class StopMatcher {
 public:
  struct Output {
    // Text to append to the choice's output now (possibly empty).
    std::string text;
    // Index into the stop strings of the one that ended the choice in this
    // call, or -1.
    int matched_stop = -1;
  };

  // InvalidArgument when there are more than max_stop_strings strings, or one
  // is empty or not valid UTF-8. No stop strings is valid: everything passes
  // through at once. Duplicates are allowed (the first one reports).
  static absl::StatusOr<StopMatcher> Create(std::vector<std::string> stop_strings,
                                            int max_stop_strings = kMaxStopStrings);

  // Consumes the next decoded text increment.
  Output Feed(std::string_view increment);

  // The end of generation (length limit, EOS, stop token): no stop string can
  // complete any more, so the held-back text is released. Returns "" after a
  // stop string matched. Later Feed calls return nothing.
  std::string Finish();

  // True once a stop string matched.
  bool stopped() const { return matched_stop_ >= 0; }
  // The index of the matched stop string, or -1.
  int matched_stop() const { return matched_stop_; }
  const std::vector<std::string>& stop_strings() const { return stops_; }
  // Bytes currently held back (for tests and metrics).
  size_t held_bytes() const { return held_.size(); }

 private:
  explicit StopMatcher(std::vector<std::string> stops);

  std::vector<std::string> stops_;
  // failure_[s][i]: length of the longest proper prefix of stops_[s][0..i]
  // that is also its suffix (Knuth-Morris-Pratt), to advance matched_[s]
  // without rescanning text.
  std::vector<std::vector<int>> failure_;
  // matched_[s]: length of the longest suffix of all text fed so far that is a
  // prefix of stops_[s]; always < stops_[s].size() while not stopped.
  std::vector<int> matched_;
  // The tail of the text not yet released; its length is max(matched_), so
  // every partial match lies inside it.
  std::string held_;
  int matched_stop_ = -1;
  bool finished_ = false;
};

// The token side of stopping: EOS ids (unless ignore_eos) and the request's
// stop token ids. Either kind of token is returned to the client but its text
// is not. Immutable after Create; safe to share between threads.
class StopTokens {
 public:
  enum class Kind {
    kNone,         // keep generating
    kEos,          // one of the model's EOS tokens
    kStopTokenId,  // one of the request's stop_token_ids
  };

  // InvalidArgument when a stop token id is outside [0, vocab_size).
  // ignore_eos disables the EOS ids only; explicit stop token ids still stop.
  static absl::StatusOr<StopTokens> Create(absl::Span<const int32_t> stop_token_ids,
                                           absl::Span<const int32_t> eos_token_ids, bool ignore_eos,
                                           int32_t vocab_size);

  // A token that is both an EOS and a requested stop id reports
  // kStopTokenId, so the response can name the stop the client asked for.
  Kind Check(int32_t token_id) const;

 private:
  StopTokens() = default;

  // Sorted and unique; a request names a handful, so binary search beats a
  // hash set here.
  std::vector<int32_t> stop_ids_;
  std::vector<int32_t> eos_ids_;  // empty when ignore_eos
};

}  // namespace ringlane::router

#endif  // RINGLANE_ROUTER_REQUEST_STOP_MATCHER_H_
