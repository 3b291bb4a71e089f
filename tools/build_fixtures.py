# Fixture tokenizers: README
# ===========================
#
# tests/fixtures/{qwen3,llama3,deepseek,mistral}/ are small stand-ins for real model directories, loaded by the tests
# and the demo through `--model-path`. Real tokenizers are large (Qwen3's tokenizer.json is ~11 MB) and this machine
# has no Hugging Face hub access, so the gateway's tokenizer-dependent paths (chat-template rendering, special-token
# handling, stop ids, incremental detokenization) run against these. Each keeps what matters of its family:
#
# * the family's special/control tokens, each a single id, with the real "special" flag: Qwen3's <think>, </think>,
#   <tool_call>, </tool_call>, <tool_response>, </tool_response> and DeepSeek's <think>, </think> and tool markers are
#   added tokens that survive decode(..., skip_special_tokens=True), as in the real tokenizers;
# * the family's stop ids: generation_config.json `eos_token_id` lists every one (Qwen3: <|im_end|>, <|endoftext|>;
#   Llama 3: <|eot_id|>, <|eom_id|>, <|end_of_text|>; DeepSeek: <｜end▁of▁sentence｜>; Mistral: </s>);
# * the family's chat-template format (see the comment above each template below): system prompts, mid-conversation
#   system messages rendered in place, content parts with image placeholders, OpenAI-shaped tools / tool_calls /
#   tool results, reasoning content, the thinking toggle (Qwen3 `enable_thinking`, DeepSeek `thinking`);
# * a byte-level BPE (3.2k-4k entries) trained on a corpus generated here, so any text round-trips and multi-byte
#   characters (accents, CJK, emoji) often span several tokens, which incremental detokenization must handle.
#
# The ids are NOT the real models' ids (the vocabularies are tiny): read them from the fixture, never hard-code them.
# Each directory holds tokenizer.json, tokenizer_config.json (tokenizer_class PreTrainedTokenizerFast, bos/eos/pad,
# model_max_length, added_tokens_decoder and the chat template for transformers 4.x), chat_template.jinja (read by
# transformers 5.x), generation_config.json and a small config.json (model_type, architectures, eos/bos ids,
# max_position_embeddings). Each loads offline with transformers.AutoTokenizer.from_pretrained(dir) as a fast
# tokenizer on transformers 4.x and 5.x.
#
# The build is deterministic: a fixed-seed corpus, BPE training whose ties break by pair order (not by hash or thread
# order) and no time stamps, so re-running it rewrites identical bytes; tests/pipeline/test_fixtures.py checks that.
#
#   .venv/bin/python -m tools.build_fixtures                 # all four into tests/fixtures/
#   .venv/bin/python -m tools.build_fixtures qwen3           # only the named families
#   .venv/bin/python -m tools.build_fixtures --out /tmp/fx   # somewhere else
#
# Change a template or the corpus here, re-run, and commit the regenerated directories with the change.

"""Builds the fixture tokenizers the tests and the demo load through ``--model-path``.

This module owns ``tests/fixtures/{qwen3,llama3,deepseek,mistral}/``: their tokenizers, chat templates and the small
model/generation configs next to them. Nothing else writes those directories; see the README comment above.
"""

from __future__ import annotations

import argparse
import json
import random
import sys
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers, processors, trainers

REPO_ROOT = Path(__file__).resolve().parents[1]
FIXTURES_DIR = REPO_ROOT / "tests" / "fixtures"
CORPUS_SEED = 20250101


@dataclass(frozen=True)
class Tok:
    """An added token: its text and whether it is "special" (dropped by ``skip_special_tokens``)."""

    content: str
    special: bool = True


@dataclass(frozen=True)
class Family:
    """Everything that differs between the fixture families."""

    name: str
    model_type: str
    architectures: tuple[str, ...]
    vocab_size: int  # BPE vocabulary size, leading special tokens included
    leading: tuple[Tok, ...]  # trained into the vocabulary at ids 0.. (DeepSeek, Mistral put control tokens first)
    trailing: tuple[Tok, ...]  # added after the BPE vocabulary (Qwen, Llama put control tokens last)
    bos: str | None
    eos: str
    pad: str
    stop: tuple[str, ...]  # generation_config eos_token_id, in order
    add_bos: bool  # whether encode() prepends bos (the post-processor), as the real tokenizer does
    chat_template: str
    max_position_embeddings: int
    model_max_length: int
    unk: str | None = None
    config_eos_list: bool = False  # config.json eos_token_id: the whole stop list (Llama 3.1) or the eos id
    generation_bos: str | None = None  # bos_token_id in the configs when the tokenizer has no bos (Qwen)
    config_extra: dict[str, Any] = field(default_factory=dict)


# --------------------------------------------------------------------------------------------------------------
# Chat templates. Each follows its family's real template, extended where the real one is silent or strict:
# list content (text parts, image placeholders), system messages in mid-conversation rendered in place, and
# tool-call arguments given as a dict or as a JSON string.
# --------------------------------------------------------------------------------------------------------------


_RENDER_CONTENT = r"""{%- macro render_content(content) -%}
    {%- if content is none -%}
    {%- elif content is string -%}
        {{- content -}}
    {%- else -%}
        {%- for part in content -%}
            {%- if part is string -%}
                {{- part -}}
            {%- elif part.type == 'text' -%}
                {{- part.text -}}
            {%- elif part.type in ['image', 'image_url'] -%}
                {{- 'IMAGE' -}}
VIDEO            {%- endif -%}
        {%- endfor -%}
    {%- endif -%}
{%- endmacro -%}
"""
_VIDEO_PART = r"""            {%- elif part.type in ['video', 'video_url'] -%}
                {{- 'VIDEO' -}}
"""


def _render_content(image: str, video: str | None = None) -> str:
    """The `render_content` macro every template opens with: a message's content as text, each
    image part (and video part, for a model that takes them) as the model's placeholder."""
    videos = _VIDEO_PART.replace("VIDEO", video) if video is not None else ""
    return _RENDER_CONTENT.replace("IMAGE", image).replace("VIDEO", videos)


# Qwen3 (Qwen/Qwen3-8B): ChatML; tools in the system turn; <tool_call> JSON; tool results as user turns with
# <tool_response>; reasoning only on assistant turns after the last real user query; enable_thinking=false
# pre-fills an empty think block. Images as Qwen-VL's <|vision_start|><|image_pad|><|vision_end|>.
QWEN3_TEMPLATE = (
    _render_content("<|vision_start|><|image_pad|><|vision_end|>", video="<|vision_start|><|video_pad|><|vision_end|>")
    + r"""{%- if tools %}
    {{- '<|im_start|>system\n' }}
    {%- if messages[0].role == 'system' %}
        {{- render_content(messages[0].content) + '\n\n' }}
    {%- endif %}
    {{- "# Tools\n\nYou may call one or more functions to assist with the user query.\n\n" }}
    {{- "You are provided with function signatures within <tools></tools> XML tags:\n<tools>" }}
    {%- for tool in tools %}
        {{- "\n" }}
        {{- tool | tojson }}
    {%- endfor %}
    {{- "\n</tools>\n\nFor each function call, return a json object with function name and arguments within " }}
    {{- "<tool_call></tool_call> XML tags:\n<tool_call>\n" }}
    {{- '{"name": <function-name>, "arguments": <args-json-object>}\n</tool_call><|im_end|>\n' }}
{%- else %}
    {%- if messages[0].role == 'system' %}
        {{- '<|im_start|>system\n' + render_content(messages[0].content) + '<|im_end|>\n' }}
    {%- endif %}
{%- endif %}
{%- set ns = namespace(multi_step_tool=true, last_query_index=messages|length - 1) %}
{%- for message in messages[::-1] %}
    {%- set index = (messages|length - 1) - loop.index0 %}
    {%- set content = render_content(message.content) %}
    {%- if ns.multi_step_tool and message.role == "user"
          and not(content.startswith('<tool_response>') and content.endswith('</tool_response>')) %}
        {%- set ns.multi_step_tool = false %}
        {%- set ns.last_query_index = index %}
    {%- endif %}
{%- endfor %}
{%- for message in messages %}
    {%- set content = render_content(message.content) %}
    {%- if (message.role == "user") or (message.role == "system" and not loop.first) %}
        {{- '<|im_start|>' + message.role + '\n' + content + '<|im_end|>' + '\n' }}
    {%- elif message.role == "assistant" %}
        {%- set reasoning_content = '' %}
        {%- if message.reasoning_content is string %}
            {%- set reasoning_content = message.reasoning_content %}
        {%- elif '</think>' in content %}
            {%- set reasoning_content = content.split('</think>')[0].rstrip('\n').split('<think>')[-1].lstrip('\n') %}
            {%- set content = content.split('</think>')[-1].lstrip('\n') %}
        {%- endif %}
        {%- if loop.index0 > ns.last_query_index and (loop.last or reasoning_content) %}
            {{- '<|im_start|>' + message.role + '\n<think>\n' + reasoning_content.strip('\n') + '\n</think>\n\n' }}
            {{- content.lstrip('\n') }}
        {%- else %}
            {{- '<|im_start|>' + message.role + '\n' + content }}
        {%- endif %}
        {%- if message.tool_calls %}
            {%- for tool_call in message.tool_calls %}
                {%- if (loop.first and content) or (not loop.first) %}
                    {{- '\n' }}
                {%- endif %}
                {%- if tool_call.function %}
                    {%- set tool_call = tool_call.function %}
                {%- endif %}
                {{- '<tool_call>\n{"name": "' }}
                {{- tool_call.name }}
                {{- '", "arguments": ' }}
                {%- if tool_call.arguments is string %}
                    {{- tool_call.arguments }}
                {%- else %}
                    {{- tool_call.arguments | tojson }}
                {%- endif %}
                {{- '}\n</tool_call>' }}
            {%- endfor %}
        {%- endif %}
        {{- '<|im_end|>\n' }}
    {%- elif message.role == "tool" %}
        {%- if loop.first or (messages[loop.index0 - 1].role != "tool") %}
            {{- '<|im_start|>user' }}
        {%- endif %}
        {{- '\n<tool_response>\n' }}
        {{- content }}
        {{- '\n</tool_response>' }}
        {%- if loop.last or (messages[loop.index0 + 1].role != "tool") %}
            {{- '<|im_end|>\n' }}
        {%- endif %}
    {%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}
    {{- '<|im_start|>assistant\n' }}
    {%- if enable_thinking is defined and enable_thinking is false %}
        {{- '<think>\n\n</think>\n\n' }}
    {%- endif %}
{%- endif %}
"""
)


# Llama 3.1 (meta-llama/Llama-3.1-8B-Instruct): header-delimited turns; a fixed "Today Date" (the real template's
# default, so renders are reproducible); tools (JSON, indent 4) in the first user turn unless
# tools_in_user_message=false; a custom tool call is {"name": ..., "parameters": ...} in an assistant turn, several
# joined with "; " (the real template allows one); builtin_tools switch to <|python_tag|> calls ending in <|eom_id|>;
# tool results in an "ipython" turn. Images as a literal <image>.
LLAMA3_TEMPLATE = (
    _render_content("<image>")
    + r"""{{- bos_token }}
{%- if custom_tools is defined %}
    {%- set tools = custom_tools %}
{%- endif %}
{%- if not tools_in_user_message is defined %}
    {%- set tools_in_user_message = true %}
{%- endif %}
{%- if not date_string is defined %}
    {%- set date_string = "26 Jul 2024" %}
{%- endif %}
{%- if not tools is defined %}
    {%- set tools = none %}
{%- endif %}

{#- This block extracts the system message, so we can slot it into the right place. #}
{%- if messages[0].role == 'system' %}
    {%- set system_message = render_content(messages[0].content) | trim %}
    {%- set messages = messages[1:] %}
{%- else %}
    {%- set system_message = "" %}
{%- endif %}

{#- System message + builtin tools #}
{{- "<|start_header_id|>system<|end_header_id|>\n\n" }}
{%- if builtin_tools is defined or tools is not none %}
    {{- "Environment: ipython\n" }}
{%- endif %}
{%- if builtin_tools is defined %}
    {{- "Tools: " + builtin_tools | reject('equalto', 'code_interpreter') | join(", ") + "\n\n" }}
{%- endif %}
{{- "Cutting Knowledge Date: December 2023\n" }}
{{- "Today Date: " + date_string + "\n\n" }}
{%- if tools is not none and not tools_in_user_message %}
    {{- "You have access to the following functions. " }}
    {{- "To call a function, please respond with JSON for a function call." }}
    {{- 'Respond in the format {"name": function name, "parameters": dictionary of argument name and its value}.' }}
    {{- "Do not use variables.\n\n" }}
    {%- for t in tools %}
        {{- t | tojson(indent=4) }}
        {{- "\n\n" }}
    {%- endfor %}
{%- endif %}
{{- system_message }}
{{- "<|eot_id|>" }}

{#- Custom tools are passed in a user message with some extra guidance #}
{%- if tools_in_user_message and tools is not none %}
    {#- Extract the first user message so we can plug it in here #}
    {%- if messages | length != 0 %}
        {%- set first_user_message = render_content(messages[0].content) | trim %}
        {%- set messages = messages[1:] %}
    {%- else %}
        {{- raise_exception("Cannot put tools in the first user message when there's no first user message!") }}
    {%- endif %}
    {{- '<|start_header_id|>user<|end_header_id|>\n\n' -}}
    {{- "Given the following functions, please respond with a JSON for a function call " }}
    {{- "with its proper arguments that best answers the given prompt.\n\n" }}
    {{- 'Respond in the format {"name": function name, "parameters": dictionary of argument name and its value}.' }}
    {{- "Do not use variables.\n\n" }}
    {%- for t in tools %}
        {{- t | tojson(indent=4) }}
        {{- "\n\n" }}
    {%- endfor %}
    {{- first_user_message + "<|eot_id|>" }}
{%- endif %}

{%- for message in messages %}
    {%- if message.role == 'tool' or message.role == 'ipython' %}
        {{- "<|start_header_id|>ipython<|end_header_id|>\n\n" }}
        {%- if message.content is mapping %}
            {{- message.content | tojson }}
        {%- else %}
            {{- render_content(message.content) }}
        {%- endif %}
        {{- "<|eot_id|>" }}
    {%- elif message.tool_calls %}
        {{- '<|start_header_id|>assistant<|end_header_id|>\n\n' -}}
        {%- set content = render_content(message.content) | trim %}
        {%- if content %}
            {{- content + "\n" }}
        {%- endif %}
        {%- for tool_call in message.tool_calls %}
            {%- if tool_call.function is defined and tool_call.function %}
                {%- set tool_call = tool_call.function %}
            {%- endif %}
            {%- if not loop.first %}
                {{- "; " }}
            {%- endif %}
            {%- if builtin_tools is defined and tool_call.name in builtin_tools %}
                {{- "<|python_tag|>" + tool_call.name + ".call(" }}
                {%- for arg_name, arg_val in tool_call.arguments | items %}
                    {{- arg_name + '="' + arg_val + '"' }}
                    {%- if not loop.last %}
                        {{- ", " }}
                    {%- endif %}
                {%- endfor %}
                {{- ")" }}
            {%- else %}
                {{- '{"name": "' + tool_call.name + '", ' }}
                {{- '"parameters": ' }}
                {%- if tool_call.arguments is string %}
                    {{- tool_call.arguments }}
                {%- else %}
                    {{- tool_call.arguments | tojson }}
                {%- endif %}
                {{- "}" }}
            {%- endif %}
        {%- endfor %}
        {%- if builtin_tools is defined %}
            {#- This means we're in ipython mode #}
            {{- "<|eom_id|>" }}
        {%- else %}
            {{- "<|eot_id|>" }}
        {%- endif %}
    {%- else %}
        {{- '<|start_header_id|>' + message.role + '<|end_header_id|>\n\n' }}
        {{- render_content(message.content) | trim + '<|eot_id|>' }}
    {%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}
    {{- '<|start_header_id|>assistant<|end_header_id|>\n\n' }}
{%- endif %}
"""
)

# DeepSeek V3.1 (deepseek-ai/DeepSeek-V3.1): bos, then the system prompt as bare text (tools described after it);
# <｜User｜>/<｜Assistant｜> turns; the `thinking` kwarg opens <think> after <｜Assistant｜> in the generation
# prompt, else </think> closes an empty one; history keeps no reasoning (a final assistant turn with
# reasoning_content keeps it when thinking, for prefill); tool calls as <｜tool▁calls▁begin｜>
# <｜tool▁call▁begin｜>NAME<｜tool▁sep｜>ARGS<｜tool▁call▁end｜>...<｜tool▁calls▁end｜> (no spaces); tool results as
# <｜tool▁output▁begin｜>...<｜tool▁output▁end｜>, after which the model continues without a new <｜Assistant｜>.
# (<｜tool▁outputs▁begin｜>/<｜tool▁outputs▁end｜> are in the vocabulary, as in V3.1, but V3.1's template no longer
# emits them.)
# Mid-conversation system messages are rendered in place as bare text. Images as a literal <image>.
DEEPSEEK_TEMPLATE = (
    _render_content("<image>")
    + r"""{%- if not add_generation_prompt is defined -%}
    {%- set add_generation_prompt = false -%}
{%- endif -%}
{%- if not thinking is defined -%}
    {%- set thinking = false -%}
{%- endif -%}
{%- set ns = namespace(is_tool=false, system_prompt='', is_last_user=false) -%}
{%- if messages and messages[0].role == 'system' -%}
    {%- set ns.system_prompt = render_content(messages[0].content) -%}
    {%- set loop_messages = messages[1:] -%}
{%- else -%}
    {%- set loop_messages = messages -%}
{%- endif -%}
{%- if tools -%}
    {%- set tool_ns = namespace(text='## Tools\nYou have access to the following tools:\n') -%}
    {%- for tool in tools -%}
        {%- set fn = tool.function if tool.function is defined else tool -%}
        {%- set tool_ns.text = tool_ns.text + '\n### ' + fn.name + '\nDescription: ' + (fn.description or '') -%}
        {%- set tool_ns.text = tool_ns.text + '\n\nParameters: ' + (fn.parameters | tojson) + '\n' -%}
    {%- endfor -%}
    {%- set tool_ns.text = tool_ns.text + '\nIMPORTANT: ALWAYS adhere to this exact format for tool use:\n' -%}
    {%- set tool_ns.text = tool_ns.text + '<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>tool_call_name<｜tool▁sep｜>' -%}
    {%- set tool_ns.text = tool_ns.text + 'tool_call_arguments<｜tool▁call▁end｜>{{additional_tool_calls}}' -%}
    {%- set tool_ns.text = tool_ns.text + '<｜tool▁calls▁end｜>\n\nWhere:\n\n' -%}
    {%- set tool_ns.text = tool_ns.text + '- `tool_call_name` must be an exact match to one of the ' -%}
    {%- set tool_ns.text = tool_ns.text + 'available tools\n' -%}
    {%- set tool_ns.text = tool_ns.text + "- `tool_call_arguments` must be valid JSON that strictly follows " -%}
    {%- set tool_ns.text = tool_ns.text + "the tool's Parameters Schema\n" -%}
    {%- set tool_ns.text = tool_ns.text + '- For multiple tool calls, chain them directly without separators ' -%}
    {%- set tool_ns.text = tool_ns.text + 'or spaces\n' -%}
    {%- if ns.system_prompt -%}
        {%- set ns.system_prompt = ns.system_prompt + '\n\n' + tool_ns.text -%}
    {%- else -%}
        {%- set ns.system_prompt = tool_ns.text -%}
    {%- endif -%}
{%- endif -%}
{{- bos_token + ns.system_prompt -}}
{%- for message in loop_messages -%}
    {%- set content = render_content(message.content) -%}
    {%- if message.role == 'system' -%}
        {{- content -}}
    {%- elif message.role == 'user' -%}
        {%- set ns.is_tool = false -%}
        {%- set ns.is_last_user = true -%}
        {{- '<｜User｜>' + content -}}
    {%- elif message.role == 'assistant' -%}
        {%- if ns.is_last_user -%}
            {{- '<｜Assistant｜>' -}}
            {%- if thinking and loop.last and message.reasoning_content is string and not message.tool_calls -%}
                {{- '<think>' + message.reasoning_content + '</think>' -}}
            {%- elif thinking and message.prefix is defined and message.prefix and not message.tool_calls -%}
                {{- '<think>' -}}
            {%- else -%}
                {{- '</think>' -}}
            {%- endif -%}
        {%- endif -%}
        {%- set ns.is_last_user = false -%}
        {%- set ns.is_tool = false -%}
        {%- if '</think>' in content -%}
            {%- set content = content.split('</think>', 1)[1] -%}
        {%- endif -%}
        {{- content -}}
        {%- if message.tool_calls -%}
            {{- '<｜tool▁calls▁begin｜>' -}}
            {%- for tool_call in message.tool_calls -%}
                {%- if tool_call.function is defined and tool_call.function -%}
                    {%- set tool_call = tool_call.function -%}
                {%- endif -%}
                {{- '<｜tool▁call▁begin｜>' + tool_call.name + '<｜tool▁sep｜>' -}}
                {%- if tool_call.arguments is string -%}
                    {{- tool_call.arguments -}}
                {%- else -%}
                    {{- tool_call.arguments | tojson -}}
                {%- endif -%}
                {{- '<｜tool▁call▁end｜>' -}}
            {%- endfor -%}
            {{- '<｜tool▁calls▁end｜>' -}}
        {%- endif -%}
        {%- if not (loop.last and message.prefix is defined and message.prefix) -%}
            {{- '<｜end▁of▁sentence｜>' -}}
        {%- endif -%}
    {%- elif message.role == 'tool' -%}
        {%- set ns.is_last_user = false -%}
        {%- set ns.is_tool = true -%}
        {{- '<｜tool▁output▁begin｜>' + content + '<｜tool▁output▁end｜>' -}}
    {%- endif -%}
{%- endfor -%}
{%- if add_generation_prompt and ns.is_last_user and not ns.is_tool -%}
    {{- '<｜Assistant｜>' -}}
    {%- if thinking -%}
        {{- '<think>' -}}
    {%- else -%}
        {{- '</think>' -}}
    {%- endif -%}
{%- endif -%}
"""
)

# Mistral (Mistral-Small-3.x, v7 control tokens): bos; [SYSTEM_PROMPT]...[/SYSTEM_PROMPT] wherever a system message
# is (first or mid-conversation); [AVAILABLE_TOOLS][...tools JSON...][/AVAILABLE_TOOLS] right before the last user
# turn; [INST]...[/INST] user turns with [IMG] placeholders; assistant text then eos; tool calls as
# [TOOL_CALLS][{"name": ..., "arguments": ..., "id": ...}]</s>; tool results as
# [TOOL_RESULTS]{"content": ..., "call_id": ...}[/TOOL_RESULTS]. The ids are kept whole (the real template wants
# 9 characters). The real template adds a dated default system prompt; this one adds none. No generation prompt:
# the model answers right after [/INST] or [/TOOL_RESULTS].
MISTRAL_TEMPLATE = (
    _render_content("[IMG]")
    + r"""{{- bos_token }}
{%- set ns = namespace(last_user=-1) %}
{%- for message in messages %}
    {%- if message.role == 'user' %}
        {%- set ns.last_user = loop.index0 %}
    {%- endif %}
{%- endfor %}
{%- for message in messages %}
    {%- set content = render_content(message.content) %}
    {%- if message.role == 'system' %}
        {{- '[SYSTEM_PROMPT]' + content + '[/SYSTEM_PROMPT]' }}
    {%- elif message.role == 'user' %}
        {%- if tools and loop.index0 == ns.last_user %}
            {{- '[AVAILABLE_TOOLS]' + (tools | tojson) + '[/AVAILABLE_TOOLS]' }}
        {%- endif %}
        {{- '[INST]' + content + '[/INST]' }}
    {%- elif message.role == 'assistant' %}
        {{- content }}
        {%- if message.tool_calls %}
            {{- '[TOOL_CALLS][' }}
            {%- for tool_call in message.tool_calls %}
                {%- set call_id = tool_call.id if tool_call.id is defined else none %}
                {%- if tool_call.function is defined and tool_call.function %}
                    {%- set tool_call = tool_call.function %}
                {%- endif %}
                {{- '{"name": ' + (tool_call.name | tojson) + ', "arguments": ' }}
                {%- if tool_call.arguments is string %}
                    {{- tool_call.arguments }}
                {%- else %}
                    {{- tool_call.arguments | tojson }}
                {%- endif %}
                {%- if call_id %}
                    {{- ', "id": ' + (call_id | tojson) }}
                {%- endif %}
                {{- '}' }}
                {%- if not loop.last %}
                    {{- ', ' }}
                {%- endif %}
            {%- endfor %}
            {{- ']' }}
        {%- endif %}
        {{- eos_token }}
    {%- elif message.role == 'tool' or message.role == 'tool_results' %}
        {{- '[TOOL_RESULTS]{"content": ' + (content | tojson) }}
        {%- if message.tool_call_id is defined and message.tool_call_id %}
            {{- ', "call_id": ' + (message.tool_call_id | tojson) }}
        {%- endif %}
        {{- '}[/TOOL_RESULTS]' }}
    {%- else %}
        {{- raise_exception('Only system, user, assistant and tool roles are supported!') }}
    {%- endif %}
{%- endfor %}
"""
)


# --------------------------------------------------------------------------------------------------------------
# Families
# --------------------------------------------------------------------------------------------------------------

QWEN3 = Family(
    name="qwen3",
    model_type="qwen3",
    architectures=("Qwen3ForCausalLM",),
    vocab_size=4000,
    leading=(),
    trailing=(
        Tok("<|endoftext|>"),
        Tok("<|im_start|>"),
        Tok("<|im_end|>"),
        Tok("<|vision_start|>"),
        Tok("<|vision_end|>"),
        Tok("<|vision_pad|>"),
        Tok("<|image_pad|>"),
        Tok("<|video_pad|>"),
        Tok("<tool_call>", special=False),
        Tok("</tool_call>", special=False),
        Tok("<tool_response>", special=False),
        Tok("</tool_response>", special=False),
        Tok("<think>", special=False),
        Tok("</think>", special=False),
    ),
    bos=None,  # Qwen has no bos token: nothing is prepended, the template starts with <|im_start|>
    eos="<|im_end|>",
    pad="<|endoftext|>",
    stop=("<|im_end|>", "<|endoftext|>"),
    add_bos=False,
    chat_template=QWEN3_TEMPLATE,
    max_position_embeddings=40960,
    model_max_length=131072,
    generation_bos="<|endoftext|>",  # config/generation_config bos_token_id, as in Qwen3
)

LLAMA3 = Family(
    name="llama3",
    model_type="llama",
    architectures=("LlamaForCausalLM",),
    vocab_size=3600,
    leading=(),
    trailing=(
        Tok("<|begin_of_text|>"),
        Tok("<|end_of_text|>"),
        Tok("<|finetune_right_pad_id|>"),
        Tok("<|start_header_id|>"),
        Tok("<|end_header_id|>"),
        Tok("<|eom_id|>"),
        Tok("<|eot_id|>"),
        Tok("<|python_tag|>"),
    ),
    bos="<|begin_of_text|>",
    eos="<|eot_id|>",
    pad="<|finetune_right_pad_id|>",
    stop=("<|eot_id|>", "<|eom_id|>", "<|end_of_text|>"),
    add_bos=True,
    chat_template=LLAMA3_TEMPLATE,
    max_position_embeddings=131072,
    model_max_length=131072,
    config_eos_list=True,
    config_extra={
        "rope_theta": 500000.0,
        "rope_scaling": {
            "factor": 8.0,
            "low_freq_factor": 1.0,
            "high_freq_factor": 4.0,
            "original_max_position_embeddings": 8192,
            "rope_type": "llama3",
        },
    },
)

DEEPSEEK = Family(
    name="deepseek",
    model_type="deepseek_v3",
    architectures=("DeepseekV3ForCausalLM",),
    vocab_size=3400,
    leading=(Tok("<｜begin▁of▁sentence｜>"), Tok("<｜end▁of▁sentence｜>")),
    trailing=(
        Tok("<think>", special=False),
        Tok("</think>", special=False),
        Tok("<｜User｜>"),
        Tok("<｜Assistant｜>"),
        Tok("<｜tool▁calls▁begin｜>", special=False),
        Tok("<｜tool▁calls▁end｜>", special=False),
        Tok("<｜tool▁call▁begin｜>", special=False),
        Tok("<｜tool▁call▁end｜>", special=False),
        Tok("<｜tool▁outputs▁begin｜>", special=False),
        Tok("<｜tool▁outputs▁end｜>", special=False),
        Tok("<｜tool▁output▁begin｜>", special=False),
        Tok("<｜tool▁output▁end｜>", special=False),
        Tok("<｜tool▁sep｜>", special=False),
    ),
    bos="<｜begin▁of▁sentence｜>",
    eos="<｜end▁of▁sentence｜>",
    pad="<｜end▁of▁sentence｜>",
    stop=("<｜end▁of▁sentence｜>",),
    add_bos=True,
    chat_template=DEEPSEEK_TEMPLATE,
    max_position_embeddings=163840,
    model_max_length=131072,
    config_extra={"first_k_dense_replace": 1, "n_routed_experts": 4, "num_experts_per_tok": 2},
)

MISTRAL = Family(
    name="mistral",
    model_type="mistral",
    architectures=("MistralForCausalLM",),
    vocab_size=3200,
    leading=(
        Tok("<unk>"),
        Tok("<s>"),
        Tok("</s>"),
        Tok("[INST]"),
        Tok("[/INST]"),
        Tok("[TOOL_CALLS]"),
        Tok("[AVAILABLE_TOOLS]"),
        Tok("[/AVAILABLE_TOOLS]"),
        Tok("[TOOL_RESULTS]"),
        Tok("[/TOOL_RESULTS]"),
        Tok("[IMG]"),
        Tok("[SYSTEM_PROMPT]"),
        Tok("[/SYSTEM_PROMPT]"),
    ),
    trailing=(),
    bos="<s>",
    eos="</s>",
    pad="</s>",
    unk="<unk>",
    stop=("</s>",),
    add_bos=True,
    chat_template=MISTRAL_TEMPLATE,
    max_position_embeddings=32768,
    model_max_length=32768,
    config_extra={"rope_theta": 1000000.0, "sliding_window": None},
)

FAMILIES: dict[str, Family] = {f.name: f for f in (QWEN3, LLAMA3, DEEPSEEK, MISTRAL)}


# --------------------------------------------------------------------------------------------------------------
# Corpus
# --------------------------------------------------------------------------------------------------------------


def _split(words: str) -> list[str]:
    return words.split("|")


_SUBJECTS = _split(
    "The gateway|A worker|The scheduler|Our team|The model|This request|The tokenizer|"
    "My friend|The weather service|The journal|A user|The assistant|The server|"
    "Each client"
)
_VERBS = _split(
    "forwards|reads|writes|streams|returns|parses|validates|renders|caches|sends|"
    "receives|retries|cancels|records|checks|counts|decodes|encodes|routes|answers"
)
_OBJECTS = _split(
    "the message|every token|a tool call|the response|the chat template|"
    "the stop sequence|a JSON object|the prompt|its arguments|the result|"
    "a long document|the next event|the weather in Paris|two numbers|the temperature|"
    "a short summary|the file contents"
)
_TAILS = _split(
    "before the deadline.|without blocking.|in under a second.|for each request.|"
    "when asked.|and then stops.|as quickly as possible.|with care.|"
    "after a short delay.|on port 30000.|because the user asked for it.|"
    "so nothing is lost.|if the stream ends early.|at the end."
)
_QUESTIONS = [
    "What is the weather like in {city} today?",
    "Can you summarize this article in three sentences?",
    "How many tokens are in this prompt?",
    "Please write a Python function that adds two numbers.",
    "Translate 'good morning' into French, German and Japanese.",
    "What time is it in {city}?",
    "Why is the sky blue?",
    "Explain how a hash map works.",
    "List three facts about {city}.",
    "Find the file named {file} and show me its contents.",
]
_ANSWERS = [
    "Sure! Here is a short answer.",
    "The weather in {city} is sunny with a high of {n} degrees.",
    "I will call the tool to find out.",
    "Let me think about this step by step.",
    "Okay, so the user wants to know about {city}. I should check the weather first.",
    "Hmm, wait. Let me reconsider: {a} + {b} = {c}.",
    "Here is the function you asked for:",
    "I'm sorry, I can't help with that.",
    "Done. The result is {n}.",
]
_CITIES = _split(
    "Paris|London|Tokyo|New York|Berlin|São Paulo|Zürich|Montréal|Kraków|Reykjavík|北京|"
    "東京|서울|Sydney|Madrid|München|Québec|Genève"
)
_FILES = _split("README.md|main.py|config.yaml|notes.txt|data.json|server.log|test_api.py")
_TOOL_NAMES = _split("get_weather|get_time|search_web|read_file|run_python|calculator|send_email")
_ARG_KEYS = _split("city|query|path|code|expression|unit|timezone|to|subject|limit")
_UNITS = _split("celsius|fahrenheit|kelvin")
_ACCENTED = _split(
    "café|naïve|résumé|façade|déjà vu|crème brûlée|über|Straße|Größe|Mädchen|niño|"
    "mañana|corazón|São|coração|ação|smörgåsbord|København|Łódź|żółw|Ελλάδα|γράμμα|"
    "Москва|привет|спасибо|שלום|مرحبا|नमस्ते|ไทย"
)
_CJK = _split(
    "你好|世界|谢谢|今天天气很好|我们一起去吃饭吧|中文分词|人工智能|模型|服务器|请求|こんにちは|ありがとう|東京タワー|日本語のテキスト|カタカナ|"
    "ひらがな|안녕하세요|감사합니다|한국어|天気|雨|雪|晴れ"
)
_EMOJI = _split("😀|🎉|👍|🚀|❤️|🔥|✅|🌧️|☀️|🇫🇷|👩‍💻|🤖|📄|⚠️|🍣|🐍")
_CODE = [
    "def add(a: int, b: int) -> int:\n    return a + b\n",
    "for i in range(10):\n    print(i * i)\n",
    "import json\n\nwith open('data.json') as f:\n    data = json.load(f)\n",
    "class Worker:\n    def __init__(self, url: str) -> None:\n        self.url = url\n",
    "async def fetch(client, url):\n    response = await client.get(url)\n    return response.json()\n",
    'if __name__ == "__main__":\n    main()\n',
    "const sum = (a, b) => a + b;\nconsole.log(sum(2, 3));\n",
    "function greet(name) {\n  return `Hello, ${name}!`;\n}\n",
    "SELECT id, name FROM users WHERE active = 1 ORDER BY name;\n",
    'fn main() {\n    println!("Hello, world!");\n}\n',
    'curl http://127.0.0.1:30000/v1/messages -H "content-type: application/json"\n',
    "$ pip install transformers tokenizers\n",
]


def _tool_call_json(rng: random.Random) -> str:
    name = rng.choice(_TOOL_NAMES)
    args: dict[str, Any] = {}
    for key in rng.sample(_ARG_KEYS, rng.randint(1, 3)):
        roll = rng.random()
        if roll < 0.5:
            args[key] = rng.choice(_CITIES + _FILES + _UNITS)
        elif roll < 0.8:
            args[key] = rng.randint(0, 10000)
        else:
            args[key] = rng.choice([True, False, None, 3.14, [1, 2, 3]])
    payload = {"name": name, "arguments": args}
    if rng.random() < 0.5:
        return json.dumps(payload, ensure_ascii=False)
    return json.dumps(payload, ensure_ascii=rng.random() < 0.5, indent=rng.choice([2, 4]))


def _tool_schema_json(rng: random.Random) -> str:
    name = rng.choice(_TOOL_NAMES)
    key = rng.choice(_ARG_KEYS)
    schema = {
        "type": "function",
        "function": {
            "name": name,
            "description": f"Get the {key} for a request.",
            "parameters": {
                "type": "object",
                "properties": {key: {"type": rng.choice(["string", "integer", "number", "boolean"])}},
                "required": [key],
            },
        },
    }
    return json.dumps(schema)


def _fill(rng: random.Random, text: str) -> str:
    a, b = rng.randint(0, 999), rng.randint(0, 999)
    return text.format(city=rng.choice(_CITIES), file=rng.choice(_FILES), n=rng.randint(-40, 120), a=a, b=b, c=a + b)


def _line(rng: random.Random) -> str:
    kind = rng.randrange(12)
    if kind <= 2:
        sentences = [
            f"{rng.choice(_SUBJECTS)} {rng.choice(_VERBS)} {rng.choice(_OBJECTS)} {rng.choice(_TAILS)}"
            for _ in range(rng.randint(1, 4))
        ]
        return " ".join(sentences)
    if kind == 3:
        return _fill(rng, rng.choice(_QUESTIONS))
    if kind == 4:
        return _fill(rng, rng.choice(_ANSWERS))
    if kind == 5:
        return rng.choice(_CODE)
    if kind == 6:
        return _tool_call_json(rng)
    if kind == 7:
        return _tool_schema_json(rng)
    if kind == 8:
        numbers = [str(rng.randint(0, 10 ** rng.randint(1, 9))) for _ in range(rng.randint(2, 8))]
        return rng.choice([", ", " ", " + ", "\n"]).join(numbers) + rng.choice(["", ".", f" = {rng.random():.4f}"])
    if kind == 9:
        words = rng.choices(_ACCENTED, k=rng.randint(2, 6))
        return " ".join(words) + rng.choice([".", "!", "?", ""])
    if kind == 10:
        return "".join(rng.choices(_CJK, k=rng.randint(1, 4))) + rng.choice(["。", "！", "？", "、", ""])
    return f"{rng.choice(_SUBJECTS)} {rng.choice(_VERBS)} {rng.choice(_OBJECTS)} " + "".join(
        rng.choices(_EMOJI, k=rng.randint(1, 3))
    )


def corpus(seed: int = CORPUS_SEED, lines: int = 30000) -> list[str]:
    """The deterministic training corpus: English, code, JSON tool calls and schemas, numbers, multi-byte text."""
    rng = random.Random(seed)
    return [_line(rng) for _ in range(lines)]


# --------------------------------------------------------------------------------------------------------------
# Building
# --------------------------------------------------------------------------------------------------------------


def _train(family: Family, lines: Sequence[str]) -> Tokenizer:
    """Train the family's byte-level BPE on ``lines`` and add its control tokens, ids in declared order."""
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=family.vocab_size,
        min_frequency=2,
        special_tokens=[t.content for t in family.leading],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator(lines, trainer=trainer, length=len(lines))
    # One at a time, in declared order: new tokens get the next free id, so ids follow the spec's order.
    for tok in family.leading + family.trailing:
        added = AddedToken(tok.content, special=tok.special, normalized=False, lstrip=False, rstrip=False)
        if tok.special:
            tokenizer.add_special_tokens([added])
        else:
            tokenizer.add_tokens([added])
    byte_level = processors.ByteLevel(trim_offsets=False)
    if family.add_bos:
        assert family.bos is not None
        bos_id = tokenizer.token_to_id(family.bos)
        template = processors.TemplateProcessing(
            single=f"{family.bos}:0 $A:0",
            pair=f"{family.bos}:0 $A:0 {family.bos}:1 $B:1",
            special_tokens=[(family.bos, bos_id)],
        )
        tokenizer.post_processor = processors.Sequence([byte_level, template])
    else:
        tokenizer.post_processor = byte_level
    return tokenizer


def _dump(obj: Any) -> str:
    return json.dumps(obj, indent=2, ensure_ascii=False) + "\n"


def build_family(family: Family, out_dir: Path, lines: Sequence[str] | None = None) -> Path:
    """Build one family's tokenizer directory at ``out_dir / family.name`` and return its path."""
    lines = corpus() if lines is None else lines
    tokenizer = _train(family, lines)
    target = out_dir / family.name
    target.mkdir(parents=True, exist_ok=True)

    def tid(token: str) -> int:
        found = tokenizer.token_to_id(token)
        if found is None:
            raise ValueError(f"{family.name}: {token!r} is not in the vocabulary")
        return int(found)

    (target / "tokenizer.json").write_text(tokenizer.to_str(pretty=True) + "\n", encoding="utf-8")

    added_decoder = {
        str(tid(t.content)): {
            "content": t.content,
            "lstrip": False,
            "normalized": False,
            "rstrip": False,
            "single_word": False,
            "special": t.special,
        }
        for t in sorted(family.leading + family.trailing, key=lambda t: tid(t.content))
    }
    named = {family.bos, family.eos, family.pad, family.unk}
    additional = [t.content for t in family.leading + family.trailing if t.special and t.content not in named]
    tokenizer_config: dict[str, Any] = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "add_bos_token": family.add_bos,
        "add_eos_token": False,
        "added_tokens_decoder": added_decoder,
        "additional_special_tokens": additional,
        "bos_token": family.bos,
        "eos_token": family.eos,
        "pad_token": family.pad,
    }
    if family.unk is not None:
        tokenizer_config["unk_token"] = family.unk
    tokenizer_config.update(
        {
            "clean_up_tokenization_spaces": False,
            "model_max_length": family.model_max_length,
            "split_special_tokens": False,
            "chat_template": family.chat_template,
        }
    )
    (target / "tokenizer_config.json").write_text(_dump(tokenizer_config), encoding="utf-8")
    (target / "chat_template.jinja").write_text(family.chat_template, encoding="utf-8")

    bos_token = family.generation_bos or family.bos
    bos_id = tid(bos_token) if bos_token is not None else None
    stop_ids = [tid(s) for s in family.stop]
    generation_config = {"bos_token_id": bos_id, "eos_token_id": stop_ids, "pad_token_id": tid(family.pad)}
    (target / "generation_config.json").write_text(_dump(generation_config), encoding="utf-8")

    config = {
        "architectures": list(family.architectures),
        "model_type": family.model_type,
        "bos_token_id": bos_id,
        "eos_token_id": stop_ids if family.config_eos_list else tid(family.eos),
        "pad_token_id": tid(family.pad),
        "vocab_size": tokenizer.get_vocab_size(with_added_tokens=True),
        "max_position_embeddings": family.max_position_embeddings,
        "hidden_size": 64,
        "intermediate_size": 128,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "tie_word_embeddings": True,
    }
    config.update(family.config_extra)
    (target / "config.json").write_text(_dump(config), encoding="utf-8")
    return target


def build(out_dir: Path = FIXTURES_DIR, families: Iterable[str] | None = None) -> list[Path]:
    """Build the named families (all by default) under ``out_dir``; return the directories written."""
    names = list(FAMILIES) if families is None else list(families)
    unknown = [n for n in names if n not in FAMILIES]
    if unknown:
        raise ValueError(f"unknown families {unknown}; known: {sorted(FAMILIES)}")
    lines = corpus()
    return [build_family(FAMILIES[name], out_dir, lines) for name in names]


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("families", nargs="*", help=f"families to build (default: all of {', '.join(FAMILIES)})")
    parser.add_argument("--out", type=Path, default=FIXTURES_DIR, help="output directory (default: tests/fixtures)")
    args = parser.parse_args(argv)
    for path in build(args.out, args.families or None):
        files = sorted(p for p in path.iterdir() if p.is_file())
        total = sum(p.stat().st_size for p in files)
        print(f"{path}: {len(files)} files, {total} bytes")
    return 0


if __name__ == "__main__":
    sys.exit(main())
