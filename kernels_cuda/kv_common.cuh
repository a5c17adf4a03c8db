// Shared helpers for the KV offload kernels: 16-byte memory access and the number formats
// (bf16/fp16 in, INT8 / FP8 e4m3 out) written with PTX so that NVRTC needs no CUDA headers.
#pragma once

#define KV_INT8 0
#define KV_FP8 1
#define KV_BF16 0
#define KV_FP16 1

typedef unsigned long long u64;
typedef long long i64;

// Read-only 16-byte load from device memory that skips L1 allocation: the KV blocks are read once.
__device__ __forceinline__ uint4 ld_stream(const uint4* p) {
  uint4 r;
  asm volatile("ld.global.nc.L1::no_allocate.v4.u32 {%0,%1,%2,%3}, [%4];"
               : "=r"(r.x), "=r"(r.y), "=r"(r.z), "=r"(r.w) : "l"(p));
  return r;
}

__device__ __forceinline__ float bf16_to_float(unsigned int bits16) {
  return __uint_as_float(bits16 << 16);
}

__device__ __forceinline__ float fp16_to_float(unsigned int bits16) {
  float f;
  unsigned short h = (unsigned short)bits16;
  asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(h));
  return f;
}

// Round to nearest even, as the NumPy reference does; NaN inputs are not supported.
__device__ __forceinline__ unsigned int float_to_bf16(float f) {
  unsigned int u = __float_as_uint(f);
  return (u + 0x7fffu + ((u >> 16) & 1u)) >> 16;
}

__device__ __forceinline__ unsigned int float_to_fp16(float f) {
  unsigned short h;
  asm("cvt.rn.f16.f32 %0, %1;" : "=h"(h) : "f"(f));
  return h;
}

template <int DT>
__device__ __forceinline__ float half_to_float(unsigned int bits16) {
  return DT == KV_BF16 ? bf16_to_float(bits16) : fp16_to_float(bits16);
}

template <int DT>
__device__ __forceinline__ unsigned int float_to_half(float f) {
  return DT == KV_BF16 ? float_to_bf16(f) : float_to_fp16(f);
}

// The 8 values of one 16-byte vector of 16-bit floats.
template <int DT>
__device__ __forceinline__ void unpack8(const uint4& v, float* out) {
  const unsigned int w[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    out[2 * i] = half_to_float<DT>(w[i] & 0xffffu);
    out[2 * i + 1] = half_to_float<DT>(w[i] >> 16);
  }
}

template <int DT>
__device__ __forceinline__ uint4 pack8(const float* in) {
  unsigned int w[4];
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    w[i] = float_to_half<DT>(in[2 * i]) | (float_to_half<DT>(in[2 * i + 1]) << 16);
  }
  return make_uint4(w[0], w[1], w[2], w[3]);
}

template <int FMT>
__device__ __forceinline__ float qmax() {
  return FMT == KV_INT8 ? 127.0f : 448.0f;
}

// Two codes in the low 16 bits: a in the low byte, b in the high byte.
template <int FMT>
__device__ __forceinline__ unsigned int encode2(float a, float b) {
  if (FMT == KV_INT8) {
    int qa = min(127, max(-127, __float2int_rn(a)));
    int qb = min(127, max(-127, __float2int_rn(b)));
    return (unsigned int)(qa & 0xff) | ((unsigned int)(qb & 0xff) << 8);
  } else {
    unsigned short r;
    a = fminf(448.0f, fmaxf(-448.0f, a));
    b = fminf(448.0f, fmaxf(-448.0f, b));
    asm("cvt.rn.satfinite.e4m3x2.f32 %0, %1, %2;" : "=h"(r) : "f"(b), "f"(a));
    return r;
  }
}

template <int FMT>
__device__ __forceinline__ void decode2(unsigned int codes16, float* out) {
  if (FMT == KV_INT8) {
    out[0] = (float)(signed char)(codes16 & 0xffu);
    out[1] = (float)(signed char)((codes16 >> 8) & 0xffu);
  } else {
    unsigned int h2;
    unsigned short c = (unsigned short)codes16;
    asm("cvt.rn.f16x2.e4m3x2 %0, %1;" : "=r"(h2) : "h"(c));
    out[0] = fp16_to_float(h2 & 0xffffu);
    out[1] = fp16_to_float(h2 >> 16);
  }
}

// 8 scaled values -> 8 codes in a uint2 (little-endian order, as the values).
template <int FMT>
__device__ __forceinline__ uint2 encode8(const float* x, float inv_scale) {
  unsigned int p[4];
#pragma unroll
  for (int i = 0; i < 4; ++i) p[i] = encode2<FMT>(x[2 * i] * inv_scale, x[2 * i + 1] * inv_scale);
  return make_uint2(p[0] | (p[1] << 16), p[2] | (p[3] << 16));
}

template <int FMT>
__device__ __forceinline__ void decode8(const uint2& c, float* out) {
  decode2<FMT>(c.x & 0xffffu, out);
  decode2<FMT>(c.x >> 16, out + 2);
  decode2<FMT>(c.y & 0xffffu, out + 4);
  decode2<FMT>(c.y >> 16, out + 6);
}

__device__ __forceinline__ float warp_max(float v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}

// One row held by one warp: row_vec 16-byte vectors (8 values each), lane l takes vectors l, l+32,
// ...; load_row issues all loads before any use, encode_row quantizes and stores, returns the scale.
template <int MAX_V>
__device__ __forceinline__ void load_row(const uint4* src, uint4* r, int row_vec, int lane) {
#pragma unroll
  for (int v = 0; v < MAX_V; ++v) {
    int i = lane + 32 * v;
    if (i < row_vec) r[v] = ld_stream(src + i);
  }
}

template <int FMT, int DT, int MAX_V>
__device__ __forceinline__ float encode_row(const uint4* r, uint2* dst, int row_vec, int lane) {
  float amax = 0.0f;
  float x[8];
#pragma unroll
  for (int v = 0; v < MAX_V; ++v) {
    if (lane + 32 * v < row_vec) {
      unpack8<DT>(r[v], x);
#pragma unroll
      for (int k = 0; k < 8; ++k) amax = fmaxf(amax, fabsf(x[k]));
    }
  }
  amax = warp_max(amax);
  const float inv_scale = amax > 0.0f ? qmax<FMT>() / amax : 0.0f;
#pragma unroll
  for (int v = 0; v < MAX_V; ++v) {
    int i = lane + 32 * v;
    if (i < row_vec) {
      unpack8<DT>(r[v], x);
      dst[i] = encode8<FMT>(x, inv_scale);
    }
  }
  return amax / qmax<FMT>();
}

template <int FMT, int DT, int MAX_V>
__device__ __forceinline__ float quant_row(const uint4* src, uint2* dst, int row_vec, int lane) {
  uint4 r[MAX_V];
  load_row<MAX_V>(src, r, row_vec, lane);
  return encode_row<FMT, DT, MAX_V>(r, dst, row_vec, lane);
}

// ---- Cheaper per-token encode (v2, 2026-11-29 pm): same codes bit for bit as encode8 --------------
// Load flavours: 0 = ld.global.nc.L1::no_allocate (ld_stream), 1 = the same with an L2 256-byte
// prefetch hint.
template <int LD>
__device__ __forceinline__ uint4 ld_stream_h(const uint4* p) {
  uint4 r;
  if (LD == 0) {
    asm volatile("ld.global.nc.L1::no_allocate.v4.u32 {%0,%1,%2,%3}, [%4];"
                 : "=r"(r.x), "=r"(r.y), "=r"(r.z), "=r"(r.w) : "l"(p));
  } else {
    asm volatile("ld.global.nc.L1::no_allocate.L2::256B.v4.u32 {%0,%1,%2,%3}, [%4];"
                 : "=r"(r.x), "=r"(r.y), "=r"(r.z), "=r"(r.w) : "l"(p));
  }
  return r;
}

// Store flavours: 0 = plain st.global, 1 = st.global.cs (streaming: evict first).
template <int ST>
__device__ __forceinline__ void st_codes(uint2* p, uint2 v) {
  if (ST == 0) {
    *p = v;
  } else {
    asm volatile("st.global.cs.v2.u32 [%0], {%1,%2};" ::"l"(p), "r"(v.x), "r"(v.y) : "memory");
  }
}

// Absmax of 8 16-bit floats as packed 16-bit integers: |x| bits (sign cleared) order like the
// values for finite inputs, so an unsigned 16x2 max gives the bits of max|x| per half-word.
__device__ __forceinline__ unsigned int umax16x2(unsigned int a, unsigned int b) {
  unsigned int d;
  asm("max.u16x2 %0, %1, %2;" : "=r"(d) : "r"(a), "r"(b));
  return d;
}

__device__ __forceinline__ unsigned int abs_bits8(const uint4& v, unsigned int m) {
  const unsigned int k = 0x7fff7fffu;
  return umax16x2(umax16x2(m, umax16x2(v.x & k, v.y & k)), umax16x2(v.z & k, v.w & k));
}

// INT8 without F2I: for |a| < 2^22, a + 1.5*2^23 rounds a to the nearest integer (ties to even,
// as rintf) and leaves it in the low mantissa bits, two's complement, so the low byte is the INT8
// code. |x * (127/absmax)| <= 127 * (1 + 2^-23)^2 rounds to at most 127, so no clamp is needed.
// FP8: cvt...satfinite saturates to +-448 itself, which equals clamping first.
template <int FMT>
__device__ __forceinline__ uint2 encode8_fast(const float* x, float inv_scale) {
  if (FMT == KV_INT8) {
    // Explicit _rn product and sum: a fused multiply-add would skip the rounding of x * inv.
    unsigned int b[8];
#pragma unroll
    for (int i = 0; i < 8; ++i) {
      const float y = __fmul_rn(x[i], inv_scale);
      b[i] = __float_as_uint(__fadd_rn(y, 12582912.0f));
    }
    const unsigned int w0 = __byte_perm(__byte_perm(b[0], b[1], 0x0040),
                                        __byte_perm(b[2], b[3], 0x0040), 0x5410);
    const unsigned int w1 = __byte_perm(__byte_perm(b[4], b[5], 0x0040),
                                        __byte_perm(b[6], b[7], 0x0040), 0x5410);
    return make_uint2(w0, w1);
  } else {
    unsigned int p[4];
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      unsigned short r;
      const float a = __fmul_rn(x[2 * i], inv_scale), b = __fmul_rn(x[2 * i + 1], inv_scale);
      asm("cvt.rn.satfinite.e4m3x2.f32 %0, %1, %2;" : "=h"(r) : "f"(b), "f"(a));
      p[i] = r;
    }
    return make_uint2(p[0] | (p[1] << 16), p[2] | (p[3] << 16));
  }
}
