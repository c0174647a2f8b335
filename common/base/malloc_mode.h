// Process-wide glibc malloc setting for the binaries' main().
#ifndef ZSHARD_COMMON_BASE_MALLOC_MODE_H_
#define ZSHARD_COMMON_BASE_MALLOC_MODE_H_

namespace zshard {

// Keeps freed message buffers in the process for the next message instead
// of handing them back to the kernel. gRPC receives each message into
// freshly malloc'd slices of up to a few MiB; with glibc's defaults those
// come from mmap, or from arena memory that free() trims away again, so
// every received byte of the inline data plane was a first touch (~1 s per
// 256 MiB on our VMs; 2,200 page faults per step at the default shape).
// Sets M_MMAP_THRESHOLD to 32 MiB (the most glibc allows: larger blocks,
// the state buffers, are still mmap'd and returned at free) and
// M_TRIM_THRESHOLD to 64 MiB (an arena keeps up to that much free memory at
// its top). Call from main before starting threads; a process embedding
// the client (the Python binding) keeps its own settings.
void KeepFreedMemoryForReuse();

}  // namespace zshard

#endif  // ZSHARD_COMMON_BASE_MALLOC_MODE_H_
