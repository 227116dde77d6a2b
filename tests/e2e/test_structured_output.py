"""Structured output through the official `openai` client: response_format json_schema (20 schemas:
nested objects, arrays, enums, numbers, required fields, string patterns) and json_object on the tiny
random-weight model and on SmolLM2-135M-Instruct, streamed and not, every output parsed and validated
with `jsonschema`; vLLM's structured_outputs / guided_* fields (regex, choice, grammar); and the 400s
for schemas and grammars the engine cannot compile.

Every schema bounds its output (maxLength, maxItems, integer ranges, enums, patterns): a random-weight
model picks among the allowed tokens almost uniformly, so an unbounded string would run to max_tokens.
"""

import concurrent.futures
import json
import pathlib
import re

import jsonschema
import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
SMOLLM2 = ROOT / "models" / "smollm2-135m-instruct"

SHORT = {"type": "string", "maxLength": 8}

SCHEMAS = {
    "person": {"type": "object", "properties": {"name": SHORT, "age": {"type": "integer", "minimum": 0, "maximum": 150}},
               "required": ["name", "age"]},
    "colour_enum": {"type": "string", "enum": ["red", "green", "blue"]},
    "nested_user": {"type": "object", "properties": {"user": {"type": "object", "properties": {
        "id": {"type": "integer", "minimum": 1, "maximum": 9999},
        "email": {"type": "string", "pattern": "^[a-z]{1,8}@[a-z]{1,6}\\.com$"}}, "required": ["id", "email"]}},
        "required": ["user"]},
    "int_array": {"type": "array", "items": {"type": "integer", "minimum": 0, "maximum": 9}, "minItems": 1, "maxItems": 5},
    "points": {"type": "object", "properties": {"points": {"type": "array", "maxItems": 3, "items": {
        "type": "object", "properties": {"x": {"type": "integer", "minimum": -10, "maximum": 10},
                                         "y": {"type": "integer", "minimum": -10, "maximum": 10}},
        "required": ["x", "y"]}}}, "required": ["points"]},
    "booleans": {"type": "object", "properties": {"ok": {"type": "boolean"}, "flag": {"type": "boolean"}},
                 "required": ["ok", "flag"]},
    "const_version": {"type": "object", "properties": {"version": {"const": "v1"},
                                                       "n": {"type": "integer", "minimum": 0, "maximum": 99}},
                      "required": ["version", "n"]},
    "code_pattern": {"type": "object", "properties": {"code": {"type": "string", "pattern": "^[A-Z]{3}-[0-9]{4}$"}},
                     "required": ["code"]},
    "date_pattern": {"type": "object", "properties": {"date": {"type": "string", "pattern": "^[0-9]{4}-[0-9]{2}-[0-9]{2}$"}},
                     "required": ["date"]},
    "optional_fields": {"type": "object", "properties": {"a": {"type": "string", "maxLength": 5},
                                                         "b": {"type": "integer", "minimum": 0, "maximum": 9}}},
    "any_of": {"type": "object", "properties": {"value": {"anyOf": [{"type": "integer", "minimum": 0, "maximum": 99},
                                                                    {"type": "string", "maxLength": 4}]}},
               "required": ["value"]},
    "matrix": {"type": "object", "properties": {"matrix": {"type": "array", "maxItems": 3, "items": {
        "type": "array", "maxItems": 3, "items": {"type": "integer", "minimum": 0, "maximum": 9}}}},
        "required": ["matrix"]},
    "int_enum": {"type": "object", "properties": {"level": {"enum": [1, 2, 3]}}, "required": ["level"]},
    "nullable": {"type": "object", "properties": {"note": {"type": ["string", "null"], "maxLength": 6}},
                 "required": ["note"]},
    "refs": {"type": "object", "$defs": {"pt": {"type": "object", "properties": {
        "x": {"type": "integer", "minimum": 0, "maximum": 9}}, "required": ["x"]}},
        "properties": {"a": {"$ref": "#/$defs/pt"}, "b": {"$ref": "#/$defs/pt"}}, "required": ["a", "b"]},
    "deep": {"type": "object", "properties": {"a": {"type": "object", "properties": {"b": {"type": "object", "properties": {
        "c": {"enum": ["x", "y"]}}, "required": ["c"]}}, "required": ["b"]}}, "required": ["a"]},
    "product": {"type": "object", "properties": {
        "id": {"type": "integer", "minimum": 1, "maximum": 1000}, "name": {"type": "string", "maxLength": 12},
        "price": {"type": "number", "minimum": 0, "maximum": 1000}, "in_stock": {"type": "boolean"},
        "tags": {"type": "array", "items": {"enum": ["new", "sale"]}, "maxItems": 2}},
        "required": ["id", "name", "price", "in_stock"]},
    "word_length": {"type": "object", "properties": {"word": {"type": "string", "minLength": 2, "maxLength": 5}},
                    "required": ["word"]},
    "letter_list": {"type": "array", "items": {"enum": ["a", "b", "c"]}, "minItems": 2, "maxItems": 4},
    "weather": {"type": "object", "properties": {
        "city": {"type": "string", "maxLength": 10}, "unit": {"enum": ["celsius", "fahrenheit"]},
        "temperature": {"type": "integer", "minimum": -50, "maximum": 50},
        "hourly": {"type": "array", "maxItems": 2, "items": {"type": "integer", "minimum": 0, "maximum": 23}}},
        "required": ["city", "unit", "temperature"]},
}
assert len(SCHEMAS) == 20


def response_format(name):
    return {"type": "json_schema", "json_schema": {"name": name, "schema": SCHEMAS[name], "strict": True}}


def ask(client, model, name, stream, seed):
    """(text, finish_reason) of one chat completion constrained to schema `name`."""
    kw = dict(model=model, messages=[{"role": "user", "content": f"Give me a JSON value for '{name}'."}],
              response_format=response_format(name), max_tokens=400, seed=seed, temperature=0.7)
    if not stream:
        r = client.chat.completions.create(**kw)
        return r.choices[0].message.content, r.choices[0].finish_reason
    text, finish = "", None
    for chunk in client.chat.completions.create(stream=True, **kw):
        if chunk.choices:
            text += chunk.choices[0].delta.content or ""
            finish = chunk.choices[0].finish_reason or finish
    return text, finish


def check_all_schemas(client, model):
    jobs = [(name, stream) for name in SCHEMAS for stream in (False, True)]
    with concurrent.futures.ThreadPoolExecutor(8) as pool:
        results = list(pool.map(lambda j: ask(client, model, j[0], j[1], seed=len(j[0])), jobs))
    for (name, stream), (text, finish) in zip(jobs, results):
        assert finish == "stop", (name, stream, finish, text)
        value = json.loads(text)
        jsonschema.validate(value, SCHEMAS[name])


JSON_OBJECT_PROMPTS = ["Describe a cat as a JSON object with the keys name and age.",
                       "Give the capital of France as a JSON object.",
                       "Return a JSON object with a field 'answer' saying hello.",
                       "A JSON object describing a book (title, year)."]


def json_objects(client, model, seeds, max_tokens, temperature=1.0):
    """(text, finish_reason) of json_object completions, one per seed, sent concurrently."""
    def one(seed):
        r = client.chat.completions.create(
            model=model, messages=[{"role": "user", "content": JSON_OBJECT_PROMPTS[seed % len(JSON_OBJECT_PROMPTS)]}],
            response_format={"type": "json_object"}, max_tokens=max_tokens, seed=seed, temperature=temperature)
        return r.choices[0].message.content, r.choices[0].finish_reason
    with concurrent.futures.ThreadPoolExecutor(8) as pool:
        return list(pool.map(one, seeds))


# --- the tiny random-weight model --------------------------------------------------------------


def test_twenty_schemas_validate_on_random_model(server):
    check_all_schemas(server.openai(), "tiny-moe")


def test_json_object_is_an_object_on_random_model(server):
    # A random-weight model almost never closes an unconstrained string, so most of these run to
    # max_tokens: each output still opens an object, and every one that ends is an object (with the
    # fixed server and request seeds, some do end).
    results = json_objects(server.openai(), "tiny-moe", range(8), 600)
    finished = [text for text, finish in results if finish == "stop"]
    assert all(text.startswith("{") for text, _ in results), results
    assert finished, "no json_object output ended within 600 tokens"
    for text in finished:
        assert isinstance(json.loads(text), dict), text


def test_regex_choice_and_grammar_fields(server):
    client = server.openai()
    msg = [{"role": "user", "content": "hi"}]

    def content(**extra):
        r = client.chat.completions.create(model="tiny-moe", messages=msg, max_tokens=60, seed=3, extra_body=extra)
        assert r.choices[0].finish_reason == "stop"
        return r.choices[0].message.content

    assert re.fullmatch(r"[0-9]{3}-[a-z]{2}", content(structured_outputs={"regex": "[0-9]{3}-[a-z]{2}"}))
    assert re.fullmatch(r"[A-C]{4}", content(guided_regex="[A-C]{4}"))
    assert content(structured_outputs={"choice": ["alpha", "beta"]}) in ("alpha", "beta")
    assert content(guided_choice=["yes", "no"]) in ("yes", "no")
    grammar = 'root ::= "(" [0-9] ("+" [0-9])? ")"'
    assert re.fullmatch(r"\([0-9](\+[0-9])?\)", content(structured_outputs={"grammar": grammar}))
    assert re.fullmatch(r"\([0-9](\+[0-9])?\)", content(guided_grammar=grammar))
    # The completions API takes the same fields.
    r = client.completions.create(model="tiny-moe", prompt="x", max_tokens=20, seed=1,
                                  extra_body={"guided_choice": ["up", "down"]})
    assert r.choices[0].text in ("up", "down")


def test_n_choices_and_seeds_all_validate(server):
    r = server.openai().chat.completions.create(model="tiny-moe", messages=[{"role": "user", "content": "go"}],
                                                response_format=response_format("weather"), max_tokens=300, n=4,
                                                temperature=1.0)
    assert len(r.choices) == 4
    for c in r.choices:
        jsonschema.validate(json.loads(c.message.content), SCHEMAS["weather"])


@pytest.mark.parametrize("body, param, needle", [
    ({"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "frobnicate"}}}},
     "response_format", "json_schema"),
    ({"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": {
        "type": "object", "properties": {"a": {"$ref": "#/$defs/missing"}}}}}}, "response_format", "json_schema"),
    ({"response_format": {"type": "json_schema", "json_schema": {"name": "x"}}},
     "response_format.json_schema.schema", "required"),
    ({"response_format": {"type": "xml"}}, "response_format.type", "json_schema"),
    ({"guided_regex": "(unclosed"}, "guided_regex", "regex"),
    ({"structured_outputs": {"grammar": "root ::= undefined_rule"}}, "structured_outputs.grammar", "grammar"),
    ({"guided_choice": []}, "guided_choice", "non-empty"),
    ({"guided_json": "{not json"}, "guided_json", "not valid JSON"),
    ({"guided_regex": "a", "response_format": {"type": "json_object"}}, "guided_regex", "Only one"),
])
def test_uncompilable_constraints_are_400(server, body, param, needle):
    import openai

    client = server.openai()
    with pytest.raises(openai.BadRequestError) as e:
        client.chat.completions.create(model="tiny-moe", messages=[{"role": "user", "content": "hi"}], max_tokens=5,
                                       extra_body=body)
    err = e.value.body
    assert err["param"] == param, err
    assert needle in err["message"], err


def test_text_response_format_is_unconstrained(server):
    r = server.openai().chat.completions.create(model="tiny-moe", messages=[{"role": "user", "content": "hi"}],
                                                response_format={"type": "text"}, max_tokens=8, seed=1)
    assert r.choices[0].message.content is not None


# --- SmolLM2-135M-Instruct (real weights) ------------------------------------------------------

smollm2 = pytest.mark.skipif(not (SMOLLM2 / "model.safetensors").exists(),
                             reason="models/smollm2-135m-instruct not converted (scripts/test.sh does it)")


@pytest.fixture(scope="module")
def smol_server(start_server, tmp_path_factory):
    return start_server(SMOLLM2, "--max-num-seqs", 16, "--max-model-len", 1024, "--served-model-name", "smollm2",
                        load_format="auto", log_dir=str(tmp_path_factory.mktemp("smol-logs")))


def slow_client(server):
    """An openai client for the real model with room for a busy 2-core machine (a request of ~40 tokens
    beside 7 others takes ~10 s on an idle one)."""
    import httpx
    import openai

    return openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0, timeout=900,
                         http_client=httpx.Client(trust_env=False, timeout=900))


@smollm2
def test_twenty_schemas_validate_on_smollm2(smol_server):
    check_all_schemas(slow_client(smol_server), "smollm2")


@smollm2
def test_strict_schema_answer_on_smollm2(smol_server):
    """A real model asked a real question answers with the schema's shape, streamed and not alike."""
    schema = {"type": "object", "properties": {"capital": {"type": "string", "maxLength": 20}},
              "required": ["capital"]}
    kw = dict(model="smollm2", messages=[{"role": "user", "content": "What is the capital of France? Answer in JSON."}],
              response_format={"type": "json_schema", "json_schema": {"name": "c", "schema": schema, "strict": True}},
              max_tokens=40, temperature=0)
    client = slow_client(smol_server)
    text = client.chat.completions.create(**kw).choices[0].message.content
    streamed = "".join(c.choices[0].delta.content or "" for c in client.chat.completions.create(stream=True, **kw)
                       if c.choices)
    assert streamed == text
    value = json.loads(text)
    jsonschema.validate(value, schema)
    assert "paris" in value["capital"].lower(), text


@smollm2
def test_json_object_is_an_object_on_smollm2(smol_server):
    # The 135M model can ramble inside a valid object until max_tokens (greedy on the France prompt lists
    # population keys; temperature 1 lists numbers): these seeds at 0.7 answer briefly (sampling is
    # counter-based, so they always do).
    for text, finish in json_objects(slow_client(smol_server), "smollm2", range(3), 200, temperature=0.7):
        assert finish == "stop", text
        assert isinstance(json.loads(text), dict), text
