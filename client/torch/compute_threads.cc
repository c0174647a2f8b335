#include "client/torch/compute_threads.h"

#include <dlfcn.h>
#include <torch/torch.h>

namespace zshard {
namespace {

// OpenBLAS's entry points, looked up in the process (libtorch links
// libblas.so.3 dynamically; with another BLAS behind it they are absent).
template <typename Fn>
Fn OpenBlasSymbol(const char* name) {
  return reinterpret_cast<Fn>(dlsym(RTLD_DEFAULT, name));
}

}  // namespace

std::string SetComputeThreads(int threads) {
  torch::set_num_threads(threads);
  auto set = OpenBlasSymbol<void (*)(int)>("openblas_set_num_threads");
  if (!set) return "";
  set(threads);
  return "openblas";
}

int OpenBlasThreads() {
  auto get = OpenBlasSymbol<int (*)()>("openblas_get_num_threads");
  return get ? get() : -1;
}

}  // namespace zshard
