// Swap of paged KV blocks between the device cache and a pinned host pool, all layers and K/V in
// one launch. Layout (vLLM): layer l is [2, num_device_blocks, block_size, num_kv_heads, head_dim],
// so one (layer, K|V, block) chunk is contiguous; the host pool is
// [num_host_blocks, num_layers, 2, chunk]. The host side is mapped pinned memory accessed directly
// by the SMs (zero-copy), 16 bytes per thread access; the copy is dtype-agnostic (bf16/fp16/fp8).
#include "kv_common.cuh"

struct ChunkAddr {
  const unsigned char* device_chunk;
  unsigned char* host_chunk;
};

__device__ __forceinline__ ChunkAddr chunk_addr(i64 c, const u64* layer_ptrs, const i64* device_ids,
                                                const i64* host_ids, int num_layers,
                                                i64 num_device_blocks, i64 chunk_bytes,
                                                unsigned char* host_pool) {
  const i64 pair = c / (2 * num_layers);
  const int rem = (int)(c % (2 * num_layers));
  const int layer = rem >> 1;
  const int kv = rem & 1;
  ChunkAddr a;
  a.device_chunk = (const unsigned char*)layer_ptrs[layer] +
                   (kv * num_device_blocks + device_ids[pair]) * chunk_bytes;
  a.host_chunk = host_pool + ((host_ids[pair] * num_layers + layer) * 2 + kv) * chunk_bytes;
  return a;
}

// Each CTA copies whole chunks (grid-stride over chunks); each thread keeps UNROLL 16-byte loads in
// flight before it stores, so a chunk of 32 KiB needs one pass of 256 threads x 8.
template <int UNROLL, bool SRC_DEVICE>
__device__ __forceinline__ void copy_chunk(const uint4* __restrict__ src, uint4* __restrict__ dst,
                                           int num_vec) {
  const int step = blockDim.x * UNROLL;
  for (int base = threadIdx.x; base < num_vec; base += step) {
    uint4 r[UNROLL];
#pragma unroll
    for (int u = 0; u < UNROLL; ++u) {
      const int i = base + u * blockDim.x;
      if (i < num_vec) r[u] = SRC_DEVICE ? ld_stream(src + i) : src[i];
    }
#pragma unroll
    for (int u = 0; u < UNROLL; ++u) {
      const int i = base + u * blockDim.x;
      if (i < num_vec) dst[i] = r[u];
    }
  }
}

// OUT = true: device blocks -> host pool (swap-out); false: host pool -> device blocks (swap-in).
template <int UNROLL, bool OUT>
__device__ __forceinline__ void swap_impl(const u64* layer_ptrs, const i64* device_ids,
                                          const i64* host_ids, i64 num_pairs, int num_layers,
                                          i64 num_device_blocks, i64 chunk_bytes,
                                          unsigned char* host_pool) {
  const i64 num_chunks = num_pairs * num_layers * 2;
  const int num_vec = (int)(chunk_bytes / 16);
  for (i64 c = blockIdx.x; c < num_chunks; c += gridDim.x) {
    ChunkAddr a = chunk_addr(c, layer_ptrs, device_ids, host_ids, num_layers, num_device_blocks,
                             chunk_bytes, host_pool);
    if (OUT) {
      copy_chunk<UNROLL, true>((const uint4*)a.device_chunk, (uint4*)a.host_chunk, num_vec);
    } else {
      copy_chunk<UNROLL, false>((const uint4*)a.host_chunk, (uint4*)a.device_chunk, num_vec);
    }
  }
}

#define KV_SWAP_ARGS                                                                         \
  const u64 *layer_ptrs, const i64 *device_ids, const i64 *host_ids, i64 num_pairs,          \
      int num_layers, i64 num_device_blocks, i64 chunk_bytes, unsigned char *host_pool
#define KV_SWAP_CALL \
  layer_ptrs, device_ids, host_ids, num_pairs, num_layers, num_device_blocks, chunk_bytes, host_pool

#define KV_SWAP_KERNEL(NAME, UNROLL, OUT) \
  extern "C" __global__ void NAME(KV_SWAP_ARGS) { swap_impl<UNROLL, OUT>(KV_SWAP_CALL); }

KV_SWAP_KERNEL(swap_out_u2, 2, true)
KV_SWAP_KERNEL(swap_out_u4, 4, true)
KV_SWAP_KERNEL(swap_out_u8, 8, true)
KV_SWAP_KERNEL(swap_in_u2, 2, false)
KV_SWAP_KERNEL(swap_in_u4, 4, false)
KV_SWAP_KERNEL(swap_in_u8, 8, false)

// Device-side gather into a contiguous staging buffer laid out like the host pool (the first
// half of the "gather on device, then one bulk copy" path) and its inverse scatter.
KV_SWAP_KERNEL(gather_u8, 8, true)
KV_SWAP_KERNEL(scatter_u8, 8, false)
