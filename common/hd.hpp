// FA_HD marks the small functions that host code, device code and the plain C++ models all call (the
// problem's geometry, the causal mask, the dropout draw), so there is one definition of each.
#pragma once

#if defined(__CUDACC__)
#define FA_HD __host__ __device__ __forceinline__
#else
#define FA_HD inline
#endif
