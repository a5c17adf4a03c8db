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
