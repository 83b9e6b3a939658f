// Writing a file so that a failure never leaves a truncated one: the content goes to PATH.tmp, which
// replaces PATH (rename) only once it is complete. Throws std::runtime_error naming what failed.
#pragma once
#include <cstdio>
#include <fstream>
#include <stdexcept>
#include <string>

namespace fa {

template <class WriteFn>
void replace_file(const std::string& path, WriteFn&& write) {
  const std::string tmp = path + ".tmp";
  {
    std::ofstream f(tmp, std::ios::binary);
    if (!f) throw std::runtime_error("cannot write " + tmp);
    write(f);
    f.flush();
    if (!f) {
      std::remove(tmp.c_str());
      throw std::runtime_error("error while writing " + tmp + " (disk full?)");
    }
  }
  if (std::rename(tmp.c_str(), path.c_str()) != 0) {
    std::remove(tmp.c_str());
    throw std::runtime_error("cannot rename " + tmp + " to " + path);
  }
}

}  // namespace fa
