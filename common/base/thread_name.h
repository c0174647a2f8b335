// Names the calling thread, as `top`, `perf` and /proc/<pid>/task/*/comm
// show it. A thread otherwise inherits its creator's name: the update engine
// started from an RPC handler showed as "grpcpp_sync_server".
#ifndef ZSHARD_COMMON_BASE_THREAD_NAME_H_
#define ZSHARD_COMMON_BASE_THREAD_NAME_H_

#include <string>

#include "absl/strings/string_view.h"

namespace zshard {

// Sets the calling thread's name to `name`, cut to the 15 bytes Linux
// keeps. Best effort: a name the system refuses leaves the old one. Call it
// first thing in a thread's body; never blocks.
void NameCurrentThread(absl::string_view name);

// The calling thread's name ("" where it cannot be read).
std::string CurrentThreadName();

}  // namespace zshard

#endif  // ZSHARD_COMMON_BASE_THREAD_NAME_H_
