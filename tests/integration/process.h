// Process: a child process for integration tests (fork + exec), its output
// captured in files. The destructor kills it (SIGKILL) if it still runs.
#ifndef ZSHARD_TESTS_INTEGRATION_PROCESS_H_
#define ZSHARD_TESTS_INTEGRATION_PROCESS_H_

#include <fcntl.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

#include "absl/time/clock.h"
#include "absl/time/time.h"

namespace zshard {
namespace testing {

class Process {
 public:
  // Starts `argv[0]` with `argv`; stdout and stderr go to `log_prefix`.out /
  // .err. Returns a process whose pid() is -1 when fork failed.
  Process(const std::vector<std::string>& argv, const std::string& log_prefix)
      : out_path_(log_prefix + ".out"), err_path_(log_prefix + ".err") {
    pid_ = fork();
    if (pid_ != 0) return;
    int out = open(out_path_.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    int err = open(err_path_.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    dup2(out, 1);
    dup2(err, 2);
    std::vector<char*> args;
    for (const auto& a : argv) args.push_back(const_cast<char*>(a.c_str()));
    args.push_back(nullptr);
    execv(args[0], args.data());
    _exit(127);
  }
  ~Process() { Kill(); }
  Process(const Process&) = delete;
  Process& operator=(const Process&) = delete;

  pid_t pid() const { return pid_; }

  // Exit code (128 + signal when killed by one), or nullopt at the deadline.
  std::optional<int> Wait(absl::Duration timeout) {
    if (exit_code_) return exit_code_;
    const absl::Time deadline = absl::Now() + timeout;
    while (pid_ > 0) {
      int status = 0;
      const pid_t r = waitpid(pid_, &status, WNOHANG);
      if (r == pid_) {
        exit_code_ = WIFEXITED(status) ? WEXITSTATUS(status)
                                       : 128 + WTERMSIG(status);
        return exit_code_;
      }
      if (absl::Now() >= deadline) return std::nullopt;
      absl::SleepFor(absl::Milliseconds(20));
    }
    return std::nullopt;
  }

  // Sends `sig` (SIGSTOP, SIGCONT...) to the process.
  void Signal(int sig) {
    if (pid_ > 0 && !exit_code_) kill(pid_, sig);
  }

  void Kill() {
    if (pid_ > 0 && !exit_code_) {
      kill(pid_, SIGKILL);
      Wait(absl::Seconds(10));
    }
  }

  std::string Stdout() const { return Read(out_path_); }
  std::string Stderr() const { return Read(err_path_); }

 private:
  static std::string Read(const std::string& path) {
    std::ifstream in(path);
    std::stringstream s;
    s << in.rdbuf();
    return s.str();
  }

  pid_t pid_ = -1;
  std::optional<int> exit_code_;
  std::string out_path_, err_path_;
};

// Reads a port file written by zshard-server --port_file; 0 on timeout.
inline int WaitForPortFile(const std::string& path, Process& p,
                           absl::Duration timeout) {
  const absl::Time deadline = absl::Now() + timeout;
  while (absl::Now() < deadline) {
    std::ifstream in(path);
    int port = 0;
    if (in >> port && port > 0) return port;
    if (p.Wait(absl::ZeroDuration())) return 0;  // exited
    absl::SleepFor(absl::Milliseconds(20));
  }
  return 0;
}

// A fresh directory under the system's temporary one, named `prefix` and a
// random suffix; the caller removes it.
inline std::string MakeTempDir(const std::string& prefix) {
  std::string tmpl =
      (std::filesystem::temp_directory_path() / (prefix + ".XXXXXX")).string();
  return mkdtemp(tmpl.data());
}

}  // namespace testing
}  // namespace zshard

#endif  // ZSHARD_TESTS_INTEGRATION_PROCESS_H_
