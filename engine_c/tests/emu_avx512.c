/* emu_avx512.c - the AVX-512 kernels against their definitions, built freestanding (no libc, no
 * threads, no system calls) so that tools/emulate_avx512.py can run it on an emulated AVX-512 VNNI
 * + BF16 CPU where the machine has none, or on one without VNNI (Cannon Lake) for the avx512f path.
 *
 * The emulator writes one case into `emu_case` before it starts the program at _start; the program
 * fills random weights and activations, runs the AVX-512 path and the portable definition, compares
 * every output's bits, writes its counts to `emu_result` and stops at a hlt. Kinds of case:
 * - int8: q8_0/q4_0 products (and their 8-row panels) through col_rows_avx512, the dispatch a pool's
 *   AVX-512 threads call, or col_rows_int8_avx512, or (entry avx512f) the AVX2 kernels in the form
 *   the avx512f path runs them, against col_dotq_stored;
 * - numerics: a jitter-lab variant's loops (col_numerics_rows_avx512) against its reference loops
 *   (col_numerics_matmul without a pool), every stored dtype of rows and of 8-row panels;
 * - bf16dot: bf16 dot products with vdpbf16ps (col_rows_bf16dot_avx512), or (entry avx512f) its
 *   arithmetic without AVX512-BF16 (col_rows_bf16dot_avx512f), against col_rows_bf16dot_portable, on
 *   bf16 rows and bf16x16 panels;
 * - float: f32, f16 and bf16 products of the default path (col_rows_avx512), whose bits differ from
 *   the portable path's by design (another order of the sums): a batch must give the bits of its
 *   tokens run one at a time, and every output must lie within 2^-16 of the largest output's size
 *   from col_rows_portable's (a wrong element or row is off by far more). */
#include "internal.h"
#include "kernels_internal.h"
#include "numerics.h"

#include <stdint.h>
#include <string.h>

/* What a freestanding link lacks: the few C library functions the kernels and the compiler use. */
void *memcpy(void *dst, const void *src, size_t n)
{
    uint8_t *d = dst;
    const uint8_t *s = src;
    while (n--) *d++ = *s++;
    return dst;
}
void *memset(void *dst, int c, size_t n)
{
    uint8_t *d = dst;
    while (n--) *d++ = (uint8_t)c;
    return dst;
}
void *memmove(void *dst, const void *src, size_t n)
{
    uint8_t *d = dst;
    const uint8_t *s = src;
    if (d < s)
        while (n--) *d++ = *s++;
    else
        while (n--) d[n] = s[n];
    return dst;
}
__attribute__((target("fma"))) float fmaf(float a, float b, float c)
{
    return __builtin_fmaf(a, b, c);
}
__attribute__((target("sse4.1"))) float nearbyintf(float x)
{
    return __builtin_nearbyintf(x);
}
float fabsf(float x)
{
    return __builtin_fabsf(x);
}

#define MAX_ROWS 80
#define MAX_COLS 4384
#define MAX_TOKENS 40

enum { KIND_INT8 = 0, KIND_NUMERICS = 1, KIND_BF16DOT = 2, KIND_FLOAT = 3 };
enum { ENTRY_DISPATCH = 0, ENTRY_INT8 = 1, ENTRY_AVX512F = 2 };

/* Written by the emulator before the run: kind, dtype, rows, cols, tokens, seed, entry (int8), and
 * the variant (numerics): reduction, lanes, fma, split. */
volatile uint64_t emu_case[11] = {KIND_INT8, COL_DTYPE_Q8_0, 16, 1024, 9, 1, ENTRY_DISPATCH, 0, 0, 0, 0};
/* Read back after it: outputs that differ from the definition, outputs, outputs not zero, done
 * (0x600d when the run reached its end). */
volatile uint64_t emu_result[4];

static uint8_t weights[MAX_ROWS * MAX_COLS * 4 + 64];
static float x[MAX_TOKENS * MAX_COLS];
static uint8_t qx[MAX_TOKENS * (MAX_COLS + MAX_COLS / QK * 8 + 64)];
static float y[MAX_TOKENS * MAX_ROWS], want[MAX_TOKENS * MAX_ROWS], portable[MAX_TOKENS * MAX_ROWS];
static uint16_t xp[MAX_TOKENS * MAX_COLS];
static uint8_t stage[1 << 18] __attribute__((aligned(64)));

static uint32_t rng;
static uint32_t rnd(void)
{
    rng = rng * 1664525u + 1013904223u;
    return rng >> 8;
}

/* Where row r's scale of block b sits (docs/format.md: rows, or 8-row panels). */
static uint8_t *scale_at(uint32_t dtype, uint64_t rb, uint64_t r, uint64_t b)
{
    if (dtype == COL_DTYPE_Q8_0X8 || dtype == COL_DTYPE_Q4_0X8)
        return weights + r / 8 * 8 * rb + 2 * (8 * b + r % 8);
    return weights + r * rb + 2 * b;
}

/* A float spread over 13 binades (2^-6 .. 2^6), so that summation orders round differently. */
static float spread(void)
{
    const float v = (float)(rnd() & 0xFFFFFF) / (float)0x800000 - 1.0f;
    return v * (float)(1u << (rnd() % 13)) / 64.0f;
}

/* rows x cols random weights of dtype: floats of either sign over binades, or blocks with normal
 * f16 scales and random payloads. */
static void fill_weights(uint32_t dtype, uint64_t rows, uint64_t cols)
{
    const uint64_t rb = col_dtype_row_bytes(dtype, cols), nb = cols / QK;
    for (uint64_t i = 0; i < rows * rb; i++) weights[i] = (uint8_t)rnd();
    for (uint64_t r = 0; r < rows; r++)
        for (uint64_t i = 0; i < cols; i++) {
            uint8_t *at = weights + r * rb;
            if (dtype == COL_DTYPE_F32) {
                const float v = spread();
                memcpy(at + 4 * i, &v, 4);
            } else if (dtype == COL_DTYPE_F16 || dtype == COL_DTYPE_BF16 || dtype == COL_DTYPE_BF16X16) {
                uint16_t v = dtype == COL_DTYPE_F16 ? (uint16_t)(0x0C00u + rnd() % 0x3C00u) : (uint16_t)(0x3980u + rnd() % 0x0800u);
                v |= (uint16_t)(rnd() & 0x8000u);
                memcpy(at + 2 * i, &v, 2);
            } else if (i < nb) {
                const uint16_t h = (uint16_t)((0x1400 + rnd() % 0x1400) | (rnd() % 2 ? 0x8000 : 0));
                memcpy(scale_at(dtype, rb, r, i), &h, 2);
            }
        }
}

static void run_case(void)
{
    const uint32_t kind = (uint32_t)emu_case[0], dtype = (uint32_t)emu_case[1], nt = (uint32_t)emu_case[4];
    const uint64_t rows = emu_case[2], cols = emu_case[3], qb = col_qrow_bytes(cols);
    rng = (uint32_t)emu_case[5];
    fill_weights(dtype, rows, cols);
    for (uint64_t i = 0; i < nt * cols; i++) x[i] = kind == KIND_INT8 ? (float)((int32_t)(rnd() % 20001u) - 10000) / 8192.0f : spread();
    const col_matvec_job job = {{weights, dtype, rows, cols, 0}, x, y, nt, NULL};
    const col_decode_tuning tune = {1024, 1024, 1024, 8, 4, 0, COL_WIDEN_MIN_TOKENS};
    emu_result[0] = 0;
    if (kind == KIND_INT8) {
        const col_isa isa = emu_case[6] == ENTRY_AVX512F ? COL_ISA_AVX512F : COL_ISA_AVX512;
        for (uint32_t t = 0; t < nt; t++) col_quantize_row(x + t * cols, cols, dtype, isa, qx + t * qb);
        if (emu_case[6] == ENTRY_AVX512F) /* what an avx512f pool's threads call (pool.c job_rows) */
            col_rows_avx2(&job, qx, 0, rows, tune, COL_INT8_MADDUBS_512);
        else if (emu_case[6] == ENTRY_INT8)
            col_rows_int8_avx512(&job, qx, 0, rows, stage, sizeof stage, tune);
        else
            col_rows_avx512(&job, qx, 0, rows, stage, sizeof stage, tune);
        for (uint32_t t = 0; t < nt; t++)
            for (uint64_t r = 0; r < rows; r++) want[t * rows + r] = col_dotq_stored(weights, dtype, r, qx + t * qb, cols);
        if ((dtype == COL_DTYPE_Q4_0X8 || dtype == COL_DTYPE_Q8_0X8) && nt == 1 && emu_case[6] != ENTRY_AVX512F)
            for (uint32_t streams = 4; streams <= 8; streams += 4) {
                /* the other tiles a CPU may take for one token of stored panels: 4 or 8 panels a
                 * tile (col_decode_tuning.stored_streams), q4_0's on them (q4_zmm) */
                const col_matvec_job other_job = {job.w, x, portable, nt, NULL};
                col_decode_tuning other = tune;
                other.q4_zmm = 1;
                other.stored_streams = streams;
                col_rows_int8_avx512(&other_job, qx, 0, rows, stage, sizeof stage, other);
                for (uint64_t r = 0; r < rows; r++) {
                    uint32_t a, b;
                    memcpy(&a, &portable[r], 4);
                    memcpy(&b, &want[r], 4);
                    emu_result[0] += a != b;
                }
            }
    } else if (kind == KIND_NUMERICS) {
        col_numerics nx = {0};
        nx.reduction = (uint32_t)emu_case[7];
        nx.lanes = (uint32_t)emu_case[8];
        nx.fma = (uint32_t)emu_case[9];
        nx.split = (uint32_t)emu_case[10];
        col_matvec_job reference = job;
        reference.y = want;
        col_numerics_matmul(&nx, NULL, &reference, 1);
        col_numerics_rows_avx512(&nx, &job, 0, rows);
    } else if (kind == KIND_FLOAT) {
        col_rows_avx512(&job, NULL, 0, rows, stage, sizeof stage, tune);
        for (uint32_t t = 0; t < nt; t++) {
            const col_matvec_job step = {job.w, x + t * cols, want + t * rows, 1, NULL};
            col_decode_tuning step_tune = tune;
            step_tune.f_streams = t % 2 ? 4 : 8; /* both tile heights a CPU may decode with */
            col_rows_avx512(&step, NULL, 0, rows, stage, sizeof stage, step_tune);
        }
        col_matvec_job reference = job;
        reference.y = portable;
        col_rows_portable(&reference, NULL, 0, rows);
        float largest = 0.0f;
        for (uint64_t i = 0; i < nt * rows; i++) largest = fabsf(portable[i]) > largest ? fabsf(portable[i]) : largest;
        uint64_t far = 0;
        for (uint64_t i = 0; i < nt * rows; i++) far += !(fabsf(y[i] - portable[i]) <= largest * 0x1p-16f);
        emu_result[0] = far; /* added to the batch's bit differences from stepping below */
    } else {
        /* entry avx512f: vdpbf16ps's arithmetic without it, what pools on CPUs without AVX512-BF16 call */
        void (*const dot_rows)(const col_matvec_job *, const uint16_t *, uint64_t, uint64_t, col_decode_tuning) =
            emu_case[6] == ENTRY_AVX512F ? col_rows_bf16dot_avx512f : col_rows_bf16dot_avx512;
        for (uint32_t t = 0; t < nt; t++) col_pack_bf16(x + t * cols, cols, COL_ISA_AVX512, xp + t * cols);
        dot_rows(&job, xp, 0, rows, tune);
        col_matvec_job reference = job;
        reference.y = want;
        col_rows_bf16dot_portable(&reference, 0, rows);
        if (nt == 1) {
            /* the other tile height a CPU may decode one token with (col_decode_tuning.f_streams) */
            const col_matvec_job step = {job.w, x, portable, 1, NULL};
            col_decode_tuning four = tune;
            four.f_streams = 4;
            dot_rows(&step, xp, 0, rows, four);
            for (uint64_t r = 0; r < rows; r++) {
                uint32_t a, b;
                memcpy(&a, &portable[r], 4);
                memcpy(&b, &want[r], 4);
                emu_result[0] += a != b;
            }
        }
    }
    uint64_t differ = 0, nonzero = 0;
    for (uint64_t i = 0; i < nt * rows; i++) {
        uint32_t a, b;
        memcpy(&a, &y[i], 4);
        memcpy(&b, &want[i], 4);
        differ += a != b;
        nonzero += a != 0;
    }
    emu_result[0] += differ;
    emu_result[1] = (uint64_t)nt * rows;
    emu_result[2] = nonzero;
    emu_result[3] = 0x600d;
}

__attribute__((noreturn)) void _start(void)
{
    run_case();
    for (;;) __asm__ volatile("hlt");
}
