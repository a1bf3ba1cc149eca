#ifndef RINGLANE_ROUTER_REQUEST_TOOL_PARSER_H_
#define RINGLANE_ROUTER_REQUEST_TOOL_PARSER_H_

// The output side of OpenAI tool calling and reasoning: turns a choice's
// generated text into content, reasoning_content and tool_calls, either for a
// whole response (ParseOutput) or as stream deltas (OutputStreamParser).
//
// ParseOutput is OutputStreamParser fed the whole text at once, and the
// stream parser decides nothing from where a chunk ends: it holds text back
// until the decision no longer depends on what follows. So for every chunking
// of a text, the deltas folded with AppendDelta equal ParseOutput's result.
//
// Rules, the same for every format (ToolFormat in tool_format.h):
// - Reasoning (options.reasoning): text up to "</think>" is reasoning_content;
//   a leading "<think>" is dropped (GLM-4.5+ templates open the block in the
//   prompt, so it may be absent). If "</think>" never comes, all text is
//   reasoning_content and content is empty, as in vLLM: a model asked to
//   think that is cut off mid-thought has given no answer.
// - A tool call inside the reasoning block (before "</think>") is still a tool
//   call and is cut out of reasoning_content (kHermes, kGlm45, kGlm47; Llama
//   3.1 JSON calls are whole messages, so they are looked for only after it).
// - Only calls to declared tools (tool_parameters' keys) are calls. A block
//   naming anything else stays text where it stands (content, or reasoning):
//   we do not invent calls to functions the client never offered.
// - Text outside calls is kept, before, between and after them, with
//   whitespace trimmed at both ends of content and of reasoning_content (the
//   "\n\n" after "</think>", the newlines around call blocks). Callers that
//   need the raw text with no tools and no reasoning should not use this.
// - Markers split across chunks ("<tool_", "</thi") are held back until they
//   complete or turn out to be plain text, which is then released.
// - A call is announced (id and whole name in its first delta) once its name
//   is complete and declared and, for the JSON formats, its arguments object
//   has begun (a string-form or arguments-first JSON call: once its object is
//   complete). From then on it stays a call: if the text ends first (a
//   max_tokens cut) or its arguments turn out malformed, its arguments are
//   closed at the last point where they were still valid JSON (e.g. an open
//   string or object is closed, a half-written member is dropped), and the rest
//   of that call's block is dropped. A call cut before it was announced is
//   text. Arguments are always a JSON object text once the call ends.
// - Ids are id_prefix + index (0, 1, 2, ... in the order calls appear), so the
//   whole and the streamed parse agree without shared state.
// Formats:
// - kHermes: "<tool_call>" ws {"name": N, "arguments": A} ws "</tool_call>";
//   "parameters" is accepted for "arguments". An object A is passed through
//   as written (raw control characters inside strings escaped); a JSON string
//   A holding an object becomes that object's text (trimmed). A missing A is
//   "{}". A missing "</tool_call>" after a complete object is tolerated.
// - kGlm45 / kGlm47: "<tool_call>NAME" then pairs
//   "<arg_key>K</arg_key><arg_value>V</arg_value>" then "</tool_call>", with or
//   without newlines between the parts. V is a raw string when the declared
//   parameter type is "string" (or lists "string"); otherwise V is parsed as
//   JSON, and taken as a string when that fails. Arguments are written as
//   {"K": V, "K2": V2} in argument order; no pairs is "{}".
// - kLlama31Json: after leading whitespace and an optional "<|python_tag|>",
//   a message starting with "{" may be calls: {"name": N, "parameters": A}
//   ("arguments" accepted) objects separated by ";". A message not starting
//   so, or whose first object is not a call to a declared tool, is content;
//   text after the calls (other than ";" and whitespace) is content.
//
// Held text is re-read on each Feed while a JSON call's header or a
// non-string GLM value is still open (both short in practice); everything
// else is scanned once.
//
// Not thread-safe: one OutputStreamParser per choice, used by the thread that
// streams that choice.

#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "nlohmann/json.hpp"
#include "router/request/tool_format.h"

namespace ringlane::router {

struct ToolCall {
  std::string id;
  std::string name;
  std::string arguments;  // JSON object text
};

struct ParsedOutput {
  std::string content;
  std::string reasoning_content;
  std::vector<ToolCall> tool_calls;
};

// One piece of one call. The first delta of a call carries its id and whole
// name (arguments may be empty); later ones carry only argument text, which
// the client appends.
struct ToolCallDelta {
  int index = 0;
  std::string id;
  std::string name;
  std::string arguments;
};

struct OutputDelta {
  std::string content;
  std::string reasoning_content;
  // In the order produced; consecutive pieces of one call are merged.
  std::vector<ToolCallDelta> tool_calls;

  bool empty() const { return content.empty() && reasoning_content.empty() && tool_calls.empty(); }
};

struct ToolParserOptions {
  ToolFormat format = ToolFormat::kHermes;
  // The prompt asked for (or the template opens) a <think> block.
  bool reasoning = false;
  // Declared tools: function name -> JSON schema of its parameters (the
  // request's "parameters"; may be null). Empty (no tools, or tool_choice
  // "none"): no calls are parsed.
  std::map<std::string, nlohmann::json> tool_parameters;
  // Ids are id_prefix + call index, e.g. "call_" + request id + "_".
  std::string id_prefix;
};

class OutputStreamParser {
 public:
  explicit OutputStreamParser(ToolParserOptions options);
  ~OutputStreamParser();
  OutputStreamParser(OutputStreamParser&&) noexcept;
  OutputStreamParser& operator=(OutputStreamParser&&) noexcept;

  // Consumes the next increment of generated text; returns what can be sent
  // now (possibly empty). Ignored after Finish().
  OutputDelta Feed(std::string_view chunk);

  // The end of generation: releases held text and ends an open call.
  OutputDelta Finish();

  // Whether any tool call was announced so far (finish_reason "tool_calls",
  // unless the gateway prefers "length" for a cut-off output).
  bool has_tool_calls() const { return next_index_ > 0; }

 private:
  enum class Mode {
    kThinkStart,   // reasoning: before an optional leading "<think>"
    kText,         // reasoning or content text, looking for markers
    kPlain,        // content with no more calls possible (Llama JSON)
    kLlamaStart,   // Llama JSON: at the start of content
    kJsonHeader,   // a JSON call object before it is announced
    kJsonArgs,     // streaming an announced call's arguments object
    kJsonTail,     // the members after the arguments, up to the object's "}"
    kHermesClose,  // after a hermes call object: optional "</tool_call>"
    kLlamaAfter,   // after a Llama call object: ";" or the end
    kGlmName,      // after "<tool_call>": the function name
    kGlmBetween,   // in a GLM call, between pairs
    kGlmKey,       // inside <arg_key>
    kGlmAfterKey,  // between </arg_key> and <arg_value>
    kGlmValue,     // inside a buffered <arg_value>
    kGlmStrValue,  // inside a string <arg_value>, streamed
    kDrop,         // the rest of a broken call's block
    kDone,
  };

  // One step of the state machine over the unconsumed text; false when it
  // needs more text (or, at eof, when nothing is left to do).
  bool Step(bool eof);
  bool StepText(bool eof);
  bool StepJsonHeader(bool eof);
  bool StepGlmName(bool eof);
  // Consumes whitespace and `marker` when `rest` starts with them; false
  // when what follows might still become the marker (more text needed),
  // true otherwise (marker consumed, or absent: nothing consumed).
  bool SkipOptionalMarker(std::string_view rest, std::string_view marker, bool eof);
  void Run(bool eof);

  void EmitText(std::string_view s);
  void StartCall(const std::string& name);
  void EmitArgs(std::string_view s);
  // Ends the open call with closers appended and returns to text.
  void EndCall(std::string_view closers);
  void RejectCall();
  Mode ContentStartMode() const;

  ToolParserOptions options_;
  bool tools_;  // tool_parameters non-empty
  bool finished_ = false;
  Mode mode_;
  bool in_reasoning_;
  std::string buf_;  // unconsumed text from pos_
  size_t pos_ = 0;
  // Where the JSON object starts in the unconsumed text (kJsonHeader).
  size_t call_offset_ = 0;
  // The marker text a rejected call gives back ("<tool_call>"; empty for
  // Llama, which gives the whole message).
  size_t marker_len_ = 0;
  int next_index_ = 0;
  int open_index_ = -1;
  std::string open_name_;
  // GLM: the current key and whether any pair was written.
  std::string glm_key_;
  bool glm_any_ = false;
  // kJsonArgs: the streaming scanner (opaque; defined in the .cc).
  struct ArgsState;
  std::unique_ptr<ArgsState> args_;
  // Trailing whitespace held per channel, and whether the channel has
  // non-whitespace yet (trimming both ends).
  struct TrimState {
    bool started = false;
    std::string pending;
  };
  TrimState content_trim_, reasoning_trim_;
  OutputDelta out_;
};

ParsedOutput ParseOutput(std::string_view text, const ToolParserOptions& options);

// Appends one delta to out as a client would: text concatenated, a call's
// first delta adds it, later ones append arguments.
void AppendDelta(const OutputDelta& delta, ParsedOutput* out);

inline bool HasToolCalls(const ParsedOutput& out) { return !out.tool_calls.empty(); }

}  // namespace ringlane::router

#endif  // RINGLANE_ROUTER_REQUEST_TOOL_PARSER_H_
