// The Jinja engine against Python's jinja2: every vector of tests/data/chat (real chat templates
// of the model families strata serves, rendered by jinja2 under transformers' rules) renders byte
// for byte, and the one the template refuses fails with the template's own message.
#include <gtest/gtest.h>

#include <ctime>
#include <fstream>
#include <sstream>

#include "jinja/jinja.h"

namespace strata::jinja {
namespace {

const std::string chat_dir = STRATA_SOURCE_DIR "/tests/data/chat";

std::string slurp(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  std::stringstream s;
  s << f.rdbuf();
  return s.str();
}

TEST(JinjaVectors, EveryVectorRendersAsJinja2Does) {
  const Json doc = Json::parse(slurp(chat_dir + "/vectors.json"));
  std::tm now{};
  ASSERT_NE(strptime(doc["fixed_now"].get<std::string>().c_str(), "%Y-%m-%dT%H:%M:%S", &now), nullptr);
  RenderOptions o;
  o.now = now;
  int rendered = 0, refused = 0;
  for (const auto& v : doc["vectors"]) {
    const std::string name = v["template"].get<std::string>() + " / " + v["case"].get<std::string>();
    SCOPED_TRACE(name);
    auto t = Template::parse(slurp(chat_dir + "/templates/" + v["template"].get<std::string>() + ".jinja"));
    ASSERT_TRUE(t.ok()) << t.error().message;
    auto r = t->render(v["context"], o);
    if (v.contains("error")) {
      ASSERT_FALSE(r.ok()) << "rendered what jinja2 refuses";
      EXPECT_EQ("TemplateError: " + r.error().message, v["error"].get<std::string>());
      ++refused;
      continue;
    }
    ASSERT_TRUE(r.ok()) << r.error().message;
    EXPECT_EQ(*r, v["expected"].get<std::string>());
    ++rendered;
  }
  EXPECT_GE(rendered, 80);
  EXPECT_GE(refused, 1);
}

}  // namespace
}  // namespace strata::jinja
