// Test support: run the qwenrt binary with arguments (through /bin/sh) and capture its exit code,
// stdout and stderr.
#pragma once

#include <sys/wait.h>

#include <array>
#include <cstdio>
#include <fstream>
#include <iterator>
#include <string>

#include "support/model_files.h"

namespace qwenrt::testing_support {

struct Output {
  int code;
  std::string out;
  std::string err;
};

// `env` is prepended to the command line as shell assignments ("A=1 B=2 "). The drafting cost
// model's step costs are not persisted (QWENRT_STEP_COSTS=0) unless `env` names a folder: a test
// neither reads what earlier runs on the machine measured nor writes into the user's cache.
inline Output run_qwenrt_env(const std::string& env, const std::string& args) {
  static int calls = 0;
  const std::string err_path = temp_path("stderr." + std::to_string(calls++) + ".txt");
  const std::string hermetic =
      env.find("QWENRT_STEP_COSTS=") == std::string::npos ? "QWENRT_STEP_COSTS=0 " : "";
  const std::string cmd =
      hermetic + env + " " + std::string(QWENRT_BINARY) + " " + args + " 2>" + err_path;
  Output o;
  FILE* p = popen(cmd.c_str(), "r");
  std::array<char, 4096> buf;
  size_t n;
  while ((n = fread(buf.data(), 1, buf.size(), p)) > 0) o.out.append(buf.data(), n);
  const int status = pclose(p);
  o.code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  std::ifstream in(err_path);
  o.err.assign(std::istreambuf_iterator<char>(in), {});
  return o;
}

inline Output run_qwenrt(const std::string& args) {
  return run_qwenrt_env("", args);
}

}  // namespace qwenrt::testing_support
