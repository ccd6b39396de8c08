// ndtrain: numbers as a person reads them in logs and tables.
//
//   io::format_bytes(3.5 * (1 << 20))   // "3.50 MiB"  (GiB, MiB or KiB, binary units)
//   io::format_duration(4000)           // "1h06m"     (or "4m05s" under an hour)
#pragma once

#include <string>

namespace ndt::io {

std::string format_bytes(double bytes);
std::string format_duration(double seconds);

}  // namespace ndt::io
