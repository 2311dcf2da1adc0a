#include <cinttypes>
#include <cstdio>

#include "cli/commands.h"
#include "model/gguf.h"

namespace strata::cli {

Runner add_info_command(CLI::App& app) {
  CLI::App* sub = app.add_subcommand("info", "describe a GGUF model: architecture, tensors, bytes per token");
  auto path = std::make_shared<std::string>();
  sub->add_option("model", *path, "GGUF file")->required();
  return [path] {
    auto f = GgufFile::open(*path);
    if (!f) {
      std::fprintf(stderr, "strata info: %s\n", f.error().message.c_str());
      return 1;
    }
    std::printf("%s: GGUF v%u, %zu metadata keys, %zu tensors\n", path->c_str(), f->version(),
                f->kvs().size(), f->tensors().size());
    return 0;
  };
}

}  // namespace strata::cli
