/* The "stream" memory update for d = 64 and bf16 k, v: a drop-in for
 * mma_update_kernel<64, DELTA, bf16, true> with the same chunks (its grid transposed), partials and
 * precision (bf16 operands, float32 accumulation, z in double), built to keep DRAM busy instead of
 * waiting on barriers. memory.cu includes it after compressive_memory_mma.cuh (bf16; memory_stream.cuh:
 * sigma, the lanes' features, M_h's staging). Device code and the size of its shared memory.
 *
 * Why it is shaped so (bench/lab/MEMORY_NOTES.md: the tiled kernels were latency-bound, three block
 * barriers and a copy round trip per 64-row tile, 2 blocks an SM):
 * - Tiles of 128 rows, one barrier each. The row phase needs no other warp: warp w reads rows
 *   16w..16w+15 of k and v straight into registers (thread (g, t) of the warp: rows g and g + 8,
 *   features 8t..8t+7 and 32+8t..32+8t+7, two 16-byte loads a row) and computes sigma, the
 *   denominators, the delta target and the z sums there. Its bf16 sigma(K) and T go to a
 *   double-buffered shared tile, so the one barrier a tile orders both the writes before the
 *   update's reads and (a tile later) those reads before the next writes of the buffer.
 * - The next tile's loads are issued before the barrier and the update's products (asm
 *   volatile keeps the compiler from sinking them to their use): a block always has a tile,
 *   32 KB, in flight, 8 MB over the grid, well over DRAM's bandwidth-latency product.
 * - Retrieval without a transpose: a dot product's order is free, so the thread's k features
 *   feed the A fragments as they were loaded (slot k = 16kk + 2t + e <-> word 2kk of its 16,
 *   slot 8 + 2t + e <-> word 2kk + 1, see stream_feature_of), M_h is staged once per block already
 *   permuted into B fragments, and its columns permuted so that the C fragments land on the
 *   very v columns the thread holds: T = v - R / den needs no exchange.
 * - Update P += sigma(K)^T T: ldmatrix .trans reads both operands transposed from the shared
 *   tiles (16-byte chunks XOR-swizzled per row, so neither the row-phase stores nor the 8-row
 *   ldmatrix reads conflict). Warp w owns features 16(w % 4).. and columns 32(w / 4).. of P
 *   (16 accumulators), so every warp consumes every row of the tile.
 * - z sums: each tile's two rows a thread holds are added in float and reduce-scattered over
 *   the warp's 8 row groups by shuffles (fixed tree), leaving 2 features a lane, accumulated
 *   in double across tiles; the warps' sums are added in warp order at the end. Same bits on
 *   every run: no atomics, every sum in a fixed order. */
#ifndef SEQFLOW_KERNELS_CUDA_MEMORY_STREAM_UPDATE_CUH
#define SEQFLOW_KERNELS_CUDA_MEMORY_STREAM_UPDATE_CUH

#define STREAM_UPDATE_ROWS 128   /* rows a tile */
#define STREAM_UPDATE_THREADS 256 /* 8 warps, 16 rows each in the row phase */
#define STREAM_UPDATE_TILE_BYTES (STREAM_UPDATE_ROWS * 64 * 2) /* one bf16 tile of sigma(K) or T */

/* Shared memory: sigma(K) tiles [2], T tiles [2], the warps' z sums (double [8][64]), z_h
 * (float [64]) and, delta, M_h as B fragments (uint2 [4 kk][8 n-tiles][32 lanes]). */
static size_t stream_update_shared_bytes(bool delta)
{
    return 4 * (size_t)STREAM_UPDATE_TILE_BYTES + 8 * 64 * sizeof(double) + 64 * sizeof(float) +
           (delta ? 4 * 8 * 32 * sizeof(uint2) : 0);
}

/* Byte offset of 16-byte chunk c of row r in a tile: chunk c ^ f(r) with f a permutation of
 * 0..7 over any 8 consecutive rows (ldmatrix reads 8 rows of one chunk: 8 distinct bank
 * groups) whose bit 2 differs between rows 2m and 2m + 1 (a row-phase store covers chunks
 * 0..3 or 4..7 of two such rows in one 8-lane phase: disjoint halves). */
__host__ __device__ static inline int stream_swizzle(int r, int c)
{
    return r * 128 + ((c ^ (((r & 1) << 2) | ((r >> 1) & 3))) << 4);
}

/* 16 bytes of a row, or zeros (rows past the block's end: nothing is read there) */
__device__ static inline uint4 stream_load16(const bf16 *p, bool in)
{
    uint4 r = make_uint4(0, 0, 0, 0);
    asm volatile("{\n .reg .pred p;\n setp.ne.b32 p, %5, 0;\n"
                 " @p ld.global.nc.L1::no_allocate.v4.u32 {%0,%1,%2,%3}, [%4];\n}\n"
                 : "+r"(r.x), "+r"(r.y), "+r"(r.z), "+r"(r.w)
                 : "l"(p), "r"((int)in));
    return r;
}

__device__ static inline void stream_ldsm_trans(unsigned (&r)[4], const unsigned char *p)
{
    const unsigned a = (unsigned)__cvta_generic_to_shared(p);
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(a)
                 : "memory");
}


/* The thread's rows (g, g + 8) of one tile: [row][run] */
struct stream_rows {
    uint4 k[2][2], v[2][2];
};

__device__ static inline void stream_load_k(stream_rows &x, const bf16 *k, size_t at0, size_t at1, bool in0, bool in1)
{
    x.k[0][0] = stream_load16(k + at0, in0), x.k[0][1] = stream_load16(k + at0 + 32, in0);
    x.k[1][0] = stream_load16(k + at1, in1), x.k[1][1] = stream_load16(k + at1 + 32, in1);
}
__device__ static inline void stream_load_v(stream_rows &x, const bf16 *v, size_t at0, size_t at1, bool in0, bool in1)
{
    x.v[0][0] = stream_load16(v + at0, in0), x.v[0][1] = stream_load16(v + at0 + 32, in0);
    x.v[1][0] = stream_load16(v + at1, in1), x.v[1][1] = stream_load16(v + at1 + 32, in1);
}

/* Adds the thread's 16 z slots over the warp's 8 row groups (lanes 4 apart): each step keeps
 * the half its bit of g selects and adds the partner's copy of it (own + partner, a fixed
 * order), so lane (g, t) ends with slots 8(g&1) + 4(g>>1&1) + 2(g>>2&1) + {0, 1}. */
__device__ static inline void stream_z_scatter(const float (&zs)[16], int g, float (&kept)[2])
{
    float a[8], b[4];
    const bool h0 = g & 1, h1 = g & 2, h2 = g & 4;
#pragma unroll
    for (int j = 0; j < 8; j++)
        a[j] = (h0 ? zs[8 + j] : zs[j]) + __shfl_xor_sync(0xffffffffu, h0 ? zs[j] : zs[8 + j], 4);
#pragma unroll
    for (int j = 0; j < 4; j++) b[j] = (h1 ? a[4 + j] : a[j]) + __shfl_xor_sync(0xffffffffu, h1 ? a[j] : a[4 + j], 8);
#pragma unroll
    for (int j = 0; j < 2; j++)
        kept[j] = (h2 ? b[2 + j] : b[j]) + __shfl_xor_sync(0xffffffffu, h2 ? b[j] : b[2 + j], 16);
}

template <bool DELTA>
__global__ static void __launch_bounds__(STREAM_UPDATE_THREADS, 2)
    stream_update64_kernel(int n, int rows_per_chunk, int heads, int ld, const bf16 *__restrict__ k,
                           const bf16 *__restrict__ v, const float *__restrict__ M, const float *__restrict__ z,
                           float *__restrict__ partM, double *__restrict__ partz)
{
    extern __shared__ float4 shared4[];
    unsigned char *sK = (unsigned char *)shared4, *sT = sK + 2 * STREAM_UPDATE_TILE_BYTES;
    double *zred = (double *)(sT + 2 * STREAM_UPDATE_TILE_BYTES);
    float *sz = (float *)(zred + 8 * 64);
    uint2 *sMB = (uint2 *)(sz + 64);
    /* heads fastest in the grid: the blocks of one chunk start together, so the heads' 128-byte
     * pieces of a row reach DRAM close in time (H100, 2026-11-22: delta 0.0334 -> 0.0326 ms) */
    const int chunk = blockIdx.y, h = blockIdx.x;
    const int begin = chunk * rows_per_chunk, end = min(n, begin + rows_per_chunk);
    const int lane = threadIdx.x % 32, w = threadIdx.x / 32, g = lane / 4, t = lane % 4;
    const bf16 *kh = k + (size_t)h * 64 + 8 * t, *vh = v + (size_t)h * 64 + 8 * t;

    stream_rows x;
    {
        const int r0 = begin + 16 * w + g, r1 = r0 + 8;
        stream_load_k(x, kh, (size_t)r0 * ld, (size_t)r1 * ld, r0 < end, r1 < end);
        stream_load_v(x, vh, (size_t)r0 * ld, (size_t)r1 * ld, r0 < end, r1 < end);
    }
    if (threadIdx.x < 64) sz[threadIdx.x] = z[(size_t)h * 64 + threadIdx.x];
    if (DELTA) stage_stream_b(M + (size_t)h * 64 * 64, sMB, true); /* columns on the v words a lane holds */
    __syncthreads();

    /* update operands: lane l gives ldmatrix the address of row l % 8 of matrix l / 8; the
     * swizzle depends on the row only through l % 8 (tiles are 8-row aligned) */
    const int mi = lane % 8, mj = lane / 8;
    const int a_off = stream_swizzle(8 * (mj >> 1) + mi, 2 * (w % 4) + (mj & 1));
    const int b_off0 = stream_swizzle(8 * (mj & 1) + mi, 4 * (w / 4) + (mj >> 1));
    const int b_off1 = stream_swizzle(8 * (mj & 1) + mi, 4 * (w / 4) + 2 + (mj >> 1));
    float acc[4][4];
#pragma unroll
    for (int nt = 0; nt < 4; nt++) acc[nt][0] = acc[nt][1] = acc[nt][2] = acc[nt][3] = 0;
    double zd[2] = {0, 0};

    for (int i0 = begin, buf = 0; i0 < end; i0 += STREAM_UPDATE_ROWS, buf ^= 1) {
        const int r0 = i0 + 16 * w + g;
        const bool in[2] = {r0 < end, r0 + 8 < end};
        const int nr0 = r0 + STREAM_UPDATE_ROWS, nr1 = nr0 + 8;
        const bool more = i0 + STREAM_UPDATE_ROWS < end;
        /* sigma(k) as float (denominators, z) and as bf16 words (the products) */
        unsigned sk[2][8];
        float zs[16], den[2] = {0, 0};
        const float4 *z4 = (const float4 *)(sz + 8 * t);
        const float4 zq[4] = {z4[0], z4[1], z4[8], z4[9]}; /* z_h of the thread's 16 features, word order */
#pragma unroll
        for (int rh = 0; rh < 2; rh++)
#pragma unroll
            for (int wi = 0; wi < 8; wi++) {
                const unsigned u = word_of(x.k[rh][wi >> 2], wi & 3);
                const float s0 = in[rh] ? sigma(bf16_lo(u)) : 0.0f, s1 = in[rh] ? sigma(bf16_hi(u)) : 0.0f;
                const float4 zz = zq[wi >> 1];
                den[rh] += s0 * (wi & 1 ? zz.z : zz.x) + s1 * (wi & 1 ? zz.w : zz.y);
                zs[2 * wi] = rh ? zs[2 * wi] + s0 : s0, zs[2 * wi + 1] = rh ? zs[2 * wi + 1] + s1 : s1;
                sk[rh][wi] = pack_bf16x2(s0, s1);
            }
        if (more) stream_load_k(x, kh, (size_t)nr0 * ld, (size_t)nr1 * ld, nr0 < end, nr1 < end);
        {
            float kept[2];
            stream_z_scatter(zs, g, kept);
            zd[0] += kept[0], zd[1] += kept[1];
        }
        unsigned char *tk = sK + buf * STREAM_UPDATE_TILE_BYTES, *tt = sT + buf * STREAM_UPDATE_TILE_BYTES;
#pragma unroll
        for (int rh = 0; rh < 2; rh++) {
            const int r = 16 * w + g + 8 * rh;
            *(uint4 *)(tk + stream_swizzle(r, t)) = make_uint4(sk[rh][0], sk[rh][1], sk[rh][2], sk[rh][3]);
            *(uint4 *)(tk + stream_swizzle(r, 4 + t)) = make_uint4(sk[rh][4], sk[rh][5], sk[rh][6], sk[rh][7]);
        }
        uint4 tv[2][2];
        if (DELTA) {
            /* the quad's partial dot products, added so that all four hold the same bits */
#pragma unroll
            for (int rh = 0; rh < 2; rh++) {
                den[rh] += __shfl_xor_sync(0xffffffffu, den[rh], 1);
                den[rh] += __shfl_xor_sync(0xffffffffu, den[rh], 2);
            }
            const float inv[2] = {den[0] != 0 ? 1.0f / den[0] : 0.0f, den[1] != 0 ? 1.0f / den[1] : 0.0f};
#pragma unroll
            for (int run = 0; run < 2; run++) { /* C n-tiles 4run.. are the v words of this run */
                float c[4][4];
                if (run == 0) stream_retrieve<0, 4>(sk, sMB, lane, c);
                else stream_retrieve<4, 4>(sk, sMB, lane, c);
#pragma unroll
                for (int rh = 0; rh < 2; rh++) {
                    unsigned o[4];
#pragma unroll
                    for (int j = 0; j < 4; j++) {
                        const unsigned u = word_of(x.v[rh][run], j);
                        o[j] = pack_bf16x2(bf16_lo(u) - c[j][2 * rh] * inv[rh], bf16_hi(u) - c[j][2 * rh + 1] * inv[rh]);
                    }
                    tv[rh][run] = make_uint4(o[0], o[1], o[2], o[3]);
                }
            }
        } else {
            tv[0][0] = x.v[0][0], tv[0][1] = x.v[0][1], tv[1][0] = x.v[1][0], tv[1][1] = x.v[1][1];
        }
#pragma unroll
        for (int rh = 0; rh < 2; rh++) {
            const int r = 16 * w + g + 8 * rh;
            *(uint4 *)(tt + stream_swizzle(r, t)) = tv[rh][0];
            *(uint4 *)(tt + stream_swizzle(r, 4 + t)) = tv[rh][1];
        }
        if (more) stream_load_v(x, vh, (size_t)nr0 * ld, (size_t)nr1 * ld, nr0 < end, nr1 < end);
        __syncthreads(); /* the tile's sigma(K) and T are written; buf ^ 1's readers are done */
        /* operands of step s + 1 are read before step s's products (the mma and ldmatrix asm are
         * volatile: the compiler keeps them in this order) */
        unsigned a[2][4], b[2][2][4];
        stream_ldsm_trans(a[0], tk + a_off);
        stream_ldsm_trans(b[0][0], tt + b_off0);
        stream_ldsm_trans(b[0][1], tt + b_off1);
#pragma unroll
        for (int s = 0; s < STREAM_UPDATE_ROWS / 16; s++) {
            const int cur = s & 1, nxt = cur ^ 1;
            if (s + 1 < STREAM_UPDATE_ROWS / 16) {
                stream_ldsm_trans(a[nxt], tk + (s + 1) * 16 * 128 + a_off);
                stream_ldsm_trans(b[nxt][0], tt + (s + 1) * 16 * 128 + b_off0);
                stream_ldsm_trans(b[nxt][1], tt + (s + 1) * 16 * 128 + b_off1);
            }
            mma_bf16(acc[0], a[cur], b[cur][0][0], b[cur][0][1]);
            mma_bf16(acc[1], a[cur], b[cur][0][2], b[cur][0][3]);
            mma_bf16(acc[2], a[cur], b[cur][1][0], b[cur][1][1]);
            mma_bf16(acc[3], a[cur], b[cur][1][2], b[cur][1][3]);
        }
    }

    float *P = partM + ((size_t)chunk * heads + h) * 64 * 64;
    const int f_lo = 16 * (w % 4) + g, c0 = 32 * (w / 4) + 2 * t;
#pragma unroll
    for (int nt = 0; nt < 4; nt++) {
        *(float2 *)(P + (size_t)f_lo * 64 + c0 + 8 * nt) = make_float2(acc[nt][0], acc[nt][1]);
        *(float2 *)(P + (size_t)(f_lo + 8) * 64 + c0 + 8 * nt) = make_float2(acc[nt][2], acc[nt][3]);
    }
    const int wi = 4 * (g & 1) + 2 * ((g >> 1) & 1) + ((g >> 2) & 1);
    zred[w * 64 + stream_feature_of(t, wi, 0)] = zd[0];
    zred[w * 64 + stream_feature_of(t, wi, 1)] = zd[1];
    __syncthreads();
    if (threadIdx.x < 64) {
        double sum = 0;
#pragma unroll
        for (int ww = 0; ww < 8; ww++) sum += zred[ww * 64 + threadIdx.x];
        partz[((size_t)chunk * heads + h) * 64 + threadIdx.x] = sum;
    }
}

#endif
