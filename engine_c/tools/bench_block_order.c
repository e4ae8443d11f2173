/*
 * bench_block_order.c - what a q8_0/q4_0 product in block order would gain: a measurement for a
 * proposed numerics mode and weight layout, not engine code.
 *
 *   bench_block_order DTYPE ROWS COLS TOKENS [--megabytes M] [--repeats R]
 *
 * The engine's quantised tiles (kernels_x86.c) keep 16 column lanes per output and add every
 * lane's exact 4-product (q8_0) or 8-product (q4_0) integer sum into f32 with its block's scale:
 * a convert, a scale and a fused multiply-add per vpdpbusd or two, which bounds them at about a
 * third of the core's int8 rate (bench_products --ceilings). This prototype puts rows in the lanes
 * instead, as ik_llama.cpp's repacked q8_0_r8 tiles do: 16 rows are interleaved 4 bytes at a time
 * (a block's 32 bytes of 16 rows in 8 vectors, one 4-byte group of each row per lane; q4_0's
 * nibbles in 4 vectors, split with two ands and a shift per vector for all the pass's tokens), each
 * vpdpbusd takes one broadcast 4-byte group of a token's activations, a lane sums its row's whole
 * block exactly in int32, and a block costs one convert, one scale multiply and one fused
 * multiply-add per 16 outputs. The float order differs (one rounding per block and output instead
 * of per 4 or 8 products and lane), so it could only be an opt-in numerics mode or a new
 * definition of the quantised product; the interleaving could be a file layout (done once, at
 * conversion) or a per-load repack; a panel holds the same bytes as its rows. The packing is
 * not timed (it stands for that layout); the activations' quantisation is.
 *
 * Runs the engine's product (col_matmul_many, 1 thread, AVX-512) and the prototype in turns on
 * the same weights, read from memory (M MiB of copies, default 1024), 1 thread, and prints one
 * JSON line: the seconds of each, and the largest difference between their outputs relative to
 * the largest output. Needs AVX-512 VNNI.
 */
#include "internal.h"
#include "kernels.h"

#include <stdio.h>

#if defined(__x86_64__)
#include <immintrin.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include "bench_common.h"

#define QK 32
#define PANEL 16 /* rows interleaved in one panel: the lanes of a vector */
#define MAX_NT 12 /* tokens per pass: 12 accumulators, 8 weight vectors */

/* A panel of 16 rows: per block, the 16 rows' f16 scales d_w, then the payload, whose vectors hold
 * in lane r row r's elements 4g..4g+3 (group g): q8_0 8 vectors of w + 128; q4_0 4 vectors of
 * nibbles q = w + 8, byte i of a lane holding element 4h + i (low nibble) and 16 + 4h + i (high),
 * q4_0's own pairing. The same bytes as the rows: [rows / 16][nb][32 + 512 or 256 bytes] */
static uint64_t panel_block_bytes(uint32_t dtype)
{
    return 2 * PANEL + (dtype == COL_DTYPE_Q8_0 ? 8 : 4) * 64;
}

static int8_t weight_q(const uint8_t *row, uint32_t dtype, uint64_t nb, uint64_t b, uint32_t j)
{
    const uint8_t *payload = row + 2 * nb;
    if (dtype == COL_DTYPE_Q8_0) return (int8_t)payload[b * QK + j];
    const uint8_t byte = payload[b * 16 + (j & 15u)];
    return (int8_t)((j < 16 ? byte & 0x0F : byte >> 4) - 8);
}

static void pack_panels(const uint8_t *w, uint32_t dtype, uint64_t rows, uint64_t cols, uint8_t *out)
{
    const uint64_t nb = cols / QK, rb = col_dtype_row_bytes(dtype, cols), pb = panel_block_bytes(dtype);
    for (uint64_t p = 0; p < rows / PANEL; p++)
        for (uint64_t b = 0; b < nb; b++) {
            uint8_t *blk = out + (p * nb + b) * pb, *payload = blk + 2 * PANEL;
            for (uint32_t r = 0; r < PANEL; r++) {
                const uint8_t *row = w + (p * PANEL + r) * rb;
                memcpy(blk + 2 * r, row + 2 * b, 2);
                for (uint32_t j = 0; j < QK; j++) {
                    const int q = weight_q(row, dtype, nb, b, j);
                    if (dtype == COL_DTYPE_Q8_0) {
                        payload[(j / 4) * 64 + r * 4 + j % 4] = (uint8_t)(q + 128); /* unsigned for vpdpbusd */
                    } else {
                        const uint32_t e = j % 16;
                        uint8_t *byte = payload + (e / 4) * 64 + r * 4 + e % 4;
                        *byte = (uint8_t)(j < 16 ? (*byte & 0xF0) | (q + 8) : (*byte & 0x0F) | ((q + 8) << 4));
                    }
                }
            }
        }
}

/* One token's activations: per block 32 int8 (element order), d_x and the correction
 * -bias * sum(x) (bias 128 for q8_0, 8 for q4_0). [nb][32 bytes + f32 + i32] */
#define XBLOCK_BYTES (QK + 8)

__attribute__((target("avx512f,avx512bw,avx512vl"))) static void quantize_token(const float *x, uint64_t cols, int bias,
                                                                               uint8_t *out)
{
    for (uint64_t b = 0; b < cols / QK; b++) {
        const __m512 lo = _mm512_loadu_ps(x + b * QK), hi = _mm512_loadu_ps(x + b * QK + 16);
        const float amax = _mm512_reduce_max_ps(_mm512_max_ps(_mm512_abs_ps(lo), _mm512_abs_ps(hi)));
        const float d = amax / 127.0f;
        const __m512 id = _mm512_set1_ps(d > 0.0f ? 1.0f / d : 0.0f);
        const __m512i top = _mm512_set1_epi32(127), bottom = _mm512_set1_epi32(-127);
        __m512i qlo = _mm512_min_epi32(_mm512_max_epi32(_mm512_cvtps_epi32(_mm512_mul_ps(lo, id)), bottom), top);
        __m512i qhi = _mm512_min_epi32(_mm512_max_epi32(_mm512_cvtps_epi32(_mm512_mul_ps(hi, id)), bottom), top);
        uint8_t *o = out + b * XBLOCK_BYTES;
        _mm_storeu_si128((__m128i *)o, _mm512_cvtepi32_epi8(qlo));
        _mm_storeu_si128((__m128i *)(o + 16), _mm512_cvtepi32_epi8(qhi));
        const int32_t corr = -bias * _mm512_reduce_add_epi32(_mm512_add_epi32(qlo, qhi));
        memcpy(o + QK, &d, 4);
        memcpy(o + QK + 4, &corr, 4);
    }
}

/* NT tokens x one panel of 16 rows: per block, every token's exact int32 block sums of the 16 rows
 * (8 vpdpbusd, each with one broadcast 4-byte group of the token), then one convert, one scale
 * (d_w of the 16 rows times the token's d_x) and one fused multiply-add per token. */
static inline __attribute__((always_inline, target("avx512f,avx512bw,avx512vnni,fma,f16c"))) void panel_tokens(
    const uint8_t *panel, uint32_t dtype, uint64_t nb, const uint8_t *xq, uint32_t t0, int NT, float *y, uint64_t rows,
    uint64_t r0)
{
    const uint64_t pb = panel_block_bytes(dtype);
    const __m512i low4 = _mm512_set1_epi8(0x0F);
    __m512 acc[MAX_NT];
#pragma GCC unroll 12
    for (int b = 0; b < NT; b++) acc[b] = _mm512_setzero_ps();
    for (uint64_t k = 0; k < nb; k++) {
        const uint8_t *blk = panel + k * pb, *payload = blk + 2 * PANEL;
        __m512i w[8];
        if (dtype == COL_DTYPE_Q8_0) {
#pragma GCC unroll 8
            for (int g = 0; g < 8; g++) w[g] = _mm512_loadu_si512((const void *)(payload + 64 * g));
        } else {
#pragma GCC unroll 4
            for (int h = 0; h < 4; h++) {
                const __m512i v = _mm512_loadu_si512((const void *)(payload + 64 * h));
                w[h] = _mm512_and_si512(v, low4);
                w[h + 4] = _mm512_and_si512(_mm512_srli_epi16(v, 4), low4);
            }
        }
        const __m512 dw = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(const void *)blk));
#pragma GCC unroll 12
        for (int b = 0; b < NT; b++) {
            const uint8_t *xb = xq + ((uint64_t)(t0 + (uint32_t)b) * nb + k) * XBLOCK_BYTES;
            int32_t corr;
            float dx;
            memcpy(&dx, xb + QK, 4);
            memcpy(&corr, xb + QK + 4, 4);
            __m512i isum = _mm512_set1_epi32(corr);
#pragma GCC unroll 8
            for (int g = 0; g < 8; g++) {
                int32_t four;
                memcpy(&four, xb + 4 * g, 4);
                isum = _mm512_dpbusd_epi32(isum, w[g], _mm512_set1_epi32(four));
            }
            acc[b] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(isum), _mm512_mul_ps(dw, _mm512_set1_ps(dx)), acc[b]);
        }
    }
    for (int b = 0; b < NT; b++) {
        float out[PANEL];
        _mm512_storeu_ps(out, acc[b]);
        for (int r = 0; r < PANEL; r++) y[(uint64_t)(t0 + (uint32_t)b) * rows + r0 + (uint64_t)r] = out[r];
    }
}

__attribute__((target("avx512f,avx512vnni,avx512bw,avx512vl,fma,f16c"))) static void product_block_order(
    const uint8_t *panels, uint32_t dtype, uint64_t rows, uint64_t cols, const float *x, uint32_t tokens, uint8_t *xq,
    float *y)
{
    const uint64_t nb = cols / QK;
    for (uint32_t t = 0; t < tokens; t++)
        quantize_token(x + (uint64_t)t * cols, cols, dtype == COL_DTYPE_Q8_0 ? 128 : 8, xq + (uint64_t)t * nb * XBLOCK_BYTES);
    for (uint64_t p = 0; p < rows / PANEL; p++) {
        const uint8_t *panel = panels + p * nb * panel_block_bytes(dtype);
        uint32_t t = 0;
        for (; t + MAX_NT <= tokens; t += MAX_NT) panel_tokens(panel, dtype, nb, xq, t, MAX_NT, y, rows, p * PANEL);
        switch (tokens - t) {
#define CASE(n) case n: panel_tokens(panel, dtype, nb, xq, t, n, y, rows, p * PANEL); break;
        CASE(1) CASE(2) CASE(3) CASE(4) CASE(5) CASE(6) CASE(7) CASE(8) CASE(9) CASE(10) CASE(11)
#undef CASE
        default: break;
        }
    }
}

static int usage(void)
{
    fputs("usage: bench_block_order q8_0|q4_0 ROWS COLS TOKENS [--megabytes M] [--repeats R]\n"
          "  ROWS a multiple of 16, COLS of 32\n",
          stderr);
    return 2;
}

static double median(double *v, unsigned long n)
{
    for (unsigned long i = 1; i < n; i++)
        for (unsigned long k = i; k > 0 && v[k - 1] > v[k]; k--) {
            const double s = v[k];
            v[k] = v[k - 1];
            v[k - 1] = s;
        }
    return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

int main(int argc, char **argv)
{
    if (argc < 5) return usage();
    uint32_t dtype;
    if (strcmp(argv[1], "q8_0") == 0) dtype = COL_DTYPE_Q8_0;
    else if (strcmp(argv[1], "q4_0") == 0) dtype = COL_DTYPE_Q4_0;
    else return usage();
    const uint64_t rows = strtoull(argv[2], NULL, 10), cols = strtoull(argv[3], NULL, 10);
    const unsigned long tokens = strtoul(argv[4], NULL, 10);
    unsigned long megabytes = 1024, repeats = 5;
    for (int i = 5; i + 1 < argc; i += 2) {
        if (strcmp(argv[i], "--megabytes") == 0) megabytes = strtoul(argv[i + 1], NULL, 10);
        else if (strcmp(argv[i], "--repeats") == 0) repeats = strtoul(argv[i + 1], NULL, 10);
        else return usage();
    }
    if (rows == 0 || rows % PANEL || cols == 0 || cols % QK || rows > (1u << 20) || cols > (1u << 20) || tokens == 0 ||
        tokens > 4096 || repeats < 1 || repeats > 100 || megabytes > (1u << 16))
        return usage();
    if (!__builtin_cpu_supports("avx512f") || !__builtin_cpu_supports("avx512vnni")) {
        fputs("bench_block_order: needs AVX-512 VNNI\n", stderr);
        return 1;
    }
    const uint64_t nb = cols / QK, rb = col_dtype_row_bytes(dtype, cols), matrix = (rows * rb + 63) / 64 * 64;
    const uint64_t packed = (rows / PANEL * nb * panel_block_bytes(dtype) + 63) / 64 * 64;
    const uint64_t copies = (megabytes << 20) / matrix + 1;
    void *wm = NULL, *pm = NULL, *xm = NULL, *qm = NULL, *ym = NULL, *zm = NULL;
    if (posix_memalign(&wm, 64, copies * matrix) || posix_memalign(&pm, 64, copies * packed) ||
        posix_memalign(&xm, 64, tokens * cols * 4) || posix_memalign(&qm, 64, tokens * nb * XBLOCK_BYTES) ||
        posix_memalign(&ym, 64, tokens * rows * 4) || posix_memalign(&zm, 64, tokens * rows * 4)) {
        fputs("bench_block_order: out of memory\n", stderr);
        return 1;
    }
    uint8_t *w = wm, *panels = pm, *xq = qm;
    float *x = xm, *y = ym, *z = zm;
    uint64_t state = 42;
    for (uint64_t r = 0; r < rows; r++) {
        uint8_t *row = w + r * rb;
        for (uint64_t b = 0; b < nb; b++) {
            const uint16_t h = (uint16_t)(0x2000u + ((state >> 30) & 0x3FFu)); /* scales near 1/128 */
            noise(&state);
            memcpy(row + 2 * b, &h, 2);
        }
        for (uint64_t i = 2 * nb; i < rb; i++) {
            noise(&state);
            row[i] = (uint8_t)(state >> 33);
        }
    }
    for (uint64_t c = 1; c < copies; c++) memcpy(w + c * matrix, w, matrix);
    memset(panels, 0, packed);
    pack_panels(w, dtype, rows, cols, panels);
    for (uint64_t c = 1; c < copies; c++) memcpy(panels + c * packed, panels, packed);
    for (uint64_t i = 0; i < tokens * cols; i++) x[i] = noise(&state);

    const col_isa isa = col_choose_isa(COL_ISA_AVX512);
    const col_pool_limits limits = {1, tokens * cols, (uint32_t)tokens, cols};
    const uint64_t scratch_bytes = col_pool_scratch_size(isa, 1, &limits);
    void *scratch = NULL;
    if (scratch_bytes && posix_memalign(&scratch, 64, scratch_bytes) != 0) return 1;
    col_allocator alloc;
    col_allocator_or_default(NULL, &alloc);
    col_pool *pool = col_pool_create(isa, 1, scratch, scratch_bytes, &limits, &alloc);
    if (!pool) return 1;
    col_matvec_job job = {{w, dtype, rows, cols, 0}, x, y, (uint32_t)tokens};
    col_matmul_many(pool, &job, 1);
    product_block_order(panels, dtype, rows, cols, x, (uint32_t)tokens, xq, z);
    float ymax = 0.0f, dmax = 0.0f;
    for (uint64_t i = 0; i < tokens * rows; i++) {
        if (fabsf(y[i]) > ymax) ymax = fabsf(y[i]);
        if (fabsf(y[i] - z[i]) > dmax) dmax = fabsf(y[i] - z[i]);
    }

    double *lane = calloc(repeats, sizeof *lane), *block = calloc(repeats, sizeof *block);
    if (!lane || !block) return 1;
    for (unsigned long rep = 0; rep < repeats; rep++) {
        double t0 = now_s();
        for (uint64_t c = 0; c < copies; c++) {
            job.w.data = w + c * matrix;
            col_matmul_many(pool, &job, 1);
        }
        lane[rep] = (now_s() - t0) / (double)copies;
        t0 = now_s();
        for (uint64_t c = 0; c < copies; c++)
            product_block_order(panels + c * packed, dtype, rows, cols, x, (uint32_t)tokens, xq, z);
        block[rep] = (now_s() - t0) / (double)copies;
    }
    const double ml = median(lane, repeats), mb = median(block, repeats), macs = (double)rows * (double)cols * (double)tokens;
    printf("{\"dtype\": \"%s\", \"rows\": %llu, \"cols\": %llu, \"tokens\": %lu, \"kernels\": \"%s\", "
           "\"lane_order_s\": %.9f, \"block_order_s\": %.9f, \"lane_order_gmacs\": %.1f, \"block_order_gmacs\": %.1f, "
           "\"speedup\": %.2f, \"max_diff_of_max\": %.2e}\n",
           argv[1], (unsigned long long)rows, (unsigned long long)cols, tokens, col_isa_name(col_pool_isa(pool)), ml, mb,
           macs / ml * 1e-9, macs / mb * 1e-9, ml / mb, ymax > 0.0f ? (double)(dmax / ymax) : 0.0);
    col_pool_free(pool);
    free(scratch);
    free(lane);
    free(block);
    free(wm);
    free(pm);
    free(xm);
    free(qm);
    free(ym);
    free(zm);
    return 0;
}
#else
int main(void)
{
    fputs("bench_block_order: x86-64 only\n", stderr);
    return 1;
}
#endif
