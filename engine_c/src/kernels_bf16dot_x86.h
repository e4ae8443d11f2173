/*
 * kernels_bf16dot_x86.h - the AVX-512 path's bf16 dot-product tiles (COL_REDUCTION_BF16_DOT), a
 * template that kernels_x86.c includes twice: once with vdpbf16ps, where the CPU has AVX512-BF16,
 * and once with that instruction's arithmetic in AVX-512 F/BW (dp16_flushed), where it has not.
 * Both give the bits of col_dot_bf16_portable (rows) and col_dot_bf16_panel_portable (bf16x16
 * panels), so the one tile walk serves both and the emulation stays in step with the instruction.
 *
 * Define before each inclusion (they are undefined at the end):
 *   BF16DOT_TARGET           the target attribute of the functions it defines;
 *   BF16DOT_STEP(acc, w, x)  one vdpbf16ps: per 32-bit lane, acc plus the odd then the even product
 *                            of w's and x's bf16 pairs (__m512, __m512i, __m512i -> __m512);
 *   BF16DOT_ROWS             the name of the rows function it defines (kernels_internal.h).
 */
#define BF16DOT_PASTE_(a, b) a##_##b
#define BF16DOT_PASTE(a, b) BF16DOT_PASTE_(a, b)
#define BF16DOT_ROW_TILE BF16DOT_PASTE(BF16DOT_ROWS, row_tile)
#define BF16DOT_PANEL_TILE BF16DOT_PASTE(BF16DOT_ROWS, panel_tile)

/* A tile of bf16 dot products: per step 32 columns of each row (one 64-byte load) against the
 * tokens' packed activations, each lane adding its odd then its even product (a last, partial
 * step under a mask: zero pairs); the 16 lane sums reduced by the kernels' tree. Decode tiles take
 * distant rows and prefetch them `ahead` bytes ahead; batch tiles neighbouring rows. */
COL_INLINE BF16DOT_TARGET void BF16DOT_ROW_TILE(const col_matvec_job *j, const uint16_t *xp, uint64_t r, uint64_t step,
                                                int NR, int NT, uint32_t t, uint32_t ahead)
{
    const uint64_t n = j->w.cols, rb = 2 * n, steps = (n + 31) / 32;
    const uint8_t *row[MAX_TILE_ROWS];
    const uint16_t *x[4];
    __m512 acc[MAX_TILE];
    for (int a = 0; a < NR; a++) row[a] = (const uint8_t *)j->w.data + (r + (uint64_t)a * step) * rb;
    for (int b = 0; b < NT; b++) x[b] = xp + (uint64_t)(t + b) * n;
#pragma GCC unroll 24
    for (int k = 0; k < NR * NT; k++) acc[k] = _mm512_setzero_ps();
    next_tile_prefetch pf = next_tile_slice(j, r, step, NR, NT, t, rb, steps);
    uint64_t i = 0;
    for (; i + 32 <= n; i += 32) {
        next_tile_step(&pf);
        __m512i xv[4];
#pragma GCC unroll 4
        for (int b = 0; b < NT; b++) xv[b] = _mm512_loadu_si512((const void *)(x[b] + i));
#pragma GCC unroll 8
        for (int a = 0; a < NR; a++) {
            if (NT == 1) _mm_prefetch((const char *)(row[a] + 2 * i + ahead), _MM_HINT_T0);
            const __m512i wv = _mm512_loadu_si512((const void *)(row[a] + 2 * i));
#pragma GCC unroll 4
            for (int b = 0; b < NT; b++) acc[a * NT + b] = BF16DOT_STEP(acc[a * NT + b], wv, xv[b]);
        }
    }
    if (i < n) {
        const __mmask32 m = (__mmask32)((1u << (n - i)) - 1u);
        __m512i xv[4];
#pragma GCC unroll 4
        for (int b = 0; b < NT; b++) xv[b] = _mm512_maskz_loadu_epi16(m, x[b] + i);
        /* unrolled as the main loop is: an accumulator indexed by a variable would keep all of
         * them in a stack array, stored and reloaded around every pass */
#pragma GCC unroll 8
        for (int a = 0; a < NR; a++) {
            const __m512i wv = _mm512_maskz_loadu_epi16(m, row[a] + 2 * i);
#pragma GCC unroll 4
            for (int b = 0; b < NT; b++) acc[a * NT + b] = BF16DOT_STEP(acc[a * NT + b], wv, xv[b]);
        }
    }
    if (step == 1) {
        hsum16_store_rows(acc, NR, NT, j->y + (uint64_t)t * j->w.rows + r, j->w.rows);
        return;
    }
    float sums[MAX_TILE];
    hsum16_many(acc, NR * NT, sums);
    for (int a = 0; a < NR; a++)
        for (int b = 0; b < NT; b++) j->y[(uint64_t)(t + b) * j->w.rows + r + (uint64_t)a * step] = sums[a * NT + b];
}

/* bf16 dot products over panels: per pair of columns one load a panel, and per token its pair of
 * activations broadcast (one 32-bit lane) into one step whose lanes are the panel's rows: each
 * output the chain col_dot_bf16_panel_portable defines. */
COL_INLINE BF16DOT_TARGET void BF16DOT_PANEL_TILE(const col_matvec_job *j, const uint16_t *xp, uint64_t r,
                                                  uint64_t step, int NP, int NT, uint32_t t, uint32_t ahead)
{
    const uint64_t n = j->w.cols;
    const uint16_t *panel[PANEL_TILE_MAX];
    const uint32_t *x[MAX_TILE_TOKENS];
    __m512 acc[MAX_TILE];
    for (int a = 0; a < NP; a++) panel[a] = (const uint16_t *)j->w.data + (r + (uint64_t)a * step) * n;
    for (int b = 0; b < NT; b++) x[b] = (const uint32_t *)(const void *)(xp + (uint64_t)(t + b) * n);
#pragma GCC unroll 24
    for (int k = 0; k < NP * NT; k++) acc[k] = _mm512_setzero_ps();
    for (uint64_t q = 0; q < n / 2; q++) {
        __m512i w[PANEL_TILE_MAX];
#pragma GCC unroll 4
        for (int a = 0; a < NP; a++) {
            const uint16_t *line = panel[a] + 2 * COL_BF16_PANEL_ROWS * q;
            if (NT == 1) _mm_prefetch((const char *)line + ahead, _MM_HINT_T0);
            w[a] = _mm512_loadu_si512((const void *)line);
        }
#pragma GCC unroll 8
        for (int b = 0; b < NT; b++) {
            const __m512i xv = _mm512_set1_epi32((int)x[b][q]);
#pragma GCC unroll 4
            for (int a = 0; a < NP; a++) acc[a * NT + b] = BF16DOT_STEP(acc[a * NT + b], w[a], xv);
        }
    }
#pragma GCC unroll 8
    for (int b = 0; b < NT; b++)
#pragma GCC unroll 4
        for (int a = 0; a < NP; a++)
            _mm512_storeu_ps(j->y + (uint64_t)(t + b) * j->w.rows + r + (uint64_t)a * step, acc[a * NT + b]);
}

BF16DOT_TARGET void BF16DOT_ROWS(const col_matvec_job *j, const uint16_t *xp, uint64_t r0, uint64_t r1,
                                 col_decode_tuning tune)
{
    if (is_bf16_panel(j->w.dtype)) {
#define T(NP, NT, r, step, t) BF16DOT_PANEL_TILE(j, xp, r, step, NP, NT, t, tune.f)
        WALK_PANELS(T, 4, 3, 8);
#undef T
        return;
    }
#define T(NR, NT, r, step, t) BF16DOT_ROW_TILE(j, xp, r, step, NR, NT, t, tune.f)
    WALK_TILES_512(T);
#undef T
}

#undef BF16DOT_PANEL_TILE
#undef BF16DOT_ROW_TILE
#undef BF16DOT_PASTE
#undef BF16DOT_PASTE_
#undef BF16DOT_ROWS
#undef BF16DOT_STEP
#undef BF16DOT_TARGET
