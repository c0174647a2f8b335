#include "common/base/huge_pages.h"

#include <sys/mman.h>

#include <cstdint>

namespace zshard {

bool AdviseHugePages(void* data, size_t bytes) {
  constexpr uintptr_t kHuge = uintptr_t{2} << 20;
  const uintptr_t begin = reinterpret_cast<uintptr_t>(data);
  if (!data || bytes < kHuge || begin > UINTPTR_MAX - bytes) return false;
  const uintptr_t first = (begin + kHuge - 1) & ~(kHuge - 1);
  const uintptr_t last = (begin + bytes) & ~(kHuge - 1);
  if (first >= last) return false;
  return madvise(reinterpret_cast<void*>(first), last - first, MADV_HUGEPAGE) == 0;
}

}  // namespace zshard
