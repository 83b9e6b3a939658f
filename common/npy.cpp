#include "npy.hpp"

#include <climits>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <sstream>
#include <stdexcept>

#include "problem.hpp"  // UsageError
#include "replace_file.hpp"

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
  replace_file(path, [&](std::ofstream& f) {
    const std::string h = header_for(descr, shape);
    const unsigned char pre[10] = {0x93, 'N', 'U', 'M', 'P', 'Y', 1, 0, (unsigned char)(h.size() & 0xFF),
                                   (unsigned char)(h.size() >> 8)};
    f.write(reinterpret_cast<const char*>(pre), 10);
    f.write(h.data(), std::streamsize(h.size()));
    size_t n = 1;
    for (size_t d : shape) n *= d;
    f.write(reinterpret_cast<const char*>(data), std::streamsize(n * sizeof(T)));
  });
}

std::string field(const std::string& header, const std::string& key, const std::string& path) {
  const size_t k = header.find("'" + key + "'");
  if (k == std::string::npos) throw UsageError(path + ": .npy header has no '" + key + "'");
  const size_t colon = header.find(':', k);
  return header.substr(colon + 1);
}

// "(2, 8, 1024, 64)" -> dims; every token must be a plain decimal integer that fits an int.
std::vector<size_t> parse_shape(const std::string& after_colon, const std::string& path) {
  const size_t open = after_colon.find('('), close = after_colon.find(')');
  if (open == std::string::npos || close == std::string::npos || close < open)
    throw UsageError(path + ": .npy header has no shape tuple");
  std::stringstream ss(after_colon.substr(open + 1, close - open - 1));
  std::vector<size_t> shape;
  std::string tok;
  while (std::getline(ss, tok, ',')) {
    const size_t a = tok.find_first_not_of(" \t"), b = tok.find_last_not_of(" \t");
    if (a == std::string::npos) continue;  // the empty token after "(5,"
    tok = tok.substr(a, b - a + 1);
    if (tok.find_first_not_of("0123456789") != std::string::npos)
      throw UsageError(path + ": shape entry '" + tok + "' is not a non-negative integer");
    if (tok.size() > 10 || std::stoull(tok) > (unsigned long long)INT_MAX)
      throw UsageError(path + ": shape entry " + tok + " is larger than 2^31 - 1, the largest size a program takes");
    shape.push_back(std::stoul(tok));
  }
  return shape;
}

}  // namespace

size_t NpyHeader::elems() const {
  size_t n = 1;
  for (size_t d : shape) n *= d;  // npy_read_header checked that the file holds them all
  return n;
}

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
void npy_write(const std::string& path, const std::vector<size_t>& shape, const uint8_t* data) {
  write_impl(path, "|u1", shape, data);
}

namespace {
// The header of `path`, its dtype one of float32/float16 (floats) or uint8/bool (a block mask).
NpyHeader read_header(const std::string& path, bool bytes) {
  std::ifstream f(path, std::ios::binary);
  if (!f) throw UsageError("cannot open " + path + " (missing or unreadable)");
  unsigned char pre[8];
  f.read(reinterpret_cast<char*>(pre), 8);
  if (!f || std::memcmp(pre, "\x93NUMPY", 6) != 0) throw UsageError(path + ": not a .npy file");
  if (pre[6] < 1 || pre[6] > 3) throw UsageError(path + ": unknown .npy format version " + std::to_string(pre[6]));
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
  if (!f || hlen > (1u << 20)) throw UsageError(path + ": bad .npy header length");
  std::string header(hlen, '\0');
  f.read(header.data(), std::streamsize(hlen));
  if (!f) throw UsageError(path + ": truncated .npy header");

  NpyHeader h;
  const std::string descr = field(header, "descr", path);
  const std::string dtype = descr.substr(0, descr.find(','));
  if (bytes && (dtype.find("'|u1'") != std::string::npos || dtype.find("'|b1'") != std::string::npos))
    h.elem_bytes = 1;
  else if (bytes)
    throw UsageError(path + ": dtype must be uint8 ('|u1') or bool ('|b1'), header says" + dtype);
  else if (dtype.find("'<f4'") != std::string::npos)
    h.elem_bytes = 4;
  else if (dtype.find("'<f2'") != std::string::npos)
    h.elem_bytes = 2;
  else
    throw UsageError(path + ": dtype must be float32 ('<f4') or float16 ('<f2'), header says" + dtype);
  const std::string order = field(header, "fortran_order", path);
  if (order.substr(0, order.find(',')).find("True") != std::string::npos)
    throw UsageError(path + ": Fortran-order arrays are not supported (use np.ascontiguousarray)");
  h.shape = parse_shape(field(header, "shape", path), path);
  h.data_offset = size_t(f.tellg());

  // The file must hold exactly the data the shape promises (checked in long double: no overflow).
  long double want = h.elem_bytes;
  for (size_t d : h.shape) want *= d;
  f.seekg(0, std::ios::end);
  const size_t have = size_t(f.tellg()) - h.data_offset;
  if (want != (long double)have) {
    char need[64];  // the count may pass 2^64: printed from the long double, not through an integer
    std::snprintf(need, sizeof need, "%.0Lf", want);
    throw UsageError(path + ": shape " + shape_str(h.shape) + " needs " + need + " bytes of data, the file holds " +
                     std::to_string(have));
  }
  return h;
}
}  // namespace

NpyHeader npy_read_header(const std::string& path) { return read_header(path, false); }

NpyBytes npy_read_bytes(const std::string& path) {
  const NpyHeader h = read_header(path, true);
  std::ifstream f(path, std::ios::binary);
  f.seekg(std::streamoff(h.data_offset));
  NpyBytes a;
  a.shape = h.shape;
  a.data.resize(h.elems());
  f.read(reinterpret_cast<char*>(a.data.data()), std::streamsize(a.data.size()));
  if (!f) throw UsageError(path + ": read error");
  return a;
}

NpyArray npy_read(const std::string& path) {
  const NpyHeader h = npy_read_header(path);
  std::ifstream f(path, std::ios::binary);
  f.seekg(std::streamoff(h.data_offset));
  NpyArray a;
  a.shape = h.shape;
  const size_t n = h.elems();
  a.data.resize(n);
  if (h.elem_bytes == 4) {
    f.read(reinterpret_cast<char*>(a.data.data()), std::streamsize(n * 4));
  } else {
    std::vector<half_t> half(n);
    f.read(reinterpret_cast<char*>(half.data()), std::streamsize(n * 2));
    for (size_t i = 0; i < n; ++i) a.data[i] = to_float(half[i]);
  }
  if (!f) throw UsageError(path + ": read error");
  return a;
}

}  // namespace fa
