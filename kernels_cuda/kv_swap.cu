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

// ---- Split swap-in / scatter (2026-11-29 pm) ------------------------------------------------------
// PARTS CTAs share one chunk (each copies chunk_bytes / PARTS), so a small swap fills the SMs. LD
// picks the source load: 0 = ld.global (mapped host memory; the plain kernels above), 1 = ld.global
// with an L2 256-byte prefetch hint, 2 = ld.global.nc.L1::no_allocate (device staging buffers).
template <int LD>
__device__ __forceinline__ uint4 ld_src(const uint4* p) {
  uint4 r;
  if (LD == 0) {
    r = *p;
  } else if (LD == 1) {
    asm volatile("ld.global.L2::256B.v4.u32 {%0,%1,%2,%3}, [%4];"
                 : "=r"(r.x), "=r"(r.y), "=r"(r.z), "=r"(r.w) : "l"(p));
  } else {
    r = ld_stream(p);
  }
  return r;
}

template <int UNROLL, int PARTS, int LD>
__device__ __forceinline__ void swap_in_split_impl(const u64* layer_ptrs, const i64* device_ids,
                                                   const i64* host_ids, i64 num_pairs,
                                                   int num_layers, i64 num_device_blocks,
                                                   i64 chunk_bytes, unsigned char* host_pool) {
  const i64 num_items = num_pairs * num_layers * 2 * PARTS;
  const int part_vec = (int)(chunk_bytes / 16 / PARTS);
  for (i64 it = blockIdx.x; it < num_items; it += gridDim.x) {
    const i64 c = it / PARTS;
    const int part = (int)(it % PARTS);
    ChunkAddr a = chunk_addr(c, layer_ptrs, device_ids, host_ids, num_layers, num_device_blocks,
                             chunk_bytes, host_pool);
    const uint4* src = (const uint4*)a.host_chunk + (i64)part * part_vec;
    uint4* dst = (uint4*)a.device_chunk + (i64)part * part_vec;
    const int step = blockDim.x * UNROLL;
    for (int base = threadIdx.x; base < part_vec; base += step) {
      uint4 r[UNROLL];
#pragma unroll
      for (int u = 0; u < UNROLL; ++u) {
        const int i = base + u * blockDim.x;
        if (i < part_vec) r[u] = ld_src<LD>(src + i);
      }
#pragma unroll
      for (int u = 0; u < UNROLL; ++u) {
        const int i = base + u * blockDim.x;
        if (i < part_vec) dst[i] = r[u];
      }
    }
  }
}

#define KV_SWAP_IN_SPLIT(NAME, UNROLL, PARTS, LD)                                          \
  extern "C" __global__ void NAME(KV_SWAP_ARGS) {                                          \
    swap_in_split_impl<UNROLL, PARTS, LD>(KV_SWAP_CALL);                                   \
  }

// Zero-copy swap-in from mapped host memory (chunk_bytes must be a multiple of 16 * PARTS).
KV_SWAP_IN_SPLIT(swap_in_p4_u2, 2, 4, 0)
KV_SWAP_IN_SPLIT(swap_in_p1_u8_pf, 8, 1, 1)
KV_SWAP_IN_SPLIT(swap_in_p4_u2_pf, 2, 4, 1)
// Scatter from a device staging buffer (the second half of "bulk copy, then scatter").
KV_SWAP_IN_SPLIT(scatter_p4_u2, 2, 4, 2)
KV_SWAP_IN_SPLIT(scatter_p8_u1, 1, 8, 2)

// Flag-driven scatter: launched before the bulk copies finish; each CTA waits until the copy of
// its piece (piece_blocks pairs) has landed in the staging buffer, which the copy stream signals
// by copying this call's epoch (a fresh 32-bit value per call) into flags[piece] after the
// piece's copies, so no event wait or kernel launch sits between the last copy and its scatter,
// and old flags never need resetting. The producer is the copy engine, never another CTA, so
// CTAs that wait for a slot cannot deadlock the wait.
__device__ __forceinline__ unsigned int ld_acquire_u32(const unsigned int* p) {
  unsigned int v;
  asm volatile("ld.acquire.gpu.global.u32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
  return v;
}

template <int UNROLL, int PARTS>
__device__ __forceinline__ void scatter_flagged_impl(const u64* layer_ptrs, const i64* device_ids,
                                                     const i64* staging_ids, i64 num_pairs,
                                                     int num_layers, i64 num_device_blocks,
                                                     i64 chunk_bytes, unsigned char* staging,
                                                     const unsigned int* flags,
                                                     int piece_blocks, unsigned int epoch) {
  const i64 num_items = num_pairs * num_layers * 2 * PARTS;
  const int part_vec = (int)(chunk_bytes / 16 / PARTS);
  for (i64 it = blockIdx.x; it < num_items; it += gridDim.x) {
    const i64 c = it / PARTS;
    const int part = (int)(it % PARTS);
    const i64 piece = c / (2 * num_layers) / piece_blocks;
    if (threadIdx.x == 0) {
      // Bounded (seconds at most): a flag that never comes gives wrong data, which the checks
      // catch, instead of a hung GPU.
      for (int spin = 0; spin < (1 << 25); ++spin) {
        if (ld_acquire_u32(flags + piece) == epoch) break;
        __nanosleep(100);
      }
    }
    __syncthreads();
    ChunkAddr a = chunk_addr(c, layer_ptrs, device_ids, staging_ids, num_layers,
                             num_device_blocks, chunk_bytes, staging);
    const uint4* src = (const uint4*)a.host_chunk + (i64)part * part_vec;
    uint4* dst = (uint4*)a.device_chunk + (i64)part * part_vec;
    const int step = blockDim.x * UNROLL;
    for (int base = threadIdx.x; base < part_vec; base += step) {
      uint4 r[UNROLL];
#pragma unroll
      for (int u = 0; u < UNROLL; ++u) {
        const int i = base + u * blockDim.x;
        if (i < part_vec) r[u] = ld_src<0>(src + i);
      }
#pragma unroll
      for (int u = 0; u < UNROLL; ++u) {
        const int i = base + u * blockDim.x;
        if (i < part_vec) dst[i] = r[u];
      }
    }
    __syncthreads();
  }
}

extern "C" __global__ void scatter_flag_p4_u2(KV_SWAP_ARGS, const unsigned int* flags,
                                              int piece_blocks, unsigned int epoch) {
  scatter_flagged_impl<2, 4>(KV_SWAP_CALL, flags, piece_blocks, epoch);
}
