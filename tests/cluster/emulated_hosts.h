// EmulatedHosts: a set of emulated hosts (tests/cluster/hosts.sh) for a
// test's lifetime: network, IPC, PID and UTS namespaces joined by a bridge,
// links optionally shaped with tc tbf. The destructor kills every process
// of every host and removes the set (also when a test fails).
#ifndef ZSHARD_TESTS_CLUSTER_EMULATED_HOSTS_H_
#define ZSHARD_TESTS_CLUSTER_EMULATED_HOSTS_H_

#include <unistd.h>

#include <optional>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "tests/integration/process.h"

namespace zshard {
namespace testing {

class EmulatedHosts {
 public:
  // `script` is hosts.sh; `logs` a directory for its output. Call Up next.
  EmulatedHosts(std::string script, std::string logs)
      : script_(std::move(script)),
        logs_(std::move(logs)),
        tag_(absl::StrCat("t", getpid() % 100000)) {}
  ~EmulatedHosts() {
    if (up_) (void)Call({"down", tag_});
  }
  EmulatedHosts(const EmulatedHosts&) = delete;
  EmulatedHosts& operator=(const EmulatedHosts&) = delete;

  // Makes `n` hosts with links at `rate` ("off": unshaped). Returns hosts.sh's
  // exit code: 0 made, 77 this machine cannot (not root, no namespaces),
  // anything else failed (its stderr in error()).
  int Up(int n, const std::string& rate) {
    const int code = Call({"up", tag_, absl::StrCat(n), rate});
    up_ = code == 0;
    return code;
  }

  // Host `i`'s address (10.231.0.i+1).
  std::string Address(int i) const { return absl::StrCat("10.231.0.", i + 1); }

  // `argv` run on host `i` (killing the returned process kills the command).
  std::vector<std::string> On(int i, const std::vector<std::string>& argv) {
    std::vector<std::string> out = {script_, "run", tag_, absl::StrCat(i)};
    out.insert(out.end(), argv.begin(), argv.end());
    return out;
  }

  // Takes host `i`'s link down (silence, no resets) or back up; true when
  // hosts.sh succeeded.
  bool Cut(int i) { return Call({"cut", tag_, absl::StrCat(i)}) == 0; }
  bool Heal(int i) { return Call({"heal", tag_, absl::StrCat(i)}) == 0; }

  const std::string& error() const { return error_; }

 private:
  int Call(const std::vector<std::string>& args) {
    std::vector<std::string> argv = {script_};
    argv.insert(argv.end(), args.begin(), args.end());
    Process p(argv, absl::StrCat(logs_, "/hosts-", args[0], "-", ++calls_));
    const std::optional<int> code = p.Wait(absl::Seconds(60));
    error_ = p.Stderr();
    return code.value_or(-1);
  }

  const std::string script_, logs_, tag_;
  bool up_ = false;
  int calls_ = 0;
  std::string error_;
};

}  // namespace testing
}  // namespace zshard

#endif  // ZSHARD_TESTS_CLUSTER_EMULATED_HOSTS_H_
