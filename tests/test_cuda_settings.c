/* The CUDA backend's settings string (kernels/cuda/cuda_settings.h, docs/CUDA.md): built-in
 * defaults, an environment variable as a key's default, an explicit key winning over it (even
 * over a variable with a bad value), and SF_E_OPTION naming an unknown key, a bad value (in the
 * string or the environment), a key given twice or an empty entry, also through
 * sf_backend_create_opts. Needs no GPU (parsing touches no device), only a CUDA build: without
 * one this prints "skipped: no CUDA build" and exits 77. */
#include <stdlib.h>
#include <string.h>

#include "seqflow/seqflow.h"
#include "support/check.h"
#ifdef SEQFLOW_HAVE_CUDA
#include "kernels/cuda/cuda_settings.h"

/* Every variable the settings read, cleared so that the caller's environment cannot leak in. */
static const char *const vars[] = {
    "SEQFLOW_CUDA_QKV",         "SEQFLOW_CUDA_GEMM",          "SEQFLOW_CUDA_MEMORY",
    "SEQFLOW_CUDA_MEMORY_BF16", "SEQFLOW_CUDA_ATTENTION_MIX", "SEQFLOW_CUDA_GATE_UP",
    "SEQFLOW_CUDA_SIDE_QUEUE",  "SEQFLOW_CUDA_PDL",           "SEQFLOW_CUDA_UPLOAD_UNORDERED",
    "SEQFLOW_PINNED_PACKETS",   "SEQFLOW_CUDA_PROFILE",       "SEQFLOW_DEVICE_ROWS",
    "SEQFLOW_CUDA_WARMUP",      "SEQFLOW_CUDA_FP8_SCALE",     "SEQFLOW_CUDA_FP8_ACCUM",
    "SEQFLOW_NCCL_CTAS",        "SEQFLOW_CUDA_PLAN_CACHE",    "SEQFLOW_CACHE_DIR",
    "SEQFLOW_CUDA_NORMED_SUMS", "SEQFLOW_CUDA_FP8_BLOCKS",    "XDG_CACHE_HOME"};

/* The parse of text fails with SF_E_OPTION and a message naming `names`. */
static void refused(const char *text, const char *names)
{
    sf_cuda_settings s;
    const int rc = sf_cuda_settings_parse(text, &s);
    CHECKF(rc == SF_E_OPTION, "'%s': returned %d, want SF_E_OPTION", text ? text : "(null)", rc);
    CHECKF(strstr(sf_last_error(), names) != NULL, "'%s': error '%s' does not name '%s'", text ? text : "(null)",
           sf_last_error(), names);
}

int main(void)
{
    for (size_t i = 0; i < sizeof vars / sizeof *vars; i++) unsetenv(vars[i]);
    sf_cuda_settings d, s;
    sf_cuda_settings_defaults(&d);
    /* the built-in defaults: every fast path on, the profile off */
    CHECK(d.qkv_bf16 == 1 && d.gemm == SF_CUDA_GEMM_FASTEST && d.memory == SF_CUDA_MEMORY_AUTO);
    CHECK(d.memory_bf16 == 1 && d.attention_mix == 1 && d.gate_up == 1 && d.side_queue == 1);
    CHECK(d.early_launch == 1 && d.upload_unordered == 1 && d.pinned_packets == 1 && d.profile == 0);
    CHECK(d.device_rows == 1 && d.warmup == 1 && d.fp8_scale == SF_CUDA_FP8_SCALE_AUTO && d.fp8_accum == 0);
    CHECK(d.normed_sums == 1 && d.fp8_blocks == 1);
    CHECK_OK(sf_cuda_settings_parse("fp8_blocks=0", &s));
    CHECK(s.fp8_blocks == 0);
    refused("fp8_blocks=square", "fp8_blocks");
    CHECK_OK(sf_cuda_settings_parse("normed_sums=0", &s));
    CHECK(s.normed_sums == 0);
    refused("normed_sums=2", "normed_sums");
    CHECK_OK(sf_cuda_settings_parse("fp8_accum=fast", &s));
    CHECK(s.fp8_accum == 1);
    refused("fp8_accum=slow", "fp8_accum");
    /* nccl_ctas: auto is 0 blocks (NCCL's choice), a number is itself, others refused */
    CHECK(sf_cuda_settings_nccl_ctas(&d) == 0);
    CHECK_OK(sf_cuda_settings_parse("nccl_ctas=8", &s));
    CHECK(sf_cuda_settings_nccl_ctas(&s) == 8);
    refused("nccl_ctas=3", "nccl_ctas");
    /* warmup and fp8_scale: given, and from their variables */
    CHECK_OK(sf_cuda_settings_parse("warmup=1,fp8_scale=epilogue", &s));
    CHECK(s.warmup == 1 && s.fp8_scale == SF_CUDA_FP8_SCALE_EPILOGUE);
    setenv("SEQFLOW_CUDA_WARMUP", "0", 1);
    setenv("SEQFLOW_CUDA_FP8_SCALE", "epilogue", 1);
    CHECK_OK(sf_cuda_settings_parse(NULL, &s));
    CHECK(s.warmup == 0 && s.fp8_scale == SF_CUDA_FP8_SCALE_EPILOGUE);
    CHECK_OK(sf_cuda_settings_parse("warmup=1,fp8_scale=auto", &s));
    CHECK(s.warmup == 1 && s.fp8_scale == SF_CUDA_FP8_SCALE_AUTO);
    unsetenv("SEQFLOW_CUDA_WARMUP");
    unsetenv("SEQFLOW_CUDA_FP8_SCALE");
    refused("fp8_scale=outer", "fp8_scale");
    /* plan_cache: on by default; its folder from SEQFLOW_CACHE_DIR, XDG_CACHE_HOME, HOME in turn */
    CHECK(d.plan_cache == 1 && d.cache_dir[0] == 0);
    CHECK_OK(sf_cuda_settings_parse("plan_cache=0", &s));
    CHECK(s.plan_cache == 0);
    refused("plan_cache=yes", "plan_cache");
    const char *home = getenv("HOME");
    char *saved_home = home ? strdup(home) : NULL;
    setenv("SEQFLOW_CACHE_DIR", "/tmp/sf-own", 1);
    setenv("XDG_CACHE_HOME", "/tmp/xdg", 1);
    setenv("HOME", "/tmp/home", 1);
    CHECK_OK(sf_cuda_settings_parse(NULL, &s));
    CHECKF(strcmp(s.cache_dir, "/tmp/sf-own") == 0, "%s", s.cache_dir);
    unsetenv("SEQFLOW_CACHE_DIR");
    CHECK_OK(sf_cuda_settings_parse(NULL, &s));
    CHECKF(strcmp(s.cache_dir, "/tmp/xdg/seqflow") == 0, "%s", s.cache_dir);
    unsetenv("XDG_CACHE_HOME");
    CHECK_OK(sf_cuda_settings_parse(NULL, &s));
    CHECKF(strcmp(s.cache_dir, "/tmp/home/.cache/seqflow") == 0, "%s", s.cache_dir);
    unsetenv("HOME");
    CHECK_OK(sf_cuda_settings_parse(NULL, &s));
    CHECK(s.cache_dir[0] == 0);
    if (saved_home) setenv("HOME", saved_home, 1);
    free(saved_home);
    /* device_rows: given, from its variable, and the given key winning over the variable */
    CHECK_OK(sf_cuda_settings_parse("device_rows=0", &s));
    CHECK(s.device_rows == 0);
    setenv("SEQFLOW_DEVICE_ROWS", "0", 1);
    CHECK_OK(sf_cuda_settings_parse(NULL, &s));
    CHECK(s.device_rows == 0);
    CHECK_OK(sf_cuda_settings_parse("device_rows=1", &s));
    CHECK(s.device_rows == 1);
    setenv("SEQFLOW_DEVICE_ROWS", "maybe", 1);
    refused(NULL, "SEQFLOW_DEVICE_ROWS");
    unsetenv("SEQFLOW_DEVICE_ROWS");
    /* nothing given, no variable set: the defaults (the cache folder comes from HOME) */
    CHECK_OK(sf_cuda_settings_parse(NULL, &s));
    memset(s.cache_dir, 0, sizeof s.cache_dir);
    CHECK(memcmp(&s, &d, sizeof s) == 0);
    CHECK_OK(sf_cuda_settings_parse("", &s));
    memset(s.cache_dir, 0, sizeof s.cache_dir);
    CHECK(memcmp(&s, &d, sizeof s) == 0);

    /* every key, each to a value other than its default */
    CHECK_OK(sf_cuda_settings_parse("qkv=f32,gemm=lt,memory=mma,memory_bf16=0,attention_mix=0,gate_up=0,"
                                    "side_queue=0,early_launch=0,upload_unordered=0,pinned_packets=0,profile=1",
                                    &s));
    CHECK(s.qkv_bf16 == 0 && s.gemm == SF_CUDA_GEMM_LT && s.memory == SF_CUDA_MEMORY_MMA);
    CHECK(s.memory_bf16 == 0 && s.attention_mix == 0 && s.gate_up == 0 && s.side_queue == 0);
    CHECK(s.early_launch == 0 && s.upload_unordered == 0 && s.pinned_packets == 0 && s.profile == 1);
    CHECK_OK(sf_cuda_settings_parse("gemm=gemmex,memory=tiled", &s));
    CHECK(s.gemm == SF_CUDA_GEMM_GEMMEX && s.memory == SF_CUDA_MEMORY_TILED);
    CHECK_OK(sf_cuda_settings_parse("memory=fma,gemm=fastest,memory_bf16=1", &s));
    CHECK(s.memory == SF_CUDA_MEMORY_FMA && s.gemm == SF_CUDA_GEMM_FASTEST && s.memory_bf16 == 1);

    /* the environment is a key's default; the string wins over it; an empty variable is unset */
    setenv("SEQFLOW_CUDA_PDL", "0", 1);
    setenv("SEQFLOW_CUDA_MEMORY", "fma", 1);
    setenv("SEQFLOW_CUDA_QKV", "", 1);
    CHECK_OK(sf_cuda_settings_parse(NULL, &s));
    CHECK(s.early_launch == 0 && s.memory == SF_CUDA_MEMORY_FMA && s.qkv_bf16 == 1 && s.gate_up == 1);
    CHECK_OK(sf_cuda_settings_parse("early_launch=1,memory=auto", &s));
    CHECK(s.early_launch == 1 && s.memory == SF_CUDA_MEMORY_AUTO);
    /* a bad value in the environment is refused, naming the variable, unless the string gives
     * the key (the variable is then never read) */
    setenv("SEQFLOW_CUDA_GATE_UP", "yes", 1);
    refused(NULL, "SEQFLOW_CUDA_GATE_UP");
    CHECK_OK(sf_cuda_settings_parse("gate_up=0", &s));
    CHECK(s.gate_up == 0);
    for (size_t i = 0; i < sizeof vars / sizeof *vars; i++) unsetenv(vars[i]);

    refused("no_such_key=1", "no_such_key");
    refused("gate_up=2", "gate_up");
    refused("qkv=bf17", "qkv");
    refused("memory=", "memory");
    refused("gemm", "gemm");
    refused("gate_up=0,gate_up=1", "gate_up");
    refused("gate_up=0,,qkv=f32", "empty");
    refused("gate_up=0,", "empty");
    refused(",gate_up=0", "empty");
    refused("GATE_UP=0", "GATE_UP"); /* keys are lower case */

    /* through the backend: the settings are checked before the device is looked for, so a bad
     * one is SF_E_OPTION on any machine and leaves no backend */
    sf_backend_options opts = {0};
    sf_backend *be = NULL;
    opts.settings = "side_queue=2";
    CHECK(sf_backend_create_opts("cuda", &opts, &be) == SF_E_OPTION && be == NULL);
    CHECKF(strstr(sf_last_error(), "side_queue") != NULL, "error '%s' does not name side_queue", sf_last_error());
    opts.settings = "side_queue=0";
    const int rc = sf_backend_create_opts("cuda", &opts, &be);
    CHECKF(rc == SF_OK || rc == SF_E_BACKEND, "good settings: returned %d (%s)", rc, sf_last_error());
    CHECK((rc == SF_OK) == (be != NULL));
    sf_backend_free(be);
    return check_finish("test_cuda_settings");
}
#else
int main(void) { return check_skip("no CUDA build"); }
#endif
