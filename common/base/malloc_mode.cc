#include "common/base/malloc_mode.h"

#include <malloc.h>

namespace zshard {

void KeepFreedMemoryForReuse() {
  mallopt(M_MMAP_THRESHOLD, 32 << 20);
  mallopt(M_TRIM_THRESHOLD, 64 << 20);
}

}  // namespace zshard
