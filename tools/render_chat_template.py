#!/usr/bin/env python3
"""Renders the chat templates under router/request/testdata/chat_templates/
with jinja2 for the tool-calling conversations below and writes the results
as C++ test cases (router/request/chat_template_tool_cases.inc), the ground
truth that chat_template_test.cc checks the built-in renderers against, and
each template as a tokenizer_config.json for DetectChatTemplate
(chat_template_detect_cases.inc).

  python3 tools/render_chat_template.py            # rewrite the .inc
  python3 tools/render_chat_template.py --check    # exit 1 if it is stale

Needs only python3 and jinja2 (Debian's python3-jinja2). transformers is not
needed: render() sets up jinja2 the way transformers' apply_chat_template
does (its chat_template_utils), which is what "the published template's
output" means in practice:
  - ImmutableSandboxedEnvironment, trim_blocks, lstrip_blocks, loopcontrols;
  - tojson replaced by json.dumps(x, ensure_ascii=False, indent=indent,
    separators=separators, sort_keys=False): keys keep their order, non-ASCII
    stays raw and nothing is HTML-escaped. Jinja's own tojson (sorted keys,
    \\u003c for <, >, &, ') is NOT what a served Hugging Face model sees, and
    the GLM templates' tojson(ensure_ascii=False) would not even run with it;
  - raise_exception(msg) raises; a case whose template raises is written as an
    expected InvalidArgument.
Messages are given as an OpenAI client sends them; as vLLM does before
rendering, each tool call's "arguments" JSON text is parsed into an object.
"""

import argparse
import json
import os
import sys

import jinja2
from jinja2.ext import loopcontrols
from jinja2.sandbox import ImmutableSandboxedEnvironment

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TEMPLATES = os.path.join(ROOT, "router", "request", "testdata", "chat_templates")
OUT = os.path.join(ROOT, "router", "request", "chat_template_tool_cases.inc")
# DetectChatTemplate cases: each template text as a tokenizer_config.json.
DETECT_OUT = os.path.join(ROOT, "router", "request", "chat_template_detect_cases.inc")

# --chat_template name -> (template file, bos_token). Where each text comes
# from is in testdata/chat_templates/README.md.
FAMILIES = {
    "plain": ("plain.jinja", ""),
    "chatml": ("chatml.jinja", ""),
    "qwen2": ("qwen2.5.jinja", ""),
    "llama3.1": ("llama3.1.jinja", "<|begin_of_text|>"),
    "glm4.5": ("glm4.5.jinja", ""),
    "glm4.7": ("glm4.7.jinja", ""),
}


class TemplateError(Exception):
    pass


def raise_exception(message):
    raise TemplateError(message)


def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
    return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators,
                      sort_keys=sort_keys)


def render(template_text, messages, tools, add_generation_prompt, bos_token):
    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                        extensions=[loopcontrols])
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    kwargs = {"messages": messages, "add_generation_prompt": add_generation_prompt,
              "bos_token": bos_token, "eos_token": ""}
    if tools is not None:
        kwargs["tools"] = tools
    return env.from_string(template_text).render(**kwargs)


# ---- the conversations -----------------------------------------------------

def call(call_id, name, arguments_text):
    return {"id": call_id, "name": name, "arguments": arguments_text}


def msg(role, content="", tool_calls=None, tool_call_id="", name="", reasoning_content=""):
    return {"role": role, "content": content, "tool_calls": tool_calls or [],
            "tool_call_id": tool_call_id, "name": name, "reasoning_content": reasoning_content}


TOOLS = [
    {"type": "function", "function": {
        "name": "get_weather",
        "description": "Weather for a city, in °C.\nUse <b>only</b> when asked & it's needed.",
        "parameters": {"type": "object", "properties": {
            "city": {"type": "string", "description": "City name, e.g. Zürich"},
            "unit": {"type": "string", "enum": ["c", "f"]},
            "days": {"type": "integer", "minimum": 1, "maximum": 7.5}},
            "required": ["city"], "additionalProperties": False}}},
    {"type": "function", "function": {
        "name": "get_time", "description": "Current time",
        "parameters": {"type": "object", "properties": {}}}},
]

UNICODE_ARGS = ('{"to": "東京 \\"desk\\"", "text": "line1\\nline2 <ok> & \'q\' \\t\\u0001", '
                '"n": 3, "ratio": 0.25, "big": 1e20, "small": 1.5e-7, "round": 100.0, '
                '"neg_zero": -0.0, "sci": 1.5E3, "huge": 12345678901234567890, '
                '"flag": true, "nothing": null, "list": [1, "ü", {"k": []}], '
                '"nested": {"b": {"a": "c"}, "a": {}}}')

CASES = [
    ("tools_first_turn", TOOLS, [msg("user", "What's the weather in Zürich?")], True),
    ("system_parallel_calls_and_results", TOOLS, [
        msg("system", "You are terse."),
        msg("user", "Weather in Paris, and the time?"),
        msg("assistant", "Let me check.", tool_calls=[
            call("call_1", "get_weather", '{"city": "Paris", "unit": "c"}'),
            call("call_2", "get_time", "{}")]),
        msg("tool", '{"temp": 21}', tool_call_id="call_1", name="get_weather"),
        msg("tool", "12:00", tool_call_id="call_2", name="get_time"),
        msg("assistant", "Paris: 21°C at noon."),
        msg("user", "Thanks"),
    ], True),
    ("sequential_calls", TOOLS, [
        msg("user", "  Weather in Oslo?  "),
        msg("assistant", "", tool_calls=[call("c1", "get_weather", '{"city":"Oslo"}')]),
        msg("tool", '{"temp": -3}', tool_call_id="c1"),
        msg("assistant", "", tool_calls=[call("c2", "get_time", "{}")]),
        msg("tool", "09:30", tool_call_id="c2"),
        msg("assistant", "It is -3 at 09:30."),
    ], False),
    ("zero_argument_call", TOOLS, [
        msg("user", "What time is it?"),
        msg("assistant", "", tool_calls=[call("t1", "get_time", "{}")]),
        msg("tool", "12:00", tool_call_id="t1"),
    ], True),
    ("unicode_and_number_arguments", TOOLS, [
        msg("user", "Send hi to 東京"),
        msg("assistant", "", tool_calls=[call("u1", "send_message", UNICODE_ARGS)]),
        msg("tool", "送信しました ✓", tool_call_id="u1"),
    ], True),
    ("calls_without_tools", None, [
        msg("user", "hi"),
        msg("assistant", "", tool_calls=[call("x1", "get_time", "{}")]),
        msg("tool", "12:00", tool_call_id="x1"),
    ], True),
    ("empty_tools_list", [], [msg("system", "Be brief."), msg("user", "hi")], True),
    ("reasoning_kept_after_last_user_only", TOOLS, [
        msg("user", "Q1"),
        msg("assistant", "A1", reasoning_content="old thoughts"),
        msg("user", "Q2"),
        msg("assistant", "", reasoning_content="  new thoughts\n",
            tool_calls=[call("r1", "get_time", "{}")]),
        msg("tool", "12:00", tool_call_id="r1"),
        msg("assistant", "<think>\ninline thoughts\n</think>\n\n It is noon. "),
    ], True),
]


def to_template_message(m):
    out = {"role": m["role"], "content": m["content"]}
    if m["tool_calls"]:
        out["tool_calls"] = [{"id": c["id"], "type": "function", "function": {
            "name": c["name"], "arguments": json.loads(c["arguments"])}}
            for c in m["tool_calls"]]
    if m["tool_call_id"]:
        out["tool_call_id"] = m["tool_call_id"]
    if m["name"]:
        out["name"] = m["name"]
    if m["reasoning_content"]:
        out["reasoning_content"] = m["reasoning_content"]
    return out


# ---- C++ output ------------------------------------------------------------

def cpp_string(s, indent):
    """A C++ string literal for s (UTF-8 kept as is), split after newlines."""
    def esc(piece):
        out = []
        for ch in piece:
            if ch == "\\":
                out.append("\\\\")
            elif ch == '"':
                out.append('\\"')
            elif ch == "\n":
                out.append("\\n")
            elif ch == "\t":
                out.append("\\t")
            elif ord(ch) < 0x20 or ord(ch) == 0x7f:
                out.append("\\%03o" % ord(ch))
            else:
                out.append(ch)
        return '"' + "".join(out) + '"'
    lines = s.split("\n")
    pieces = [line + "\n" for line in lines[:-1]] + ([lines[-1]] if lines[-1] else [])
    if not pieces:
        return '""'
    return ("\n" + " " * indent).join(esc(p) for p in pieces)


def cpp_message(m, indent):
    fields = [".role = " + cpp_string(m["role"], 0),
              ".content = " + cpp_string(m["content"], indent + 11)]
    if m["tool_calls"]:
        calls = ", ".join("{.id = %s, .name = %s, .arguments = %s}" % (
            cpp_string(c["id"], 0), cpp_string(c["name"], 0),
            cpp_string(c["arguments"], indent + 4)) for c in m["tool_calls"])
        fields.append(".tool_calls = {" + calls + "}")
    if m["tool_call_id"]:
        fields.append(".tool_call_id = " + cpp_string(m["tool_call_id"], 0))
    if m["name"]:
        fields.append(".name = " + cpp_string(m["name"], 0))
    if m["reasoning_content"]:
        fields.append(".reasoning_content = " + cpp_string(m["reasoning_content"], 0))
    return "ChatMessage{" + ", ".join(fields) + "}"


def generate():
    out = ["// Generated by tools/render_chat_template.py from the templates in",
           "// router/request/testdata/chat_templates/; do not edit by hand.",
           "// clang-format off", ""]
    for family, (path, bos) in FAMILIES.items():
        with open(os.path.join(TEMPLATES, path), encoding="utf-8") as f:
            text = f.read()
        for case_name, tools, messages, gen in CASES:
            try:
                want = render(text, [to_template_message(m) for m in messages], tools, gen, bos)
                want_cpp, error = cpp_string(want, 8), "false"
            except TemplateError as e:
                want_cpp, error = "// raise_exception: " + str(e) + "\n        \"\"", "true"
            tools_cpp = "nullptr" if tools is None else cpp_string(
                json.dumps(tools, ensure_ascii=False), 8)
            msgs = (",\n        ").join(cpp_message(m, 8) for m in messages)
            out.append("ToolRenderCase{")
            out.append("    %s, %s," % (cpp_string(family.replace(".", "") + "_" + case_name, 0),
                                        cpp_string(family, 0)))
            out.append("    %s," % tools_cpp)
            out.append("    {%s}," % msgs)
            out.append("    %s, %s," % ("true" if gen else "false", error))
            out.append("    " + want_cpp + "},")
    out.append("// clang-format on")
    return "\n".join(out) + "\n"


def generate_detect():
    out = ["// Generated by tools/render_chat_template.py from the templates in",
           "// router/request/testdata/chat_templates/; do not edit by hand.",
           "// clang-format off", ""]
    for family, (path, _) in FAMILIES.items():
        if family == "plain":  # ours, with no marker to detect
            continue
        with open(os.path.join(TEMPLATES, path), encoding="utf-8") as f:
            config = json.dumps({"chat_template": f.read()}, ensure_ascii=False)
        out.append("DetectCase{%s,\n    %s,\n    %s}," % (
            cpp_string("file_" + family.replace(".", ""), 0), cpp_string(config, 4),
            cpp_string(family, 0)))
    out.append("// clang-format on")
    return "\n".join(out) + "\n"


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--check", action="store_true", help="fail if the .inc is stale")
    args = parser.parse_args()
    outputs = {OUT: generate(), DETECT_OUT: generate_detect()}
    for path, text in outputs.items():
        if args.check:
            with open(path, encoding="utf-8") as f:
                if f.read() != text:
                    print(path + " is stale; rerun tools/render_chat_template.py",
                          file=sys.stderr)
                    return 1
            continue
        with open(path, "w", encoding="utf-8") as f:
            f.write(text)
        print("wrote %s (jinja2 %s)" % (path, jinja2.__version__))
    return 0


if __name__ == "__main__":
    sys.exit(main())
