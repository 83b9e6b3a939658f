// .npy read/write (NumPy format 1.0/2.0, little-endian, C order) for float32 ('<f4') and
// float16 ('<f2'). NumPy has no bfloat16: bf16 tensors are exchanged as float32.
// torch.from_numpy(np.load("q.npy")) gives exactly the tensor a chapter program read or wrote.
#pragma once
#include <string>
#include <vector>

#include "dtype.hpp"

namespace fa {

struct NpyArray {
  std::vector<size_t> shape;
  std::vector<float> data;  // float16 files are widened on read
};

// Throws std::runtime_error naming the file and what is wrong with it.
NpyArray npy_read(const std::string& path);
void npy_write(const std::string& path, const std::vector<size_t>& shape, const float* data);
void npy_write(const std::string& path, const std::vector<size_t>& shape, const half_t* data);

std::string shape_str(const std::vector<size_t>& shape);  // "[2, 8, 1024, 64]"

}  // namespace fa
