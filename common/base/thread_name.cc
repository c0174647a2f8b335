#include "common/base/thread_name.h"

#include <pthread.h>

namespace zshard {

void NameCurrentThread(absl::string_view name) {
  const std::string cut(name.substr(0, 15));
  pthread_setname_np(pthread_self(), cut.c_str());
}

std::string CurrentThreadName() {
  char buf[16] = {};
  if (pthread_getname_np(pthread_self(), buf, sizeof(buf)) != 0) return "";
  return buf;
}

}  // namespace zshard
