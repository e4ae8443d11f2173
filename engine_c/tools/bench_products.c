/*
 * bench_products.c - time one weight product of a prefill, the way the engine runs it.
 *
 *   bench_products DTYPE ROWS COLS TOKENS [--threads T] [--megabytes M] [--repeats R]
 *                  [--kernels portable|avx2|avx512f|avx512|amx] [--numerics SPEC]
 *
 * Multiplies TOKENS activation rows by a ROWS x COLS weight matrix of DTYPE (f32, f16, bf16,
 * q8_0, q4_0) on a pool of T threads (col_matmul_many, one product per call). The weights are
 * copies of one random matrix, at least M MiB of them (default 1024, past this machine's caches),
 * multiplied in turn, so every product reads its weights from memory as a prefill's expert
 * products do. Prints one JSON line: the seconds per product of each repeat (a pass over all the
 * copies) and the path that ran. tools/bench_products.py runs it in turns with torch's products on
 * the same shapes. --numerics runs a numerics variant's products instead (SPEC: seq, pairwise,
 * blockedL or dot-bf16, with +fma and +splitS, as colibri.numerics spells them). A developer's benchmark: it
 * uses the engine's internal kernel interface.
 *
 *   bench_products --ceilings [--kernels avx2]
 *
 * Prints this core's multiply-add ceilings instead, one JSON line (G multiply-adds/s of one
 * thread): int8 VNNI vpdpbusd (64 per instruction), f32 FMA (16), and the int8 rate of the
 * instruction mix a batch tile needs in each float order (probe_mix), each over 8-12 independent
 * chains so latency does not bound them. On AVX2 without AVX-512 VNNI, or with --kernels avx2 on
 * any AVX2 CPU (the AVX2 path's bound there): vpmaddwd alone (16 per instruction), and the int8
 * rate of a q8_0 pass's work per token and 4-byte group in the forms its operations could take
 * (probe_q8_avx2).
 */
#include "internal.h"
#include "kernels.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "bench_common.h"

static int parse_dtype(const char *s, uint32_t *dtype)
{
    static const struct { const char *name; uint32_t dtype; } names[] = {
        {"f32", COL_DTYPE_F32}, {"f16", COL_DTYPE_F16}, {"bf16", COL_DTYPE_BF16},
        {"q8_0", COL_DTYPE_Q8_0}, {"q4_0", COL_DTYPE_Q4_0}, {"q8_0x8", COL_DTYPE_Q8_0X8}, {"q4_0x8", COL_DTYPE_Q4_0X8},
        {"bf16x16", COL_DTYPE_BF16X16}};
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++)
        if (strcmp(s, names[i].name) == 0) {
            *dtype = names[i].dtype;
            return 1;
        }
    return 0;
}

static int parse_isa(const char *s, col_isa *isa)
{
    static const char *names[] = {"portable", "avx2", "avx512f", "avx512", "amx"};
    for (int i = 0; i < (int)(sizeof names / sizeof *names); i++)
        if (strcmp(s, names[i]) == 0) {
            *isa = (col_isa)i;
            return 1;
        }
    return 0;
}

#define QUANT_SCALE 0x2400 /* 1/64 in f16: quantised products stay finite */

static int is_panels(uint32_t dtype)
{
    return dtype == COL_DTYPE_Q8_0X8 || dtype == COL_DTYPE_Q4_0X8;
}

/* One row of `cols` random weights in `dtype`. Quantised rows: scales of 1/64, then random payload
 * bytes (panels: random bytes, their scales set by fill_panel_scales). */
static void fill_row(uint8_t *row, uint32_t dtype, uint64_t cols, uint64_t *state)
{
    if (dtype == COL_DTYPE_F32) {
        for (uint64_t i = 0; i < cols; i++) {
            float v = noise(state);
            memcpy(row + 4 * i, &v, 4);
        }
    } else if (dtype == COL_DTYPE_F16 || dtype == COL_DTYPE_BF16 || dtype == COL_DTYPE_BF16X16) {
        for (uint64_t i = 0; i < cols; i++) { /* bf16x16: any 16-bit values in any layout */
            /* f16 0x3xxx and bf16 0x3Exx/0xBExx: ordinary values near 0.1-1 in magnitude */
            uint16_t v = dtype == COL_DTYPE_F16 ? (uint16_t)(0x3000u | ((*state >> 20) & 0x8FFFu))
                                                : (uint16_t)(0x3E00u | ((*state >> 20) & 0x80FFu));
            noise(state);
            memcpy(row + 2 * i, &v, 2);
        }
    } else {
        const uint64_t nb = cols / 32, payload = col_dtype_row_bytes(dtype, cols) - 2 * nb;
        const uint16_t scale = QUANT_SCALE;
        for (uint64_t b = 0; b < nb; b++) memcpy(row + 2 * b, &scale, 2);
        for (uint64_t i = 0; i < payload; i++) {
            noise(state);
            row[2 * nb + i] = (uint8_t)(*state >> 33);
        }
    }
}

/* The scales of a matrix stored in 8-row panels: each panel's first 8 * nb f16 (docs/format.md). */
static void fill_panel_scales(uint8_t *matrix, uint32_t dtype, uint64_t rows, uint64_t cols)
{
    const uint16_t scale = QUANT_SCALE;
    const uint64_t panel = 8 * col_dtype_row_bytes(dtype, cols);
    for (uint64_t p = 0; p < rows / 8; p++)
        for (uint64_t k = 0; k < 8 * (cols / 32); k++) memcpy(matrix + p * panel + 2 * k, &scale, 2);
}

/* A reduction variant's spec (seq, pairwise, blockedL, dot-bf16; +fma; +splitS) into nx; 0 if it
 * does not parse (the engine judges the combination). */
static int parse_numerics(const char *spec, col_numerics *nx)
{
    char buf[128];
    if (strlen(spec) >= sizeof buf) return 0;
    strcpy(buf, spec);
    memset(nx, 0, sizeof *nx);
    for (char *part = strtok(buf, "+"); part; part = strtok(NULL, "+")) {
        if (strcmp(part, "seq") == 0) nx->reduction = COL_REDUCTION_SEQUENTIAL;
        else if (strcmp(part, "pairwise") == 0) nx->reduction = COL_REDUCTION_PAIRWISE;
        else if (strcmp(part, "dot-bf16") == 0) nx->reduction = COL_REDUCTION_BF16_DOT;
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

#if defined(__x86_64__)
#include <immintrin.h>
#define PROBE_ITERS 20000000ull
#define PROBE_CHAINS 12

/* Seconds for PROBE_ITERS rounds of PROBE_CHAINS independent vpdpbusd. */
__attribute__((target("avx512f,avx512vnni"))) static double probe_vnni(int32_t *sink)
{
    __m512i acc[PROBE_CHAINS], a = _mm512_set1_epi8(3), b = _mm512_set1_epi8(-5);
    for (int c = 0; c < PROBE_CHAINS; c++) acc[c] = _mm512_set1_epi32(c);
    const double t0 = now_s();
    for (uint64_t i = 0; i < PROBE_ITERS; i++) {
#pragma GCC unroll 12
        for (int c = 0; c < PROBE_CHAINS; c++) acc[c] = _mm512_dpbusd_epi32(acc[c], a, b);
        __asm__ volatile("" : "+v"(a), "+v"(b)); /* keep the loop from being folded */
    }
    const double dt = now_s() - t0;
    for (int c = 1; c < PROBE_CHAINS; c++) acc[0] = _mm512_add_epi32(acc[0], acc[c]);
    *sink += _mm512_reduce_add_epi32(acc[0]);
    return dt;
}

__attribute__((target("avx512f,fma"))) static double probe_fma(float *sink)
{
    __m512 acc[PROBE_CHAINS], a = _mm512_set1_ps(1.0f), b = _mm512_set1_ps(1e-9f);
    for (int c = 0; c < PROBE_CHAINS; c++) acc[c] = _mm512_set1_ps((float)c);
    const double t0 = now_s();
    for (uint64_t i = 0; i < PROBE_ITERS; i++) {
#pragma GCC unroll 12
        for (int c = 0; c < PROBE_CHAINS; c++) acc[c] = _mm512_fmadd_ps(a, b, acc[c]);
        __asm__ volatile("" : "+v"(a), "+v"(b));
    }
    const double dt = now_s() - t0;
    for (int c = 1; c < PROBE_CHAINS; c++) acc[0] = _mm512_add_ps(acc[0], acc[c]);
    *sink += _mm512_reduce_add_ps(acc[0]);
    return dt;
}

/* A batch tile's vector work for DP vpdpbusd (64 int8 multiply-adds each) into one exact int32
 * lane sum started from a correction, then its conversion, the lane scale (vpermps of a vector of
 * d_w * d_x) and the fused accumulate: DP = 1 is q8_0's lane order (a float step per 4 products a
 * lane), 2 is q4_0's (per 8), 8 a whole block's exact sum per lane (rows in lanes, one float step
 * per block: a different float order). 12 chains; the asm keeps each chain's operand its own.
 * Returns G int8 multiply-adds/s. */
__attribute__((target("avx512f,avx512vnni,fma"))) static double probe_mix(int DP, float *sink)
{
    __m512 acc[PROBE_CHAINS], sc = _mm512_set1_ps(1e-9f);
    __m512i idx = _mm512_set1_epi32(1), w = _mm512_set1_epi8(3), x = _mm512_set1_epi8(-5), corr = _mm512_set1_epi32(7);
    for (int c = 0; c < PROBE_CHAINS; c++) acc[c] = _mm512_set1_ps((float)c);
    const uint64_t iters = PROBE_ITERS / (uint64_t)DP;
    const double t0 = now_s();
    for (uint64_t i = 0; i < iters; i++) {
#pragma GCC unroll 12
        for (int c = 0; c < PROBE_CHAINS; c++) {
            __m512i isum = corr;
            for (int d = 0; d < DP; d++) {
                isum = _mm512_dpbusd_epi32(isum, w, x);
                __asm__ volatile("" : "+v"(x));
            }
            acc[c] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(isum), _mm512_permutexvar_ps(idx, sc), acc[c]);
        }
        __asm__ volatile("" : "+v"(w), "+v"(sc), "+v"(idx), "+v"(corr));
    }
    const double dt = now_s() - t0;
    for (int c = 1; c < PROBE_CHAINS; c++) acc[0] = _mm512_add_ps(acc[0], acc[c]);
    *sink += _mm512_reduce_add_ps(acc[0]);
    return (double)iters * PROBE_CHAINS * DP * 64 / dt * 1e-9;
}

#define PROBE_CHAINS_AVX2 8 /* AVX2's 16 registers */

/* Seconds for PROBE_ITERS rounds of PROBE_CHAINS_AVX2 independent chains of vpmaddwd. */
__attribute__((target("avx2"))) static double probe_maddwd(int32_t *sink)
{
    __m256i acc[PROBE_CHAINS_AVX2], b = _mm256_set1_epi16(-5);
    for (int c = 0; c < PROBE_CHAINS_AVX2; c++) acc[c] = _mm256_set1_epi32(c);
    const double t0 = now_s();
    for (uint64_t i = 0; i < PROBE_ITERS; i++) {
#pragma GCC unroll 8
        for (int c = 0; c < PROBE_CHAINS_AVX2; c++) acc[c] = _mm256_madd_epi16(acc[c], b);
        __asm__ volatile("" : "+x"(b));
    }
    const double dt = now_s() - t0;
    for (int c = 1; c < PROBE_CHAINS_AVX2; c++) acc[0] = _mm256_add_epi32(acc[0], acc[c]);
    *sink += _mm256_extract_epi32(acc[0], 0);
    return dt;
}

/* One block of a q8_0 pass on AVX2, 8 rows in the lanes (w: the block's 8 vectors of 4-byte groups,
 * lane r row r's) against 4 tokens (x: their 32 activations each, widened to int16 for forms 1
 * and 2), repeated from L1; G int8 multiply-adds/s. FORM 0: the kernels' vpsignb + vpmaddubsw +
 * vpmaddwd + vpaddd per token and group (vpabsb per group); 1: int16 pairs, the group's even and
 * odd bytes by shifts, then two vpbroadcastd + two vpmaddwd + two vpaddd; 2: vpmovsxbw of rows
 * 0-3 and 4-7, one vpbroadcastq + two vpmaddwd + two vpaddd, vphaddd + vpermq per block. */
__attribute__((target("avx2"))) static double probe_q8_avx2(const int FORM, int32_t *sink)
{
    static int8_t w_mem[256] __attribute__((aligned(64)));
    static int16_t x_mem[4][32] __attribute__((aligned(64)));
    for (int i = 0; i < 256; i++) w_mem[i] = (int8_t)(i * 37);
    for (int i = 0; i < 128; i++) x_mem[i / 32][i % 32] = (int16_t)(i * 13 % 255 - 127);
    const __m256i ones = _mm256_set1_epi16(1);
    __m256i total = _mm256_setzero_si256();
    const uint64_t blocks = PROBE_ITERS / 8;
    const double t0 = now_s();
    for (uint64_t i = 0; i < blocks; i++) {
        const int8_t *w = w_mem;
        const int16_t *x = &x_mem[0][0];
        __asm__ volatile("" : "+r"(w), "+r"(x)); /* reloaded every block, as a pass's are */
        __m256i lo[4], hi[4];
        for (int b = 0; b < 4; b++) lo[b] = hi[b] = _mm256_setzero_si256();
#pragma GCC unroll 8
        for (int g = 0; g < 8; g++) {
            const __m256i wg = _mm256_loadu_si256((const __m256i *)(const void *)(w + 32 * g));
            __m256i a, c;
            if (FORM == 0) {
                a = _mm256_abs_epi8(wg), c = wg;
            } else if (FORM == 1) {
                a = _mm256_srai_epi16(_mm256_slli_epi16(wg, 8), 8), c = _mm256_srai_epi16(wg, 8);
            } else {
                a = _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)(const void *)(w + 32 * g)));
                c = _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)(const void *)(w + 32 * g + 16)));
            }
#pragma GCC unroll 4
            for (int b = 0; b < 4; b++) {
                const int16_t *xb = x + 32 * b;
                if (FORM == 0) {
                    int32_t x4; /* the int8 values' bytes, as a pass broadcasts them */
                    memcpy(&x4, (const int8_t *)(const void *)xb + 4 * g, 4);
                    const __m256i prod = _mm256_maddubs_epi16(a, _mm256_sign_epi8(_mm256_set1_epi32(x4), c));
                    lo[b] = _mm256_add_epi32(lo[b], _mm256_madd_epi16(prod, ones));
                } else if (FORM == 1) {
                    int32_t xe, xo;
                    memcpy(&xe, xb + 2 * g, 4);
                    memcpy(&xo, xb + 16 + 2 * g, 4);
                    lo[b] = _mm256_add_epi32(lo[b], _mm256_madd_epi16(a, _mm256_set1_epi32(xe)));
                    hi[b] = _mm256_add_epi32(hi[b], _mm256_madd_epi16(c, _mm256_set1_epi32(xo)));
                } else {
                    int64_t x4;
                    memcpy(&x4, xb + 4 * g, 8);
                    const __m256i xv = _mm256_set1_epi64x(x4);
                    lo[b] = _mm256_add_epi32(lo[b], _mm256_madd_epi16(a, xv));
                    hi[b] = _mm256_add_epi32(hi[b], _mm256_madd_epi16(c, xv));
                }
                if (FORM == 0)
                    __asm__ volatile("" : "+x"(lo[b]));
                else
                    __asm__ volatile("" : "+x"(lo[b]), "+x"(hi[b]));
            }
        }
        for (int b = 0; b < 4; b++) {
            __m256i isum = lo[b];
            if (FORM == 1) isum = _mm256_add_epi32(lo[b], hi[b]);
            if (FORM == 2) isum = _mm256_permute4x64_epi64(_mm256_hadd_epi32(lo[b], hi[b]), 0xD8);
            total = _mm256_xor_si256(total, isum);
        }
    }
    const double dt = now_s() - t0;
    *sink += _mm256_extract_epi32(total, 0);
    return (double)blocks * 4 * 256 / dt * 1e-9;
}

/* avx2: the AVX2 probes even where the CPU has AVX-512 VNNI (the AVX2 path's bound on this core). */
static int print_ceilings(int avx2)
{
    if (avx2 || !__builtin_cpu_supports("avx512f") || !__builtin_cpu_supports("avx512vnni")) {
        if (!__builtin_cpu_supports("avx2")) {
            fputs(avx2 ? "bench_products: --ceilings --kernels avx2 needs AVX2\n"
                       : "bench_products: --ceilings needs AVX-512 VNNI or AVX2\n", stderr);
            return 1;
        }
        int32_t sink = 0;
        const double maddwd = (double)PROBE_ITERS * PROBE_CHAINS_AVX2 * 16 / probe_maddwd(&sink) * 1e-9;
        const double sign = probe_q8_avx2(0, &sink), pairs = probe_q8_avx2(1, &sink), movsx = probe_q8_avx2(2, &sink);
        printf("{\"vpmaddwd_gmacs\": %.1f, \"q8_avx2_sign_gmacs\": %.1f, \"q8_avx2_int16_pairs_gmacs\": %.1f, "
               "\"q8_avx2_int16_movsx_gmacs\": %.1f, \"sink\": %d}\n",
               maddwd, sign, pairs, movsx, sink);
        return 0;
    }
    int32_t isink = 0;
    float fsink = 0.0f;
    const double rounds = (double)PROBE_ITERS * PROBE_CHAINS;
    const double vnni = probe_vnni(&isink), fma = probe_fma(&fsink);
    const double q8 = probe_mix(1, &fsink), q4 = probe_mix(2, &fsink), block = probe_mix(8, &fsink);
    printf("{\"int8_vnni_gmacs\": %.1f, \"f32_fma_gmacs\": %.1f, \"q8_lane_order_gmacs\": %.1f, "
           "\"q4_lane_order_gmacs\": %.1f, \"block_order_gmacs\": %.1f, \"sink\": %g}\n",
           rounds * 64 / vnni * 1e-9, rounds * 16 / fma * 1e-9, q8, q4, block, (double)fsink + isink);
    return 0;
}
#endif

static int usage(void)
{
    fputs("usage: bench_products DTYPE ROWS COLS TOKENS [--threads T] [--megabytes M] [--repeats R]\n"
          "                      [--kernels portable|avx2|avx512f|avx512|amx] [--numerics SPEC]\n"
          "       bench_products --ceilings [--kernels avx2]\n"
          "  DTYPE: f32 f16 bf16 q8_0 q4_0 q8_0x8 q4_0x8 (quantised: COLS a multiple of 32; the\n"
          "         panels q8_0x8/q4_0x8: ROWS a multiple of 8)\n",
          stderr);
    return 2;
}

int main(int argc, char **argv)
{
#if defined(__x86_64__)
    if (argc >= 2 && strcmp(argv[1], "--ceilings") == 0) {
        if (argc == 2) return print_ceilings(0);
        if (argc == 4 && strcmp(argv[2], "--kernels") == 0 && strcmp(argv[3], "avx2") == 0) return print_ceilings(1);
        return usage();
    }
#endif
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
    if (col_dtype_size(dtype) == 0 && cols % 32 != 0) return usage();
    if (is_panels(dtype) && rows % 8 != 0) return usage();
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
    if (is_panels(dtype)) fill_panel_scales(weights, dtype, rows, cols);
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
    col_matvec_job job = {{weights, dtype, rows, cols, 0}, x, y, (uint32_t)tokens, NULL};
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
