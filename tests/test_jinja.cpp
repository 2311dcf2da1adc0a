// The Jinja engine (src/jinja) against Python's jinja2 on the semantics chat templates lean on:
// whitespace control, Python printing, Undefined, scoping, loops, macros, filters, tests, the
// sandbox and the limits. The cases and jinja2's renderings live in tests/data/jinja/cases.json
// (tests/jinja/oracle.py update regenerates the renderings); $STRATA_JINJA_CASES names another
// file of the same form (tests/jinja/differential.py feeds random programs through it).
#include <gtest/gtest.h>

#include <cstdlib>
#include <fstream>
#include <sstream>

#include "jinja/jinja.h"

namespace strata::jinja {
namespace {

std::string slurp(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  std::stringstream s;
  s << f.rdbuf();
  return s.str();
}

RenderOptions fixed_now() {
  std::tm now{};
  now.tm_year = 2026 - 1900;
  now.tm_mon = 11;
  now.tm_mday = 2;
  now.tm_hour = 9;
  now.tm_min = 30;
  now.tm_wday = 3;
  now.tm_yday = 335;
  RenderOptions o;
  o.now = now;
  return o;
}

Result<std::string> render(std::string_view source, const Json& context = Json::object()) {
  auto t = Template::parse(source);
  if (!t) return t.error();
  return t->render(context, fixed_now());
}

// A jinja2 syntax error's message names jinja2's parser state; strata's names its own, with the
// line. Render errors carry the message of the Python exception, and must match it (the random
// programs of the differential test mark theirs "any_message": both must fail, that is all).
bool is_syntax_error(const Json& c) { return c["name"].get<std::string>().rfind("syntax_", 0) == 0; }

TEST(Jinja, CasesRenderAsJinja2Does) {
  const char* env = std::getenv("STRATA_JINJA_CASES");
  const std::string path = env && *env ? env : STRATA_SOURCE_DIR "/tests/data/jinja/cases.json";
  const Json cases = Json::parse(slurp(path));
  ASSERT_GT(cases.size(), 0u);
  for (const auto& c : cases) {
    SCOPED_TRACE(c["name"].get<std::string>() + ": " + c["template"].get<std::string>());
    auto r = render(c["template"].get<std::string>(), c.value("context", Json::object()));
    if (c.contains("error")) {
      EXPECT_FALSE(r.ok()) << "rendered " << *r << "\njinja2 raised: " << c["error"].get<std::string>();
      if (!r.ok() && !is_syntax_error(c) && !c.value("any_message", false)) {
        EXPECT_EQ(r.error().message, c["error"].get<std::string>());
      }
      continue;
    }
    EXPECT_TRUE(r.ok()) << r.error().message;
    if (r.ok()) {
      EXPECT_EQ(*r, c["expected"].get<std::string>());
    }
  }
}

TEST(Jinja, SyntaxErrorsNameTheLine) {
  auto r = render("line one\n{% if x %}\n{{ 1 + }}\n{% endif %}");
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.error().message.rfind("line 3: ", 0), 0u) << r.error().message;
  auto u = render("{% if x %}open");
  ASSERT_FALSE(u.ok());
  EXPECT_NE(u.error().message.find("'endif'"), std::string::npos) << u.error().message;
}

TEST(Jinja, LimitsStopRunawayTemplates) {
  // recursion without end
  auto deep = render("{% macro f(n) %}{{ f(n + 1) }}{% endmacro %}{{ f(0) }}");
  ASSERT_FALSE(deep.ok());
  EXPECT_NE(deep.error().message.find("recursed deeper"), std::string::npos) << deep.error().message;
  // output past the limit (64 MiB): doubling a string
  auto big = render("{% set ns = namespace(s='x') %}{% for i in range(40) %}{% set ns.s = ns.s ~ ns.s %}{% endfor %}{{ ns.s }}");
  ASSERT_FALSE(big.ok());
  EXPECT_NE(big.error().message.find("MiB"), std::string::npos) << big.error().message;
  // loops of loops past the step limit
  auto steps = render("{% for a in range(100000) %}{% for b in range(100000) %}{% endfor %}{% endfor %}");
  ASSERT_FALSE(steps.ok());
  EXPECT_NE(steps.error().message.find("steps"), std::string::npos) << steps.error().message;
  // nesting past the parser's depth
  std::string nested;
  for (int i = 0; i < 500; ++i) nested += "(";
  auto n = render("{{ " + nested + "1" + std::string(500, ')') + " }}");
  ASSERT_FALSE(n.ok());
  EXPECT_NE(n.error().message.find("nests deeper"), std::string::npos) << n.error().message;
}

TEST(Jinja, HostileSourcesFailCleanly) {
  const char* bad[] = {"{{", "{%", "{#", "{{ 'abc", "{{ \"\\", "{% for %}", "{% for x in %}{% endfor %}",
                       "{% set %}", "{% macro %}", "{{ a[ }}", "{{ a. }}", "{{ ) }}", "{{ ] }}", "{% endif %}",
                       "{% if %}{% endif %}", "{{ 1 | }}", "{{ x is }}", "{% raw %}", "{{ {1: } }}",
                       "{% filter %}{% endfilter %}", "{% call %}{% endcall %}", "{{ '\\xZZ' }}", "\xff{{ \xfe }}"};
  for (const char* s : bad) {
    SCOPED_TRACE(s);
    auto r = render(s);
    EXPECT_FALSE(r.ok());
    if (!r.ok()) {
      EXPECT_FALSE(r.error().message.empty());
    }
  }
}

TEST(Jinja, InvalidUtf8SurvivesByteForByte) {
  auto r = render("{{ s }}|{{ s | length }}|{{ s[1:] }}", Json{{"s", "a\xff" "b"}});
  // nlohmann refuses invalid UTF-8 only when dumping; the engine keeps the bytes as Python's
  // surrogateescape does
  ASSERT_TRUE(r.ok()) << r.error().message;
  EXPECT_EQ(*r, "a\xff" "b|3|\xff" "b");
}

TEST(Jinja, StrftimeNowDefaultsToTheClock) {
  auto t = Template::parse("{{ strftime_now('%Y') }}");
  ASSERT_TRUE(t.ok());
  auto r = t->render(Json::object());
  ASSERT_TRUE(r.ok());
  std::time_t s = std::time(nullptr);
  std::tm now{};
  localtime_r(&s, &now);
  EXPECT_EQ(*r, std::to_string(now.tm_year + 1900));
}

// Python's ints are unbounded, strata's 64-bit: past that range is an error, never a wrapped value.
TEST(Jinja, IntegerOverflowIsAnError) {
  for (const char* t : {"{{ 9223372036854775807 + 1 }}", "{{ -9223372036854775807 - 2 }}", "{{ 4611686018427387904 * 2 }}",
                        "{{ -(-9223372036854775807 - 1) }}", "{{ (-9223372036854775807 - 1) // -1 }}"}) {
    SCOPED_TRACE(t);
    auto r = render(t);
    ASSERT_FALSE(r.ok()) << *r;
    EXPECT_NE(r.error().message.find("overflow"), std::string::npos) << r.error().message;
  }
  EXPECT_EQ(*render("{{ 9223372036854775806 + 1 }} {{ 7 // -1 }} {{ 7 % -1 }}"), "9223372036854775807 -7 0");
  EXPECT_FALSE(render("{{ 'ab' * 4611686018427387904 }}").ok());
  EXPECT_FALSE(render("{{ range(-9223372036854775807, 9223372036854775807) | length }}").ok());
}

// A namespace that holds itself, a macro kept in the namespace it reads: reference cycles, taken
// apart when the render ends (the sanitizer build's leak check sees any that stay).
TEST(Jinja, CyclesComeApartAfterTheRender) {
  auto r = render("{% set ns = namespace(n=1) %}{% set ns.me = ns %}{% macro m() %}{{ ns.n }}{% endmacro %}"
                  "{% set ns.m = m %}{{ ns.me.me.n }}{{ ns.m() }}{% for i in [1] %}{% macro inner() %}{{ i }}{% endmacro %}"
                  "{% set ns.inner = inner %}{{ ns.inner() }}{% endfor %}");
  ASSERT_TRUE(r.ok()) << r.error().message;
  EXPECT_EQ(*r, "111");  // jinja2 renders the same
}

TEST(Jinja, ContextMustBeAnObject) {
  auto t = Template::parse("x");
  ASSERT_TRUE(t.ok());
  EXPECT_FALSE(t->render(Json::array()).ok());
}

}  // namespace
}  // namespace strata::jinja
