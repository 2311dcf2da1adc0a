// strata logits: evaluate token ids and write float32 logits in the fixtures' format.
// strata tokenize: the token ids of a text file, with the tokenizer test vectors' conventions.
#include <cstdio>
#include <fstream>
#include <memory>
#include <nlohmann/json.hpp>
#include <sstream>

#include "cli/commands.h"
#include "cli/common.h"
#include "engine/session.h"
#include "model/model.h"
#include "model/tokenizer.h"

namespace strata::cli {
namespace {

struct LogitsOptions {
  CommonOptions common;  // -m, -c, --set (budgets.ram: a streamed model computes the same logits)
  std::string tokens_path;
  std::string out_path;
  bool sequential = false;
  bool exact = false;
  int greedy = 0;
};

Result<std::vector<int32_t>> read_token_ids(const std::string& path) {
  std::ifstream in(path);
  if (!in) return Error{strfmt("%s: cannot open", path.c_str())};
  nlohmann::json j = nlohmann::json::parse(in, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) return Error{strfmt("%s: not valid JSON", path.c_str())};
  const nlohmann::json* ids = j.is_array() ? &j : (j.contains("ids") ? &j["ids"] : nullptr);
  if (!ids || !ids->is_array())
    return Error{strfmt("%s: expected an object with an \"ids\" array (tokens.json) or an array", path.c_str())};
  std::vector<int32_t> out;
  for (const auto& v : *ids) {
    if (!v.is_number_integer()) return Error{strfmt("%s: \"ids\" holds a value that is not an integer", path.c_str())};
    out.push_back(v.get<int32_t>());
  }
  if (out.empty()) return Error{strfmt("%s: no token ids", path.c_str())};
  return out;
}

int fail(const char* cmd, const std::string& message) {
  std::fprintf(stderr, "strata %s: %s\n", cmd, message.c_str());
  return 1;
}

int run_logits(const LogitsOptions& o) {
  auto ids = read_token_ids(o.tokens_path);
  if (!ids) return fail("logits", ids.error().message);
  auto loaded = load_model(o.common, "strata logits");
  if (!loaded) return fail("logits", loaded.error().message);
  const Engine& engine = **loaded;
  const Model& m = engine.model();
  const int V = m.hparams().n_vocab;
  const auto path = o.exact ? cpu::MatmulPath::exact : cpu::MatmulPath::quantized;
  const int ctx = int(ids->size()) + o.greedy;
  Session s(engine, ctx, path);
  std::vector<float> logits;
  if (o.sequential) {
    for (int32_t id : *ids) {
      auto l = s.eval(std::span<const int32_t>(&id, 1));
      if (!l) return fail("logits", l.error().message);
      logits.insert(logits.end(), l->begin(), l->end());
    }
  } else {
    auto l = s.eval(*ids, true);
    if (!l) return fail("logits", l.error().message);
    logits = std::move(*l);
  }
  if (!o.out_path.empty()) {
    std::ofstream out(o.out_path, std::ios::binary | std::ios::trunc);
    out.write(reinterpret_cast<const char*>(logits.data()), std::streamsize(logits.size() * sizeof(float)));
    if (!out) return fail("logits", o.out_path + ": write failed");
    std::fprintf(stderr, "strata logits: wrote [%zu][%d] float32 to %s\n", ids->size(), V, o.out_path.c_str());
  }
  if (o.greedy > 0) {
    std::span<const float> last(logits.data() + logits.size() - size_t(V), size_t(V));
    std::vector<float> next_logits;
    std::string line;
    for (int i = 0; i < o.greedy; ++i) {
      const int32_t tok = argmax(last);
      if (i) line += ' ';
      line += std::to_string(tok);
      auto l = s.eval(std::span<const int32_t>(&tok, 1));
      if (!l) return fail("logits", l.error().message);
      next_logits = std::move(*l);
      last = next_logits;
    }
    std::printf("%s\n", line.c_str());
  }
  return 0;
}

struct TokenizeOptions {
  std::string model;  // empty: default_model_path()
  std::string file;
};

int run_tokenize(const TokenizeOptions& o) {
  std::ifstream in(o.file, std::ios::binary);
  if (!in) return fail("tokenize", o.file + ": cannot open");
  std::stringstream ss;
  ss << in.rdbuf();
  auto f = GgufFile::open(o.model.empty() ? default_model_path() : o.model);
  if (!f) return fail("tokenize", f.error().message);
  auto tok = Tokenizer::from_gguf(*f);
  if (!tok) return fail("tokenize", tok.error().message);
  const std::vector<TokenId> ids = tok->tokenize(ss.str(), /*add_special=*/false, /*parse_special=*/false);
  std::string line;
  for (size_t i = 0; i < ids.size(); ++i) {
    if (i) line += ' ';
    line += std::to_string(ids[i]);
  }
  std::printf("%s\n", line.c_str());
  return 0;
}

}  // namespace

Runner add_logits_command(CLI::App& app) {
  CLI::App* sub = app.add_subcommand("logits", "evaluate token ids, write float32 logits [n_tokens][n_vocab]");
  auto o = std::make_shared<LogitsOptions>();
  add_common(sub, o->common);
  sub->add_option("--tokens", o->tokens_path, "tokens.json (fixtures format: {\"ids\": [...]})")->required();
  sub->add_option("-o,--out", o->out_path, "output file of float32 logits");
  sub->add_flag("--sequential", o->sequential, "evaluate one token at a time instead of one batch");
  sub->add_flag("--exact", o->exact, "float reference path: dequantized weights x float activations");
  sub->add_option("--greedy", o->greedy, "also print the N greedy token ids after the given ids")->check(CLI::NonNegativeNumber);
  return [o] { return run_logits(*o); };
}

Runner add_tokenize_command(CLI::App& app) {
  CLI::App* sub = app.add_subcommand("tokenize", "print the token ids of a text file (no BOS/EOS, specials as text)");
  auto o = std::make_shared<TokenizeOptions>();
  sub->add_option("-m,--model", o->model, "GGUF model or vocab (default: $STRATA_MODEL, else the bundled demo model)");
  sub->add_option("-f,--file", o->file, "text file")->required();
  return [o] { return run_tokenize(*o); };
}

}  // namespace strata::cli
