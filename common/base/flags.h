// A small command-line parser for `--name=value` flags. Each binary declares
// its flags with defaults and help; unknown flags and bad values are errors
// naming the flag. Not thread-safe; used from main() only.
#ifndef ZSHARD_COMMON_BASE_FLAGS_H_
#define ZSHARD_COMMON_BASE_FLAGS_H_

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace zshard {

class Flags {
 public:
  // Declares a flag with its default value (as text) and a one-line help.
  void Define(const std::string& name, const std::string& default_value,
              const std::string& help);

  // Parses argv[1..]; positional arguments (not starting with "--") are
  // collected in positional(). INVALID_ARGUMENT naming an unknown flag or one
  // without "=value" (bool flags may omit it).
  absl::Status Parse(int argc, char** argv);

  bool IsSet(const std::string& name) const;
  std::string GetString(const std::string& name) const;
  absl::StatusOr<int64_t> GetInt(const std::string& name, int64_t lo,
                                 int64_t hi) const;
  absl::StatusOr<double> GetDouble(const std::string& name) const;
  absl::StatusOr<bool> GetBool(const std::string& name) const;
  const std::vector<std::string>& positional() const { return positional_; }

  // "  --name=default  help" lines for every flag.
  std::string Usage() const;

 private:
  struct Flag {
    std::string value;
    std::string default_value;
    std::string help;
    bool set = false;
  };
  std::map<std::string, Flag> flags_;
  std::vector<std::string> positional_;
};

}  // namespace zshard

#endif  // ZSHARD_COMMON_BASE_FLAGS_H_
