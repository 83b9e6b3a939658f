// Byte counts for people: "1.5 KiB", "32 GiB".
#pragma once
#include <cstdio>
#include <string>

namespace fa {

inline std::string human_bytes(double bytes) {
  const char* unit[] = {"B", "KiB", "MiB", "GiB", "TiB", "PiB", "EiB"};
  int u = 0;
  while (bytes >= 1024 && u < 6) bytes /= 1024, ++u;
  char b[64];
  std::snprintf(b, sizeof b, "%.3g %s", bytes, unit[u]);
  return b;
}

}  // namespace fa
