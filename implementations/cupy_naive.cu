// cupy_naive.cu -- "standard attention", the deliberately naive baseline.
//
// O = softmax(scale * Q K^T [+ causal mask]) V, computed the textbook way:
//
//   1. S = scale * Q K^T is written out IN FULL to a float32 buffer in global memory,
//      shape [batch, heads_q, seqlen_q, seqlen_k], contiguous: 4 * B * Hq * Nq * Nk bytes
//      (B=1, Hq=32, N=16384 is already 32 GiB). Causally masked entries hold -inf.
//   2. Each row of that buffer is turned, in place, into probabilities
//      P = exp(S - rowmax) / rowsum.
//   3. O = P V, reading P back from global memory.
//
// One thread block handles one query row (i, head, batch). It reads all of K and V for its
// head, so K and V are re-read from memory once per query row with no reuse across rows, and
// the score row makes a round trip through global memory between every phase. That quadratic
// memory traffic and footprint is the point: this kernel is the baseline that a flash
// (tiled, online-softmax, no N x N buffer) kernel is compared with. Correctness matters here,
// speed does not.
//
// Conventions (pytest-attnkit's contract):
//   * q is [B, Hq, Nq, D], k and v are [B, Hkv, Nk, D], each addressed through ELEMENT
//     strides (b, h, n, d), so non-contiguous views ([B, N, H, D] transposed) need no copy.
//   * GQA/MQA: query head h reads kv head h / (Hq / Hkv).
//   * Causal masking is bottom-right aligned: query i sees key j iff j <= i + Nk - Nq.
//     A row that sees no key at all (Nq > Nk) produces zeros, never NaN.
//   * Arithmetic is float32 throughout; 16-bit inputs are converted on load and the output
//     is rounded to nearest-even on store. out is contiguous [B, Hq, Nq, D].
//
// Launch: grid = (Nq, Hq, B), block = a multiple of 32 threads (at most 1024; the Python side
// uses 128), dynamic shared memory = (32 + round_up(D, 4)) * sizeof(float) bytes: 32 floats of
// reduction scratch (one per warp) followed by q_i as float, zero-padded to a multiple of 4
// floats. The padding is needed: the compiler turns the tail of the dot-product loop into
// 16-byte shared loads (LDS.128) that read up to 3 floats past D and ignore them, which
// compute-sanitizer reports as an out-of-bounds __shared__ read (seen with D = 130) unless the
// allocation covers the whole aligned 16-byte chunk. Offsets into tensors and into the score
// buffer are 64-bit.
//
// No #include on purpose: this file compiles as-is under NVRTC (cupy.RawModule) and nvcc,
// with no header search. 16-bit types travel as unsigned short and are converted with inline
// PTX (fp16) or bit operations (bf16).

// ---------------------------------------------------------------------------------------------
// Element types: storage type plus conversions to and from float.
// ---------------------------------------------------------------------------------------------

#define ATTN_NEG_INF (__int_as_float(0xff800000))

struct F16Traits {
    typedef unsigned short storage;
    static __device__ __forceinline__ float load(unsigned short x) {
        float f;
        asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(x));
        return f;
    }
    static __device__ __forceinline__ unsigned short store(float f) {
        unsigned short h;
        asm("cvt.rn.f16.f32 %0, %1;" : "=h"(h) : "f"(f));
        return h;
    }
};

struct BF16Traits {
    typedef unsigned short storage;
    static __device__ __forceinline__ float load(unsigned short x) {
        return __uint_as_float(((unsigned int)x) << 16);
    }
    // Round to nearest, ties to even, by bit manipulation (works on every architecture, unlike
    // cvt.rn.bf16.f32 which needs sm_80). NaN stays a (quiet) NaN with its sign; overflow past
    // the largest bf16 rounds to infinity, as IEEE rounding requires.
    static __device__ __forceinline__ unsigned short store(float f) {
        unsigned int u = __float_as_uint(f);
        if ((u & 0x7fffffffu) > 0x7f800000u) {
            return (unsigned short)((u >> 16) | 0x0040u);
        }
        u += 0x7fffu + ((u >> 16) & 1u);
        return (unsigned short)(u >> 16);
    }
};

struct F32Traits {
    typedef float storage;
    static __device__ __forceinline__ float load(float x) { return x; }
    static __device__ __forceinline__ float store(float f) { return f; }
};

// ---------------------------------------------------------------------------------------------
// Block-wide reductions. Every thread of the block must call them (blockDim.x a multiple of
// 32); every thread gets the same result. `red` is shared scratch of at least 32 floats.
// ---------------------------------------------------------------------------------------------

__device__ __forceinline__ float attn_block_max(float x, float* red) {
    for (int offset = 16; offset > 0; offset >>= 1) {
        x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, offset));
    }
    const int lane = threadIdx.x & 31;
    const int warp = threadIdx.x >> 5;
    const int num_warps = (blockDim.x + 31) >> 5;
    if (lane == 0) {
        red[warp] = x;
    }
    __syncthreads();
    float r = red[0];
    for (int w = 1; w < num_warps; ++w) {
        r = fmaxf(r, red[w]);
    }
    __syncthreads();  // red may be reused by the next reduction
    return r;
}

__device__ __forceinline__ float attn_block_sum(float x, float* red) {
    for (int offset = 16; offset > 0; offset >>= 1) {
        x += __shfl_xor_sync(0xffffffffu, x, offset);
    }
    const int lane = threadIdx.x & 31;
    const int warp = threadIdx.x >> 5;
    const int num_warps = (blockDim.x + 31) >> 5;
    if (lane == 0) {
        red[warp] = x;
    }
    __syncthreads();
    float r = red[0];
    for (int w = 1; w < num_warps; ++w) {
        r += red[w];
    }
    __syncthreads();  // red may be reused by the next reduction
    return r;
}

extern __shared__ float attn_smem[];

// ---------------------------------------------------------------------------------------------
// The kernel body, written once for every element type.
// ---------------------------------------------------------------------------------------------

template <typename Traits>
__device__ __forceinline__ void naive_attention_body(
    const typename Traits::storage* __restrict__ q,
    const typename Traits::storage* __restrict__ k,
    const typename Traits::storage* __restrict__ v,
    float* scores,  // [B, Hq, Nq, Nk] float32, contiguous; written and re-read: no __restrict__
    typename Traits::storage* __restrict__ out, // [B, Hq, Nq, D], contiguous
    long long heads_q, long long heads_kv,
    long long seqlen_q, long long seqlen_k, long long head_dim,
    long long q_sb, long long q_sh, long long q_sn, long long q_sd,
    long long k_sb, long long k_sh, long long k_sn, long long k_sd,
    long long v_sb, long long v_sh, long long v_sn, long long v_sd,
    float scale, long long causal) {
    const long long i = (long long)blockIdx.x;   // query row
    const long long h = (long long)blockIdx.y;   // query head
    const long long b = (long long)blockIdx.z;   // batch
    const long long kvh = h / (heads_q / heads_kv);
    const int tid = (int)threadIdx.x;
    const int nthreads = (int)blockDim.x;

    float* red = attn_smem;          // 32 floats of reduction scratch
    float* q_row = attn_smem + 32;   // head_dim floats, zero-padded to a multiple of 4
    const long long head_dim_padded = (head_dim + 3) & ~3LL;

    const long long q_base = b * q_sb + h * q_sh + i * q_sn;
    const long long k_base = b * k_sb + kvh * k_sh;
    const long long v_base = b * v_sb + kvh * v_sh;
    float* score_row = scores + ((b * heads_q + h) * seqlen_q + i) * seqlen_k;
    typename Traits::storage* out_row = out + ((b * heads_q + h) * seqlen_q + i) * head_dim;

    // Keys j <= last_visible are visible (bottom-right aligned causal mask); may be negative.
    const long long last_visible = causal ? (i + seqlen_k - seqlen_q) : (seqlen_k - 1);

    // ---- Phase 1: s_j = scale * <q_i, k_j>, written to the global score buffer -------------
    for (long long d = tid; d < head_dim_padded; d += nthreads) {
        q_row[d] = (d < head_dim) ? Traits::load(q[q_base + d * q_sd]) : 0.0f;
    }
    __syncthreads();

    for (long long j = tid; j < seqlen_k; j += nthreads) {
        float s;
        if (j <= last_visible) {
            const long long k_row = k_base + j * k_sn;
            float acc = 0.0f;
            for (long long d = 0; d < head_dim; ++d) {
                acc += q_row[d] * Traits::load(k[k_row + d * k_sd]);
            }
            s = scale * acc;
        } else {
            s = ATTN_NEG_INF;
        }
        score_row[j] = s;
    }

    // ---- Phase 2: softmax of the row, in place in the global buffer -------------------------
    // Each thread touches only the entries it wrote itself (same j stride) until phase 3, but
    // the reductions below synchronize the block anyway.
    float local_max = ATTN_NEG_INF;
    for (long long j = tid; j < seqlen_k; j += nthreads) {
        local_max = fmaxf(local_max, score_row[j]);
    }
    const float row_max = attn_block_max(local_max, red);
    // A fully masked row has row_max = -inf; subtracting 0 instead makes every exp() exactly 0
    // (exp(-inf) = 0), so the sum is 0 and the row becomes all-zero probabilities, not NaN.
    const bool empty_row = (row_max == ATTN_NEG_INF);  // the same in every thread of the block
    const float shift = empty_row ? 0.0f : row_max;

    float local_sum = 0.0f;
    for (long long j = tid; j < seqlen_k; j += nthreads) {
        const float e = expf(score_row[j] - shift);
        score_row[j] = e;
        local_sum += e;
    }
    const float row_sum = attn_block_sum(local_sum, red);

    if (!empty_row) {
        for (long long j = tid; j < seqlen_k; j += nthreads) {
            score_row[j] = score_row[j] / row_sum;
        }
    }
    // (A fully masked row's entries are already exactly 0; row_sum is 0 there.)

    // Phase 3 reads probabilities written by other threads of this block.
    __threadfence_block();
    __syncthreads();

    // ---- Phase 3: o_i[d] = sum_j p_j * v_j[d] ------------------------------------------------
    // empty_row is uniform across the block. A fully masked row writes exact zeros without
    // touching v (0 * inf in v would otherwise be NaN).
    for (long long d = tid; d < head_dim; d += nthreads) {
        float acc = 0.0f;
        if (!empty_row) {
            const long long v_col = v_base + d * v_sd;
            for (long long j = 0; j < seqlen_k; ++j) {
                acc += score_row[j] * Traits::load(v[v_col + j * v_sn]);
            }
        }
        out_row[d] = Traits::store(acc);
    }
}

// ---------------------------------------------------------------------------------------------
// One entry point per dtype; C linkage so cupy.RawModule.get_function finds them by name.
// ---------------------------------------------------------------------------------------------

#define ATTN_DEFINE_KERNEL(NAME, TRAITS)                                                        \
    extern "C" __global__ void NAME(                                                           \
        const TRAITS::storage* __restrict__ q, const TRAITS::storage* __restrict__ k,          \
        const TRAITS::storage* __restrict__ v, float* scores,                                  \
        TRAITS::storage* __restrict__ out, long long heads_q, long long heads_kv,              \
        long long seqlen_q, long long seqlen_k, long long head_dim,                            \
        long long q_sb, long long q_sh, long long q_sn, long long q_sd,                        \
        long long k_sb, long long k_sh, long long k_sn, long long k_sd,                        \
        long long v_sb, long long v_sh, long long v_sn, long long v_sd,                        \
        float scale, long long causal) {                                                        \
        naive_attention_body<TRAITS>(q, k, v, scores, out, heads_q, heads_kv, seqlen_q,         \
                                     seqlen_k, head_dim, q_sb, q_sh, q_sn, q_sd, k_sb, k_sh,   \
                                     k_sn, k_sd, v_sb, v_sh, v_sn, v_sd, scale, causal);       \
    }

ATTN_DEFINE_KERNEL(naive_attention_f16, F16Traits)
ATTN_DEFINE_KERNEL(naive_attention_bf16, BF16Traits)
ATTN_DEFINE_KERNEL(naive_attention_f32, F32Traits)
