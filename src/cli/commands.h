// Subcommands of the qwenrt binary: each registers its options on the app and returns the
// function that runs it.
#pragma once

#include <CLI/CLI.hpp>

#include <functional>

namespace qwenrt::cli {

using Run = std::function<int()>;

Run add_info(CLI::App& app);
Run add_logits(CLI::App& app);
Run add_run(CLI::App& app);
Run add_chat(CLI::App& app);
Run add_tokenize(CLI::App& app);
Run add_template(CLI::App& app);
Run add_synth(CLI::App& app);
Run add_perplexity(CLI::App& app);
Run add_bench(CLI::App& app);
Run add_pull(CLI::App& app);
Run add_ls(CLI::App& app);
Run add_serve(CLI::App& app);

}  // namespace qwenrt::cli
