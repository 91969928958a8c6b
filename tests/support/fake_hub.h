// Test support: the fake Hugging Face hub (tests/python/fake_hub.py) as a child process on
// 127.0.0.1, with its config rewritten by the test and its request log read back.
#pragma once

#include <fcntl.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <nlohmann/json.hpp>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "support/model_files.h"

extern char** environ;

namespace qwenrt::testing_support {

// The Python that runs the fake hub: the project's .venv when it is there, else python3.
inline std::string test_python() {
#ifdef QWENRT_PYTHON
  if (std::filesystem::exists(QWENRT_PYTHON)) return QWENRT_PYTHON;
#endif
  return "python3";
}

class FakeHub {
 public:
  explicit FakeHub(const nlohmann::json& config) {
    // Loopback never through a proxy a CI machine may set (libcurl and the binary read these).
    for (const char* name : {"no_proxy", "NO_PROXY"}) {
      const char* old = std::getenv(name);
      setenv(name,
             (std::string("127.0.0.1,localhost") + (old ? "," + std::string(old) : "")).c_str(), 1);
    }
    static int instances = 0;
    dir_ = temp_path("fakehub." + std::to_string(instances++));
    std::filesystem::create_directories(dir_);
    std::filesystem::remove(dir_ + "/ports");  // only the server this starts writes it
    set_config(config);
    const std::string script = std::string(QWENRT_SOURCE_DIR) + "/tests/python/fake_hub.py";
    const std::string python = test_python();
    std::vector<std::string> args = {python,    script,          "--config", config_path(),
                                     "--ports", dir_ + "/ports", "--log",    log_path()};
    std::vector<char*> argv;
    for (auto& a : args) argv.push_back(a.data());
    argv.push_back(nullptr);
    // Its output goes to a file: a server holding the test's stdout would keep a pipe open.
    posix_spawn_file_actions_t actions;
    posix_spawn_file_actions_init(&actions);
    const std::string server_log = dir_ + "/server.log";
    posix_spawn_file_actions_addopen(&actions, 1, server_log.c_str(), O_WRONLY | O_CREAT | O_TRUNC,
                                     0644);
    posix_spawn_file_actions_adddup2(&actions, 1, 2);
    const int rc = posix_spawnp(&pid_, python.c_str(), &actions, nullptr, argv.data(), environ);
    posix_spawn_file_actions_destroy(&actions);
    if (rc != 0) throw std::runtime_error("cannot start " + python + " " + script);
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(20);
    while (!std::filesystem::exists(dir_ + "/ports")) {
      int status = 0;
      if (waitpid(pid_, &status, WNOHANG) == pid_) {
        pid_ = -1;
        throw std::runtime_error("the fake hub exited before it listened");
      }
      if (std::chrono::steady_clock::now() > deadline)
        throw std::runtime_error("the fake hub did not start in 20 s");
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    const auto ports = nlohmann::json::parse(std::ifstream(dir_ + "/ports"));
    hub_port_ = ports.at("hub").get<int>();
    cdn_port_ = ports.at("cdn").get<int>();
  }
  ~FakeHub() {
    if (pid_ > 0) {
      kill(pid_, SIGTERM);
      int status = 0;
      waitpid(pid_, &status, 0);
    }
  }
  FakeHub(const FakeHub&) = delete;
  FakeHub& operator=(const FakeHub&) = delete;

  // Replaces the config; the server reads it again at its next request (fault counters reset).
  void set_config(const nlohmann::json& config) {
    const std::string tmp = config_path() + ".tmp";
    std::ofstream(tmp) << config.dump();
    std::filesystem::rename(tmp, config_path());
  }

  std::string endpoint() const { return "http://127.0.0.1:" + std::to_string(hub_port_); }
  int cdn_port() const { return cdn_port_; }

  // Every request so far: {"server": "hub"|"cdn", "method", "path", "range", "authorization"}.
  std::vector<nlohmann::json> requests() const {
    std::vector<nlohmann::json> out;
    std::ifstream in(log_path());
    for (std::string line; std::getline(in, line);) {
      if (!line.empty()) out.push_back(nlohmann::json::parse(line));
    }
    return out;
  }
  void clear_log() const { std::ofstream(log_path(), std::ios::trunc); }

 private:
  std::string config_path() const { return dir_ + "/config.json"; }
  std::string log_path() const { return dir_ + "/requests.jsonl"; }

  std::string dir_;
  pid_t pid_ = -1;
  int hub_port_ = 0;
  int cdn_port_ = 0;
};

}  // namespace qwenrt::testing_support
