"""Tool calls and reasoning through the official `openai` client (issue 17).

Servers: a tiny random-weight qwen3_5_moe with the fixture Qwen tokenizer and the Qwen3.6 chat
template (tool calls in its qwen3_coder format, thinking opened by the template), started with
--enable-auto-tool-choice --reasoning-parser qwen3; and, when converted, SmolLM2-135M-Instruct
(a template without tools: "required" and named calls come out in the hermes format). "required"
and named tool choices are enforced by the grammar, so even random weights return well-formed
calls whose arguments validate against the tool's parameters.
"""
import json
import os
import pathlib

import jsonschema
import pytest

from conftest import FIXTURE_TOKENIZER, ROOT, Server, write_model_dir

QWEN36_TEMPLATE = ROOT / "tests" / "fixtures" / "chat_templates" / "qwen3_6" / "chat_template.jinja"
SMOLLM2 = pathlib.Path(os.environ.get("MOEFOLD_SMOLLM2", ROOT / "models" / "smollm2-135m-instruct"))

WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Current weather in a city",
        "parameters": {
            "type": "object",
            "properties": {
                "city": {"type": "string", "maxLength": 12},
                "days": {"type": "integer", "minimum": 1, "maximum": 7},
                "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
            },
            "required": ["city", "days", "unit"],
            "additionalProperties": False,
        },
    },
}
TIME = {
    "type": "function",
    "function": {
        "name": "get_time",
        "description": "Current time in a time zone",
        "parameters": {
            "type": "object",
            "properties": {"tz": {"type": "string", "enum": ["UTC", "Europe/Paris"]}, "verbose": {"type": "boolean"}},
            "required": ["tz", "verbose"],
            "additionalProperties": False,
        },
    },
}
TOOLS = [WEATHER, TIME]
PARAMS = {t["function"]["name"]: t["function"]["parameters"] for t in TOOLS}
ASK = [{"role": "user", "content": "What is the weather in Paris?"}]


@pytest.fixture(scope="module")
def qwen_dir(tmp_path_factory):
    d = tmp_path_factory.mktemp("models") / "tiny-qwen36"
    write_model_dir(d, json.loads(FIXTURE_TOKENIZER.read_text()))
    (d / "tokenizer_config.json").write_text(json.dumps({"eos_token": "<|im_end|>"}))
    (d / "chat_template.jinja").write_text(QWEN36_TEMPLATE.read_text())
    cfg = json.loads((d / "config.json").read_text())
    cfg["text_config"]["max_position_embeddings"] = 4096  # the template's tool prompt is long
    (d / "config.json").write_text(json.dumps(cfg))
    return d


@pytest.fixture(scope="module")
def qwen(qwen_dir):
    s = Server(qwen_dir, "--enable-auto-tool-choice", "--reasoning-parser", "qwen3", "--max-num-seqs", "4")
    yield s
    s.stop()


@pytest.fixture(scope="module")
def qwen_plain(qwen_dir):
    """The same model without --enable-auto-tool-choice / --reasoning-parser."""
    s = Server(qwen_dir, "--max-num-seqs", "2")
    yield s
    s.stop()


@pytest.fixture(scope="module")
def smollm2(tmp_path_factory):
    if not (SMOLLM2 / "model.safetensors").exists():
        pytest.skip(f"converted SmolLM2 not found at {SMOLLM2} (scripts/test.sh makes it)")
    s = Server(SMOLLM2, "--max-num-seqs", "2", "--max-model-len", "2048", load_format="auto",
               log_dir=str(tmp_path_factory.mktemp("smollm2-logs")))
    yield s
    s.stop()


def collect_stream(stream):
    """(reasoning, content, {index: {id, name, arguments}}, finish_reason) of a streamed choice."""
    reasoning, content, calls, finish = "", "", {}, None
    for chunk in stream:
        if not chunk.choices:
            continue
        ch = chunk.choices[0]
        d = ch.delta
        reasoning += getattr(d, "reasoning_content", None) or ""
        content += d.content or ""
        for t in d.tool_calls or []:
            if t.index not in calls:
                assert t.id and t.id.startswith("call_") and t.function.name, "id and name come first"
                calls[t.index] = {"id": t.id, "name": t.function.name, "arguments": ""}
            else:
                assert not t.id and not t.function.name, "later fragments carry arguments only"
            calls[t.index]["arguments"] += t.function.arguments or ""
        if ch.finish_reason:
            finish = ch.finish_reason
    return reasoning, content, calls, finish


# --- request checks ---------------------------------------------------------------------------


def test_auto_without_the_flag_is_400_naming_it(qwen_plain):
    import openai

    with pytest.raises(openai.BadRequestError) as e:
        qwen_plain.openai().chat.completions.create(model="tiny-qwen36", messages=ASK, tools=TOOLS, max_tokens=4)
    assert "--enable-auto-tool-choice" in str(e.value)


@pytest.mark.parametrize("extra", [
    {"tool_choice": "required"},                                          # no tools
    {"tools": TOOLS, "tool_choice": {"type": "function", "function": {"name": "nope"}}},
    {"tools": TOOLS, "tool_choice": "sometimes"},
    {"tools": [{"type": "function", "function": {"description": "no name"}}], "tool_choice": "none"},
])
def test_bad_tool_fields_are_400(qwen, extra):
    r = qwen.post("/v1/chat/completions", {"messages": ASK, "max_tokens": 4, **extra})
    assert r.status_code == 400, r.text
    assert r.json()["error"]["param"].startswith(("tool_choice", "tools"))


def test_tool_choice_none_and_auto_return_text(qwen):
    c = qwen.openai()
    for choice in ["none", "auto"]:
        r = c.chat.completions.create(model="tiny-qwen36", messages=ASK, tools=TOOLS, tool_choice=choice,
                                      max_tokens=8, temperature=0)
        ch = r.choices[0]
        assert ch.finish_reason == "length" and not ch.message.tool_calls  # random weights call nothing


# --- reasoning --------------------------------------------------------------------------------


def test_reasoning_opened_by_the_template(qwen):
    """The Qwen3.6 template ends the prompt in '<think>\\n': the whole (truncated) output is reasoning,
    max_tokens counts it, and the stream splits it the same way."""
    c = qwen.openai()
    r = c.chat.completions.create(model="tiny-qwen36", messages=ASK, max_tokens=12, temperature=0)
    m = r.choices[0].message
    assert m.reasoning_content and m.content == ""
    assert "<think>" not in m.reasoning_content and "</think>" not in m.reasoning_content
    assert r.usage.completion_tokens == 12 and r.choices[0].finish_reason == "length"
    stream = c.chat.completions.create(model="tiny-qwen36", messages=ASK, max_tokens=12, temperature=0, stream=True)
    reasoning, content, calls, finish = collect_stream(stream)
    assert (reasoning, content, calls, finish) == (m.reasoning_content, "", {}, "length")


def test_enable_thinking_false_reaches_the_template(qwen):
    """chat_template_kwargs.enable_thinking=false: the template closes an empty think block, so the
    output is content and reasoning_content is null."""
    c = qwen.openai()
    r = c.chat.completions.create(model="tiny-qwen36", messages=ASK, max_tokens=12, temperature=0,
                                  extra_body={"chat_template_kwargs": {"enable_thinking": False}})
    m = r.choices[0].message
    assert m.reasoning_content is None and m.content
    on = c.chat.completions.create(model="tiny-qwen36", messages=ASK, max_tokens=12, temperature=0)
    assert r.usage.prompt_tokens > on.usage.prompt_tokens  # '<think>\n\n</think>\n\n' vs '<think>\n'


def test_without_a_reasoning_parser_thinking_stays_in_content(qwen_plain):
    r = qwen_plain.openai().chat.completions.create(model="tiny-qwen36", messages=ASK, max_tokens=6, temperature=0)
    m = r.choices[0].message
    assert m.content and getattr(m, "reasoning_content", None) is None


# --- multi-turn -------------------------------------------------------------------------------


def tool_turn(call_id="call_abc123"):
    return ASK + [
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": call_id, "type": "function",
             "function": {"name": "get_weather", "arguments": json.dumps({"city": "Paris", "days": 1, "unit": "celsius"})}}]},
        {"role": "tool", "tool_call_id": call_id, "content": json.dumps({"temperature": 18, "sky": "clear"})},
    ]


def test_multi_turn_with_a_tool_result(qwen):
    """An assistant tool call (arguments as a JSON string, content null) and the tool's result render
    through the template: the prompt grows by the call and the result."""
    c = qwen.openai()
    first = c.chat.completions.create(model="tiny-qwen36", messages=ASK, tools=TOOLS, tool_choice="none",
                                      max_tokens=4, temperature=0)
    r = c.chat.completions.create(model="tiny-qwen36", messages=tool_turn(), tools=TOOLS, tool_choice="none",
                                  max_tokens=4, temperature=0)
    assert r.choices[0].finish_reason == "length"
    assert r.usage.prompt_tokens > first.usage.prompt_tokens + 20


# --- forced tool calls (grammar) --------------------------------------------------------------


def check_calls(message, finish_reason, names=None, single=False):
    """Well-formed tool calls whose arguments validate against their tool's parameters."""
    assert finish_reason == "tool_calls", finish_reason
    assert message.content is None
    assert message.tool_calls, message
    if single:
        assert len(message.tool_calls) == 1
    for call in message.tool_calls:
        assert call.type == "function" and call.id.startswith("call_")
        assert call.function.name in (names or PARAMS)
        jsonschema.validate(json.loads(call.function.arguments), PARAMS[call.function.name])
    return message.tool_calls


@pytest.fixture(scope="module", params=["qwen", "smollm2"])
def forced(request):
    """(server, model name, max_tokens, cases) for the forced-call tests, on both models; SmolLM2 runs
    one case per test (it is ~100x slower per token on the CPU)."""
    if request.param == "qwen":
        return request.getfixturevalue("qwen"), "tiny-qwen36", 300, 2
    return request.getfixturevalue("smollm2"), "smollm2-135m-instruct", 160, 1


def test_required_returns_valid_calls(forced):
    server, name, max_tokens, cases = forced
    c = server.openai()
    for seed in range(cases):
        r = c.chat.completions.create(model=name, messages=ASK, tools=TOOLS, tool_choice="required",
                                      parallel_tool_calls=False, max_tokens=max_tokens, temperature=1.0, seed=seed)
        check_calls(r.choices[0].message, r.choices[0].finish_reason, single=True)


def test_named_returns_that_function(forced):
    server, name, max_tokens, cases = forced
    c = server.openai()
    for fn in ["get_time", "get_weather"][:cases]:
        r = c.chat.completions.create(model=name, messages=ASK, tools=TOOLS, max_tokens=max_tokens, temperature=0,
                                      tool_choice={"type": "function", "function": {"name": fn}})
        check_calls(r.choices[0].message, r.choices[0].finish_reason, names=[fn], single=True)


def test_streamed_tool_call_deltas_concatenate_to_the_non_streamed_call(forced):
    server, name, max_tokens, _ = forced
    c = server.openai()
    kw = dict(model=name, messages=ASK, tools=TOOLS, tool_choice="required", parallel_tool_calls=False,
              max_tokens=max_tokens, temperature=0)
    whole = c.chat.completions.create(**kw)
    calls = check_calls(whole.choices[0].message, whole.choices[0].finish_reason)
    reasoning, content, streamed, finish = collect_stream(c.chat.completions.create(stream=True, **kw))
    assert finish == "tool_calls" and content == "" and reasoning == ""
    assert [(s["name"], s["arguments"]) for _, s in sorted(streamed.items())] == \
        [(t.function.name, t.function.arguments) for t in calls]


def test_multi_turn_after_a_forced_call(forced):
    """The call the model made goes back with the tool's result; the next turn answers in text."""
    server, name, max_tokens, _ = forced
    c = server.openai()
    r = c.chat.completions.create(model=name, messages=ASK, tools=TOOLS, max_tokens=max_tokens, temperature=0,
                                  tool_choice={"type": "function", "function": {"name": "get_weather"}})
    msg = r.choices[0].message
    call = check_calls(msg, r.choices[0].finish_reason, single=True)[0]
    history = ASK + [msg.model_dump(exclude_none=True),
                     {"role": "tool", "tool_call_id": call.id, "content": '{"temperature": 18}'}]
    again = c.chat.completions.create(model=name, messages=history, tools=TOOLS, tool_choice="none", max_tokens=8,
                                      temperature=0)
    assert again.choices[0].finish_reason in ("stop", "length")
    assert again.usage.prompt_tokens > r.usage.prompt_tokens
