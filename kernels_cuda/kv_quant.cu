// Symmetric KV quantization of rows of 16-bit floats ([num_rows, row_len], bf16 or fp16) to INT8
// (scale = absmax / 127, codes rounded to nearest even in [-127, 127]) or FP8 e4m3 (scale =
// absmax / 448, round to nearest, saturating), with one f32 scale per row (per token) or per
// column (per channel), and the matching dequantization back to the 16-bit format.
#include "kv_common.cuh"

// Per token: one warp per R rows at a time (all R rows' loads in flight first), grid-stride.
template <int FMT, int DT, int MAX_V, int R>
__device__ __forceinline__ void quant_tok_impl(const uint4* x, uint2* q, float* scales,
                                               i64 num_rows, int row_vec) {
  const int lane = threadIdx.x & 31;
  const i64 warps_per_grid = (i64)gridDim.x * (blockDim.x >> 5);
  for (i64 row0 = ((i64)blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5)) * R; row0 < num_rows;
       row0 += warps_per_grid * R) {
    uint4 r[R][MAX_V];
#pragma unroll
    for (int k = 0; k < R; ++k) {
      if (row0 + k < num_rows) load_row<MAX_V>(x + (row0 + k) * row_vec, r[k], row_vec, lane);
    }
#pragma unroll
    for (int k = 0; k < R; ++k) {
      if (row0 + k < num_rows) {
        const float s = encode_row<FMT, DT, MAX_V>(r[k], q + (row0 + k) * row_vec, row_vec, lane);
        if (lane == 0) scales[row0 + k] = s;
      }
    }
  }
}

#define QUANT_TOK_R(NAME, FMT, DT, MAX_V, R)                                                 \
  extern "C" __global__ void NAME(const uint4* x, uint2* q, float* scales, i64 num_rows,     \
                                  int row_vec) {                                             \
    quant_tok_impl<FMT, DT, MAX_V, R>(x, q, scales, num_rows, row_vec);                      \
  }
#define QUANT_TOK(NAME, FMT, DT, MAX_V) QUANT_TOK_R(NAME, FMT, DT, MAX_V, 1)

QUANT_TOK_R(quant_tok_int8_bf16_v4_r2, KV_INT8, KV_BF16, 4, 2)
QUANT_TOK_R(quant_tok_fp8_bf16_v4_r2, KV_FP8, KV_BF16, 4, 2)
QUANT_TOK_R(quant_tok_int8_fp16_v4_r2, KV_INT8, KV_FP16, 4, 2)
QUANT_TOK_R(quant_tok_fp8_fp16_v4_r2, KV_FP8, KV_FP16, 4, 2)

QUANT_TOK(quant_tok_int8_bf16_v4, KV_INT8, KV_BF16, 4)
QUANT_TOK(quant_tok_fp8_bf16_v4, KV_FP8, KV_BF16, 4)
QUANT_TOK(quant_tok_int8_fp16_v4, KV_INT8, KV_FP16, 4)
QUANT_TOK(quant_tok_fp8_fp16_v4, KV_FP8, KV_FP16, 4)
QUANT_TOK(quant_tok_int8_bf16_v16, KV_INT8, KV_BF16, 16)
QUANT_TOK(quant_tok_fp8_bf16_v16, KV_FP8, KV_BF16, 16)
QUANT_TOK(quant_tok_int8_fp16_v16, KV_INT8, KV_FP16, 16)
QUANT_TOK(quant_tok_fp8_fp16_v16, KV_FP8, KV_FP16, 16)

// Per token, v2: one warp per R rows (all loads issued first); the row absmax is taken on the packed
// 16-bit |x| bits while the data sits in registers, and encode8_fast avoids F2I and clamps. Codes
// and scales are bit-identical to the kernels above. LD / ST pick cache hints (kv_common.cuh).
template <int MAX_V, int R, int LD>
__device__ __forceinline__ void load_rows_v2(const uint4* x, uint4 (&r)[R][MAX_V], i64 row0,
                                             i64 num_rows, int row_vec, int lane) {
#pragma unroll
  for (int k = 0; k < R; ++k) {
    if (row0 + k < num_rows) {
      const uint4* src = x + (row0 + k) * row_vec;
#pragma unroll
      for (int v = 0; v < MAX_V; ++v) {
        const int i = lane + 32 * v;
        if (i < row_vec) r[k][v] = ld_stream_h<LD>(src + i);
      }
    }
  }
}

template <int FMT, int DT, int MAX_V, int R, int ST>
__device__ __forceinline__ void encode_rows_v2(const uint4 (&r)[R][MAX_V], uint2* q,
                                               float* scales, i64 row0, i64 num_rows,
                                               int row_vec, int lane) {
  unsigned int m[R];
#pragma unroll
  for (int k = 0; k < R; ++k) {
    m[k] = 0u;
    if (row0 + k < num_rows) {
#pragma unroll
      for (int v = 0; v < MAX_V; ++v) {
        if (lane + 32 * v < row_vec) m[k] = abs_bits8(r[k][v], m[k]);
      }
    }
  }
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) {
#pragma unroll
    for (int k = 0; k < R; ++k) m[k] = umax16x2(m[k], __shfl_xor_sync(0xffffffffu, m[k], o));
  }
#pragma unroll
  for (int k = 0; k < R; ++k) {
    if (row0 + k < num_rows) {
      const float amax =
          fmaxf(half_to_float<DT>(m[k] & 0xffffu), half_to_float<DT>(m[k] >> 16));
      const float inv_scale = amax > 0.0f ? qmax<FMT>() / amax : 0.0f;
      uint2* dst = q + (row0 + k) * row_vec;
#pragma unroll
      for (int v = 0; v < MAX_V; ++v) {
        const int i = lane + 32 * v;
        if (i < row_vec) {
          float f[8];
          unpack8<DT>(r[k][v], f);
          st_codes<ST>(dst + i, encode8_fast<FMT>(f, inv_scale));
        }
      }
      if (lane == 0) scales[row0 + k] = amax / qmax<FMT>();
    }
  }
}

// PIPE = false: grid-stride, load then encode; PIPE = true: persistent grid, each warp issues the
// loads of its next R rows before it encodes the current ones (double buffer in registers).
template <int FMT, int DT, int MAX_V, int R, int LD, int ST, bool PIPE>
__device__ __forceinline__ void quant_tok_v2_impl(const uint4* x, uint2* q, float* scales,
                                                  i64 num_rows, int row_vec) {
  const int lane = threadIdx.x & 31;
  const i64 step = (i64)gridDim.x * (blockDim.x >> 5) * R;
  i64 row0 = ((i64)blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5)) * R;
  if (!PIPE) {
    for (; row0 < num_rows; row0 += step) {
      uint4 r[R][MAX_V];
      load_rows_v2<MAX_V, R, LD>(x, r, row0, num_rows, row_vec, lane);
      encode_rows_v2<FMT, DT, MAX_V, R, ST>(r, q, scales, row0, num_rows, row_vec, lane);
    }
  } else {
    uint4 cur[R][MAX_V];
    load_rows_v2<MAX_V, R, LD>(x, cur, row0, num_rows, row_vec, lane);
    for (; row0 < num_rows; row0 += step) {
      uint4 nxt[R][MAX_V];
      load_rows_v2<MAX_V, R, LD>(x, nxt, row0 + step, num_rows, row_vec, lane);
      encode_rows_v2<FMT, DT, MAX_V, R, ST>(cur, q, scales, row0, num_rows, row_vec, lane);
#pragma unroll
      for (int k = 0; k < R; ++k) {
#pragma unroll
        for (int v = 0; v < MAX_V; ++v) cur[k][v] = nxt[k][v];
      }
    }
  }
}

#define QUANT_TOK_V2(NAME, FMT, DT, R, LD, ST, PIPE)                                          \
  extern "C" __global__ void NAME(const uint4* x, uint2* q, float* scales, i64 num_rows,      \
                                  int row_vec) {                                              \
    quant_tok_v2_impl<FMT, DT, 4, R, LD, ST, PIPE>(x, q, scales, num_rows, row_vec);          \
  }
// Names: quant_tok2{p = pipelined}_{fmt}_{half}_v4_r{R}{_pf = L2 256 B prefetch}{_cs = .cs store}
#define QUANT_TOK_V2_SET(FMTN, FMT, DTN, DT)                                                  \
  QUANT_TOK_V2(quant_tok2_##FMTN##_##DTN##_v4_r1, FMT, DT, 1, 0, 0, false)                    \
  QUANT_TOK_V2(quant_tok2_##FMTN##_##DTN##_v4_r2, FMT, DT, 2, 0, 0, false)                    \
  QUANT_TOK_V2(quant_tok2_##FMTN##_##DTN##_v4_r4, FMT, DT, 4, 0, 0, false)                    \
  QUANT_TOK_V2(quant_tok2_##FMTN##_##DTN##_v4_r2_pf, FMT, DT, 2, 1, 0, false)                 \
  QUANT_TOK_V2(quant_tok2_##FMTN##_##DTN##_v4_r2_cs, FMT, DT, 2, 0, 1, false)                 \
  QUANT_TOK_V2(quant_tok2p_##FMTN##_##DTN##_v4_r1, FMT, DT, 1, 0, 0, true)                    \
  QUANT_TOK_V2(quant_tok2p_##FMTN##_##DTN##_v4_r2, FMT, DT, 2, 0, 0, true)                    \
  QUANT_TOK_V2(quant_tok2p_##FMTN##_##DTN##_v4_r1_cs, FMT, DT, 1, 0, 1, true)

QUANT_TOK_V2_SET(int8, KV_INT8, bf16, KV_BF16)
QUANT_TOK_V2_SET(fp8, KV_FP8, bf16, KV_BF16)
QUANT_TOK_V2_SET(int8, KV_INT8, fp16, KV_FP16)
QUANT_TOK_V2_SET(fp8, KV_FP8, fp16, KV_FP16)

// Per token, v3: as v2, but each lane owns 16 contiguous values (two adjacent 16-byte loads), so
// its 16 codes leave in one 16-byte store (v2 stores 8 bytes per lane). Rows must hold a multiple
// of 16 values (row_vec even). LD: 0 = ld.global.nc.L1::no_allocate, 2 = plain ld.global (L1
// allocating, so the second half of each 32-byte sector hits L1).
template <int LD>
__device__ __forceinline__ uint4 ld_v3(const uint4* p) {
  if (LD == 2) return *p;
  return ld_stream_h<0>(p);
}

template <int FMT, int DT, int MAX_P, int R, int LD>
__device__ __forceinline__ void quant_tok_v3_impl(const uint4* x, uint4* q, float* scales,
                                                  i64 num_rows, int row_vec) {
  const int lane = threadIdx.x & 31;
  const int row_pairs = row_vec >> 1;
  const i64 step = (i64)gridDim.x * (blockDim.x >> 5) * R;
  for (i64 row0 = ((i64)blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5)) * R; row0 < num_rows;
       row0 += step) {
    uint4 r[R][2 * MAX_P];
#pragma unroll
    for (int k = 0; k < R; ++k) {
      if (row0 + k < num_rows) {
        const uint4* src = x + (row0 + k) * row_vec;
#pragma unroll
        for (int j = 0; j < MAX_P; ++j) {
          const int pr = lane + 32 * j;
          if (pr < row_pairs) {
            r[k][2 * j] = ld_v3<LD>(src + 2 * pr);
            r[k][2 * j + 1] = ld_v3<LD>(src + 2 * pr + 1);
          }
        }
      }
    }
    unsigned int m[R];
#pragma unroll
    for (int k = 0; k < R; ++k) {
      m[k] = 0u;
      if (row0 + k < num_rows) {
#pragma unroll
        for (int j = 0; j < MAX_P; ++j) {
          if (lane + 32 * j < row_pairs) {
            m[k] = abs_bits8(r[k][2 * j], abs_bits8(r[k][2 * j + 1], m[k]));
          }
        }
      }
    }
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) {
#pragma unroll
      for (int k = 0; k < R; ++k) m[k] = umax16x2(m[k], __shfl_xor_sync(0xffffffffu, m[k], o));
    }
#pragma unroll
    for (int k = 0; k < R; ++k) {
      if (row0 + k < num_rows) {
        const float amax =
            fmaxf(half_to_float<DT>(m[k] & 0xffffu), half_to_float<DT>(m[k] >> 16));
        const float inv_scale = amax > 0.0f ? qmax<FMT>() / amax : 0.0f;
        uint4* dst = q + (row0 + k) * row_pairs;
#pragma unroll
        for (int j = 0; j < MAX_P; ++j) {
          const int pr = lane + 32 * j;
          if (pr < row_pairs) {
            float f[8];
            unpack8<DT>(r[k][2 * j], f);
            const uint2 c0 = encode8_fast<FMT>(f, inv_scale);
            unpack8<DT>(r[k][2 * j + 1], f);
            const uint2 c1 = encode8_fast<FMT>(f, inv_scale);
            dst[pr] = make_uint4(c0.x, c0.y, c1.x, c1.y);
          }
        }
        if (lane == 0) scales[row0 + k] = amax / qmax<FMT>();
      }
    }
  }
}

#define QUANT_TOK_V3(NAME, FMT, DT, R, LD)                                                    \
  extern "C" __global__ void NAME(const uint4* x, uint4* q, float* scales, i64 num_rows,      \
                                  int row_vec) {                                              \
    quant_tok_v3_impl<FMT, DT, 2, R, LD>(x, q, scales, num_rows, row_vec);                    \
  }
// Names: quant_tok3_{fmt}_{half}_v4_r{R}{_pl = plain L1-allocating loads}
#define QUANT_TOK_V3_SET(FMTN, FMT, DTN, DT)                                                  \
  QUANT_TOK_V3(quant_tok3_##FMTN##_##DTN##_v4_r1, FMT, DT, 1, 0)                              \
  QUANT_TOK_V3(quant_tok3_##FMTN##_##DTN##_v4_r2, FMT, DT, 2, 0)                              \
  QUANT_TOK_V3(quant_tok3_##FMTN##_##DTN##_v4_r4, FMT, DT, 4, 0)                              \
  QUANT_TOK_V3(quant_tok3_##FMTN##_##DTN##_v4_r1_pl, FMT, DT, 1, 2)                           \
  QUANT_TOK_V3(quant_tok3_##FMTN##_##DTN##_v4_r2_pl, FMT, DT, 2, 2)                           \
  QUANT_TOK_V3(quant_tok3_##FMTN##_##DTN##_v4_r4_pl, FMT, DT, 4, 2)

QUANT_TOK_V3_SET(int8, KV_INT8, bf16, KV_BF16)
QUANT_TOK_V3_SET(fp8, KV_FP8, bf16, KV_BF16)
QUANT_TOK_V3_SET(int8, KV_INT8, fp16, KV_FP16)
QUANT_TOK_V3_SET(fp8, KV_FP8, fp16, KV_FP16)

// Per channel, step 1: column absmax. col_absmax must hold zeros before the launch; non-negative
// floats order like their bit patterns, so an integer atomicMax is a float max.
template <int DT>
__device__ __forceinline__ void col_absmax_impl(const uint4* x, unsigned int* col_absmax,
                                                i64 num_rows, int row_vec) {
  const int v = blockIdx.x * blockDim.x + threadIdx.x;  // column vector index, 8 columns
  if (v >= row_vec) return;
  float m[8] = {0, 0, 0, 0, 0, 0, 0, 0};
  float f[8];
  for (i64 row = blockIdx.y; row < num_rows; row += gridDim.y) {
    unpack8<DT>(ld_stream(x + row * row_vec + v), f);
#pragma unroll
    for (int k = 0; k < 8; ++k) m[k] = fmaxf(m[k], fabsf(f[k]));
  }
#pragma unroll
  for (int k = 0; k < 8; ++k) atomicMax(col_absmax + 8 * v + k, __float_as_uint(m[k]));
}

// Per channel, step 2: elementwise quantization against the column absmax; writes the scales.
template <int FMT, int DT>
__device__ __forceinline__ void quant_chan_impl(const uint4* x, uint2* q,
                                                const float* col_absmax, float* scales,
                                                i64 num_rows, int row_vec) {
  const i64 n = num_rows * row_vec;
  for (i64 i = (i64)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (i64)gridDim.x * blockDim.x) {
    const int v = (int)(i % row_vec);
    float f[8];
    unsigned int p[4];
    unpack8<DT>(ld_stream(x + i), f);
#pragma unroll
    for (int k = 0; k < 8; k += 2) {
      const float a0 = col_absmax[8 * v + k], a1 = col_absmax[8 * v + k + 1];
      const float s0 = a0 > 0.0f ? qmax<FMT>() / a0 : 0.0f;
      const float s1 = a1 > 0.0f ? qmax<FMT>() / a1 : 0.0f;
      p[k / 2] = encode2<FMT>(f[k] * s0, f[k + 1] * s1);
    }
    q[i] = make_uint2(p[0] | (p[1] << 16), p[2] | (p[3] << 16));
    if (i < row_vec) {
#pragma unroll
      for (int k = 0; k < 8; ++k) scales[8 * v + k] = col_absmax[8 * v + k] / qmax<FMT>();
    }
  }
}

// Dequantization: PER_TOKEN scales index rows, otherwise columns.
template <int FMT, int DT, bool PER_TOKEN>
__device__ __forceinline__ void dequant_impl(const uint2* q, const float* scales, uint4* x,
                                             i64 num_rows, int row_vec) {
  const i64 n = num_rows * row_vec;
  for (i64 i = (i64)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (i64)gridDim.x * blockDim.x) {
    float f[8];
    decode8<FMT>(q[i], f);
    if (PER_TOKEN) {
      const float s = scales[i / row_vec];
#pragma unroll
      for (int k = 0; k < 8; ++k) f[k] *= s;
    } else {
      const int v = (int)(i % row_vec);
#pragma unroll
      for (int k = 0; k < 8; ++k) f[k] *= scales[8 * v + k];
    }
    x[i] = pack8<DT>(f);
  }
}

#define COL_ABSMAX(NAME, DT)                                                                  \
  extern "C" __global__ void NAME(const uint4* x, unsigned int* col_absmax, i64 num_rows,     \
                                  int row_vec) {                                              \
    col_absmax_impl<DT>(x, col_absmax, num_rows, row_vec);                                    \
  }
#define QUANT_CHAN(NAME, FMT, DT)                                                             \
  extern "C" __global__ void NAME(const uint4* x, uint2* q, const float* col_absmax,          \
                                  float* scales, i64 num_rows, int row_vec) {                 \
    quant_chan_impl<FMT, DT>(x, q, col_absmax, scales, num_rows, row_vec);                    \
  }
#define DEQUANT(NAME, FMT, DT, PER_TOKEN)                                                     \
  extern "C" __global__ void NAME(const uint2* q, const float* scales, uint4* x, i64 num_rows, \
                                  int row_vec) {                                              \
    dequant_impl<FMT, DT, PER_TOKEN>(q, scales, x, num_rows, row_vec);                        \
  }

COL_ABSMAX(col_absmax_bf16, KV_BF16)
COL_ABSMAX(col_absmax_fp16, KV_FP16)
QUANT_CHAN(quant_chan_int8_bf16, KV_INT8, KV_BF16)
QUANT_CHAN(quant_chan_fp8_bf16, KV_FP8, KV_BF16)
QUANT_CHAN(quant_chan_int8_fp16, KV_INT8, KV_FP16)
QUANT_CHAN(quant_chan_fp8_fp16, KV_FP8, KV_FP16)
DEQUANT(dequant_tok_int8_bf16, KV_INT8, KV_BF16, true)
DEQUANT(dequant_tok_fp8_bf16, KV_FP8, KV_BF16, true)
DEQUANT(dequant_tok_int8_fp16, KV_INT8, KV_FP16, true)
DEQUANT(dequant_tok_fp8_fp16, KV_FP8, KV_FP16, true)
DEQUANT(dequant_chan_int8_bf16, KV_INT8, KV_BF16, false)
DEQUANT(dequant_chan_fp8_bf16, KV_FP8, KV_BF16, false)
DEQUANT(dequant_chan_int8_fp16, KV_INT8, KV_FP16, false)
DEQUANT(dequant_chan_fp8_fp16, KV_FP8, KV_FP16, false)
