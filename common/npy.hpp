// .npy read/write (NumPy format 1.0/2.0, little-endian, C order) for float32 ('<f4') and
// float16 ('<f2'), and uint8/bool ('|u1', '|b1') for block masks. NumPy has no bfloat16: bf16 tensors
// are exchanged as float32.
// torch.from_numpy(np.load("q.npy")) gives exactly the tensor a chapter program read or wrote.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "dtype.hpp"

namespace fa {

// What a .npy header says, checked against the file: magic, dtype, C order, every dimension a plain
// non-negative integer below 2^31 (Problem's sizes are int), and a file exactly as long as the shape.
struct NpyHeader {
  std::vector<size_t> shape;
  size_t elem_bytes = 4;  // 4 for '<f4', 2 for '<f2', 1 for '|u1' or '|b1'
  size_t data_offset = 0;
  size_t elems() const;
};

// A file that is missing or malformed is the user's to fix: these throw fa::UsageError naming the
// file and what is wrong with it (the programs exit 2).
NpyHeader npy_read_header(const std::string& path);
struct NpyArray {
  std::vector<size_t> shape;
  std::vector<float> data;  // float16 files are widened on read
};
NpyArray npy_read(const std::string& path);
// A uint8 or bool array (a block mask, common/block_mask.hpp); any other dtype is a UsageError.
struct NpyBytes {
  std::vector<size_t> shape;
  std::vector<uint8_t> data;
};
NpyBytes npy_read_bytes(const std::string& path);

// Writes to PATH.tmp and renames it to PATH at the end, so a failed write never leaves a truncated
// PATH behind. Throws std::runtime_error if the file cannot be written.
void npy_write(const std::string& path, const std::vector<size_t>& shape, const float* data);
void npy_write(const std::string& path, const std::vector<size_t>& shape, const half_t* data);
void npy_write(const std::string& path, const std::vector<size_t>& shape, const uint8_t* data);

std::string shape_str(const std::vector<size_t>& shape);  // "[2, 8, 1024, 64]"

}  // namespace fa
