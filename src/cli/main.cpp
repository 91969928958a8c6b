// The qwenrt binary: one subcommand per job. Errors end as one line on stderr and exit code 1.
#include <cstdio>
#include <map>
#include <string>
#include <vector>

#include "cli/commands.h"
#include "core/error.h"

int main(int argc, char** argv) {
  // llama.cpp spells the hub option `-hf`; CLI11 takes single-dash names of one letter only.
  std::vector<std::string> args(argv, argv + argc);
  std::vector<char*> arg_ptrs;
  for (auto& a : args) {
    if (a == "-hf") a = "--hf";
    if (a.rfind("-hf=", 0) == 0) a = "--hf=" + a.substr(4);
    arg_ptrs.push_back(a.data());
  }
  argv = arg_ptrs.data();
  CLI::App app{"qwenrt: inference engine for the Qwen3.5 / 3.6 / 3.8 hybrid model family"};
  app.require_subcommand(1);
  std::map<CLI::App*, qwenrt::cli::Run> runs;
  auto add = [&](qwenrt::cli::Run (*adder)(CLI::App&)) {
    const size_t before = app.get_subcommands({}).size();
    qwenrt::cli::Run run = adder(app);
    runs[app.get_subcommands({}).at(before)] = std::move(run);
  };
  add(&qwenrt::cli::add_info);
  add(&qwenrt::cli::add_run);
  add(&qwenrt::cli::add_chat);
  add(&qwenrt::cli::add_logits);
  add(&qwenrt::cli::add_tokenize);
  add(&qwenrt::cli::add_template);
  add(&qwenrt::cli::add_synth);
  add(&qwenrt::cli::add_perplexity);
  add(&qwenrt::cli::add_bench);
  add(&qwenrt::cli::add_pull);
  add(&qwenrt::cli::add_ls);
  add(&qwenrt::cli::add_serve);

  CLI11_PARSE(app, argc, argv);
  try {
    for (auto& [sub, run] : runs) {
      if (sub->parsed()) return run();
    }
  } catch (const qwenrt::Error& e) {
    std::fprintf(stderr, "qwenrt: error: %s\n", e.what());
    return 1;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "qwenrt: internal error: %s\n", e.what());
    return 2;
  }
  return 0;
}
