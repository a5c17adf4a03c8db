// Fused swap-out with quantization: gather scattered 16-bit KV blocks of all layers, quantize each
// token row (num_kv_heads * head_dim values) to INT8 or FP8 e4m3 with one f32 scale per token, and
// write codes and scales straight into mapped pinned host memory (zero-copy), so PCIe carries about
// half the bytes of a 16-bit swap. The reverse reloads host codes and writes dequantized blocks.
// Host pools: codes [num_host_blocks, num_layers, 2, block_size, row_len] bytes, scales
// [num_host_blocks, num_layers, 2, block_size] f32.
#include "kv_common.cuh"

#define KV_MAX_BLOCK_SIZE 256

struct ChunkRef {
  i64 device_row0;  // first row of the chunk in its layer's [2 * num_device_blocks * block_size]
  i64 host_chunk;   // chunk index in the host pool
  int layer;
};

__device__ __forceinline__ ChunkRef chunk_ref(i64 c, const i64* device_ids, const i64* host_ids,
                                              int num_layers, i64 num_device_blocks,
                                              int block_size) {
  const i64 pair = c / (2 * num_layers);
  const int rem = (int)(c % (2 * num_layers));
  ChunkRef r;
  r.layer = rem >> 1;
  r.device_row0 = ((rem & 1) * num_device_blocks + device_ids[pair]) * block_size;
  r.host_chunk = (host_ids[pair] * num_layers + r.layer) * 2 + (rem & 1);
  return r;
}

// One CTA per chunk (grid-stride); each warp quantizes token rows; the chunk's scales are gathered
// in shared memory and written to the host as one contiguous run.
template <int FMT, int DT, int MAX_V>
__device__ __forceinline__ void swap_out_quant_impl(const u64* layer_ptrs, const i64* device_ids,
                                                    const i64* host_ids, i64 num_pairs,
                                                    int num_layers, i64 num_device_blocks,
                                                    int block_size, int row_vec,
                                                    unsigned char* host_codes,
                                                    float* host_scales) {
  __shared__ float s_scale[KV_MAX_BLOCK_SIZE];
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, num_warps = blockDim.x >> 5;
  const i64 num_chunks = num_pairs * num_layers * 2;
  for (i64 c = blockIdx.x; c < num_chunks; c += gridDim.x) {
    const ChunkRef r = chunk_ref(c, device_ids, host_ids, num_layers, num_device_blocks, block_size);
    const uint4* src = (const uint4*)layer_ptrs[r.layer] + r.device_row0 * row_vec;
    uint2* dst = (uint2*)host_codes + r.host_chunk * block_size * row_vec;
    for (int tok = warp; tok < block_size; tok += num_warps) {
      const float s = quant_row<FMT, DT, MAX_V>(src + (i64)tok * row_vec,
                                                dst + (i64)tok * row_vec, row_vec, lane);
      if (lane == 0) s_scale[tok] = s;
    }
    __syncthreads();
    for (int t = threadIdx.x; t < block_size; t += blockDim.x) {
      host_scales[r.host_chunk * block_size + t] = s_scale[t];
    }
    __syncthreads();
  }
}

// Reload: host codes and scales of a chunk -> dequantized 16-bit rows in the device block.
template <int FMT, int DT>
__device__ __forceinline__ void swap_in_dequant_impl(const u64* layer_ptrs, const i64* device_ids,
                                                     const i64* host_ids, i64 num_pairs,
                                                     int num_layers, i64 num_device_blocks,
                                                     int block_size, int row_vec,
                                                     const unsigned char* host_codes,
                                                     const float* host_scales) {
  __shared__ float s_scale[KV_MAX_BLOCK_SIZE];
  const i64 num_chunks = num_pairs * num_layers * 2;
  const int num_vec = block_size * row_vec;
  for (i64 c = blockIdx.x; c < num_chunks; c += gridDim.x) {
    const ChunkRef r = chunk_ref(c, device_ids, host_ids, num_layers, num_device_blocks, block_size);
    for (int t = threadIdx.x; t < block_size; t += blockDim.x) {
      s_scale[t] = host_scales[r.host_chunk * block_size + t];
    }
    __syncthreads();
    const uint2* src = (const uint2*)host_codes + r.host_chunk * num_vec;
    uint4* dst = (uint4*)layer_ptrs[r.layer] + r.device_row0 * row_vec;
    constexpr int UNROLL = 4;
    for (int base = threadIdx.x; base < num_vec; base += blockDim.x * UNROLL) {
      uint2 q[UNROLL];
#pragma unroll
      for (int u = 0; u < UNROLL; ++u) {
        const int i = base + u * blockDim.x;
        if (i < num_vec) q[u] = src[i];
      }
#pragma unroll
      for (int u = 0; u < UNROLL; ++u) {
        const int i = base + u * blockDim.x;
        if (i < num_vec) {
          float f[8];
          decode8<FMT>(q[u], f);
          const float s = s_scale[i / row_vec];
#pragma unroll
          for (int k = 0; k < 8; ++k) f[k] *= s;
          dst[i] = pack8<DT>(f);
        }
      }
    }
    __syncthreads();
  }
}

#define KV_FUSED_ARGS                                                                          \
  const u64 *layer_ptrs, const i64 *device_ids, const i64 *host_ids, i64 num_pairs,            \
      int num_layers, i64 num_device_blocks, int block_size, int row_vec
#define KV_FUSED_CALL \
  layer_ptrs, device_ids, host_ids, num_pairs, num_layers, num_device_blocks, block_size, row_vec

#define SWAP_OUT_QUANT(NAME, FMT, DT, MAX_V)                                                   \
  extern "C" __global__ void NAME(KV_FUSED_ARGS, unsigned char* host_codes, float* host_scales) { \
    swap_out_quant_impl<FMT, DT, MAX_V>(KV_FUSED_CALL, host_codes, host_scales);               \
  }
#define SWAP_IN_DEQUANT(NAME, FMT, DT)                                                         \
  extern "C" __global__ void NAME(KV_FUSED_ARGS, const unsigned char* host_codes,              \
                                  const float* host_scales) {                                  \
    swap_in_dequant_impl<FMT, DT>(KV_FUSED_CALL, host_codes, host_scales);                     \
  }

SWAP_OUT_QUANT(swap_out_quant_int8_bf16_v4, KV_INT8, KV_BF16, 4)
SWAP_OUT_QUANT(swap_out_quant_fp8_bf16_v4, KV_FP8, KV_BF16, 4)
SWAP_OUT_QUANT(swap_out_quant_int8_fp16_v4, KV_INT8, KV_FP16, 4)
SWAP_OUT_QUANT(swap_out_quant_fp8_fp16_v4, KV_FP8, KV_FP16, 4)
SWAP_OUT_QUANT(swap_out_quant_int8_bf16_v16, KV_INT8, KV_BF16, 16)
SWAP_OUT_QUANT(swap_out_quant_fp8_bf16_v16, KV_FP8, KV_BF16, 16)
SWAP_OUT_QUANT(swap_out_quant_int8_fp16_v16, KV_INT8, KV_FP16, 16)
SWAP_OUT_QUANT(swap_out_quant_fp8_fp16_v16, KV_FP8, KV_FP16, 16)
SWAP_IN_DEQUANT(swap_in_dequant_int8_bf16, KV_INT8, KV_BF16)
SWAP_IN_DEQUANT(swap_in_dequant_fp8_bf16, KV_FP8, KV_BF16)
SWAP_IN_DEQUANT(swap_in_dequant_int8_fp16, KV_INT8, KV_FP16)
SWAP_IN_DEQUANT(swap_in_dequant_fp8_fp16, KV_FP8, KV_FP16)
