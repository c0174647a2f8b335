// Process-wide absl::Mutex setting for the binaries' main().
#ifndef ZSHARD_COMMON_BASE_MUTEX_MODE_H_
#define ZSHARD_COMMON_BASE_MUTEX_MODE_H_

namespace zshard {

// Turns off abseil's lock-order (deadlock) detection for the whole process.
// Debian's abseil is built without NDEBUG, so by default every
// absl::Mutex::Lock — ours and gRPC's, which locks through absl — records
// the acquisition in a global graph under a global lock (GraphCycles): CPU
// and contention on every RPC. Tests keep the detection on. Call from main
// before starting threads.
void DisableMutexDeadlockDetection();

}  // namespace zshard

#endif  // ZSHARD_COMMON_BASE_MUTEX_MODE_H_
