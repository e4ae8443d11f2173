/* emu_int8_avx512.c - the AVX-512 q8_0/q4_0 products against col_dotq_stored, built freestanding
 * (no libc, no threads, no system calls) so that tools/emulate_avx512.py can run it on an emulated
 * AVX-512 VNNI CPU where the machine has none.
 *
 * The emulator writes one case into `emu_case` before it starts the program at _start: dtype (q8_0,
 * q4_0 or their 8-row panels), rows, columns, tokens, a seed and which entry point runs
 * (col_rows_avx512, the dispatch a pool's AVX-512 threads call, or col_rows_int8_avx512 directly);
 * the program fills random weights and activations, quantises the activations with the AVX-512
 * path's quantiser, runs the product, compares every output's bits with col_dotq_stored (the
 * definition, portable C), writes its counts to `emu_result` and stops at a hlt. */
#include "internal.h"
#include "kernels_internal.h"

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

enum { ENTRY_DISPATCH = 0, ENTRY_INT8 = 1 };

/* Written by the emulator before the run: dtype, rows, cols, tokens, seed, entry. */
volatile uint64_t emu_case[6] = {COL_DTYPE_Q8_0, 16, 1024, 9, 1, ENTRY_DISPATCH};
/* Read back after it: outputs that differ from the definition, outputs, outputs not zero, done
 * (0x600d when the run reached its end). */
volatile uint64_t emu_result[4];

static uint8_t weights[MAX_ROWS * (MAX_COLS / QK) * 34];
static float x[MAX_TOKENS * MAX_COLS];
static uint8_t qx[MAX_TOKENS * (MAX_COLS + MAX_COLS / QK * 8 + 64)];
static float y[MAX_TOKENS * MAX_ROWS];
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

static void run_case(void)
{
    const uint32_t dtype = (uint32_t)emu_case[0], nt = (uint32_t)emu_case[3];
    const uint64_t rows = emu_case[1], cols = emu_case[2], nb = cols / QK;
    const uint64_t rb = col_dtype_row_bytes(dtype, cols), qb = col_qrow_bytes(cols);
    rng = (uint32_t)emu_case[4];
    for (uint64_t i = 0; i < rows * rb; i++) weights[i] = (uint8_t)rnd();
    for (uint64_t r = 0; r < rows; r++)
        for (uint64_t b = 0; b < nb; b++) {
            const uint16_t h = (uint16_t)((0x1400 + rnd() % 0x1400) | (rnd() % 2 ? 0x8000 : 0));
            memcpy(scale_at(dtype, rb, r, b), &h, 2);
        }
    for (uint64_t i = 0; i < nt * cols; i++) x[i] = (float)((int32_t)(rnd() % 20001u) - 10000) / 8192.0f;
    for (uint32_t t = 0; t < nt; t++) col_quantize_row(x + t * cols, cols, dtype, COL_ISA_AVX512, qx + t * qb);
    const col_matvec_job job = {{weights, dtype, rows, cols, 0}, x, y, nt, NULL};
    const col_ahead ahead = {1024, 1024};
    if (emu_case[5] == ENTRY_INT8)
        col_rows_int8_avx512(&job, qx, 0, rows, stage, sizeof stage, ahead);
    else
        col_rows_avx512(&job, qx, 0, rows, stage, sizeof stage, ahead);
    uint64_t differ = 0, nonzero = 0;
    for (uint32_t t = 0; t < nt; t++)
        for (uint64_t r = 0; r < rows; r++) {
            const float want = col_dotq_stored(weights, dtype, r, qx + t * qb, cols), got = y[t * rows + r];
            uint32_t a, b;
            memcpy(&a, &got, 4);
            memcpy(&b, &want, 4);
            differ += a != b;
            nonzero += a != 0;
        }
    emu_result[0] = differ;
    emu_result[1] = (uint64_t)nt * rows;
    emu_result[2] = nonzero;
    emu_result[3] = 0x600d;
}

__attribute__((noreturn)) void _start(void)
{
    run_case();
    for (;;) __asm__ volatile("hlt");
}
