"""The published JSON schemas of request fields whose Python types are looser than their checks.

The request models declare fields such as ``messages`` as ``list[dict]`` and check them in code
(naming the field in a 400), so FastAPI's generated schema would say "any objects" and a client
or fuzzer generated from ``/openapi.json`` would send requests the server refuses. Each field
below is annotated (pydantic's ``WithJsonSchema``) with a schema stating what the checks accept:
validation is unchanged, only the published document says more. Every constraint here is one the
server enforces (a schema stricter than the checks would call valid requests invalid); what a
schema cannot say (a ``tool_choice`` naming one of the tools, a prompt that fits the context
window, arguments that are a JSON object inside a string) is still refused with a 400.
"""

from __future__ import annotations

from typing import Any

from pydantic import WithJsonSchema

from hvd_agents.drafters import available_methods

_TEXT_PART = {"type": "object", "required": ["type", "text"],
              "properties": {"type": {"const": "text"}, "text": {"type": "string"}}}
_TEXT_CONTENT = {"anyOf": [{"type": "string"}, {"type": "array", "items": _TEXT_PART}]}
_CALL = {"type": "object", "required": ["function"], "properties": {
    "function": {"type": "object", "required": ["name"], "properties": {
        "name": {"type": "string", "minLength": 1},
        "arguments": {"anyOf": [{"type": "string"}, {"type": "object"}, {"type": "null"}]}}}}}
# tool_calls that are empty in any form are no calls (the checks read them as false)
_NO_CALLS = [{"enum": [None, False, 0, ""]}, {"type": "object", "maxProperties": 0}]


def _message(roles: list[str], content_required: bool, **extra: Any) -> dict[str, Any]:
    content = _TEXT_CONTENT if content_required else {"anyOf": [*_TEXT_CONTENT["anyOf"], {"type": "null"}]}
    return {"type": "object", "required": ["role", "content"] if content_required else ["role"],
            "properties": {"role": {"enum": roles}, "content": content, **extra}}


CHAT_MESSAGES = WithJsonSchema({"type": "array", "minItems": 1, "items": {"anyOf": [
    _message(["system", "developer", "user"], True),
    _message(["assistant"], False, tool_calls={"anyOf": [{"type": "array", "items": _CALL}, *_NO_CALLS]}),
    _message(["tool"], True),
]}})
"""``messages`` of a chat completion: roles, text content, assistant tool calls."""

_PARAMETERS = {"anyOf": [{"type": "object", "properties": {"type": {"const": "object"}}}, {"type": "null"}]}
CHAT_TOOLS = WithJsonSchema({"anyOf": [{"type": "array", "items": {
    "type": "object", "required": ["function"], "properties": {
        "type": {"const": "function"},
        "function": {"type": "object", "required": ["name"], "properties": {
            "name": {"type": "string", "minLength": 1}, "parameters": _PARAMETERS}}}}}, {"type": "null"}]})
"""``tools`` of a chat completion: function tools with a name and an object schema."""

CHAT_TOOL_CHOICE = WithJsonSchema({"anyOf": [
    {"enum": ["auto", "none", "required", "any"]}, {"type": "boolean"},
    {"type": "object", "required": ["function"], "properties": {
        "type": {"const": "function"},
        "function": {"type": "object", "required": ["name"], "properties": {"name": {"type": "string",
                                                                                     "minLength": 1}}}}},
    {"type": "null"}]})
"""``tool_choice`` of a chat completion (a named function must be one of the tools; a tool's name as a bare
string is accepted too)."""

RESPONSE_FORMAT = WithJsonSchema({"anyOf": [
    {"type": "object", "required": ["type"], "properties": {"type": {"enum": ["text", "json_object"]}}},
    {"type": "object", "required": ["type", "json_schema"], "properties": {
        "type": {"const": "json_schema"},
        "json_schema": {"type": "object", "properties": {"schema": {"anyOf": [{"type": "object"},
                                                                              {"type": "null"}]}}}}},
    {"type": "null"}]})
"""``response_format``: text, a JSON object, or a JSON schema."""

STOP = WithJsonSchema({"anyOf": [{"type": "string", "minLength": 1},
                                 {"type": "array", "items": {"type": "string", "minLength": 1}}, {"type": "null"}]})
"""``stop``: non-empty stop strings."""

METHOD = WithJsonSchema({"anyOf": [{"enum": list(available_methods())}, {"type": "null"}]})
"""HVD's ``method``: a decoding method the engine knows."""

ONLY_ONE = WithJsonSchema({"anyOf": [{"const": 1}, {"type": "null"}]})
"""``n`` / ``best_of``: one choice per request."""

ZERO = WithJsonSchema({"anyOf": [{"const": 0}, {"type": "null"}]})
"""Penalties and ``top_logprobs``: only 0 (what would change the distribution is refused)."""

NO_LOGPROBS = WithJsonSchema({"anyOf": [{"const": False}, {"const": 0}, {"type": "null"}]})
"""``logprobs``: not asked for."""

EMPTY_OBJECT = WithJsonSchema({"anyOf": [{"type": "object", "maxProperties": 0}, {"type": "null"}]})
"""``logit_bias``: none."""

FALSE = WithJsonSchema({"const": False})
"""``echo``: off."""

NO_SUFFIX = WithJsonSchema({"anyOf": [{"const": ""}, {"type": "null"}]})
"""``suffix``: none."""

PROMPT = WithJsonSchema({"anyOf": [
    {"type": "string", "minLength": 1},
    {"type": "array", "minItems": 1, "maxItems": 1, "items": {"type": "string"}},
    {"type": "array", "minItems": 1, "items": {"type": "integer", "minimum": 0}}]})
"""``prompt`` of a completion: one text, or token ids."""

FALSY = WithJsonSchema({"anyOf": [{"enum": [None, False, 0, ""]}, {"type": "object", "maxProperties": 0},
                                  {"type": "array", "maxItems": 0}]})
"""Fields the server refuses when set (``conversation``, ``prompt`` of a response): empty in any form."""

NOT_SET = WithJsonSchema({"type": "null"})
"""``max_tool_calls``: not supported."""

NO_ITEMS = WithJsonSchema({"anyOf": [{"type": "array", "maxItems": 0}, {"type": "null"}]})
"""``include``: no extra outputs."""

OFF = WithJsonSchema({"anyOf": [{"const": False}, {"type": "null"}]})
"""``background``: off."""

NO_REASONING = WithJsonSchema({"anyOf": [{"type": "object", "additionalProperties": {"type": "null"}},
                                         {"type": "null"}]})
"""``reasoning``: nothing asked for (OpenAI's SDKs send ``{"effort": null}``)."""

TRUNCATION = WithJsonSchema({"anyOf": [{"const": "disabled"}, {"type": "null"}]})
"""``truncation``: a conversation that does not fit is refused, never cut."""

_RESPONSE_PART = {"anyOf": [
    {"type": "object", "required": ["type", "text"], "properties": {
        "type": {"enum": ["input_text", "output_text", "text"]}, "text": {"type": "string"}}},
    {"type": "object", "required": ["type", "refusal"], "properties": {
        "type": {"const": "refusal"}, "refusal": {"type": "string"}}}]}
_RESPONSE_TEXT = {"anyOf": [{"type": "string"}, {"type": "array", "items": _RESPONSE_PART}]}
_NON_EMPTY = {"type": "string", "minLength": 1}
RESPONSE_INPUT = WithJsonSchema({"anyOf": [{"type": "string"}, {"type": "array", "items": {"anyOf": [
    {"type": "object", "required": ["role", "content"], "properties": {
        "type": {"const": "message"}, "role": {"enum": ["user", "assistant", "system", "developer"]},
        "content": _RESPONSE_TEXT}},
    {"type": "object", "required": ["type", "call_id", "name", "arguments"], "properties": {
        "type": {"const": "function_call"}, "call_id": _NON_EMPTY, "name": _NON_EMPTY,
        "arguments": {"type": "string"}}},
    {"type": "object", "required": ["type", "call_id", "output"], "properties": {
        "type": {"const": "function_call_output"}, "call_id": _NON_EMPTY, "output": _RESPONSE_TEXT}},
]}}]})
"""``input`` of a response: text, or message, function_call and function_call_output items."""

RESPONSE_TOOLS = WithJsonSchema({"anyOf": [{"type": "array", "items": {
    "type": "object", "required": ["type", "name"], "properties": {
        "type": {"const": "function"}, "name": _NON_EMPTY, "parameters": _PARAMETERS}}}, {"type": "null"}]})
"""``tools`` of a response: function tools."""

RESPONSE_TOOL_CHOICE = WithJsonSchema({"anyOf": [
    {"enum": ["auto", "none", "required"]},
    {"type": "object", "required": ["type", "name"], "properties": {"type": {"const": "function"},
                                                                    "name": _NON_EMPTY}},
    {"type": "null"}]})
"""``tool_choice`` of a response (a named function must be one of the tools)."""

RESPONSE_TEXT_OPTIONS = WithJsonSchema({"anyOf": [{"type": "object", "properties": {
    "format": {"anyOf": [
        {"type": "object", "required": ["type"], "properties": {"type": {"enum": ["text", "json_object"]}}},
        {"type": "object", "required": ["type", "schema"], "properties": {"type": {"const": "json_schema"},
                                                                          "schema": {"type": "object"}}},
        {"type": "null"}]},
    "verbosity": {"anyOf": [{"const": "medium"}, {"type": "null"}]}}}, {"type": "null"}]})
"""``text`` of a response: its format and verbosity."""

# ---------------------------------------------------------------- Anthropic's Messages API

_TEXT_BLOCK = {"type": "object", "required": ["type", "text"],
               "properties": {"type": {"const": "text"}, "text": {"type": "string"}}}
_TEXT_BLOCKS = {"anyOf": [{"type": "string"}, {"type": "array", "items": _TEXT_BLOCK}]}
_TOOL_RESULT = {"type": "object", "required": ["type", "tool_use_id"], "properties": {
    "type": {"const": "tool_result"}, "tool_use_id": {"type": "string"},
    "content": {"anyOf": [{"type": "string"}, {"type": "array", "items": _TEXT_BLOCK}, {"type": "null"}]}}}
_TOOL_USE = {"type": "object", "required": ["type", "id", "name"], "properties": {
    "type": {"const": "tool_use"}, "id": {"type": "string"}, "name": {"type": "string", "minLength": 1},
    "input": {"type": "object"}}}
_THINKING = {"type": "object", "required": ["type"],
             "properties": {"type": {"enum": ["thinking", "redacted_thinking"]}}}
ANTHROPIC_MESSAGES = WithJsonSchema({"type": "array", "minItems": 1, "items": {"anyOf": [
    {"type": "object", "required": ["role", "content"], "properties": {"role": {"const": "user"}, "content": {
        "anyOf": [{"type": "string"}, {"type": "array", "items": {"anyOf": [_TEXT_BLOCK, _TOOL_RESULT]}}]}}},
    {"type": "object", "required": ["role", "content"], "properties": {"role": {"const": "assistant"}, "content": {
        "anyOf": [{"type": "string"}, {"type": "array", "items": {"anyOf": [_TEXT_BLOCK, _TOOL_USE, _THINKING]}}]}}},
    {"type": "object", "required": ["role", "content"], "properties": {"role": {"const": "system"},
                                                                       "content": _TEXT_BLOCKS}},
]}})
"""``messages`` of the Messages API: text, ``tool_use`` and ``tool_result`` blocks (no images, documents)."""

ANTHROPIC_SYSTEM = WithJsonSchema({"anyOf": [*_TEXT_BLOCKS["anyOf"], {"type": "null"}]})
"""``system``: a string or text blocks."""

ANTHROPIC_TOOLS = WithJsonSchema({"anyOf": [{"type": "array", "items": {
    "type": "object", "required": ["name", "input_schema"], "properties": {
        "type": {"const": "custom"}, "name": _NON_EMPTY,
        "input_schema": {"type": "object", "properties": {"type": {"const": "object"}}}}}}, {"type": "null"}]})
"""``tools``: client tools (server tools are refused)."""

ANTHROPIC_TOOL_CHOICE = WithJsonSchema({"anyOf": [
    {"type": "object", "required": ["type"], "properties": {"type": {"enum": ["auto", "any", "none"]}}},
    {"type": "object", "required": ["type", "name"], "properties": {"type": {"const": "tool"}, "name": _NON_EMPTY}},
    {"type": "null"}]})
"""``tool_choice``: ``auto``, ``any``, ``none`` or a tool by name (one of the tools)."""

NON_EMPTY_STRINGS = WithJsonSchema({"anyOf": [{"type": "array", "items": _NON_EMPTY}, {"type": "null"}]})
"""``stop_sequences``: non-empty strings."""

ANTHROPIC_OUTPUT = WithJsonSchema({"anyOf": [{"type": "object", "properties": {"format": {"anyOf": [
    {"type": "object", "required": ["type", "schema"], "properties": {"type": {"const": "json_schema"},
                                                                      "schema": {"type": "object"}}},
    {"type": "null"}]}}}, {"type": "null"}]})
"""``output_config``: a JSON schema ``format`` (``effort`` is ignored)."""

# ---------------------------------------------------------------- Ollama's API

_OLLAMA_CALL = {"type": "object", "required": ["function"], "properties": {"function": {
    "type": "object", "required": ["name"], "properties": {
        "name": {"type": "string", "minLength": 1},
        "arguments": {"anyOf": [{"type": "object"}, {"type": "string"}]}}}}}
_NOTHING = [{"enum": [None, False, 0, ""]}, {"type": "object", "maxProperties": 0}, {"type": "array", "maxItems": 0}]
OLLAMA_MESSAGES = WithJsonSchema({"type": "array", "minItems": 1, "items": {"anyOf": [
    {"type": "object", "required": ["role"], "properties": {
        "role": {"enum": ["system", "user", "tool"]}, "content": {"type": ["string", "null"]},
        "images": {"anyOf": _NOTHING}, "tool_calls": {"anyOf": _NOTHING}}},
    {"type": "object", "required": ["role"], "properties": {
        "role": {"const": "assistant"}, "content": {"type": ["string", "null"]}, "images": {"anyOf": _NOTHING},
        "tool_calls": {"anyOf": [{"type": "array", "items": _OLLAMA_CALL}, *_NOTHING]}}},
]}})
"""``messages`` of ``/api/chat``: text, assistant tool calls with object arguments (no images)."""

OLLAMA_FORMAT = WithJsonSchema({"anyOf": [{"enum": ["json", ""]}, {"type": "object"}, {"type": "null"}]})
"""``format``: ``"json"`` or a JSON schema."""

NOTHING = WithJsonSchema({"anyOf": _NOTHING})
"""Fields refused when set (``images``, ``suffix``, ``template``, ``context``, ``mcp_servers``)."""
