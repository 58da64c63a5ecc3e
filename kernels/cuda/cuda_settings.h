/* The CUDA backend's settings (docs/CUDA.md, "Settings"): read once, when the backend is
 * created, from the "key=value,key=value" string of sf_backend_options.settings, each key
 * that the string does not name taking its environment variable's value, else the built-in
 * default. This is the one place in kernels/ that reads the environment. Plain C, so that
 * tests and benchmarks can fill one without nvcc. */
#ifndef SEQFLOW_KERNELS_CUDA_SETTINGS_H
#define SEQFLOW_KERNELS_CUDA_SETTINGS_H

#ifdef __cplusplus
extern "C" {
#endif

/* How each product shape picks its cuBLAS path (key gemm). */
typedef enum sf_cuda_gemm_mode {
    SF_CUDA_GEMM_FASTEST = 0, /* "fastest": cublasGemmEx or cuBLASLt, timed at the shape's first use */
    SF_CUDA_GEMM_GEMMEX,      /* "gemmex": cublasGemmEx only */
    SF_CUDA_GEMM_LT           /* "lt": cuBLASLt's fastest candidate always */
} sf_cuda_gemm_mode;

/* Which compressive-memory kernels run (key memory). */
typedef enum sf_cuda_memory_mode {
    SF_CUDA_MEMORY_AUTO = 0, /* "auto": stream kernels for d = 64 in bf16, else tiled (updates mma, mix fma) */
    SF_CUDA_MEMORY_TILED,    /* "tiled": the tiled kernels for d = 64 too, default products */
    SF_CUDA_MEMORY_FMA,      /* "fma": tiled, both products on FP32 FMAs */
    SF_CUDA_MEMORY_MMA       /* "mma": tiled, both products on the tensor cores */
} sf_cuda_memory_mode;

/* How precision fp8 applies the per-channel weight and per-row activation scales (key fp8_scale). */
typedef enum sf_cuda_fp8_scale {
    SF_CUDA_FP8_SCALE_AUTO = 0,  /* "auto": inside cuBLASLt (outer-vector scales) where it offers them, else epilogue */
    SF_CUDA_FP8_SCALE_EPILOGUE   /* "epilogue": unit scales in cuBLASLt, then a kernel of this backend applies them */
} sf_cuda_fp8_scale;

typedef struct sf_cuda_settings {
    int qkv_bf16;         /* qkv: 1 ("bf16") bf16 q/k/v where attention reads them in place; 0 ("f32") */
    int gemm;             /* gemm: an sf_cuda_gemm_mode */
    int memory;           /* memory: an sf_cuda_memory_mode */
    int memory_bf16;      /* memory_bf16: bf16 operands for the memory's tensor-core products in bf16 */
    int attention_mix;    /* attention_mix: the memory mix inside the attention kernel where it runs */
    int gate_up;          /* gate_up: W1, W3 and SwiGLU as one kernel on an H100 */
    int normed_sums;      /* normed_sums: head-parallel sums hand the products normed rows (normed_type) */
    int side_queue;       /* side_queue: commits on a second stream */
    int early_launch;     /* early_launch: programmatic dependent launch of the backend's kernels */
    int upload_unordered; /* upload_unordered: upload_unordered does not wait for earlier work */
    int pinned_packets;   /* pinned_packets: page-locked packet buffers */
    int profile;          /* profile: per-op device times, printed when the backend is freed */
    int device_rows;      /* device_rows: rows stay on the device between stages (0: through the host) */
    int warmup;           /* warmup: first-use costs (kernel loading, product plans, pinned buffers) paid at start-up */
    int fp8_scale;        /* fp8_scale: an sf_cuda_fp8_scale (precision fp8 only) */
    int fp8_accum;        /* fp8_accum: 0 ("exact") partial sums promoted to float32, 1 ("fast") cuBLASLt's FAST_ACCUM */
    int fp8_blocks;       /* fp8_blocks: weights prepared alone, and their inputs, with a scale a 128 values */
    int nccl_ctas;        /* nccl_ctas: the most thread blocks a collective of a head-parallel rank takes: an
                           * index into "auto", "2", "4", "8", "16", "32" (sf_cuda_settings_nccl_ctas) */
    int plan_cache;       /* plan_cache: product plans kept on disk between processes (gemm_plan_cache.cu) */
    /* Not a key: the folder of the plan cache, from SEQFLOW_CACHE_DIR, else $XDG_CACHE_HOME/seqflow,
     * else $HOME/.cache/seqflow (read by sf_cuda_settings_parse); "" when none is set. */
    char cache_dir[512];
} sf_cuda_settings;

/* nccl_ctas as a count of thread blocks; 0 for "auto" (NCCL's choice). */
int sf_cuda_settings_nccl_ctas(const sf_cuda_settings *s);

/* The built-in defaults (the fastest measured), ignoring the environment. */
void sf_cuda_settings_defaults(sf_cuda_settings *out);

/* Fills *out from `text` ("key=value,..."; NULL or "" for none; borrowed) over the environment
 * defaults over the built-in ones. A key the string gives never reads its variable. An unknown
 * key, a key given twice, an empty entry, or a bad value (in the string or in a variable that
 * is read) is SF_E_OPTION naming it; *out is then unspecified. */
int sf_cuda_settings_parse(const char *text, sf_cuda_settings *out);

#ifdef __cplusplus
}
#endif
#endif
