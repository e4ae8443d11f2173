/*
 * bench_products.c - time one weight product of a prefill, the way the engine runs it.
 *
 *   bench_products DTYPE ROWS COLS TOKENS [--threads T] [--megabytes M] [--repeats R]
 *                  [--kernels portable|avx2|avx512|amx] [--numerics SPEC]
 *
 * Multiplies TOKENS activation rows by a ROWS x COLS weight matrix of DTYPE (f32, f16, bf16,
 * q8_0, q4_0) on a pool of T threads (col_matmul_many, one product per call). The weights are
 * copies of one random matrix, at least M MiB of them (default 1024, past this machine's caches),
 * multiplied in turn, so every product reads its weights from memory as a prefill's expert
 * products do. Prints one JSON line: the seconds per product of each repeat (a pass over all the
 * copies) and the path that ran. tools/bench_products.py runs it in turns with torch's products on
 * the same shapes. --numerics runs a numerics variant's products instead (SPEC: seq, pairwise or
 * blockedL, with +fma and +splitS, as colibri.numerics spells them). A developer's benchmark: it
 * uses the engine's internal kernel interface.
 */
#include "internal.h"
#include "kernels.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static double now_s(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

/* A deterministic pseudo-random value in [-0.5, 0.5). */
static float noise(uint64_t *state)
{
    *state = *state * 6364136223846793005ull + 1442695040888963407ull;
    return (float)(*state >> 40) / (float)(1u << 24) - 0.5f;
}

static int parse_dtype(const char *s, uint32_t *dtype)
{
    static const struct { const char *name; uint32_t dtype; } names[] = {
        {"f32", COL_DTYPE_F32}, {"f16", COL_DTYPE_F16}, {"bf16", COL_DTYPE_BF16},
        {"q8_0", COL_DTYPE_Q8_0}, {"q4_0", COL_DTYPE_Q4_0}};
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++)
        if (strcmp(s, names[i].name) == 0) {
            *dtype = names[i].dtype;
            return 1;
        }
    return 0;
}

static int parse_isa(const char *s, col_isa *isa)
{
    static const char *names[] = {"portable", "avx2", "avx512", "amx"};
    for (int i = 0; i < 4; i++)
        if (strcmp(s, names[i]) == 0) {
            *isa = (col_isa)i;
            return 1;
        }
    return 0;
}

/* One row of `cols` random weights in `dtype`. Quantised rows: scales of 1/64 (so products stay
 * finite), then random payload bytes. */
static void fill_row(uint8_t *row, uint32_t dtype, uint64_t cols, uint64_t *state)
{
    if (dtype == COL_DTYPE_F32) {
        for (uint64_t i = 0; i < cols; i++) {
            float v = noise(state);
            memcpy(row + 4 * i, &v, 4);
        }
    } else if (dtype == COL_DTYPE_F16 || dtype == COL_DTYPE_BF16) {
        for (uint64_t i = 0; i < cols; i++) {
            /* f16 0x3xxx and bf16 0x3Exx/0xBExx: ordinary values near 0.1-1 in magnitude */
            uint16_t v = dtype == COL_DTYPE_F16 ? (uint16_t)(0x3000u | ((*state >> 20) & 0x8FFFu))
                                                : (uint16_t)(0x3E00u | ((*state >> 20) & 0x80FFu));
            noise(state);
            memcpy(row + 2 * i, &v, 2);
        }
    } else {
        const uint64_t nb = cols / 32, payload = col_dtype_row_bytes(dtype, cols) - 2 * nb;
        const uint16_t scale = 0x2400; /* 1/64 in f16 */
        for (uint64_t b = 0; b < nb; b++) memcpy(row + 2 * b, &scale, 2);
        for (uint64_t i = 0; i < payload; i++) {
            noise(state);
            row[2 * nb + i] = (uint8_t)(*state >> 33);
        }
    }
}

/* A reduction variant's spec (seq, pairwise, blockedL; +fma; +splitS) into nx; 0 if it does not parse. */
static int parse_numerics(const char *spec, col_numerics *nx)
{
    char buf[128];
    if (strlen(spec) >= sizeof buf) return 0;
    strcpy(buf, spec);
    memset(nx, 0, sizeof *nx);
    for (char *part = strtok(buf, "+"); part; part = strtok(NULL, "+")) {
        if (strcmp(part, "seq") == 0) nx->reduction = COL_REDUCTION_SEQUENTIAL;
        else if (strcmp(part, "pairwise") == 0) nx->reduction = COL_REDUCTION_PAIRWISE;
        else if (strncmp(part, "blocked", 7) == 0 && atoi(part + 7) > 0) {
            nx->reduction = COL_REDUCTION_BLOCKED;
            nx->lanes = (uint32_t)atoi(part + 7);
        } else if (strcmp(part, "fma") == 0) nx->fma = 1;
        else if (strncmp(part, "split", 5) == 0 && atoi(part + 5) > 0) nx->split = (uint32_t)atoi(part + 5);
        else return 0;
    }
    if (nx->reduction == COL_REDUCTION_DEFAULT) nx->reduction = COL_REDUCTION_SEQUENTIAL;
    return nx->lanes <= 256 && nx->split <= 256;
}

static int usage(void)
{
    fputs("usage: bench_products DTYPE ROWS COLS TOKENS [--threads T] [--megabytes M] [--repeats R]\n"
          "                      [--kernels portable|avx2|avx512|amx] [--numerics SPEC]\n"
          "  DTYPE: f32 f16 bf16 q8_0 q4_0 (q8_0/q4_0: COLS a multiple of 32)\n",
          stderr);
    return 2;
}

int main(int argc, char **argv)
{
    if (argc < 5) return usage();
    uint32_t dtype;
    const uint64_t rows = strtoull(argv[2], NULL, 10), cols = strtoull(argv[3], NULL, 10);
    const unsigned long tokens = strtoul(argv[4], NULL, 10);
    unsigned long threads = 1, megabytes = 1024, repeats = 5;
    col_isa ceiling = COL_ISA_AMX;
    col_numerics nx;
    int with_numerics = 0;
    if (!parse_dtype(argv[1], &dtype) || rows == 0 || cols == 0 || tokens == 0 || tokens > 65536 ||
        rows > (1u << 24) || cols > (1u << 24))
        return usage();
    if ((dtype == COL_DTYPE_Q8_0 || dtype == COL_DTYPE_Q4_0) && cols % 32 != 0) return usage();
    for (int i = 5; i < argc; i += 2) {
        const char *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!v) return usage();
        if (strcmp(argv[i], "--threads") == 0) threads = strtoul(v, NULL, 10);
        else if (strcmp(argv[i], "--megabytes") == 0) megabytes = strtoul(v, NULL, 10);
        else if (strcmp(argv[i], "--repeats") == 0) repeats = strtoul(v, NULL, 10);
        else if (strcmp(argv[i], "--kernels") == 0) {
            if (!parse_isa(v, &ceiling)) return usage();
        } else if (strcmp(argv[i], "--numerics") == 0) {
            if (!parse_numerics(v, &nx)) return usage();
            with_numerics = 1;
        } else
            return usage();
    }
    if (threads < 1 || threads > 256 || repeats < 1 || repeats > 1000 || megabytes > (1u << 20)) return usage();

    const uint64_t row_bytes = col_dtype_row_bytes(dtype, cols), matrix = rows * row_bytes;
    const uint64_t copies = (megabytes << 20) / matrix + 1;
    /* 64-byte aligned, as tensors in a .colibri file are, so no load straddles two cache lines */
    const uint64_t matrix_stride = (matrix + 63) / 64 * 64;
    void *weights_mem = NULL, *x_mem = NULL, *y_mem = NULL;
    if (posix_memalign(&weights_mem, 64, copies * matrix_stride) != 0) weights_mem = NULL;
    if (posix_memalign(&x_mem, 64, tokens * cols * sizeof(float)) != 0) x_mem = NULL;
    if (posix_memalign(&y_mem, 64, tokens * rows * sizeof(float)) != 0) y_mem = NULL;
    uint8_t *weights = weights_mem;
    float *x = x_mem, *y = y_mem;
    if (!weights || !x || !y) {
        fprintf(stderr, "bench_products: out of memory (%llu copies of %llu bytes)\n",
                (unsigned long long)copies, (unsigned long long)matrix);
        return 1;
    }
    uint64_t state = 42;
    for (uint64_t r = 0; r < rows; r++) fill_row(weights + r * row_bytes, dtype, cols, &state);
    for (uint64_t c = 1; c < copies; c++) memcpy(weights + c * matrix_stride, weights, matrix);
    for (uint64_t i = 0; i < tokens * cols; i++) x[i] = noise(&state);

    const col_isa isa = col_choose_isa(ceiling);
    const col_pool_limits limits = {1, tokens * cols, (uint32_t)tokens, cols};
    const uint64_t scratch_bytes = col_pool_scratch_size(isa, (uint32_t)threads, &limits);
    void *scratch = NULL;
    if (scratch_bytes && posix_memalign(&scratch, 64, scratch_bytes) != 0) return 1;
    col_allocator alloc;
    col_allocator_or_default(NULL, &alloc);
    col_pool *pool = col_pool_create(isa, (uint32_t)threads, scratch, scratch_bytes, &limits, &alloc);
    if (!pool) {
        fputs("bench_products: cannot create the thread pool\n", stderr);
        return 1;
    }
    if (with_numerics) col_pool_set_numerics(pool, &nx);
    col_matvec_job job = {{weights, dtype, rows, cols, 0}, x, y, (uint32_t)tokens};
    col_matmul_many(pool, &job, 1); /* warm the workers */

    printf("{\"dtype\": \"%s\", \"rows\": %llu, \"cols\": %llu, \"tokens\": %lu, \"threads\": %lu, "
           "\"kernels\": \"%s\", \"copies\": %llu, \"seconds\": [",
           argv[1], (unsigned long long)rows, (unsigned long long)cols, tokens, threads,
           col_isa_name(col_pool_isa(pool)), (unsigned long long)copies);
    for (unsigned long rep = 0; rep < repeats; rep++) {
        const double t0 = now_s();
        for (uint64_t c = 0; c < copies; c++) {
            job.w.data = weights + c * matrix_stride;
            col_matmul_many(pool, &job, 1);
        }
        printf("%s%.9f", rep ? ", " : "", (now_s() - t0) / (double)copies);
    }
    printf("]}\n");
    col_pool_free(pool);
    free(scratch);
    free(weights);
    free(x);
    free(y);
    return 0;
}
