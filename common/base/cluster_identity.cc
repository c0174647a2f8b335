#include "common/base/cluster_identity.h"

#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"

namespace zshard {

EnvLookup ProcessEnv() {
  return [](const char* name) {
    const char* v = std::getenv(name);
    return std::string(v ? v : "");
  };
}

absl::StatusOr<uint32_t> OrdinalFromHostname(absl::string_view hostname) {
  const absl::string_view name = hostname.substr(0, hostname.find('.'));
  const size_t dash = name.rfind('-');
  const absl::string_view digits = dash == absl::string_view::npos
                                       ? absl::string_view()
                                       : name.substr(dash + 1);
  uint32_t ordinal = 0;
  if (dash == 0 || digits.empty() || digits.size() > 10 ||
      digits.find_first_not_of("0123456789") != absl::string_view::npos ||
      !absl::SimpleAtoi(digits, &ordinal) || ordinal > 0x7fffffffu) {
    return absl::InvalidArgumentError(
        absl::StrCat("hostname '", hostname,
                     "' has no ordinal (expected NAME-N, as a StatefulSet "
                     "pod's hostname)"));
  }
  return ordinal;
}

absl::StatusOr<std::string> LocalHostname() {
  char buf[256] = {};
  if (::gethostname(buf, sizeof(buf) - 1) != 0) {
    return absl::UnavailableError(
        absl::StrCat("cannot read the hostname: ", std::strerror(errno)));
  }
  return std::string(buf);
}

std::string DefaultTrainerRank(const EnvLookup& env) {
  const std::string index = env("JOB_COMPLETION_INDEX");
  if (!index.empty()) return index;
  if (!env("SLURM_STEP_ID").empty() && !env("SLURM_PROCID").empty()) {
    return env("SLURM_PROCID");
  }
  return "-1";
}

absl::Status CheckSlurmTaskCount(int64_t num_shards, const EnvLookup& env) {
  const std::string tasks = env("SLURM_STEP_NUM_TASKS");
  if (tasks.empty()) return absl::OkStatus();
  int64_t n = 0;
  if (!absl::SimpleAtoi(tasks, &n) || n != num_shards) {
    return absl::InvalidArgumentError(absl::StrCat(
        "flag --num_shards: ", num_shards,
        " disagrees with this Slurm step's task count (SLURM_STEP_NUM_TASKS=",
        tasks, "); run one zshard-server per task of the step"));
  }
  return absl::OkStatus();
}

}  // namespace zshard
