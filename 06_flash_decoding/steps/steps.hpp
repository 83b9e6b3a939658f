// The ten steps of the ladder, one file each (README's order): each file's kernel() is the step's row of the
// registry (flash_decoding.cu's kernels()): its properties and its host functions.
#pragma once
#include "flash_decoding.cuh"

namespace fdec {
namespace v01_fa2_grid { Kernel kernel(); }
namespace v02_split_kv { Kernel kernel(); }
namespace v03_split_kv_gqa { Kernel kernel(); }
namespace v04_split_kv_pipelined { Kernel kernel(); }
namespace v05_split_kv_fused { Kernel kernel(); }
namespace v06_split_kv_mma { Kernel kernel(); }
namespace v07_split_kv_even { Kernel kernel(); }
namespace v08_unified_max { Kernel kernel(); }
namespace v09_paged { Kernel kernel(); }
namespace v10_flat_gemm { Kernel kernel(); }
}  // namespace fdec
