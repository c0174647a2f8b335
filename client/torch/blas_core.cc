#include "client/torch/blas_core.h"

#include <dlfcn.h>
#include <strings.h>

namespace zshard {

std::string OpenBlasCore() {
  // Looked up in the process: libtorch links libblas.so.3 dynamically, and
  // with another BLAS behind it the symbol is absent.
  auto name = reinterpret_cast<char* (*)()>(
      dlsym(RTLD_DEFAULT, "openblas_get_corename"));
  if (!name) return "";
  const char* core = name();
  return core ? core : "";
}

std::string CpuBlasCore() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_cpu_init();
  const bool avx512 =
      __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
      __builtin_cpu_supports("avx512dq") &&
      __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512cd");
  if (avx512 && __builtin_cpu_supports("avx512bf16")) return "Cooperlake";
  if (avx512) return "SkylakeX";
  if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) {
    return "Haswell";
  }
  if (__builtin_cpu_supports("avx")) return "Sandybridge";
  return "Prescott";
#else
  return "";
#endif
}

int BlasCoreTier(const std::string& core) {
  struct Tier {
    const char* name;
    int tier;
  };
  static constexpr Tier kTiers[] = {
      {"SkylakeX", 3},    {"Cooperlake", 3}, {"SapphireRapids", 3},
      {"Haswell", 2},     {"Zen", 2},        {"Excavator", 2},
      {"Sandybridge", 1}, {"Bulldozer", 1},  {"Piledriver", 1},
      {"Steamroller", 1},
  };
  for (const Tier& t : kTiers) {
    if (strcasecmp(core.c_str(), t.name) == 0) return t.tier;
  }
  return 0;
}

std::string AutoBlasCore(const std::string& running, const char* env_core,
                         const std::string& cpu) {
  if (running.empty() || env_core != nullptr || cpu.empty()) return "";
  if (BlasCoreTier(running) > 0 || BlasCoreTier(cpu) == 0) return "";
  return cpu;
}

}  // namespace zshard
