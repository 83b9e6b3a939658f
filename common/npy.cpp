#include "npy.hpp"

#include <cstring>
#include <fstream>
#include <sstream>
#include <stdexcept>

namespace fa {
namespace {

std::string header_for(const char* descr, const std::vector<size_t>& shape) {
  std::string s = "{'descr': '" + std::string(descr) + "', 'fortran_order': False, 'shape': (";
  for (size_t i = 0; i < shape.size(); ++i) s += std::to_string(shape[i]) + (shape.size() == 1 ? "," : i + 1 < shape.size() ? ", " : "");
  s += "), }";
  // magic (6) + version (2) + length (2) + header + '\n', padded to a multiple of 64.
  const size_t total = 10 + s.size() + 1;
  s += std::string((64 - total % 64) % 64, ' ') + "\n";
  return s;
}

template <class T>
void write_impl(const std::string& path, const char* descr, const std::vector<size_t>& shape,
                const T* data) {
  std::ofstream f(path, std::ios::binary);
  if (!f) throw std::runtime_error("cannot write " + path);
  const std::string h = header_for(descr, shape);
  const unsigned char pre[10] = {0x93, 'N', 'U', 'M', 'P', 'Y', 1, 0, (unsigned char)(h.size() & 0xFF),
                                 (unsigned char)(h.size() >> 8)};
  f.write(reinterpret_cast<const char*>(pre), 10);
  f.write(h.data(), std::streamsize(h.size()));
  size_t n = 1;
  for (size_t d : shape) n *= d;
  f.write(reinterpret_cast<const char*>(data), std::streamsize(n * sizeof(T)));
  if (!f) throw std::runtime_error("error while writing " + path);
}

std::string field(const std::string& header, const std::string& key, const std::string& path) {
  const size_t k = header.find("'" + key + "'");
  if (k == std::string::npos) throw std::runtime_error(path + ": .npy header has no '" + key + "'");
  const size_t colon = header.find(':', k);
  return header.substr(colon + 1);
}

}  // namespace

std::string shape_str(const std::vector<size_t>& shape) {
  std::string s = "[";
  for (size_t i = 0; i < shape.size(); ++i) s += (i ? ", " : "") + std::to_string(shape[i]);
  return s + "]";
}

void npy_write(const std::string& path, const std::vector<size_t>& shape, const float* data) {
  write_impl(path, "<f4", shape, data);
}
void npy_write(const std::string& path, const std::vector<size_t>& shape, const half_t* data) {
  write_impl(path, "<f2", shape, data);
}

NpyArray npy_read(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  if (!f) throw std::runtime_error("cannot open " + path);
  unsigned char pre[8];
  f.read(reinterpret_cast<char*>(pre), 8);
  if (!f || std::memcmp(pre, "\x93NUMPY", 6) != 0) throw std::runtime_error(path + ": not a .npy file");
  size_t hlen;
  if (pre[6] == 1) {
    unsigned char l[2];
    f.read(reinterpret_cast<char*>(l), 2);
    hlen = l[0] | (size_t(l[1]) << 8);
  } else {
    unsigned char l[4];
    f.read(reinterpret_cast<char*>(l), 4);
    hlen = l[0] | (size_t(l[1]) << 8) | (size_t(l[2]) << 16) | (size_t(l[3]) << 24);
  }
  std::string header(hlen, '\0');
  f.read(header.data(), std::streamsize(hlen));
  if (!f) throw std::runtime_error(path + ": truncated .npy header");

  const std::string descr = field(header, "descr", path);
  const bool f4 = descr.find("'<f4'") != std::string::npos;
  const bool f2 = descr.find("'<f2'") != std::string::npos;
  if (!f4 && !f2)
    throw std::runtime_error(path + ": dtype must be float32 ('<f4') or float16 ('<f2'), header says " +
                             descr.substr(0, descr.find(',')));
  const std::string order = field(header, "fortran_order", path);
  if (order.substr(0, order.find(',')).find("True") != std::string::npos)
    throw std::runtime_error(path + ": Fortran-order arrays are not supported (use np.ascontiguousarray)");

  NpyArray a;
  std::string shp = field(header, "shape", path);
  shp = shp.substr(shp.find('(') + 1, shp.find(')') - shp.find('(') - 1);
  std::stringstream ss(shp);
  std::string tok;
  while (std::getline(ss, tok, ','))
    if (tok.find_first_of("0123456789") != std::string::npos) a.shape.push_back(std::stoul(tok));
  size_t n = 1;
  for (size_t d : a.shape) n *= d;
  a.data.resize(n);
  if (f4) {
    f.read(reinterpret_cast<char*>(a.data.data()), std::streamsize(n * 4));
  } else {
    std::vector<half_t> h(n);
    f.read(reinterpret_cast<char*>(h.data()), std::streamsize(n * 2));
    for (size_t i = 0; i < n; ++i) a.data[i] = to_float(h[i]);
  }
  if (!f) throw std::runtime_error(path + ": file is shorter than its shape " + shape_str(a.shape) + " says");
  return a;
}

}  // namespace fa
