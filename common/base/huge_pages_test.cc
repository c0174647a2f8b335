#include "common/base/huge_pages.h"

#include <sys/mman.h>

#include <cstdint>
#include <cstring>
#include <fstream>
#include <memory>
#include <sstream>
#include <string>

#include "gtest/gtest.h"

namespace zshard {
namespace {

// The VmFlags line of the mapping holding `p` in /proc/self/smaps.
std::string VmFlagsOf(const void* p) {
  std::ifstream smaps("/proc/self/smaps");
  const uintptr_t at = reinterpret_cast<uintptr_t>(p);
  std::string line;
  bool inside = false;
  while (std::getline(smaps, line)) {
    uintptr_t lo = 0, hi = 0;
    char dash = 0;
    std::istringstream head(line);
    if (head >> std::hex >> lo >> dash >> hi && dash == '-' &&
        line.find(':') > line.find(' ')) {
      inside = lo <= at && at < hi;
    } else if (inside && line.rfind("VmFlags:", 0) == 0) {
      return line;
    }
  }
  return "";
}

bool KernelOffersHugePages() {
  std::ifstream f("/sys/kernel/mm/transparent_hugepage/enabled");
  std::string modes;
  std::getline(f, modes);
  return !modes.empty() && modes.find("[never]") == std::string::npos;
}

TEST(HugePagesTest, MarksTheWholeHugePagesOfABuffer) {
  if (!KernelOffersHugePages()) GTEST_SKIP() << "transparent huge pages are off";
  constexpr size_t kBytes = size_t{8} << 20;
  void* p = mmap(nullptr, kBytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS,
                 -1, 0);
  ASSERT_NE(p, MAP_FAILED);
  // An unaligned start, as operator new gives: the pages inside are marked.
  char* start = static_cast<char*>(p) + 16;
  ASSERT_TRUE(AdviseHugePages(start, kBytes - 16));
  const char* marked = static_cast<char*>(p) + (size_t{2} << 20);
  EXPECT_NE(VmFlagsOf(marked).find(" hg"), std::string::npos) << VmFlagsOf(marked);
  std::memset(start, 1, kBytes - 16);  // still ordinary memory
  EXPECT_EQ(start[kBytes - 17], 1);
  munmap(p, kBytes);
}

TEST(HugePagesTest, RangesWithoutAWholeHugePageAreLeftAlone) {
  EXPECT_FALSE(AdviseHugePages(nullptr, size_t{64} << 20));
  auto small = std::make_unique<char[]>(4096);
  EXPECT_FALSE(AdviseHugePages(small.get(), 4096));
  // 3 MiB starting 1 MiB past a 2 MiB boundary holds no whole huge page.
  EXPECT_FALSE(AdviseHugePages(reinterpret_cast<void*>(uintptr_t{3} << 20),
                               size_t{3} << 20));
}

}  // namespace
}  // namespace zshard
