// The trainer's compute threads: one number for every pool a libtorch
// computation may use.
#ifndef ZSHARD_CLIENT_TORCH_COMPUTE_THREADS_H_
#define ZSHARD_CLIENT_TORCH_COMPUTE_THREADS_H_

#include <string>

namespace zshard {

// Sets libtorch's intra-op pool to `threads` and, when the BLAS in this
// process is OpenBLAS, OpenBLAS's own pool too (Debian's libtorch calls
// whatever libblas.so.3 is installed and never sets its thread count, so
// OpenBLAS would keep a thread per core spinning beside ours). Process-wide:
// call from main before the first computation, with threads >= 1. Returns
// the BLAS it set ("openblas"), or "" when it found none to set.
std::string SetComputeThreads(int threads);

// OpenBLAS's current thread count, or -1 when this process has no OpenBLAS.
int OpenBlasThreads();

}  // namespace zshard

#endif  // ZSHARD_CLIENT_TORCH_COMPUTE_THREADS_H_
