#include "train/io/format.h"

#include <cstdint>
#include <cstdio>

namespace ndt::io {

std::string format_bytes(double b) {
  char s[32];
  if (b >= double(1 << 30))
    std::snprintf(s, sizeof(s), "%.2f GiB", b / double(1 << 30));
  else if (b >= double(1 << 20))
    std::snprintf(s, sizeof(s), "%.2f MiB", b / double(1 << 20));
  else
    std::snprintf(s, sizeof(s), "%.1f KiB", b / 1024.0);
  return s;
}

std::string format_duration(double seconds) {
  char s[32];
  const int64_t t = static_cast<int64_t>(seconds + 0.5);
  if (t >= 3600)
    std::snprintf(s, sizeof(s), "%lldh%02lldm", (long long)(t / 3600), (long long)(t % 3600 / 60));
  else
    std::snprintf(s, sizeof(s), "%lldm%02llds", (long long)(t / 60), (long long)(t % 60));
  return s;
}

}  // namespace ndt::io
