// Which of OpenBLAS's kernels ("cores") run the trainer's matrix products.
// OpenBLAS picks them once, as it loads, from the CPU's model, or from
// $OPENBLAS_CORETYPE. A model newer than the OpenBLAS build knows gets its
// generic SSE3 core: Debian 12's OpenBLAS 0.3.21 on an Intel Xeon of model
// 207 chose "Prescott", whose sgemm ran at 21-30 GFLOP/s where the
// "Cooperlake" core this CPU's features allow ran at 102-146 (one thread,
// 1024 x 1024, 2026-12-07). Nothing here changes a running process: the core
// can only be chosen by starting it again with $OPENBLAS_CORETYPE set.
#ifndef ZSHARD_CLIENT_TORCH_BLAS_CORE_H_
#define ZSHARD_CLIENT_TORCH_BLAS_CORE_H_

#include <string>

namespace zshard {

// The name of the core OpenBLAS runs in this process (e.g. "SkylakeX"), or
// "" when this process has no OpenBLAS.
std::string OpenBlasCore();

// The core OpenBLAS itself falls back to by this CPU's features when it does
// not know the model: "Cooperlake" (AVX-512 BF16), "SkylakeX" (AVX-512),
// "Haswell" (AVX2), "Sandybridge" (AVX), "Prescott" otherwise. On a
// non-x86 build, "".
std::string CpuBlasCore();

// The widest vectors a core's kernels use: 3 for the AVX-512 cores
// (SkylakeX, Cooperlake, SapphireRapids), 2 for AVX2 (Haswell, Zen,
// Excavator), 1 for AVX (Sandybridge, Bulldozer, Piledriver, Steamroller),
// 0 for any other name (SSE: Prescott, Nehalem, ...). Case-insensitive.
int BlasCoreTier(const std::string& core);

// What --blas_core=auto does: the core to start again with, or "" to keep
// this one. Only a generic core (tier 0) on a CPU whose features allow a
// wider one is replaced, and never when the user set $OPENBLAS_CORETYPE
// (`env_core` non-null, even empty) or this process has no OpenBLAS
// (`running` empty): a core OpenBLAS chose on purpose (Zen's AVX2 kernels on
// an AMD CPU with AVX-512) stays.
std::string AutoBlasCore(const std::string& running, const char* env_core,
                         const std::string& cpu);

}  // namespace zshard

#endif  // ZSHARD_CLIENT_TORCH_BLAS_CORE_H_
