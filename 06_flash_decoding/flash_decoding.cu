// Chapter 06 kernels: split-KV decoding (Flash-Decoding), GQA packing, double-buffered K/V chunks, the merge in the
// split kernel, the packed rows on tensor cores, FlashDecoding++'s unified max, a paged cache, the LSE merge, and the
// read-only ceiling. README §2-§6 derive each; the pseudo-code lines are README Algorithm 1 (split), Algorithm 1'
// (its lines 5-9 on tensor cores) and Algorithm 2 (merge).
//
// One block = (split s, row chunk, batch entry b x unit u); 128 threads = 4 warps. The block's query rows (1, 4 or
// 16 of them: plan.hpp's row bucket) sit in shared memory as fp32, pre-scaled by the softmax scale. The split's keys
// are dealt to the warps in chunks of 32 (warp w takes chunks w, w + 4, ...): split-K *inside* the block too,
// because decoding has too few query rows to give every warp rows of its own.
// Per chunk, a warp copies K_j and V_j (32 rows each) to its own shared memory with cp.async (16 bytes a lane,
// coalesced; rows past the split are zero-filled, never read; with Stages = 2 the copy of the warp's *next* chunk is
// issued into a second buffer before this chunk is computed: README §4.1), then
//   S:   lane j computes S_rj = q_r . k_j for every row r (its key row read from padded shared memory),
//   P:   running max (warp max per row, rescale of O~ by alpha) or unified max (exp(S - phi), nothing to rescale),
//   PV:  P goes to shared memory; lane c owns d/32 output columns and adds P_rj V_j[c] over the chunk.
// At the end the 4 warps' (m, l, O~) are merged (chapter 01's operator) through shared memory, and the block
// writes its partial (O_s = O~/l, LSE_s = m + log l), or O and LSE themselves when there is one split.
// Shared memory: K, V chunks Stages x 4 x 2 x 32 x (d + 8) x 2 B (69.6 KB per stage at d = 128, 36.9 KB at d = 64),
// the merge scratch reuses the first stage; Q rows x d x 4 B and P 4 x rows x 32 x 4 B (8 KB each at 16 rows,
// d = 128). Two stages at d = 128 and 16 rows: 152 KB, one block per SM (sm_80 allows 163 KB, sm_90 227 KB).
// The tensor-core kernel (split_kv_mma, attend_mma below, README §4.3) keeps all of this but lines 1 and 5-9: Q and
// P live in registers as mma fragments, so its shared memory is the K/V stages and the merge weights alone.
#include "flash_decoding.cuh"

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <algorithm>
#include <cstring>
#include <stdexcept>
#include <string>
#include <type_traits>

#include "cuda_check.cuh"
#include "device_buffer.cuh"
#include "device.cuh"
#include "lowp.cuh"
#include "model.hpp"
#include "plan.hpp"
// common/'s wrappers of mma.sync, ldmatrix and the fragment maps (frag.hpp): the ones chapter 05 uses.
#include "ptx.cuh"

namespace fdec {
namespace {

constexpr int kVec = 8;            // 16-bit elements per 16-byte copy
constexpr int kMergeRows = kWarps; // merge kernel: one warp per query row
static_assert(kKeysPerWarp == 32, "one key per lane");
static_assert(kMaxRows == 16, "row buckets are 1, 4, 16 (plan.hpp)");

__device__ __forceinline__ float2 to_float2(__half2 x) { return __half22float2(x); }
__device__ __forceinline__ float2 to_float2(__nv_bfloat162 x) { return __bfloat1622float2(x); }
template <class T>
using Pair = std::conditional_t<std::is_same_v<T, __half>, __half2, __nv_bfloat162>;

// n consecutive 16-bit values (n even) at p, widened to float.
template <class T, int N>
__device__ __forceinline__ void load_floats(const T* p, float (&f)[N]) {
  static_assert(N % 2 == 0, "pairs");
#pragma unroll
  for (int e = 0; e < N; e += 2) {
    const float2 x = to_float2(*reinterpret_cast<const Pair<T>*>(p + e));
    f[e] = x.x, f[e + 1] = x.y;
  }
}

// 8 consecutive 16-bit values at p (16-byte aligned) in one 16-byte shared-memory load, widened to float. One wide
// load per lane keeps the S loop free of bank conflicts: with the 16-byte row padding the 8 lanes of each
// quarter-warp hit 8 distinct groups of 4 banks.
template <class T>
__device__ __forceinline__ void load_floats8(const T* p, float (&f)[8]) {
  const uint4 raw = *reinterpret_cast<const uint4*>(p);
  const unsigned w[4] = {raw.x, raw.y, raw.z, raw.w};
#pragma unroll
  for (int e = 0; e < 4; ++e) {
    Pair<T> pair;
    memcpy(&pair, &w[e], 4);
    const float2 x = to_float2(pair);
    f[2 * e] = x.x, f[2 * e + 1] = x.y;
  }
}

// The L2 policy of the K/V stream (README §4.6). Evict-first: the keys and values of a step replace each other in L2
// instead of what was there before them (a dirty line replaced costs a write to HBM first); the loads then carry
// createpolicy's evict-first policy. Otherwise no policy at all: L2's default (an explicit evict-normal policy was
// measured slower, §4.6).
struct KvPolicy {
  bool evict_first;
  uint64_t first;  // the evict-first policy (plain arithmetic: computed once per thread)
};
__device__ __forceinline__ KvPolicy kv_policy(bool evict_first) {
  KvPolicy k{evict_first, 0};
  asm("createpolicy.fractional.L2::evict_first.b64 %0, 1.0;\n" : "=l"(k.first));
  return k;
}

// 16 bytes global -> shared without passing through registers (sm_80+), under the K/V policy, with L2 asked to
// fetch the whole 256-byte block around it (a warp's 32 copies cover 512 contiguous bytes; README §4.6). bytes = 0
// zero-fills the destination and reads nothing (src must still be a valid address).
__device__ __forceinline__ void cp_async16(void* dst, const void* src, bool valid, KvPolicy pol) {
  const unsigned s = static_cast<unsigned>(__cvta_generic_to_shared(dst));
  if (pol.evict_first)
    asm volatile("cp.async.cg.shared.global.L2::cache_hint.L2::256B [%0], [%1], 16, %2, %3;\n" ::"r"(s), "l"(src),
                 "r"(valid ? 16 : 0), "l"(pol.first));
  else
    asm volatile("cp.async.cg.shared.global.L2::256B [%0], [%1], 16, %2;\n" ::"r"(s), "l"(src), "r"(valid ? 16 : 0));
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::); }
template <int N>
__device__ __forceinline__ void cp_async_wait() { asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory"); }

// atomicAdd with release and acquire semantics at device scope (PTX memory model): the stores this thread made or
// observed before it (for thread 0 after a __syncthreads: the whole block's) are visible to whoever reads the new
// count, and the loads after it see what the blocks counted before it published.
__device__ __forceinline__ int atomic_add_acq_rel(int* p, int x) {
  int old;
  asm volatile("atom.acq_rel.gpu.global.add.s32 %0, [%1], %2;\n" : "=r"(old) : "l"(p), "r"(x) : "memory");
  return old;
}

__device__ __forceinline__ float warp_max(float x) {
#pragma unroll
  for (int o = 16; o > 0; o /= 2) x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, o));
  return x;
}
__device__ __forceinline__ float warp_sum(float x) {
#pragma unroll
  for (int o = 16; o > 0; o /= 2) x += __shfl_xor_sync(0xffffffffu, x, o);
  return x;
}

// Everything a split block needs besides the problem.
template <class T>
struct Args {
  fa::Problem p;  // kv_len = cache capacity
  Rows rows;
  int splits;
  float phi;
  const T* q;
  const T* k;
  const T* v;
  const int* kv_lens;
  const int* block_table;
  int pages_per_seq, log2_page;
  T* o;
  float* lse;
  float* ws_o;   // [splits, B*H*q_len, d]
  float* ws_lse; // [splits, B*H*q_len]
  int* fallbacks;
  size_t q_rows; // B*H*q_len: the query rows of the whole problem (a row of the workspace per split)
  int* done;     // fused merge: per (row chunk, batch entry x unit), how many of its splits have written their partial
  bool evict_first;  // the K/V stream's L2 policy (README §4.6)
};

// Offset of key row `key` of kv head hk of batch entry b: contiguous, or through the block table (page pool
// [pages, Hkv, page_size, d]). key < n_b <= pages_per_seq * page_size, so the table index is in bounds.
template <class T, bool Paged>
__device__ __forceinline__ size_t key_row(const Args<T>& a, int b, int hk, int key) {
  if constexpr (Paged) {
    const int page = a.block_table[size_t(b) * a.pages_per_seq + (key >> a.log2_page)];
    const int in_page = key & ((1 << a.log2_page) - 1);
    return ((size_t(page) * a.p.kv_heads + hk) << a.log2_page | size_t(in_page)) * a.p.head_dim;
  } else {
    return a.p.kv_offset(b, hk) + size_t(key) * a.p.head_dim;
  }
}

// Shared-memory layout of a split block (bytes), for D, R rows and Stages K/V chunk buffers per warp. Mma: Q and P
// are registers (attend_mma), so kQ = kP = 0.
template <int D, int R, int Stages, bool Mma>
struct Smem {
  static constexpr int kLdKV = D + kPadH;                                       // 16-bit elements per K/V row
  static constexpr int kKVWarp = 2 * kKeysPerWarp * kLdKV * 2;                   // one warp's K and V chunk
  static constexpr int kStage = kWarps * kKVWarp;                                // every warp's chunk, one stage
  static constexpr int kKV = Stages * kStage;
  static constexpr int kScratchWarp = R * (D + 3) * 4;                           // m, l, max, O~ per row
  static constexpr int kQ = Mma ? 0 : R * D * 4, kP = Mma ? 0 : kWarps * R * kKeysPerWarp * 4;
  static constexpr int kFin = 2 * R * 4 + kWarps * R * 4;
  static constexpr int kBytes = kKV + kQ + kP + kFin;
  static_assert(kBytes == split_smem_bytes(D, R, Stages, Mma), "plan.hpp's count (CPU-tested) is this layout's");
  static_assert(Stages == 1 || Stages == 2, "one buffer per warp, or two (double buffering)");
  static_assert(kWarps * kScratchWarp <= kStage, "the merge scratch reuses the first stage's K/V chunk buffers");
  static_assert((kLdKV * 2) % 16 == 0 && kKVWarp % 16 == 0, "cp.async needs 16-byte aligned rows");
};

// Algorithm 1 line 4 for one warp: K_j and V_j of the 32-key chunk at c0 -> Ks, Vs by cp.async, as two commit
// groups (K first, so the S loop can start while V is still in flight). Rows past the split are zero-filled, not read.
template <class T, int D, bool Paged>
__device__ __forceinline__ void copy_chunk(const Args<T>& a, int b, int hk, int c0, int end, T* Ks, T* Vs) {
  constexpr int kLd = D + kPadH;
  constexpr int kPieces = D / kVec;                     // 16-byte pieces per K/V row
  constexpr int kCopies = kKeysPerWarp * kPieces / 32;  // 16-byte copies per lane per chunk and matrix
  const int lane = threadIdx.x % 32;
  const KvPolicy pol = kv_policy(a.evict_first);
#pragma unroll
  for (int t = 0; t < kCopies; ++t) {
    const int e = lane + 32 * t, row = e / kPieces, col = (e % kPieces) * kVec, key = c0 + row;
    const bool ok = key < end;
    const size_t off = ok ? key_row<T, Paged>(a, b, hk, key) + col : 0;
    cp_async16(Ks + row * kLd + col, a.k + off, ok, pol);
  }
  cp_async_commit();
#pragma unroll
  for (int t = 0; t < kCopies; ++t) {
    const int e = lane + 32 * t, row = e / kPieces, col = (e % kPieces) * kVec, key = c0 + row;
    const bool ok = key < end;
    const size_t off = ok ? key_row<T, Paged>(a, b, hk, key) + col : 0;
    cp_async16(Vs + row * kLd + col, a.v + off, ok, pol);
  }
  cp_async_commit();
}

// Algorithm 1, lines 2-10, for the block's rows over its split's keys: each warp ends with (m, l, O~) of its
// chunks, which it writes to the scratch. Unified: S - phi replaces S - m (m = phi), and `m` tracks the largest
// score instead, for the fallback test. Stages = 2: while chunk t is computed, chunk t + 1 is already being copied
// into the warp's other buffer (README §4.1); the arithmetic, and so every bit of the result, is that of Stages = 1.
template <class T, int D, int R, bool Paged, bool Unified, int Stages>
__device__ __forceinline__ void attend(const Args<T>& a, int b, int hk, int r0, int nrows, KeyRange keys,
                                       const fa::Problem& pb, char* smem) {
  using L = Smem<D, R, Stages, false>;
  constexpr int kCols = D / 32;  // output columns per lane
  constexpr int kStride = kWarps * kKeysPerWarp;  // from one chunk of a warp to its next
  // cp.async groups a warp may leave in flight: K, V of the chunks copied ahead. Waiting down to kAhead + 1 groups
  // means this chunk's K has landed, down to kAhead its V too.
  constexpr int kAhead = 2 * (Stages - 1);
  static_assert(D % 64 == 0, "lane owns an even number of columns");
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  auto Ks_of = [&](int stage) { return reinterpret_cast<T*>(smem + stage * L::kStage + warp * L::kKVWarp); };
  const float* Qs = reinterpret_cast<const float*>(smem + L::kKV);
  float* Ps = reinterpret_cast<float*>(smem + L::kKV + L::kQ) + warp * R * kKeysPerWarp;

  float m[R], l[R], acc[R][kCols];
  int query[R];  // the query index of each row; -1 for the rows past the unit (zeros, masked)
#pragma unroll
  for (int r = 0; r < R; ++r) {
    query[r] = r < nrows ? a.rows.query(r0 + r) : -1;
    m[r] = -INFINITY, l[r] = 0.f;
#pragma unroll
    for (int c = 0; c < kCols; ++c) acc[r][c] = 0.f;
  }

  // Stages = 2: the warp's first chunk is already on its way to stage 0 (split_kernel issued it before line 1).
  const int first = keys.begin + warp * kKeysPerWarp;
  int stage = 0;
  for (int c0 = first; c0 < keys.end; c0 += kStride) {
    T* Ks = Ks_of(stage);
    T* Vs = Ks + kKeysPerWarp * L::kLdKV;
    // line 4: K_j, V_j of the chunk -> shared (rows past the split: zeros, nothing read). Stages = 2: this chunk was
    // copied one iteration ago; copy the next one into the other buffer now (that buffer's last reader, the previous
    // iteration's PV loop, ended at its closing __syncwarp). Past the last chunk, two empty groups keep the count.
    if constexpr (Stages == 2) {
      if (c0 + kStride < keys.end) {
        T* Kn = Ks_of(stage ^ 1);
        copy_chunk<T, D, Paged>(a, b, hk, c0 + kStride, keys.end, Kn, Kn + kKeysPerWarp * L::kLdKV);
      } else {
        cp_async_commit(), cp_async_commit();
      }
    } else {
      copy_chunk<T, D, Paged>(a, b, hk, c0, keys.end, Ks, Vs);
    }
    cp_async_wait<kAhead + 1>();  // this chunk's K has landed; its V (and the next chunk) may still be in flight
    __syncwarp();

    // line 5: S_rj = (scale q_r) . k_j, lane = key j
    const int key = c0 + lane;
    float s[R];
#pragma unroll
    for (int r = 0; r < R; ++r) s[r] = 0.f;
#pragma unroll 4
    for (int col = 0; col < D; col += kVec) {
      float kf[kVec];
      load_floats8<T>(Ks + lane * L::kLdKV + col, kf);
#pragma unroll
      for (int r = 0; r < R; ++r) {
        const float4 q0 = *reinterpret_cast<const float4*>(Qs + r * D + col);  // same address in every lane
        const float4 q1 = *reinterpret_cast<const float4*>(Qs + r * D + col + 4);
        s[r] = fmaf(q0.x, kf[0], fmaf(q0.y, kf[1], fmaf(q0.z, kf[2], fmaf(q0.w, kf[3], s[r]))));
        s[r] = fmaf(q1.x, kf[4], fmaf(q1.y, kf[5], fmaf(q1.z, kf[6], fmaf(q1.w, kf[7], s[r]))));
      }
    }
    // lines 6-8: mask, then P with the running max (rescale O~) or with phi (nothing to rescale)
#pragma unroll
    for (int r = 0; r < R; ++r) {
      if (!(key < keys.end && query[r] >= 0 && pb.visible(query[r], key))) s[r] = -INFINITY;
      float p;
      if constexpr (Unified) {
        p = expf(s[r] - a.phi);
        m[r] = fmaxf(m[r], s[r]);  // this lane's largest score: the fallback test needs the split's maximum
        l[r] += p;
      } else {
        const float m_new = fmaxf(m[r], warp_max(s[r]));
        const float m_use = m_new == -INFINITY ? 0.f : m_new;  // nothing visible yet: avoid (-inf) - (-inf)
        const float alpha = expf(m[r] - m_use);
        p = expf(s[r] - m_use);
        l[r] = l[r] * alpha + p;  // each lane sums its own keys; the lanes are summed once, after the loop
        m[r] = m_new;
#pragma unroll
        for (int c = 0; c < kCols; ++c) acc[r][c] *= alpha;
      }
      Ps[r * kKeysPerWarp + lane] = p;
    }
    cp_async_wait<kAhead>();
    __syncwarp();  // V_j and every lane's P are in shared memory

    // line 9: O~_r += P_rj V_j over the 32 keys; lane owns columns lane*kCols .. +kCols-1
#pragma unroll 2
    for (int j = 0; j < kKeysPerWarp; j += 4) {
      float vf[4][kCols];
#pragma unroll
      for (int t = 0; t < 4; ++t) load_floats<T>(Vs + (j + t) * L::kLdKV + lane * kCols, vf[t]);
#pragma unroll
      for (int r = 0; r < R; ++r) {
        const float4 p4 = *reinterpret_cast<const float4*>(Ps + r * kKeysPerWarp + j);
#pragma unroll
        for (int c = 0; c < kCols; ++c)
          acc[r][c] = fmaf(p4.w, vf[3][c], fmaf(p4.z, vf[2][c], fmaf(p4.y, vf[1][c], fmaf(p4.x, vf[0][c], acc[r][c]))));
      }
    }
    __syncwarp();  // every lane is done with K_j, V_j, P before the next chunk overwrites them
    stage ^= Stages - 1;
  }

  // line 10: the warp's (m, l, max, O~) -> scratch (which overlays the first stage's K/V buffers of every warp: wait
  // for all; no copy is in flight any more, the last iteration waited for every non-empty group)
  float mx[R];
#pragma unroll
  for (int r = 0; r < R; ++r) {
    l[r] = warp_sum(l[r]);
    mx[r] = Unified ? warp_max(m[r]) : m[r];
    if (Unified) m[r] = a.phi;  // every warp's O~ and l are relative to the same phi
  }
  __syncthreads();
  float* scratch = reinterpret_cast<float*>(smem) + warp * R * (D + 3);
#pragma unroll
  for (int r = 0; r < R; ++r) {
    float* row = scratch + r * (D + 3);
    if (lane == 0) row[D] = m[r], row[D + 1] = l[r], row[D + 2] = mx[r];
#pragma unroll
    for (int c = 0; c < kCols; ++c) row[lane * kCols + c] = acc[r][c];
  }
  __syncthreads();
}

// Algorithm 1 with lines 5-9 on tensor cores (README §4.3, Algorithm 1'), for the block's rows padded to one 16-row
// tile (rows >= nrows: Q = 0 and masked). The copies (line 4), the warps' chunks, the stages and lines 10-13 are
// attend's and split_kernel's; what changes is who holds what. With g = lane / 4 and t = lane % 4 (frag.hpp):
//   Q     A fragments of Q_i (16 x d, the dtype, unscaled), loaded from global memory once: lane holds rows g and
//         g + 8, columns 2t, 2t + 1, 2t + 8, 2t + 9 of every 16-column k-step (d / 16 x 4 registers);
//   S     C fragments of S = Q K_j^T (16 x 32 keys, fp32): rows g and g + 8, keys 8n + 2t and 8n + 2t + 1 of n-tile n;
//         the 4 lanes of a quad share the rows, so a row's max is a local max and 2 shuffles;
//   P     the same registers, rounded to the dtype: the A fragments of P V_j (chapter 05's step 5);
//   O~    C fragments of O~ (16 x d, fp32): rows g and g + 8, columns 8n + 2t and 8n + 2t + 1 (d / 2 floats).
// K_j sits in shared memory as [key][d], which is the B operand (k = d, n = key) stored column by column: ldmatrix
// without .trans. V_j as [key][d] is B (k = key, n = d) stored row by row: ldmatrix .trans. The rows' 16-byte padding
// that keeps the CUDA-core reads conflict-free also gives each 8-row ldmatrix phase 8 distinct groups of 4 banks.
// Per warp and chunk at d = 128: 32 + 32 mma.sync and 16 + 16 ldmatrix.x4 (README §4.3 counts the rest).
// Shared memory (Smem<D, 16, Stages, true>): the K/V stages and the merge weights alone, Q and P being registers:
// 139,648 bytes with two stages at d = 128 (74,112 at d = 64); one block per SM.
template <class T, int D, bool Paged, int Stages>
__device__ __forceinline__ void attend_mma(const Args<T>& a, int b, int u, int hk, int r0, int nrows, KeyRange keys,
                                           const fa::Problem& pb, char* smem) {
  namespace frag = fa::frag;
  constexpr int R = kMaxRows;
  using L = Smem<D, R, Stages, true>;
  constexpr int kStepsQK = D / 16;             // k-steps of S = Q K_j^T
  constexpr int kTilesS = kKeysPerWarp / 8;    // n-tiles of S (8 keys each)
  constexpr int kStepsPV = kKeysPerWarp / 16;  // k-steps of P V_j (16 keys each)
  constexpr int kTilesO = D / 8;               // n-tiles of O~ (8 columns each)
  constexpr int kStride = kWarps * kKeysPerWarp;
  constexpr int kAhead = 2 * (Stages - 1);     // as in attend
  static_assert(R == 16, "one mma.m16n8k16 tile of rows");
  static_assert(kTilesS % 2 == 0 && kTilesO % 2 == 0, "ldmatrix.x4 loads the B fragments of two n-tiles");
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int g = frag::group(lane), t = frag::thread_in_group(lane);
  auto Ks_of = [&](int stage) { return reinterpret_cast<T*>(smem + stage * L::kStage + warp * L::kKVWarp); };

  // line 1', for the two rows of this lane (row g + 8h of the tile): Q's fragments (a padding row: zeros), and the end
  // of the keys the row sees in this split (line 6: a row sees a prefix of the keys; a padding row sees none)
  const T* q_row[2];
  int seen_end[2];
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const int r = g + 8 * h;
    q_row[h] = r < nrows ? a.q + a.p.q_offset(b, a.rows.head(u, r0 + r)) + size_t(a.rows.query(r0 + r)) * D : nullptr;
    seen_end[h] = r < nrows ? min(keys.end, pb.visible_keys(a.rows.query(r0 + r))) : keys.begin;
  }
  uint32_t qf[kStepsQK][4];
#pragma unroll
  for (int ks = 0; ks < kStepsQK; ++ks)
#pragma unroll
    for (int reg = 0; reg < 4; ++reg) {  // register reg holds elements 2 reg, 2 reg + 1: one row, two columns
      const frag::RowCol rc = frag::a_elem(lane, 2 * reg);
      const T* row = q_row[rc.row >= 8];
      qf[ks][reg] = row ? *reinterpret_cast<const uint32_t*>(row + 16 * ks + rc.col) : 0u;
    }

  const float scale = a.p.softmax_scale();
  float m[2] = {-INFINITY, -INFINITY}, l[2] = {0.f, 0.f};  // line 3, rows g and g + 8 of the tile
  float acc[kTilesO][4] = {};

  const int first = keys.begin + warp * kKeysPerWarp;
  int stage = 0;
  for (int c0 = first; c0 < keys.end; c0 += kStride) {
    T* Ks = Ks_of(stage);
    T* Vs = Ks + kKeysPerWarp * L::kLdKV;
    // line 4: exactly attend's
    if constexpr (Stages == 2) {
      if (c0 + kStride < keys.end) {
        T* Kn = Ks_of(stage ^ 1);
        copy_chunk<T, D, Paged>(a, b, hk, c0 + kStride, keys.end, Kn, Kn + kKeysPerWarp * L::kLdKV);
      } else {
        cp_async_commit(), cp_async_commit();
      }
    } else {
      copy_chunk<T, D, Paged>(a, b, hk, c0, keys.end, Ks, Vs);
    }
    cp_async_wait<kAhead + 1>();
    __syncwarp();

    // line 5': S = Q K_j^T, fp32 accumulation; two n-tiles (16 keys) per ldmatrix.x4
    float s[kTilesS][4] = {};
#pragma unroll
    for (int np = 0; np < kTilesS / 2; ++np)
#pragma unroll
      for (int ks = 0; ks < kStepsQK; ++ks) {
        uint32_t kb[4];
        const T* k_row = Ks + (16 * np + frag::nk_tile_row(lane)) * L::kLdKV + 16 * ks + frag::nk_tile_col(lane);
        fa::tc::ldmatrix_x4(kb, k_row);
        fa::tc::mma_16816<T>(s[2 * np], qf[ks], kb);
        fa::tc::mma_16816<T>(s[2 * np + 1], qf[ks], kb + 2);
      }
    // line 6': scale, and mask what a row does not see: keys past the split, causal keys, everything for padding
#pragma unroll
    for (int n = 0; n < kTilesS; ++n)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int key = c0 + 8 * n + frag::c_elem(lane, e).col;
        s[n][e] = key < seen_end[e >> 1] ? s[n][e] * scale : -INFINITY;
      }
    // lines 7'-8': per row, the running max over the quad, P = e^(S - m_new), l and O~ rescaled
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      float mx = m[h];
#pragma unroll
      for (int n = 0; n < kTilesS; ++n) mx = fmaxf(mx, fmaxf(s[n][2 * h], s[n][2 * h + 1]));
      const float m_new = fa::tc::quad_max(mx);
      const float m_use = m_new == -INFINITY ? 0.f : m_new;  // nothing visible yet: avoid (-inf) - (-inf)
      const float alpha = expf(m[h] - m_use);
      float sum = 0.f;
#pragma unroll
      for (int n = 0; n < kTilesS; ++n)
#pragma unroll
        for (int e = 2 * h; e < 2 * h + 2; ++e) sum += (s[n][e] = expf(s[n][e] - m_use));
      l[h] = l[h] * alpha + sum;  // this lane's share of the row; the quad's 4 shares are added after the loop
      m[h] = m_new;
#pragma unroll
      for (int n = 0; n < kTilesO; ++n) acc[n][2 * h] *= alpha, acc[n][2 * h + 1] *= alpha;
    }
    cp_async_wait<kAhead>();
    __syncwarp();  // V_j has landed

    // line 9': O~ += P V_j, P (rounded to the dtype) straight from the C fragments of S to the A fragments of P
#pragma unroll
    for (int kk = 0; kk < kStepsPV; ++kk) {
      uint32_t pf[4];
#pragma unroll
      for (int reg = 0; reg < 4; ++reg) {
        const float* c = s[2 * kk + frag::p_from_s_ntile(reg)] + frag::p_from_s_celem(reg);
        pf[reg] = fa::tc::pack2<T>(c[0], c[1]);
      }
#pragma unroll
      for (int np = 0; np < kTilesO / 2; ++np) {
        uint32_t vb[4];
        const T* v_row = Vs + (16 * kk + frag::a_tile_row(lane)) * L::kLdKV + 16 * np + frag::a_tile_col(lane);
        fa::tc::ldmatrix_x4_trans(vb, v_row);
        fa::tc::mma_16816<T>(acc[2 * np], pf, vb);
        fa::tc::mma_16816<T>(acc[2 * np + 1], pf, vb + 2);
      }
    }
    __syncwarp();  // every lane is done with K_j, V_j before the next chunk overwrites them
    stage ^= Stages - 1;
  }

  // line 10: the warp's (m, l, m, O~) -> scratch, in attend's layout (the row's largest score is m itself)
#pragma unroll
  for (int h = 0; h < 2; ++h) l[h] = fa::tc::quad_sum(l[h]);
  __syncthreads();
  float* scratch = reinterpret_cast<float*>(smem) + warp * R * (D + 3);
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    float* row = scratch + (g + 8 * h) * (D + 3);
    if (t == 0) row[D] = m[h], row[D + 1] = l[h], row[D + 2] = m[h];
#pragma unroll
    for (int n = 0; n < kTilesO; ++n) {
      const frag::RowCol rc = frag::c_elem(lane, 2 * h);
      row[8 * n + rc.col] = acc[n][2 * h], row[8 * n + rc.col + 1] = acc[n][2 * h + 1];
    }
  }
  __syncthreads();
}

// Algorithm 2 for one query row g, by one warp (lane owns d/32 columns). In the fused kernels this runs after every
// other block of its row chunk has finished (with one wave of blocks, at the end of the step), so its latency is
// added to the step whole (README §4.4): no load may wait for another. Every LSE_s is loaded at once (lane i holds splits i, i + 32, ...), and with them the first
// kMergeBatch partial rows O_s, which need no M; then M (line 1), each lane's weights e^(LSE_s - M) (0 for an empty
// split, LSE_s = -inf), and the weighted sums in split order (lines 2-3), so the sums are those of a
// one-split-at-a-time loop, bit for bit. Up to 16 splits that is one round trip to L2 instead of two per split;
// beyond, one more per kMergeBatch splits (the next batch of O_s, loaded when the sums reach it).
// An empty split's O_s is loaded but never added. The workspace is read with ld.global.cg (L2, not L1): in the
// fused kernel other blocks wrote it during this launch, and L1 is not coherent between SMs.
// MaxSplits bounds `splits` (kMaxSplits; split_kv_even's pieces per tile: kMaxEvenBlocks).
constexpr int kMergeBatch = 16;  // partial rows in flight per lane: 16 x d/32 floats
template <class T, int D, int MaxSplits = kMaxSplits>
__device__ __forceinline__ void merge_row(size_t g, size_t rows, int splits, const float* ws_o, const float* ws_lse,
                                          T* o, float* lse) {
  constexpr int kCols = D / 32;
  constexpr int kLseRounds = MaxSplits / 32;  // LSE_s values per lane
  static_assert(MaxSplits % 32 == 0 && 32 % kMergeBatch == 0, "whole rounds of 32 splits, whole batches in each");
  const int lane = threadIdx.x % 32;
  float x[kMergeBatch][kCols];  // partial rows of splits s0 .. s0 + kMergeBatch - 1, this lane's columns
  auto load_batch = [&](int s0) {
#pragma unroll
    for (int i = 0; i < kMergeBatch; ++i)
#pragma unroll
      for (int c = 0; c < kCols; ++c)
        x[i][c] = s0 + i < splits ? __ldcg(ws_o + (size_t(s0 + i) * rows + g) * D + lane * kCols + c) : 0.f;
  };
  float ls[kLseRounds];
#pragma unroll
  for (int k = 0; k < kLseRounds; ++k)
    ls[k] = lane + 32 * k < splits ? __ldcg(ws_lse + size_t(lane + 32 * k) * rows + g) : -INFINITY;
  load_batch(0);
  float M = -INFINITY;  // line 1
#pragma unroll
  for (int k = 0; k < kLseRounds; ++k) M = fmaxf(M, ls[k]);
  M = warp_max(M);
  float acc[kCols] = {}, Lsum = 0.f;
  if (M != -INFINITY)
#pragma unroll
    for (int k = 0; k < kLseRounds; ++k) {  // lines 2-3
      if (32 * k >= splits) break;
      const float w_lane = ls[k] == -INFINITY ? 0.f : expf(ls[k] - M);  // split 32k + lane's weight
#pragma unroll
      for (int i0 = 0; i0 < 32; i0 += kMergeBatch) {
        const int s0 = 32 * k + i0;
        if (s0 >= splits) break;
        if (s0 > 0) load_batch(s0);
#pragma unroll
        for (int i = 0; i < kMergeBatch; ++i) {
          const float w = __shfl_sync(0xffffffffu, w_lane, i0 + i);  // the same in every lane: no divergence
          if (w == 0.f) continue;  // an empty split, or past the last
          Lsum += w;
#pragma unroll
          for (int c = 0; c < kCols; ++c) acc[c] = fmaf(w, x[i][c], acc[c]);
        }
      }
    }
#pragma unroll
  for (int c = 0; c < kCols; ++c) o[g * D + lane * kCols + c] = T(Lsum > 0.f ? acc[c] / Lsum : 0.f);  // line 4
  if (lane == 0) lse[g] = Lsum > 0.f ? M + logf(Lsum) : -INFINITY;
}

// Algorithm 2 as a kernel of its own: one warp per query row, launched after the split kernel.
template <class T, int D>
__global__ void __launch_bounds__(kThreads) merge_kernel(int rows, int splits, const float* __restrict__ ws_o,
                                                         const float* __restrict__ ws_lse, T* __restrict__ o,
                                                         float* __restrict__ lse) {
  const int g = blockIdx.x * kMergeRows + threadIdx.x / 32;
  if (g >= rows) return;
  merge_row<T, D>(g, rows, splits, ws_o, ws_lse, o, lse);
}

// Stages = 2, the pipeline's prologue: each warp's first chunk of `keys` -> stage 0, in flight while Q is loaded.
template <class T, int D, int R, bool Paged, int Stages, bool Mma>
__device__ __forceinline__ void copy_first_chunks(const Args<T>& a, int b, int hk, KeyRange keys, char* smem) {
  using L = Smem<D, R, Stages, Mma>;
  if constexpr (Stages == 2) {
    const int first = keys.begin + (threadIdx.x / 32) * kKeysPerWarp;
    T* Ks = reinterpret_cast<T*>(smem + (threadIdx.x / 32) * L::kKVWarp);
    if (first < keys.end) copy_chunk<T, D, Paged>(a, b, hk, first, keys.end, Ks, Ks + kKeysPerWarp * L::kLdKV);
  }
}

// Lines 11-13 for the block's rows, once attend or attend_mma has left every warp's (m, l, O~) in the scratch: the
// warps merged, then the partial s of `splits` written (O_s, LSE_s), or with one split O and LSE themselves. Fused:
// the block that brings the rows' arrival counter `done` to `splits` merges them (Algorithm 2), MaxSplits bounding
// `splits`. fin: the block's M, L and warp weights (Smem's kFin).
template <class T, int D, int R, bool Fused, int MaxSplits>
__device__ __forceinline__ void finish(const Args<T>& a, const char* smem, float* fin, int b, int u, int r0, int nrows,
                                       int s, int splits, int* done) {
  // line 11: merge the warps: M = max m_w, L = sum l_w e^(m_w - M), O~ = sum O~_w e^(m_w - M)
  const float* scratch = reinterpret_cast<const float*>(smem);
  if (threadIdx.x < R) {
    const int r = threadIdx.x;
    float M = -INFINITY, Lsum = 0.f;
    for (int w = 0; w < kWarps; ++w) M = fmaxf(M, scratch[(w * R + r) * (D + 3) + D]);
    for (int w = 0; w < kWarps; ++w) {
      const float mw = scratch[(w * R + r) * (D + 3) + D];
      const float wt = mw == -INFINITY ? 0.f : expf(mw - M);
      fin[2 * R + w * R + r] = wt;
      Lsum += wt * scratch[(w * R + r) * (D + 3) + D + 1];
    }
    fin[r] = M, fin[R + r] = Lsum;
  }
  __syncthreads();

  // line 12: the partial (O_s, LSE_s), or with one split O and LSE themselves
  const bool direct = splits == 1;
  for (int e = threadIdx.x; e < nrows * D; e += kThreads) {
    const int r = e / D, c = e % D;
    float o = 0.f;
    for (int w = 0; w < kWarps; ++w) o += fin[2 * R + w * R + r] * scratch[(w * R + r) * (D + 3) + c];
    const float Lsum = fin[R + r];
    o = Lsum > 0.f ? o / Lsum : 0.f;
    const size_t g = a.p.lse_offset(b, a.rows.head(u, r0 + r)) + a.rows.query(r0 + r);  // the query row
    if (direct) a.o[g * D + c] = T(o);
    else a.ws_o[(size_t(s) * a.q_rows + g) * D + c] = o;
  }
  if (threadIdx.x < nrows) {
    const int r = threadIdx.x;
    const float Lsum = fin[R + r];
    const float lse = Lsum > 0.f ? fin[r] + logf(Lsum) : -INFINITY;
    const size_t g = a.p.lse_offset(b, a.rows.head(u, r0 + r)) + a.rows.query(r0 + r);
    if (direct) a.lse[g] = lse;
    else a.ws_lse[size_t(s) * a.q_rows + g] = lse;
  }

  // line 13 (fused): publish the partial, count it; the block that brings the count to `splits` merges. The count
  // is one acquire-release atomic (README §4.2): the barrier orders every thread's workspace stores before thread
  // 0's atomic, whose release makes them visible device-wide with the count (release is cumulative); its acquire,
  // passed on by the second barrier, orders the last block's reads after every other block's published partial.
  if constexpr (Fused) {
    if (direct) return;
    __shared__ int last;
    __syncthreads();
    if (threadIdx.x == 0) {
      last = atomic_add_acq_rel(done, 1) == splits - 1;
      if (last) *done = 0;  // every other block of these rows has counted: ready for the next launch
    }
    __syncthreads();
    if (!last) return;
    for (int r = threadIdx.x / 32; r < nrows; r += kWarps)
      merge_row<T, D, MaxSplits>(a.p.lse_offset(b, a.rows.head(u, r0 + r)) + a.rows.query(r0 + r), a.q_rows, splits,
                                 a.ws_o, a.ws_lse, a.o, a.lse);
  }
}

// The split kernel (Algorithm 1). Grid (splits, row chunks, B x units), 128 threads, Smem<D, R, Stages, Mma>::kBytes
// dynamic. Fused: with more than one split, the last block of a (row chunk, batch entry x unit) to finish merges
// its rows' partials itself (Algorithm 2, line 13 of Algorithm 1; README §4.2), so no merge kernel is launched.
// Mma: lines 1 and 5-9 on tensor cores (attend_mma; README §4.3), the rest unchanged.
template <class T, int D, int R, bool Paged, bool Unified, int Stages, bool Fused, bool Mma>
__global__ void __launch_bounds__(kThreads, 1) split_kernel(Args<T> a) {
  using L = Smem<D, R, Stages, Mma>;
  static_assert(!Mma || (R == kMaxRows && !Unified), "the tensor-core path: one 16-row tile, the running max");
  static_assert(Stages == 1 || !Unified, "the unified max's fallback re-runs attend, which expects no copy in flight");
  extern __shared__ float4 smem4[];
  char* smem = reinterpret_cast<char*>(smem4);
  const int units = gridDim.z / a.p.batch;
  const int s = blockIdx.x, b = blockIdx.z / units, u = blockIdx.z % units;
  const int r0 = blockIdx.y * R, nrows = min(R, a.rows.per_unit() - r0);
  const int hk = a.p.kv_head_of(a.rows.head(u, r0));  // every row of a unit shares one kv head
  const int n_b = a.kv_lens[b];
  const fa::Problem pb = seen_by(a.p, n_b);
  const KeyRange keys = split_range(n_b, a.splits, s);

  copy_first_chunks<T, D, R, Paged, Stages, Mma>(a, b, hk, keys, smem);

  // line 1: the block's query rows (scaled) -> shared; rows past the unit are zeros (and masked in attend).
  // Mma: each warp loads Q's fragments into registers itself (attend_mma).
  if constexpr (!Mma) {
    float* Qs = reinterpret_cast<float*>(smem + L::kKV);
    const float scale = a.p.softmax_scale();
    for (int e = threadIdx.x; e < R * D; e += kThreads) {
      const int r = e / D, c = e % D;
      float x = 0.f;
      if (r < nrows) x = float(a.q[a.p.q_offset(b, a.rows.head(u, r0 + r)) + size_t(a.rows.query(r0 + r)) * D + c]);
      Qs[e] = x * scale;
    }
    __syncthreads();
  }

  if constexpr (Mma) {
    attend_mma<T, D, Paged, Stages>(a, b, u, hk, r0, nrows, keys, pb, smem);
  } else if constexpr (Unified) {
    attend<T, D, R, Paged, true, Stages>(a, b, hk, r0, nrows, keys, pb, smem);
    // The fallback test (README §5): any row whose largest score left [phi - 60, phi + 60] -> redo with the max.
    bool trip = false;
    if (threadIdx.x < nrows) {
      float M = -INFINITY;
      for (int w = 0; w < kWarps; ++w) M = fmaxf(M, reinterpret_cast<const float*>(smem)[(w * R + threadIdx.x) * (D + 3) + D + 2]);
      trip = unified_max_trips(M, a.phi);
    }
    if (__syncthreads_or(trip)) {
      if (threadIdx.x == 0) atomicAdd(a.fallbacks, 1);
      attend<T, D, R, Paged, false, Stages>(a, b, hk, r0, nrows, keys, pb, smem);
    }
  } else {
    attend<T, D, R, Paged, false, Stages>(a, b, hk, r0, nrows, keys, pb, smem);
  }

  float* fin = reinterpret_cast<float*>(smem + L::kKV + L::kQ + L::kP);  // [R] M, [R] L, [kWarps][R] weights
  finish<T, D, R, Fused, kMaxSplits>(a, smem, fin, b, u, r0, nrows, s, a.splits,
                                     Fused ? a.done + size_t(blockIdx.z) * gridDim.y + blockIdx.y : nullptr);
}

// split_kv_even (README §4.5): split_kv_mma's work, dealt by plan.hpp's even decomposition instead of the (split,
// row chunk, unit) grid. Grid: C blocks (one per SM unless --splits says otherwise), 128 threads, split_kv_mma's
// shared memory. Block k walks its share of the chunks piece by piece; each piece is split_kv_mma's block body for
// one tile and a key range: the copies of its first chunks, attend_mma, and lines 11-13 with the piece as partial
// `part` of the tile's `parts` (one piece: O and LSE written directly; else the last piece to arrive merges).
// Fewer chunks than blocks (T < C): blocks T .. C - 1 have nothing to do, so that no share is empty.
template <class T, int D>
__global__ void __launch_bounds__(kThreads, 1) even_kernel(Args<T> a, int row_chunks) {
  constexpr int R = kMaxRows, Stages = 2;
  using L = Smem<D, R, Stages, true>;
  extern __shared__ float4 smem4[];
  char* smem = reinterpret_cast<char*>(smem4);
  float* fin = reinterpret_cast<float*>(smem + L::kKV + L::kQ + L::kP);
  EvenWalk walk = even_walk(a.kv_lens, a.p.batch, a.p.kv_heads * row_chunks, gridDim.x);
  const int k = blockIdx.x;
  if (k >= walk.C) return;
  const long long x1 = even_begin(k + 1, walk.T, walk.C);
  for (long long x = even_begin(k, walk.T, walk.C); x < x1;) {
    const Piece pc = walk.piece(k, x, x1);
    x = pc.next;
    const int u = pc.tile / row_chunks, r0 = (pc.tile % row_chunks) * R, nrows = min(R, a.rows.per_unit() - r0);
    const int hk = a.p.kv_head_of(a.rows.head(u, r0));
    const fa::Problem pb = seen_by(a.p, a.kv_lens[pc.b]);
    __syncthreads();  // the previous piece's lines 11-12 are done with the scratch the copies below overwrite
    copy_first_chunks<T, D, R, false, Stages, true>(a, pc.b, hk, pc.keys, smem);
    attend_mma<T, D, false, Stages>(a, pc.b, u, hk, r0, nrows, pc.keys, pb, smem);
    finish<T, D, R, true, kMaxEvenBlocks>(a, smem, fin, pc.b, u, r0, nrows, pc.part, pc.parts,
                                          a.done + size_t(pc.b) * walk.tiles_per_entry + pc.tile);
  }
}

// 16 bytes from global memory, read-only: read_kernel's loads, with the L2 behaviour of cp_async16's.
__device__ __forceinline__ uint4 load16(const uint4* p, KvPolicy pol) {
  uint4 r;
  if (pol.evict_first)
    asm volatile("ld.global.nc.L2::cache_hint.L2::256B.v4.u32 {%0, %1, %2, %3}, [%4], %5;\n"
                 : "=r"(r.x), "=r"(r.y), "=r"(r.z), "=r"(r.w)
                 : "l"(p), "l"(pol.first));
  else
    asm volatile("ld.global.nc.L2::256B.v4.u32 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(r.x), "=r"(r.y), "=r"(r.z), "=r"(r.w)
                 : "l"(p));
  return r;
}

// The ceiling: read the visible K and V rows of every (b, kv head) as 16-byte loads, grid (blocks, B x Hkv),
// kReadUnroll loads of each matrix in flight per thread, under the L2 policy the split kernels use for the same
// step. The XOR of everything read is written only if it equals a sentinel, so the loads cannot be optimised away.
constexpr int kReadUnroll = 4;
constexpr int kReadBlocksPerSm = 8;  // enough resident threads x loads in flight to cover HBM latency
constexpr unsigned kSentinel = 0x9e3779b9u;
__global__ void __launch_bounds__(kThreads) read_kernel(fa::Problem p, const uint4* __restrict__ k,
                                                        const uint4* __restrict__ v, const int* __restrict__ lens,
                                                        bool evict_first, unsigned* sink) {
  constexpr int kElem = 2;  // fp16 and bf16
  const int b = blockIdx.y / p.kv_heads, hk = blockIdx.y % p.kv_heads;
  const size_t per_row = size_t(p.head_dim) * kElem / 16;  // 16-byte vectors per row
  const size_t base = p.kv_offset(b, hk) * kElem / 16, n = size_t(lens[b]) * per_row;
  const size_t stride = size_t(gridDim.x) * kThreads;
  const KvPolicy pol = kv_policy(evict_first);
  unsigned x = 0;
  for (size_t e0 = size_t(blockIdx.x) * kThreads + threadIdx.x; e0 < n; e0 += stride * kReadUnroll) {
    uint4 a[kReadUnroll], c[kReadUnroll];
#pragma unroll
    for (int t = 0; t < kReadUnroll; ++t) {
      const size_t e = e0 + t * stride;
      a[t] = e < n ? load16(k + base + e, pol) : make_uint4(0, 0, 0, 0);
      c[t] = e < n ? load16(v + base + e, pol) : make_uint4(0, 0, 0, 0);
    }
#pragma unroll
    for (int t = 0; t < kReadUnroll; ++t) x ^= a[t].x ^ a[t].y ^ a[t].z ^ a[t].w ^ c[t].x ^ c[t].y ^ c[t].z ^ c[t].w;
  }
  if (x == kSentinel) *sink = x;
}

// The chapter's random inputs (plan.hpp's input_value) written straight into device memory, rounded to T.
template <class T>
__global__ void fill_kernel(T* x, size_t n, uint64_t seed, Tensor which) {
  for (size_t e = size_t(blockIdx.x) * blockDim.x + threadIdx.x; e < n; e += size_t(gridDim.x) * blockDim.x)
    x[e] = T(input_value(seed, which, e));
}
constexpr int kFillBlocks = 4096;

// ---- dispatch over the compiled configurations ------------------------------------------------------------
template <class T>
struct Tag {
  using type = T;
};
template <int N>
using Int = std::integral_constant<int, N>;

template <class F>
void with_dtype_dim(fa::Dtype t, int d, F&& f) {
  auto dim = [&](auto tag) {
    if (d == 64) f(tag, Int<64>{});
    else f(tag, Int<128>{});
  };
  if (t == fa::Dtype::fp16) dim(Tag<__half>{});
  else dim(Tag<__nv_bfloat16>{});
}
template <class F>
void with_config(const KernelInfo& kernel, fa::Dtype t, int d, int bucket, F&& f) {
  with_dtype_dim(t, d, [&](auto tag, auto dim) {
    using No = std::false_type;
    using Yes = std::true_type;
    if (kernel.mma) {  // tensor cores: one 16-row tile whatever the rows (plan.hpp's row_bucket), two stages, fused
      f(tag, dim, Int<kMaxRows>{}, No{}, No{}, Int<2>{}, Yes{}, Yes{});
      return;
    }
    auto rows = [&](auto r) {  // the combinations the registry has (flags: paged, unified, stages, fused merge, mma)
      if (kernel.paged) f(tag, dim, r, Yes{}, No{}, Int<1>{}, No{}, No{});
      else if (kernel.unified) f(tag, dim, r, No{}, Yes{}, Int<1>{}, No{}, No{});
      else if (kernel.fused_merge) f(tag, dim, r, No{}, No{}, Int<2>{}, Yes{}, No{});
      else if (kernel.stages == 2) f(tag, dim, r, No{}, No{}, Int<2>{}, No{}, No{});
      else f(tag, dim, r, No{}, No{}, Int<1>{}, No{}, No{});
    };
    if (bucket == 1) rows(Int<1>{});
    else if (bucket == 4) rows(Int<4>{});
    else rows(Int<kMaxRows>{});
  });
}

// The kernel function of a configuration, with its shared-memory limit raised once.
template <class T, int D, int R, bool Paged, bool Unified, int Stages, bool Fused, bool Mma>
auto split_kernel_ready() {
  auto fn = split_kernel<T, D, R, Paged, Unified, Stages, Fused, Mma>;
  static const bool raised = [&] {
    CUDA_CHECK(cudaFuncSetAttribute(fn, cudaFuncAttributeMaxDynamicSharedMemorySize, Smem<D, R, Stages, Mma>::kBytes));
    return true;
  }();
  (void)raised;
  return fn;
}

template <class T, int D>
auto even_kernel_ready() {
  auto fn = even_kernel<T, D>;
  static const bool raised = [&] {
    CUDA_CHECK(cudaFuncSetAttribute(fn, cudaFuncAttributeMaxDynamicSharedMemorySize, Smem<D, kMaxRows, 2, true>::kBytes));
    return true;
  }();
  (void)raised;
  return fn;
}

// The fused merge's counters, one per (row chunk, batch entry x unit) of the grid: zeroed once when allocated and
// left at zero by every launch (the last block of a row chunk resets its own), so no memset runs per decode step.
// One stream at a time: two fused launches in flight on different streams would share them.
int* merge_counters(size_t n) {
  static fa::DeviceBuffer<int> counters;
  if (counters.size() < n) {
    counters = fa::DeviceBuffer<int>(n);
    counters.zero();
  }
  return counters.get();
}

int log2_of(int x) {  // x a power of two (check_page_size)
  int l = 0;
  while ((1 << l) < x) ++l;
  return l;
}

}  // namespace

const std::vector<KernelInfo>& kernels() {
  static const std::vector<KernelInfo> list = {
      {Kernel::fa2_grid, "fa2_grid", false, false, false, false, 1, false, false, false,
       "FA2's grid at decode time: one block per (query head, batch), walking all N keys"},
      {Kernel::split_kv, "split_kv", false, true, false, false, 1, false, false, false,
       "Flash-Decoding: the keys split across blocks, partials merged by LSE; one query head per block"},
      {Kernel::split_kv_gqa, "split_kv_gqa", true, true, false, false, 1, false, false, false,
       "split_kv with the query heads of a kv group packed into one block: K/V read once per group"},
      {Kernel::split_kv_pipelined, "split_kv_pipelined", true, true, false, false, 2, false, false, false,
       "split_kv_gqa with two K/V buffers per warp: the next chunk is copied while this one is computed"},
      {Kernel::split_kv_fused, "split_kv_fused", true, true, false, false, 2, true, false, false,
       "split_kv_pipelined whose last block per row chunk merges the splits: no second kernel launch"},
      {Kernel::split_kv_mma, "split_kv_mma", true, true, false, false, 2, true, true, false,
       "split_kv_fused with S = Q K^T and P V on tensor cores (mma.sync), the rows padded to a 16-row tile"},
      {Kernel::split_kv_even, "split_kv_even", true, true, false, false, 2, true, true, true,
       "split_kv_mma with the keys of all kv groups dealt evenly to one block per SM, a block crossing groups"},
      {Kernel::unified_max, "unified_max", true, true, true, false, 1, false, false, false,
       "split_kv_gqa with FlashDecoding++'s fixed phi instead of the running max, falling back when unsafe"},
      {Kernel::paged, "paged", true, true, false, true, 1, false, false, false,
       "split_kv_gqa reading K/V through a block table into a page pool"},
  };
  return list;
}

const KernelInfo& kernel_named(const std::string& name) {
  std::string names;
  for (const KernelInfo& k : kernels()) {
    if (name == k.name) return k;
    names += std::string(names.empty() ? "" : ", ") + k.name;
  }
  throw fa::UsageError("unknown kernel '" + name + "' (kernels: " + names + ", all)");
}

void check_supported(const fa::Problem& p) {
  if (p.head_dim != 64 && p.head_dim != 128)
    throw fa::UsageError("head_dim " + std::to_string(p.head_dim) + " is not supported here (supported: 64, 128)");
  if (p.q_len > kMaxQLen)
    throw fa::UsageError("q_len " + std::to_string(p.q_len) + " is not a decode step (supported: 1 .. " +
                         std::to_string(kMaxQLen) + ")");
  if (p.dropout_p != 0.f) throw fa::UsageError("decoding has no dropout (got --dropout " + std::to_string(p.dropout_p) + ")");
  if ((long long)p.batch * p.heads > 65535) throw fa::UsageError("batch x heads must be <= 65535 (the grid's z limit)");
}

void check_page_size(int page_size) {
  if (page_size < 16 || page_size > 256 || (page_size & (page_size - 1)))
    throw fa::UsageError("page size " + std::to_string(page_size) + " is not supported (supported: 16, 32, 64, 128, 256)");
}

Launch plan(const KernelInfo& kernel, const fa::Problem& p, fa::Dtype t, int max_len, int splits_override) {
  Launch l;
  const int rows = rows_of(p, kernel.packed).per_unit();
  l.row_bucket = row_bucket(rows, kernel.mma), l.row_chunks = row_chunks(rows);
  l.blocks_unsplit = (long long)p.batch * units_of(p, kernel.packed) * l.row_chunks;
  l.sms = fa::device_props().multiProcessorCount;
  with_config(kernel, t, p.head_dim, l.row_bucket,
              [&](auto tag, auto dim, auto r, auto paged, auto unified, auto stages, auto fused, auto mma) {
    using T = typename decltype(tag)::type;
    constexpr int D = decltype(dim)::value, R = decltype(r)::value, St = decltype(stages)::value;
    constexpr bool M = decltype(mma)::value;
    using L = Smem<D, R, St, M>;
    const int limit = int(fa::device_props().sharedMemPerBlockOptin);
    if (L::kBytes > limit)
      throw std::runtime_error(std::string(kernel.name) + " needs " + std::to_string(L::kBytes) +
                               " bytes of shared memory per block at head_dim " + std::to_string(D) +
                               "; this GPU allows " + std::to_string(limit) + " (sm_80 and sm_90 allow enough)");
    constexpr bool P = decltype(paged)::value, U = decltype(unified)::value, F = decltype(fused)::value;
    auto fn = split_kernel_ready<T, D, R, P, U, St, F, M>();
    CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&l.blocks_per_sm, fn, kThreads, L::kBytes));
  });
  l.max_splits = kernel.splits ? fdec_model::max_splits(max_len) : 1;
  // The slots are the SMs, not SMs x resident blocks (README §4): a second block on an SM shares that SM's bandwidth.
  // split_kv_even: splits counts its blocks, one per SM (README §4.5), or --splits of them; sweeps go to 2 per SM.
  if (kernel.even) l.max_splits = std::min(2 * l.sms, kMaxEvenBlocks);
  if (!kernel.splits) l.splits = 1;
  else if (splits_override > 0) l.splits = splits_override;
  else if (kernel.even) l.splits = std::min(l.sms, kMaxEvenBlocks);
  else l.splits = fdec_model::choose_splits(l.blocks_unsplit, max_len, l.sms);
  l.evict_first = kv_evict_first_here(p, max_len);
  return l;
}

size_t workspace_floats(const fa::Problem& p, int splits) {
  return splits > 1 ? size_t(splits) * p.lse_elems() * (p.head_dim + 1) : 0;
}

void forward(const KernelInfo& kernel, const fa::Problem& p, fa::Dtype t, const void* q, const Cache& cache, void* o,
             float* lse, const Launch& launch, float phi, float* workspace, int* fallbacks) {
  const int most = kernel.even ? kMaxEvenBlocks : kMaxSplits;
  if (launch.splits < 1 || launch.splits > most) throw fa::UsageError("splits must be in 1 .. " + std::to_string(most));
  if (launch.splits > 1 && !workspace) throw std::invalid_argument("forward: splits > 1 needs workspace_floats() floats");
  if (kernel.paged) check_page_size(cache.page_size);
  const Rows rows = rows_of(p, kernel.packed);
  const dim3 grid(launch.splits, launch.row_chunks, p.batch * units_of(p, kernel.packed));
  float* ws_o = workspace;
  float* ws_lse = workspace ? workspace + size_t(launch.splits) * p.lse_elems() * p.head_dim : nullptr;
  const bool fused_merge = kernel.fused_merge && launch.splits > 1;
  with_config(kernel, t, p.head_dim, launch.row_bucket,
              [&](auto tag, auto dim, auto r, auto paged, auto unified, auto stages, auto fused, auto mma) {
    using T = typename decltype(tag)::type;
    constexpr int D = decltype(dim)::value, R = decltype(r)::value, St = decltype(stages)::value;
    constexpr bool M = decltype(mma)::value;
    Args<T> a{p,
              rows,
              launch.splits,
              phi,
              static_cast<const T*>(q),
              static_cast<const T*>(cache.k),
              static_cast<const T*>(cache.v),
              cache.kv_lens,
              cache.block_table,
              cache.pages_per_seq,
              kernel.paged ? log2_of(cache.page_size) : 0,
              static_cast<T*>(o),
              lse,
              ws_o,
              ws_lse,
              fallbacks,
              p.lse_elems(),
              fused_merge ? merge_counters(size_t(grid.y) * grid.z) : nullptr,
              launch.evict_first};
    constexpr bool P = decltype(paged)::value, U = decltype(unified)::value, F = decltype(fused)::value;
    if (kernel.even) {
      a.done = merge_counters(size_t(p.batch) * p.kv_heads * launch.row_chunks);
      even_kernel_ready<T, D>()<<<launch.splits, kThreads, Smem<D, kMaxRows, 2, true>::kBytes>>>(a, launch.row_chunks);
      CHECK_LAUNCH();
      return;
    }
    auto fn = split_kernel_ready<T, D, R, P, U, St, F, M>();
    fn<<<grid, kThreads, Smem<D, R, St, M>::kBytes>>>(a);
    CHECK_LAUNCH();
    if (launch.splits > 1 && !fused_merge) {
      const int n = int(p.lse_elems());
      merge_kernel<T, D><<<(n + kMergeRows - 1) / kMergeRows, kThreads>>>(n, launch.splits, ws_o, ws_lse,
                                                                         static_cast<T*>(o), lse);
      CHECK_LAUNCH();
    }
  });
}

void fill_random(fa::Dtype t, size_t n, uint64_t seed, Tensor which, void* x) {
  if (n == 0) return;
  const int blocks = int(std::min<size_t>(kFillBlocks, (n + kThreads - 1) / kThreads));
  if (t == fa::Dtype::fp16) fill_kernel<<<blocks, kThreads>>>(static_cast<__half*>(x), n, seed, which);
  else fill_kernel<<<blocks, kThreads>>>(static_cast<__nv_bfloat16*>(x), n, seed, which);
  CHECK_LAUNCH();
}

bool kv_evict_first_here(const fa::Problem& p, int max_len) {
  return kv_evict_first(kv_step_bytes(p, max_len), double(fa::device_props().l2CacheSize));
}

void read_kv(const fa::Problem& p, const Cache& cache, int max_len, int sms, bool evict_first, unsigned* sink) {
  static_assert(sizeof(__half) == 2 && sizeof(__nv_bfloat16) == 2, "both dtypes are 2 bytes");
  static_assert((64 * 2) % 16 == 0, "a K/V row of the supported head_dims is a whole number of 16-byte vectors");
  const int slices = p.batch * p.kv_heads;
  const long long vectors = (long long)max_len * p.head_dim * 2 / 16;  // of the longest slice
  const long long useful = std::max(1LL, (vectors + kThreads - 1) / kThreads);
  const int per_slice = int(std::min<long long>(useful, std::max(1, kReadBlocksPerSm * sms / slices)));
  read_kernel<<<dim3(per_slice, slices), kThreads>>>(p, static_cast<const uint4*>(cache.k),
                                                     static_cast<const uint4*>(cache.v), cache.kv_lens,
                                                     evict_first, sink);
  CHECK_LAUNCH();
}

}  // namespace fdec
