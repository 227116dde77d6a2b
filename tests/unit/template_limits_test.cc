// Chat-template budgets (issue 11, item 6, and the template half of item 1): a template from a
// checkpoint or values from a request can no longer hang the renderer, exhaust memory or overflow the
// stack. Each case fails fast with TemplateLimitError (or a plain Error for Python semantics we cannot
// follow, such as bigints), never a crash, and the message names the limit. Also the crashes the
// fuzzers found (fuzz/corpus/chat_template/regress_*, docs/fuzzing.md).
#include <gtest/gtest.h>

#include <chrono>
#include <string>

#include "fixture_util.h"
#include "core/error.h"
#include "text/chat_template.h"
#include "text/jinja_limits.h"

using namespace moefold;
using Json = ChatTemplate::Json;

namespace {

const Json kMessages = Json::parse(R"([{"role": "user", "content": "hi"}])");

struct Outcome {
  std::string text;   ///< rendered text, or the error message
  bool limit = false; ///< the error was a TemplateLimitError
  bool error = false;
  double seconds = 0;
};

Outcome render(const std::string& tpl, const Json& messages = kMessages, const Json& tools = nullptr,
               const jinja::RenderLimits* limits = nullptr) {
  Outcome o;
  auto t0 = std::chrono::steady_clock::now();
  try {
    ChatTemplate t = ChatTemplate::from_string(tpl);
    if (limits) t.set_limits(*limits);
    o.text = t.render(messages, tools, true);
  } catch (const jinja::TemplateLimitError& e) {
    o.text = e.what();
    o.limit = o.error = true;
  } catch (const Error& e) {
    o.text = e.what();
    o.error = true;
  }
  o.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return o;
}

TEST(TemplateLimits, NestedLoopsStopAtTheTimeBudget) {
  jinja::RenderLimits lim;
  lim.max_seconds = 0.2;
  Outcome o = render("{% for i in range(10000) %}{% for j in range(10000) %}{% endfor %}{% endfor %}", kMessages,
                     nullptr, &lim);
  EXPECT_TRUE(o.limit) << o.text;
  EXPECT_NE(o.text.find("time budget of 0.2 s"), std::string::npos) << o.text;
  EXPECT_LT(o.seconds, 2.0);
}

TEST(TemplateLimits, HugeStringRepetitionFailsBeforeAllocating) {
  for (const char* tpl : {"{{ 'a' * 100000000000 }}", "{{ 100000000000 * 'ab' }}", "{{ ['x'] * 100000000000 }}",
                          "{{ 'a' * 9223372036854775807 }}"}) {
    Outcome o = render(tpl);
    EXPECT_TRUE(o.limit) << tpl << ": " << o.text;
    EXPECT_NE(o.text.find("repetition would build"), std::string::npos) << o.text;
    EXPECT_LT(o.seconds, 1.0) << tpl;
  }
  EXPECT_EQ(render("{{ '' * 100000000000 }}|{{ [] * 100000000000 }}").text, "|[]");
}

TEST(TemplateLimits, OutputAndStringGrowthAreBounded) {
  jinja::RenderLimits lim;
  lim.max_output_bytes = 1 << 16;
  for (const char* tpl : {"{% for i in range(100000) %}xxxxxxxxxx{% endfor %}",
                          "{% set ns = namespace(s='ab') %}{% for i in range(64) %}{% set ns.s = ns.s ~ ns.s %}{% endfor %}",
                          "{% set ns = namespace(s='ab') %}{% for i in range(64) %}{% set ns.s = ns.s.replace('a', 'aa') + ns.s %}{% endfor %}",
                          "{{ range(50000) | join('-----') }}", "{{ 'x' | center(100000000000) }}",
                          "{{ 'a\nb' | indent(100000000000) }}", "{{ [1] | tojson(indent=100000000000) }}",
                          "{{ '%100000000000s' % 'x' }}"}) {
    Outcome o = render(tpl, kMessages, nullptr, &lim);
    EXPECT_TRUE(o.limit) << tpl << ": " << o.text;
    EXPECT_NE(o.text.find("(limit 65536 bytes)"), std::string::npos) << tpl << ": " << o.text;
  }
}

TEST(TemplateLimits, RangeIsBoundedWithoutOverflow) {
  Outcome o = render("{{ range(1000000000000) | length }}");
  EXPECT_TRUE(o.limit) << o.text;
  EXPECT_NE(o.text.find("range() of 1000000000000 items"), std::string::npos) << o.text;
  EXPECT_EQ(render("{{ range(9223372036854775806, 9223372036854775807, 5) | list }}").text, "[9223372036854775806]");
  EXPECT_EQ(render("{{ range(5, -4, -3) | list }}").text, "[5, 2, -1]");
}

TEST(TemplateLimits, SelfCallingMacrosStop) {
  Outcome o = render("{% macro f(n) %}{{ f(n + 1) }}{% endmacro %}{{ f(0) }}");
  EXPECT_TRUE(o.limit) << o.text;
  EXPECT_NE(o.text.find("levels deep"), std::string::npos) << o.text;
  o = render("{% macro a() %}{{ b() }}{% endmacro %}{% macro b() %}{{ a() }}{% endmacro %}{{ a() }}");
  EXPECT_TRUE(o.limit) << o.text;
}

TEST(TemplateLimits, DeeplyNestedRequestDataIsRejectedWithoutRecursingIntoIt) {
  // The 60 KB body of issue 11 item 1: 30,000 levels in a message field and in tools.
  std::string deep = std::string(30000, '[') + std::string(30000, ']');
  Json messages = Json::parse(R"([{"role": "user", "content": "hi", "extra": )" + deep + "}]");
  Outcome o = render("{{ messages[0].content }}", messages);
  EXPECT_TRUE(o.limit) << o.text;
  EXPECT_NE(o.text.find("request data nested more than 128 levels deep"), std::string::npos) << o.text;
  o = render("{{ tools | tojson }}", kMessages, Json::parse("[" + deep + "]"));
  EXPECT_TRUE(o.limit) << o.text;
  // Realistic nesting (a JSON schema a few levels deep) still renders.
  std::string ok = std::string(20, '[') + std::string(20, ']');
  EXPECT_FALSE(render("{{ tools | tojson }}", kMessages, Json::parse("[" + ok + "]")).error);
}

TEST(TemplateLimits, ValuesBuiltDeepByATemplateAreRejected) {
  Outcome o = render("{% set ns = namespace(x=[]) %}{% for i in range(100000) %}{% set ns.x = [ns.x] %}{% endfor %}{{ ns.x }}");
  EXPECT_TRUE(o.limit) << o.text;
  EXPECT_NE(o.text.find("a value nested more than 128 levels deep"), std::string::npos) << o.text;
  // A namespace holding itself: printing it must stop, not recurse forever.
  o = render("{% set ns = namespace(a=1) %}{% set ns.self = ns %}{{ ns }}");
  EXPECT_TRUE(o.limit) << o.text;
  o = render("{% set ns = namespace(a=1) %}{% set ns.self = [ns] %}{{ ns | tojson }}");
  EXPECT_TRUE(o.limit) << o.text;
}

TEST(TemplateLimits, DeeplyNestedTemplatesAreParseErrors) {
  for (std::string tpl : {"{{ " + std::string(20000, '(') + "1" + std::string(20000, ')') + " }}",
                          "{{ 1" + [] { std::string s; for (int i = 0; i < 20000; ++i) s += "+1"; return s; }() + " }}",
                          "{{ x" + [] { std::string s; for (int i = 0; i < 20000; ++i) s += ".a"; return s; }() + " }}",
                          "{{ 'a'" + [] { std::string s; for (int i = 0; i < 20000; ++i) s += "|trim"; return s; }() + " }}",
                          [] { std::string s; for (int i = 0; i < 5000; ++i) s += "{% if true %}"; return s; }()}) {
    Outcome o = render(tpl);
    EXPECT_TRUE(o.error) << tpl.substr(0, 40);
    EXPECT_NE(o.text.find("nested too deeply"), std::string::npos) << o.text;
  }
}

TEST(TemplateLimits, IntegerArithmeticNeverWrapsOrTraps) {
  // Each of these was undefined behaviour (signed overflow; INT64_MIN // -1 raises SIGFPE) or, for
  // 2 ** 10**12, a loop of 10**12 multiplications.
  for (const char* tpl : {"{{ 9223372036854775807 + 1 }}", "{{ -9223372036854775807 - 2 }}",
                          "{{ 4611686018427387904 * 2 }}", "{{ (-9223372036854775807 - 1) // -1 }}",
                          "{{ -(-9223372036854775807 - 1) }}", "{{ 3 ** 1000000000000 }}"}) {
    Outcome o = render(tpl);
    EXPECT_TRUE(o.error) << tpl << " rendered " << o.text;
    EXPECT_NE(o.text.find("integer overflow"), std::string::npos) << tpl << ": " << o.text;
    EXPECT_LT(o.seconds, 1.0) << tpl;
  }
  EXPECT_EQ(render("{{ 2 ** 62 }} {{ (-9223372036854775807 - 1) % -1 }} {{ 1 ** 1000000000000 }}").text,
            "4611686018427387904 0 1");
}

TEST(TemplateLimits, FuzzerFindingsAreErrorsNotCrashes) {
  // fuzz_chat_template: integer literals beyond int64 threw std::out_of_range from the lexer.
  Outcome o = render("{{ 92233720368547758070 }}");
  EXPECT_TRUE(o.error);
  EXPECT_NE(o.text.find("does not fit in 64 bits"), std::string::npos) << o.text;
  EXPECT_EQ(render("{{ 1e999 }}").text, "inf");
  // Attribute paths with huge numeric parts, str.format field indices, float -> int of inf/nan.
  EXPECT_FALSE(render("{{ [{'a': 1}] | map(attribute='99999999999999999999999') | list }}").text.empty());
  EXPECT_TRUE(render("{{ '{99999999999999999999}'.format(1) }}").error);
  EXPECT_TRUE(render("{{ (1e300 * 1e300) | int }}").error);
  EXPECT_TRUE(render("{{ '%d' % (1e300 * 1e300) }}").error);
}

TEST(TemplateLimits, RealTemplatesRenderUnderTheDefaults) {
  ChatTemplate t = ChatTemplate::from_model_dir(moefold::test::kSourceDir.string() + "/tests/fixtures/chat_templates/qwen3_6");
  std::string out = t.render(kMessages, Json(nullptr), true);
  EXPECT_NE(out.find("hi"), std::string::npos);
}

}  // namespace
