#include "common/base/flags.h"

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"

namespace zshard {

void Flags::Define(const std::string& name, const std::string& default_value,
                   const std::string& help) {
  flags_[name] = Flag{default_value, default_value, help, false};
}

absl::Status Flags::Parse(int argc, char** argv) {
  for (int i = 1; i < argc; ++i) {
    std::string arg = argv[i];
    if (arg.rfind("--", 0) != 0) {
      positional_.push_back(arg);
      continue;
    }
    arg = arg.substr(2);
    const size_t eq = arg.find('=');
    const std::string name = arg.substr(0, eq);
    auto it = flags_.find(name);
    if (it == flags_.end()) {
      return absl::InvalidArgumentError(absl::StrCat("unknown flag --", name));
    }
    if (eq == std::string::npos) {
      if (it->second.default_value != "true" &&
          it->second.default_value != "false") {
        return absl::InvalidArgumentError(
            absl::StrCat("flag --", name, " needs a value (--", name, "=...)"));
      }
      it->second.value = "true";
    } else {
      it->second.value = arg.substr(eq + 1);
    }
    it->second.set = true;
  }
  return absl::OkStatus();
}

bool Flags::IsSet(const std::string& name) const {
  auto it = flags_.find(name);
  return it != flags_.end() && it->second.set;
}

std::string Flags::GetString(const std::string& name) const {
  auto it = flags_.find(name);
  return it == flags_.end() ? "" : it->second.value;
}

absl::StatusOr<int64_t> Flags::GetInt(const std::string& name, int64_t lo,
                                      int64_t hi) const {
  const std::string v = GetString(name);
  int64_t out = 0;
  if (!absl::SimpleAtoi(v, &out) || out < lo || out > hi) {
    return absl::InvalidArgumentError(
        absl::StrCat("flag --", name, ": expected an integer in ", lo, "..", hi,
                     ", got '", v, "'"));
  }
  return out;
}

absl::StatusOr<double> Flags::GetDouble(const std::string& name) const {
  const std::string v = GetString(name);
  double out = 0;
  if (!absl::SimpleAtod(v, &out)) {
    return absl::InvalidArgumentError(
        absl::StrCat("flag --", name, ": expected a number, got '", v, "'"));
  }
  return out;
}

absl::StatusOr<bool> Flags::GetBool(const std::string& name) const {
  const std::string v = GetString(name);
  if (v == "true" || v == "1") return true;
  if (v == "false" || v == "0") return false;
  return absl::InvalidArgumentError(
      absl::StrCat("flag --", name, ": expected true or false, got '", v, "'"));
}

std::string Flags::Usage() const {
  std::string out;
  for (const auto& [name, flag] : flags_) {
    absl::StrAppend(&out, "  --", name, "=", flag.default_value, "  ",
                    flag.help, "\n");
  }
  return out;
}

}  // namespace zshard
