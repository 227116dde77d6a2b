// Tests of the Jinja engine (text/jinja_*): hand-written checks of whitespace control, loops,
// scoping, namespaces, macros, filters, Python value formatting and error reporting, plus every
// case of tests/fixtures/chat_templates/jinja_cases.json, whose expected output was rendered by
// transformers' own Jinja environment (scripts/make_chat_fixtures.py).
#include <gtest/gtest.h>

#include <fstream>
#include <sstream>
#include <string>

#include "core/error.h"
#include "text/jinja_lexer.h"
#include "text/jinja_template.h"
#include "text/jinja_value.h"
#include "fixture_util.h"

namespace moefold::jinja {
namespace {

std::string render(const std::string& tpl, const Json& ctx = Json::object()) {
  ValueDict d;
  for (auto it = ctx.begin(); it != ctx.end(); ++it) d.set(it.key(), Value::from_json(it.value()));
  return Template(tpl).render(d);
}

/// The message of the moefold::Error thrown while parsing or rendering, or "" if none.
std::string error_of(const std::string& tpl, const Json& ctx = Json::object()) {
  try {
    render(tpl, ctx);
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

TEST(JinjaWhitespace, TrimAndLstripBlocks) {
  EXPECT_EQ(render("  {% if true %}\n  yes\n  {% endif %}\nend"), "  yes\nend");
  EXPECT_EQ(render("{% for i in [1, 2] %}\n{{ i }}\n{% endfor %}"), "1\n2\n");
  EXPECT_EQ(render("a {% if true %}b{% endif %} c"), "a b c");  // lstrip only at line start
}

TEST(JinjaWhitespace, MinusAndPlusModifiers) {
  EXPECT_EQ(render("a  \n  {{- 'b' -}}  \n  c"), "abc");
  EXPECT_EQ(render("a\n  {%- if true %}b{% endif -%}\n  c"), "abc");
  EXPECT_EQ(render("a\n  {%+ if true %}b{% endif %}"), "a\n  b");
  EXPECT_EQ(render("x\n{% if true +%}\ny{% endif %}"), "x\n\ny");
}

TEST(JinjaWhitespace, NewlinesAndComments) {
  EXPECT_EQ(render("a\r\nb\n"), "a\nb");  // CRLF normalised, one trailing newline dropped
  EXPECT_EQ(render("a\n{# note #}\nb"), "a\nb");
  EXPECT_EQ(render("{% raw %}{{ x }}{% endraw %}"), "{{ x }}");
}

TEST(JinjaLoops, LoopVariablesAndElse) {
  EXPECT_EQ(render("{% for x in 'abc' %}{{ loop.index0 }}{{ x }}{{ '|' if not loop.last }}{% endfor %}"), "0a|1b|2c");
  EXPECT_EQ(render("{% for x in [] %}x{% else %}none{% endfor %}"), "none");
  EXPECT_EQ(render("{% for x in [1,2,3] %}{{ loop.length }}{{ loop.revindex0 }}{% endfor %}"), "323130");
  EXPECT_EQ(render("{% for k, v in {'a': 1, 'b': 2}.items() %}{{ k }}{{ v }}{% endfor %}"), "a1b2");
  EXPECT_EQ(render("{% for x in [1,2,3,4] if x > 2 %}{{ x }}{{ loop.index }}{% endfor %}"), "3142");
  EXPECT_EQ(render("{% for i in range(5) %}{% if i == 3 %}{% break %}{% endif %}{{ i }}{% endfor %}"), "012");
}

TEST(JinjaScoping, LoopBodyScopeIsPerIteration) {
  EXPECT_EQ(render("{% set x = 0 %}{% for i in range(3) %}{% set x = x + 1 %}{{ x }}{% endfor %}{{ x }}"), "1110");
  EXPECT_EQ(render("{% set ns = namespace(x=0) %}{% for i in range(3) %}{% set ns.x = ns.x + 1 %}{% endfor %}{{ ns.x }}"),
            "3");
  EXPECT_EQ(render("{% if true %}{% set y = 5 %}{% endif %}{{ y }}"), "5");
}

TEST(JinjaMacros, DefaultsKeywordsAndTrim) {
  const std::string m = "{% macro f(a, b='B', c=none) %}{{ a }}{{ b }}{{ c }}{% endmacro %}";
  EXPECT_EQ(render(m + "{{ f(1) }}|{{ f(1, 2) }}|{{ f(1, c=3) }}|{{ f(a=0) }}"), "1BNone|12None|1B3|0BNone");
  EXPECT_EQ(render("{%- macro r(x) %}\n    {{- x }}\n{%- endmacro %}\n[{{ r(' y ')|trim }}]"), "[y]");
  EXPECT_EQ(render("{% macro w() %}({{ caller() }}){% endmacro %}{% call w() %}in{% endcall %}"), "(in)");
}

TEST(JinjaFilters, TojsonMatchesPythonJsonDumps) {
  Json ctx = Json::parse(R"({"d": {"b": [1, 2.5, null, true], "a": "é\n\"", "e": {}}})");
  EXPECT_EQ(render("{{ d|tojson }}", ctx), R"({"b": [1, 2.5, null, true], "a": "é\n\"", "e": {}})");
  EXPECT_EQ(render("{{ d.b|tojson(indent=1) }}", ctx), "[\n 1,\n 2.5,\n null,\n true\n]");
  EXPECT_EQ(render("{{ d.a|tojson(ensure_ascii=true) }}", ctx), R"("\u00e9\n\"")");
  EXPECT_EQ(render("{{ d|tojson(sort_keys=true, separators=(',', ':')) }}", ctx),
            R"({"a":"é\n\"","b":[1,2.5,null,true],"e":{}})");
}

TEST(JinjaFilters, CommonFilters) {
  EXPECT_EQ(render("{{ ' x '|trim }}{{ 'ab'|upper }}{{ [1,2]|length }}{{ 'a,b'|replace(',', ';') }}"), "xAB2a;b");
  EXPECT_EQ(render("{{ [{'n': 'a'}, {'n': 'b'}]|map(attribute='n')|join('+') }}"), "a+b");
  EXPECT_EQ(render("{{ [{'k': 1}, {'k': 0}]|selectattr('k')|list|length }}"), "1");
  EXPECT_EQ(render("{{ missing|default('d') }}{{ ''|default('e', true) }}"), "de");
  EXPECT_EQ(render("{{ [3, 1, 2]|sort|list }}{{ [1, 2]|reverse|list }}{{ '7'|int + 1 }}"), "[1, 2, 3][2, 1]8");
}

TEST(JinjaValues, PythonFormatting) {
  EXPECT_EQ(render("{{ none }}{{ true }}{{ 1.0 }}{{ 1e16 }}{{ 1e-5 }}{{ 7 / 2 }}{{ 7 // 2 }}"), "NoneTrue1.01e+161e-053.53");
  EXPECT_EQ(render("{{ ['a', \"it's\", 1, none, {'k': false}] }}"), "['a', \"it's\", 1, None, {'k': False}]");
  EXPECT_EQ(render("{{ 'héllo'|length }}{{ 'héllo'[1] }}{{ 'héllo'[::-1] }}"), "5éolléh");
  EXPECT_EQ(py_float_repr(0.1 + 0.2), "0.30000000000000004");
  EXPECT_EQ(py_float_repr(123456789012345678.0), "1.2345678901234568e+17");
}

TEST(JinjaStrings, Methods) {
  EXPECT_EQ(render("{{ 'a</think>b'.split('</think>')[-1] }}{{ '\\n\\nx'.lstrip('\\n') }}"), "bx");
  EXPECT_EQ(render("{{ 'abc'.startswith('ab') }}{{ 'abc'.endswith('bc') }}{{ ' a b '.split() }}"), "TrueTrue['a', 'b']");
}

TEST(JinjaErrors, NameTheLine) {
  std::string e = error_of("line one\n{{ raise_exception('boom') }}");
  EXPECT_NE(e.find("line 2"), std::string::npos) << e;
  EXPECT_NE(e.find("boom"), std::string::npos) << e;

  e = error_of("a\nb\n{{ x|nosuch }}");
  EXPECT_NE(e.find("line 3"), std::string::npos) << e;
  EXPECT_NE(e.find("nosuch"), std::string::npos) << e;

  e = error_of("{% if true %}\nunclosed");
  EXPECT_NE(e.find("endif"), std::string::npos) << e;

  e = error_of("ok\n\n{{ 1 + }}");
  EXPECT_NE(e.find("line 3"), std::string::npos) << e;

  e = error_of("{% for m in messages %}\n{{ m.a.b }}\n{% endfor %}", Json::parse(R"({"messages": [{}]})"));
  EXPECT_NE(e.find("line 2"), std::string::npos) << e;

  EXPECT_NE(error_of("{{ 'unterminated }}"), "");
  EXPECT_NE(error_of("{% frob %}"), "");
  EXPECT_NE(error_of("{{ 'a' + 1 }}"), "");
}

TEST(JinjaLexer, TracksLinesAndStrings) {
  auto toks = tokenize("a\n{{ 'x\\ty' }}\n{% if b %}");
  ASSERT_GE(toks.size(), 4u);
  EXPECT_EQ(toks[0].type, TokenType::Text);
  EXPECT_EQ(toks[1].type, TokenType::VarBegin);
  EXPECT_EQ(toks[1].line, 2);
  EXPECT_EQ(toks[2].type, TokenType::String);
  EXPECT_EQ(toks[2].text, "x\ty");
}

// ---- differential cases rendered by transformers' Jinja environment ---------------------------

Json load_cases() {
  std::ifstream in(moefold::test::kFixtures / "chat_templates" / "jinja_cases.json");
  std::stringstream ss;
  ss << in.rdbuf();
  return Json::parse(ss.str());
}

TEST(JinjaFixtures, MatchTransformersJinjaByteForByte) {
  Json cases = load_cases();
  ASSERT_GT(cases.size(), 50u);
  for (const auto& c : cases) {
    SCOPED_TRACE(c["name"].get<std::string>());
    const std::string tpl = c["template"].get<std::string>();
    if (c.contains("error")) {
      EXPECT_NE(error_of(tpl, c["context"]), "") << "expected an error like: " << c["error"];
      continue;
    }
    try {
      EXPECT_EQ(render(tpl, c["context"]), c["expected"].get<std::string>());
    } catch (const Error& e) {
      ADD_FAILURE() << "threw: " << e.what();
    }
  }
}

}  // namespace
}  // namespace moefold::jinja
