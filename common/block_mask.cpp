#include "block_mask.hpp"

#include <algorithm>
#include <cerrno>
#include <cstdlib>

#include "npy.hpp"
#include "random.hpp"

namespace fa {
namespace {

// An empty mask of this problem's shape, and the element ranges of block (r, c).
BlockMask empty_mask(const Problem& p) {
  BlockMask m;
  m.Tr = mask_rows_of(p.q_len), m.Tc = mask_cols_of(p.kv_len);
  m.bits.assign(size_t(m.Tr) * m.Tc, 0);
  return m;
}
int rows_begin(int r) { return r * kMaskRows; }
int rows_end(const Problem& p, int r) { return std::min((r + 1) * kMaskRows, p.q_len); }
int cols_begin(int c) { return c * kMaskCols; }
int cols_end(const Problem& p, int c) { return std::min((c + 1) * kMaskCols, p.kv_len); }

// The offsets j - (i + shift) that block (r, c) holds: [lo, hi].
void diagonal_offsets(const Problem& p, int r, int c, long long* lo, long long* hi) {
  const long long shift = p.causal_shift();
  *lo = cols_begin(c) - (rows_end(p, r) - 1 + shift);
  *hi = (cols_end(p, c) - 1) - (rows_begin(r) + shift);
}

// Digits only, within [min, max]; the whole token.
long long parse_int(const std::string& tok, long long min, long long max, const std::string& spec) {
  if (tok.empty() || tok.find_first_not_of("0123456789") != std::string::npos || tok.size() > 12)
    throw UsageError("--block-mask " + spec + ": '" + tok + "' is not a non-negative integer");
  const long long v = std::stoll(tok);
  if (v < min || v > max)
    throw UsageError("--block-mask " + spec + ": " + tok + " is out of range [" + std::to_string(min) + ", " +
                     std::to_string(max) + "]");
  return v;
}

double parse_density(const std::string& tok, const std::string& spec) {
  char* end = nullptr;
  errno = 0;
  const double v = std::strtod(tok.c_str(), &end);
  if (tok.empty() || *end != '\0' || errno != 0 || !(v >= 0.0 && v <= 1.0))
    throw UsageError("--block-mask " + spec + ": the density must be a number in [0, 1] (got '" + tok + "')");
  return v;
}

}  // namespace

double BlockMask::density() const {
  if (bits.empty()) return 0.0;
  size_t ones = 0;
  for (uint8_t b : bits) ones += b != 0;
  return double(ones) / double(bits.size());
}

BlockMask dense_block_mask(const Problem& p) {
  BlockMask m = empty_mask(p);
  std::fill(m.bits.begin(), m.bits.end(), 1);
  return m;
}

BlockMask causal_block_mask(const Problem& p) {
  BlockMask m = empty_mask(p);
  for (int r = 0; r < m.Tr; ++r)
    for (int c = 0; c < m.Tc; ++c) {
      long long lo, hi;
      diagonal_offsets(p, r, c, &lo, &hi);
      m.bits[size_t(r) * m.Tc + c] = lo <= 0;  // some key j <= i + shift
    }
  return m;
}

BlockMask local_block_mask(const Problem& p, int window) {
  BlockMask m = empty_mask(p);
  for (int r = 0; r < m.Tr; ++r)
    for (int c = 0; c < m.Tc; ++c) {
      long long lo, hi;
      diagonal_offsets(p, r, c, &lo, &hi);
      m.bits[size_t(r) * m.Tc + c] = lo <= window && hi >= -window;  // [lo, hi] meets [-W, W]
    }
  return m;
}

BlockMask strided_block_mask(const Problem& p, int stride) {
  BlockMask m = local_block_mask(p, 0);  // the diagonal blocks
  for (int r = 0; r < m.Tr; ++r)
    for (int c = 0; c < m.Tc; c += stride) m.bits[size_t(r) * m.Tc + c] = 1;
  return m;
}

BlockMask random_block_mask(const Problem& p, double density, uint64_t seed) {
  BlockMask m = empty_mask(p);
  Rng rng(seed);
  for (uint8_t& b : m.bits) b = rng.uniform() < density;
  return m;
}

BlockMask load_block_mask(const std::string& path, const Problem& p) {
  const NpyBytes a = npy_read_bytes(path);
  BlockMask m = empty_mask(p);
  if (a.shape != std::vector<size_t>{size_t(m.Tr), size_t(m.Tc)})
    throw UsageError(path + ": a block mask for q_len " + std::to_string(p.q_len) + ", kv_len " +
                     std::to_string(p.kv_len) + " has shape [" + std::to_string(m.Tr) + ", " + std::to_string(m.Tc) +
                     "] (blocks of " + std::to_string(kMaskRows) + " queries x " + std::to_string(kMaskCols) +
                     " keys), the file has " + shape_str(a.shape));
  for (size_t e = 0; e < a.data.size(); ++e) m.bits[e] = a.data[e] != 0;
  return m;
}

void save_block_mask(const std::string& path, const BlockMask& m) {
  npy_write(path, {size_t(m.Tr), size_t(m.Tc)}, m.bits.data());
}

BlockMask block_mask_from_spec(const std::string& spec, const Problem& p) {
  const size_t colon = spec.find(':');
  const std::string kind = spec.substr(0, colon), arg = colon == std::string::npos ? "" : spec.substr(colon + 1);
  if (kind == "local") return local_block_mask(p, int(parse_int(arg, 0, (1LL << 31) - 1, spec)));
  if (kind == "strided") return strided_block_mask(p, int(parse_int(arg, 1, (1LL << 31) - 1, spec)));
  if (kind == "random") {
    const size_t c2 = arg.find(':');
    const double density = parse_density(arg.substr(0, c2), spec);
    const uint64_t seed = c2 == std::string::npos ? 0 : uint64_t(parse_int(arg.substr(c2 + 1), 0, 1LL << 40, spec));
    return random_block_mask(p, density, seed);
  }
  if (spec.size() > 4 && spec.compare(spec.size() - 4, 4, ".npy") == 0) return load_block_mask(spec, p);
  throw UsageError("--block-mask " + spec + ": expected local:W, strided:S, random:DENSITY[:SEED] or a .npy file");
}

}  // namespace fa
