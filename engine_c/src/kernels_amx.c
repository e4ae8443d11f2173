/*
 * kernels_amx.c - bf16-weight products and q8_0/q4_0 batches on AMX tiles (see kernels_amx.h for
 * the arithmetic and the determinism argument). The q8_0/q4_0 section, at the end, is described
 * there.
 *
 * One tile multiply (TDPBF16PS) adds A[16 x 32] . B[32 x 16] into C[16 x 16] in f32, with bf16
 * inputs taken as pairs along the 32. Here A is 16 weight rows x 32 columns as stored; B holds the
 * activations of up to 5 tokens, 3 parts each, in 15 of its 16 columns (or of 16 tokens, one part
 * each, when the activations are bf16 values already: amx_layout); C holds the 16 rows x (token,
 * part) sums.
 *
 * Decode takes 8 distant rows of the thread's share per tile (8 streams through memory, as the
 * vector path's decode tiles; its weight and sum tiles are configured 8 rows tall). Batches take
 * 32 neighbouring rows and run every pair of token groups over them with 2 x 2 C tiles. Whole
 * rows are loaded into the tiles straight from the mapped file; partial groups and partial blocks
 * go through the per-thread staging buffer, zero padded.
 *
 * The packed activations of a product of one token group (decode) are compact: the rows of its B
 * tile are 12 bytes per token apart, and it loads B tiles exactly that wide (config_for). In
 * batches every B row is 64 bytes, so no tile row straddles two cache lines; its unused column,
 * and the columns of a last group's missing tokens, are never written and only feed C columns
 * that are never read.
 */
#if defined(__linux__)
#define _DEFAULT_SOURCE /* syscall(), for arch_prctl */
#endif
#include "kernels_amx.h"
#include "kernels_internal.h"

#include <stdatomic.h>
#include <string.h>

#define KB 32           /* weight columns per block: one 64-byte tile row of bf16 */
#define ROWS 16         /* weight rows per tile */
#define TILE_BYTES 1024 /* one 16 x 64-byte tile */
#define PREFETCH_AHEAD 1024
/* Weight rows per decode tile, each from its own stream: 8 streams a thread, as the vector path's
 * decode tiles, keep the most misses in flight (a whole tile's 16 were slower). */
#define DECODE_ROWS 8

int col_amx_handles(uint32_t dtype)
{
    return dtype == COL_DTYPE_BF16;
}

static uint64_t blocks(uint64_t cols)
{
    return (cols + KB - 1) / KB;
}

/* How a product's activations sit in the tiles: bf16 parts per token (three, or one when every
 * activation is a bf16 value already), the bytes of one token's parts of one column pair, and the
 * tokens of one activation tile (5 x 3 or 16 x 1 of its 16 columns). */
typedef struct amx_layout {
    uint32_t parts, pair_bytes, group;
} amx_layout;

static amx_layout layout_of(int x_bf16)
{
    amx_layout l = {x_bf16 ? 1 : 3, x_bf16 ? 4 : 12, x_bf16 ? 16 : 5};
    return l;
}

/* Bytes between the rows of an activation tile: a product of one token group (decode) packs its
 * parts compactly, pair_bytes per token, so a narrow tile load reads only them; batches give each
 * row a whole 64 bytes (unused columns included), since rows 60 bytes apart straddle cache lines. */
static uint64_t b_row_bytes(uint32_t n_tokens, amx_layout l)
{
    return n_tokens <= l.group ? (uint64_t)l.pair_bytes * n_tokens : 64;
}

/* Bytes of the packed activations before the 64 of slack. */
static uint64_t packed_data_bytes(uint32_t n_tokens, uint64_t cols, amx_layout l)
{
    const uint64_t groups = (n_tokens + l.group - 1) / l.group;
    return n_tokens <= l.group ? b_row_bytes(n_tokens, l) * blocks(cols) * ROWS : groups * blocks(cols) * TILE_BYTES;
}

uint64_t col_amx_packed_bytes(uint32_t n_tokens, uint64_t cols, int x_bf16)
{
    return packed_data_bytes(n_tokens, cols, layout_of(x_bf16)) + 64;
}

/* Batches over rows of more than CHUNK_BLOCKS blocks walk them a chunk of blocks at a time, up to
 * CHUNK_ROW_BLOCKS blocks of 32 rows together, saving their C tiles between chunks (rows_amx). */
#define CHUNK_BLOCKS 32u
#define CHUNK_ROW_BLOCKS 8u

/* Bytes of saved C tiles one 32-row block needs for a batch of n_tokens: 4 tiles per pair of token
 * groups. */
static uint64_t chunk_carry_bytes(uint32_t n_tokens, amx_layout l)
{
    const uint64_t n_groups = (n_tokens + l.group - 1) / l.group;
    return (n_groups + 1) / 2 * 4 * TILE_BYTES;
}

uint64_t col_amx_stage_bytes(uint64_t max_cols, uint32_t max_tokens)
{
    const uint64_t staged = 2 * blocks(max_cols) * TILE_BYTES; /* two row groups */
    const uint64_t saved_c = CHUNK_ROW_BLOCKS * chunk_carry_bytes(max_tokens, layout_of(0)); /* three parts: most groups */
    uint64_t bytes = blocks(max_cols) > CHUNK_BLOCKS && saved_c > staged ? saved_c : staged;
    return bytes > col_amx_int8_stage_bytes(max_cols) ? bytes : col_amx_int8_stage_bytes(max_cols);
}

/* q8_0/q4_0 on AMX-INT8: bytes of one staged block of 16 weight rows (16 f32 scales, then 512
 * bytes of B tiles), and how far ahead of its loads the staging prefetches a stored panel. */
#define AMX_I8_BLOCK 576
#define AMX_I8_AHEAD 256
/* Blocks between a block's tile multiplies and the vector code that adds its sums: the sums of 3
 * blocks wait in memory, so the tile unit runs that far ahead (performance.md, "AMX-INT8 sums'
 * lag"). */
#define AMX_I8_LAG 3
/* q8_0x8 batches of up to this many tokens load the weights' tiles straight from the stored panels
 * (8 rows a tile, twice the tile multiplies of staged 16-row tiles, no staging): short batches
 * do not pay the staging back (performance.md, "AMX-INT8 direct tiles"). */
#ifndef AMX_I8_DIRECT_TOKENS
#define AMX_I8_DIRECT_TOKENS 32
#endif

uint64_t col_amx_int8_stage_bytes(uint64_t cols)
{
    return 2 * (cols / QK) * AMX_I8_BLOCK + 32 * 32 * sizeof(float);
}

#if defined(__x86_64__) && defined(__linux__)
#include <cpuid.h>
#include <immintrin.h>
#include <sys/syscall.h>
#include <unistd.h>

#define ARCH_REQ_XCOMP_PERM 0x1023
#define XFEATURE_XTILEDATA 18

/* Tokens in activation group g of a product of nt tokens, and where the group starts. */
static uint32_t group_tokens(uint32_t nt, uint32_t g, amx_layout l)
{
    return nt - g * l.group < l.group ? nt - g * l.group : l.group;
}
static uint64_t group_offset(uint32_t g, uint64_t n_blocks)
{
    return (uint64_t)g * n_blocks * TILE_BYTES; /* group 0 starts at 0 in either layout */
}

int col_amx_enable(void)
{
    unsigned a, b, c, d;
    if (!__get_cpuid_count(7, 0, &a, &b, &c, &d)) return 0;
    int tile = (d >> 24) & 1, tile_bf16 = (d >> 22) & 1;
    if (!tile || !tile_bf16 || a < 1) return 0;
    __get_cpuid_count(7, 1, &a, &b, &c, &d);
    if (!((a >> 5) & 1)) return 0; /* AVX512-BF16: splitting into bf16 parts */
    return syscall(SYS_arch_prctl, ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA) == 0;
}

#define COL_AMX_T __attribute__((target("avx512f,avx512bw,avx512vl,avx512bf16,amx-tile,amx-bf16")))
#define COL_AMX_INLINE static inline __attribute__((always_inline))
/* GCC's _tile_loadd does not tell the compiler that it reads memory, so stores a tile load reads
 * (the staging) end in this barrier: inlined, they could otherwise be moved after the load. */
#define TILE_SOURCES_WRITTEN() __asm__ volatile("" ::: "memory")

/* Palette 1, all eight tiles 16 rows x 64 bytes. One row group (run_group): tile 0 the weights
 * (A), 1 the activations (B), 4 the sums (C). Two row groups against two token groups
 * (run_rows_batch): 0-1 weights, 2-3 activations, 4-7 sums. */
typedef struct tile_config {
    uint8_t palette, start_row;
    uint8_t reserved[14];
    uint16_t colsb[16];
    uint8_t rows[16];
} tile_config;
_Static_assert(sizeof(tile_config) == 64, "LDTILECFG reads 64 bytes");
static const tile_config config = {1, 0, {0}, {64, 64, 64, 64, 64, 64, 64, 64}, {16, 16, 16, 16, 16, 16, 16, 16}};

/* The configuration for a product of n_tokens: a product of one token group (decode, and
 * batches of up to l.group tokens, all in run_group) narrows its activation and sum tiles (1 and
 * 4) to the group's parts x n_g columns, so a tile load reads the pair_bytes x n_g bytes of each
 * column pair instead of 64. Each sum is computed alone, whatever the tile's width (the tests
 * hold a step to a prefill block's bits, whose tiles are 16 columns wide). */
static tile_config config_for(uint32_t n_tokens, amx_layout l)
{
    tile_config c = config;
    if (n_tokens <= l.group) c.colsb[1] = c.colsb[4] = (uint16_t)(l.pair_bytes * n_tokens);
    if (n_tokens == 1) c.rows[0] = c.rows[4] = DECODE_ROWS; /* decode: tiles of DECODE_ROWS rows */
    return c;
}

COL_AMX_INLINE COL_AMX_T __m512 bf16_low_f32(__m512i v) /* elements 0..15 of 32 bf16 */
{
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm512_castsi512_si256(v)), 16));
}
COL_AMX_INLINE COL_AMX_T __m512 bf16_high_f32(__m512i v) /* elements 16..31 */
{
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm512_extracti64x4_epi64(v, 1)), 16));
}
COL_AMX_INLINE COL_AMX_T __m512i to_bf16(__m512 lo16, __m512 hi16)
{
    return (__m512i)_mm512_cvtne2ps_pbh(hi16, lo16);
}

/* 32 values (v0: 0..15, v1: 16..31) as bf16 parts, each rounded to nearest from what the earlier
 * parts left: v = hi + mid + lo up to the last bit of an f32. */
COL_AMX_INLINE COL_AMX_T void split3(__m512 v0, __m512 v1, __m512i *hi, __m512i *mid, __m512i *lo)
{
    *hi = to_bf16(v0, v1);
    v0 = _mm512_sub_ps(v0, bf16_low_f32(*hi));
    v1 = _mm512_sub_ps(v1, bf16_high_f32(*hi));
    *mid = to_bf16(v0, v1);
    v0 = _mm512_sub_ps(v0, bf16_low_f32(*mid));
    v1 = _mm512_sub_ps(v1, bf16_high_f32(*mid));
    *lo = to_bf16(v0, v1);
}

/* The columns of block kb that exist: min(32, cols - 32 kb) low bits set. */
COL_AMX_INLINE __mmask32 block_mask(uint64_t cols, uint64_t kb)
{
    uint64_t n = cols - kb * KB;
    return n >= KB ? (__mmask32)0xFFFFFFFFu : (__mmask32)((1u << n) - 1u);
}

static COL_AMX_T void pack_amx(const float *x, uint32_t n_tokens, uint64_t cols, amx_layout l, uint32_t t0,
                                uint32_t t1, uint8_t *out)
{
    const uint64_t n_blocks = blocks(cols);
    const __m512i pair_index = _mm512_set_epi32(15, 14, 13, 12, 11, 10, 9, 8, 7, 6, 5, 4, 3, 2, 1, 0);
    const uint64_t row = b_row_bytes(n_tokens, l);
    /* word (pair p, token tt, part) sits at p * row / 4 + parts * tt + part words into the block */
    const __m512i index = _mm512_mullo_epi32(pair_index, _mm512_set1_epi32((int)(row / 4)));
    for (uint32_t t = t0; t < t1; t++) {
        uint32_t g = t / l.group, tt = t % l.group;
        uint8_t *group = out + group_offset(g, n_blocks) + (uint64_t)tt * l.pair_bytes;
        const float *xt = x + (uint64_t)t * cols;
        for (uint64_t kb = 0; kb < n_blocks; kb++) {
            __mmask32 m = block_mask(cols, kb);
            __m512 v0 = _mm512_maskz_loadu_ps((__mmask16)m, xt + kb * KB);
            __m512 v1 = _mm512_maskz_loadu_ps((__mmask16)(m >> 16), xt + kb * KB + 16);
            uint8_t *block = group + kb * ROWS * row;
            if (l.parts == 1) { /* bf16 values already: the conversion is exact */
                _mm512_i32scatter_epi32(block, index, to_bf16(v0, v1), 4);
                continue;
            }
            __m512i hi, mid, lo;
            split3(v0, v1, &hi, &mid, &lo);
            _mm512_i32scatter_epi32(block, index, hi, 4);
            _mm512_i32scatter_epi32(block + 4, index, mid, 4);
            _mm512_i32scatter_epi32(block + 8, index, lo, 4);
        }
    }
    if (t1 == n_tokens) memset(out + packed_data_bytes(n_tokens, cols, l), 0, 64);
}

void col_amx_pack(const float *x, uint32_t n_tokens, uint64_t cols, int x_bf16, uint32_t t0, uint32_t t1,
                  uint8_t *out)
{
    pack_amx(x, n_tokens, cols, layout_of(x_bf16), t0, t1, out);
}

/* 16 weight rows read with one stride; tile row m is output row first + m * step. */
typedef struct row_group {
    const uint8_t *base;
    uint64_t stride;
    uint64_t first, step;
    uint32_t n_rows; /* 1..16: tile rows past it are zero */
} row_group;

/* Block kb of the group's rows as a contiguous tile at dst: zero past the group's rows and past
 * the last column. */
static COL_AMX_T void stage_block(const row_group *g, uint64_t cols, uint64_t kb, int prefetch, uint8_t *dst)
{
    const __mmask32 m = block_mask(cols, kb);
    for (uint32_t r = 0; r < ROWS; r++) {
        __m512i v = _mm512_setzero_si512();
        if (r < g->n_rows) {
            const uint8_t *p = g->base + r * g->stride + kb * KB * 2;
            if (prefetch) _mm_prefetch((const char *)p + PREFETCH_AHEAD, _MM_HINT_T0);
            v = _mm512_maskz_loadu_epi16(m, p);
        }
        _mm512_store_si512((void *)(dst + r * 64), v);
    }
    TILE_SOURCES_WRITTEN();
}

/* Where the activation tile of token group g, block kb starts, and its row stride. */
#define B_TILE(g, kb) (packed + group_offset((g), n_blocks) + (kb) * ROWS * b_row_bytes(nt, l))
#define B_STRIDE ((long)b_row_bytes(nt, l))

/* Output of tile row r, token tt of a C tile stored at c: its three parts, (hi + mid) + lo. A
 * whole group of neighbouring rows is one vector per token (the same additions, 16 at a time).
 * With one part the output is hi + 0, the additions three parts make when mid and lo are zero
 * (their sums are +0), so the two layouts agree to the bit, signed zeros included. */
static COL_AMX_T void store_outputs(const col_matvec_job *j, amx_layout l, const row_group *g, uint32_t group,
                                    const float *c)
{
    const __m512i rows = _mm512_mullo_epi32(_mm512_set_epi32(15, 14, 13, 12, 11, 10, 9, 8, 7, 6, 5, 4, 3, 2, 1, 0),
                                            _mm512_set1_epi32(16));
    const __m512 zero = _mm512_setzero_ps();
    for (uint32_t tt = 0; tt < group_tokens(j->n_tokens, group, l); tt++) {
        float *y = j->y + (uint64_t)(group * l.group + tt) * j->w.rows + g->first;
        const float *s = c + l.parts * tt;
        if (g->n_rows == ROWS && g->step == 1) {
            __m512 hi = _mm512_i32gather_ps(rows, s, 4);
            if (l.parts == 1) {
                _mm512_storeu_ps(y, _mm512_add_ps(hi, zero));
                continue;
            }
            __m512 sum = _mm512_add_ps(hi, _mm512_i32gather_ps(rows, s + 1, 4));
            _mm512_storeu_ps(y, _mm512_add_ps(sum, _mm512_i32gather_ps(rows, s + 2, 4)));
            continue;
        }
        for (uint32_t r = 0; r < g->n_rows; r++) {
            const float *sr = s + r * 16;
            y[r * g->step] = l.parts == 1 ? sr[0] + 0.0f : (sr[0] + sr[1]) + sr[2];
        }
    }
}

/* The 2 x 2 C tiles (4..7) of a batch's row groups g[0], g[1] (only when two_a) and token groups
 * g0, g0 + 1 (only when two_b) into the outputs. */
static COL_AMX_T void store_pair_outputs(const col_matvec_job *j, amx_layout l, const row_group *g, uint32_t g0,
                                         int two_a, int two_b)
{
    float c[4][ROWS * 16] __attribute__((aligned(64)));
    _tile_stored(4, c[0], 64);
    _tile_stored(5, c[1], 64);
    _tile_stored(6, c[2], 64);
    _tile_stored(7, c[3], 64);
    store_outputs(j, l, &g[0], g0, c[0]);
    if (two_b) store_outputs(j, l, &g[0], g0 + 1, c[1]);
    if (two_a) store_outputs(j, l, &g[1], g0, c[2]);
    if (two_a && two_b) store_outputs(j, l, &g[1], g0 + 1, c[3]);
}

/* One row group against every token of a product of at most one token group (decode, and batches
 * of up to l.group tokens), block by block: whole groups straight from the weights, the rest
 * staged. */
static COL_AMX_T void run_group(const col_matvec_job *j, amx_layout l, const row_group *g, const uint8_t *packed,
                                uint8_t *stage)
{
    const uint32_t nt = j->n_tokens;
    const uint64_t cols = j->w.cols, n_blocks = blocks(cols);
    const int decode = nt == 1, direct = g->n_rows == (decode ? DECODE_ROWS : ROWS) && cols % KB == 0;
    float c[ROWS * 16] __attribute__((aligned(64)));
    _tile_zero(4);
    for (uint64_t kb = 0; kb < n_blocks; kb++) {
        _tile_loadd(1, B_TILE(0, kb), B_STRIDE);
        if (direct) {
            const uint8_t *a = g->base + kb * 64;
            if (decode)
                for (uint32_t r = 0; r < DECODE_ROWS; r++) _mm_prefetch((const char *)a + r * g->stride + PREFETCH_AHEAD, _MM_HINT_T0);
            _tile_loadd(0, a, (long)g->stride);
        } else {
            stage_block(g, cols, kb, decode, stage);
            _tile_loadd(0, stage, 64);
        }
        _tile_dpbf16ps(4, 0, 1);
    }
    _tile_stored(4, c, 64);
    store_outputs(j, l, g, 0, c);
}

/* Decode's groups of whole rows of whole blocks, rows [r0, r0 + DECODE_ROWS q): group i takes rows
 * r0 + i + kq (k < DECODE_ROWS), so DECODE_ROWS streams each read front to back over the groups.
 * run_group's operations in a loop of their own: run_group's, which also stages rows, branched on
 * its cases and reloaded the group's base and stride every block (performance.md, "AMX decode
 * loop"). */
static COL_AMX_T void run_decode(const col_matvec_job *j, amx_layout l, uint64_t r0, uint64_t q, const uint8_t *packed)
{
    const uint32_t nt = 1;
    const uint64_t n_blocks = blocks(j->w.cols), rb = col_dtype_row_bytes(j->w.dtype, j->w.cols);
    const long stride = (long)(q * rb);
    float c[ROWS * 16] __attribute__((aligned(64)));
    for (uint64_t i = 0; i < q; i++) {
        const uint8_t *a = (const uint8_t *)j->w.data + (r0 + i) * rb;
        _tile_zero(4);
        for (uint64_t kb = 0; kb < n_blocks; kb++, a += 64) {
            _tile_loadd(1, B_TILE(0, kb), B_STRIDE);
            for (uint32_t r = 0; r < DECODE_ROWS; r++) _mm_prefetch((const char *)a + r * stride + PREFETCH_AHEAD, _MM_HINT_T0);
            _tile_loadd(0, a, stride);
            _tile_dpbf16ps(4, 0, 1);
        }
        _tile_stored(4, c, 64);
        const row_group g = {NULL, 0, r0 + i, q, DECODE_ROWS};
        store_outputs(j, l, &g, 0, c);
    }
}

/* Up to 32 neighbouring rows (two row groups) against a batch of two or more token groups: each
 * pair of token groups runs over the rows with 2 x 2 C tiles. 32 whole rows are loaded straight
 * from the weights (staging them as contiguous tiles first costs more than it saves); fewer
 * rows, or rows ending in a partial block, are staged once, zero padded. Each load is issued as
 * soon as the tile it overwrites has been read, so it overlaps the multiplies still running.
 * Blocks run in the same order as in run_group, so every output gets the same operations. */
static COL_AMX_T void run_rows_batch(const col_matvec_job *j, amx_layout l, uint64_t r, uint64_t n,
                                     const uint8_t *packed, uint8_t *stage)
{
    const uint32_t nt = j->n_tokens, n_groups = (nt + l.group - 1) / l.group;
    const uint64_t cols = j->w.cols, n_blocks = blocks(cols), rb = col_dtype_row_bytes(j->w.dtype, cols);
    const int two_a = n > ROWS;
    row_group g[2];
    const uint8_t *a[2] = {stage, stage + n_blocks * TILE_BYTES};
    const int direct = n == 2 * ROWS && cols % KB == 0; /* else staged, zero padded */
    const long a_stride = direct ? (long)rb : 64;
    const uint64_t a_step = direct ? 64 : TILE_BYTES;
    for (int i = 0; i <= two_a; i++) {
        uint64_t first = r + (uint64_t)i * ROWS;
        row_group gi = {(const uint8_t *)j->w.data + first * rb, rb, first, 1,
                        (uint32_t)(r + n - first < ROWS ? r + n - first : ROWS)};
        g[i] = gi;
        if (direct)
            a[i] = gi.base;
        else
            for (uint64_t kb = 0; kb < n_blocks; kb++) stage_block(&g[i], cols, kb, 0, stage + (i * n_blocks + kb) * TILE_BYTES);
    }
    /* The next 32 rows (one contiguous run of bytes) into L2, a slice per block over all the token
     * groups' passes (not all in the first: that competes with its loads), so the next call's first
     * pass does not wait for memory. */
    const uint8_t *next = (const uint8_t *)j->w.data + (r + n) * rb;
    const uint64_t next_lines = (r + n + 2 * ROWS <= j->w.rows ? 2 * ROWS : j->w.rows - (r + n)) * rb / 64;
    const uint64_t passes = (n_groups + 1) / 2, per_block = (next_lines + passes * n_blocks - 1) / (passes * n_blocks);
    uint64_t line = 0;
    for (uint32_t g0 = 0; g0 < n_groups; g0 += 2) {
        const int two_b = g0 + 1 < n_groups;
        _tile_zero(4);
        _tile_zero(5);
        _tile_zero(6);
        _tile_zero(7);
        _tile_loadd(0, a[0], a_stride);
        if (two_a) _tile_loadd(1, a[1], a_stride);
        _tile_loadd(2, B_TILE(g0, 0), B_STRIDE);
        if (two_b) _tile_loadd(3, B_TILE(g0 + 1, 0), B_STRIDE);
        for (uint64_t kb = 0; kb < n_blocks; kb++) {
            const int more = kb + 1 < n_blocks;
            _tile_dpbf16ps(4, 0, 2);
            if (two_b) _tile_dpbf16ps(5, 0, 3);
            if (more) _tile_loadd(0, a[0] + (kb + 1) * a_step, a_stride);
            if (two_a) _tile_dpbf16ps(6, 1, 2);
            if (more) _tile_loadd(2, B_TILE(g0, kb + 1), B_STRIDE);
            if (two_a && two_b) _tile_dpbf16ps(7, 1, 3);
            if (more && two_a) _tile_loadd(1, a[1] + (kb + 1) * a_step, a_stride);
            if (more && two_b) _tile_loadd(3, B_TILE(g0 + 1, kb + 1), B_STRIDE);
            for (uint64_t end = line + per_block; line < end && line < next_lines; line++)
                _mm_prefetch((const char *)next + line * 64, _MM_HINT_T1);
        }
        store_pair_outputs(j, l, g, g0, two_a, two_b);
    }
}

/* Batches over long rows. run_rows_batch walks all of a row's blocks for each pair of token
 * groups, so each 32-row block streamed every token's packed columns through L2 again: 11 MiB at
 * 14336 columns and 128 tokens (three parts), from L3. Rows of more than CHUNK_BLOCKS blocks are
 * instead walked a chunk of blocks at a time, up to CHUNK_ROW_BLOCKS 32-row blocks per chunk,
 * so a chunk's packed columns (128 tokens x 1024 columns: 768 KiB) serve all of them from L2; the
 * C tiles are saved between chunks in the thread's staging. Chunking without several row blocks
 * together saves no traffic. (CHUNK_BLOCKS, CHUNK_ROW_BLOCKS, chunk_carry_bytes: above.) */
/* 32 neighbouring whole rows (r.., their blocks whole) against every token group of a batch, blocks
 * [kb0, kb1) only: the C tiles of each pair of token groups start from zero (kb0 = 0) or from
 * `carry` (4 tiles per pair), and end in `carry` or, after the last block, in the outputs. The
 * tile unit's sums are saved and reloaded exactly, so every output gets run_rows_batch's
 * operations. */
static COL_AMX_T void run_rows_chunk(const col_matvec_job *j, amx_layout l, uint64_t r, const uint8_t *packed,
                                     uint64_t kb0, uint64_t kb1, float *carry)
{
    const uint32_t nt = j->n_tokens, n_groups = (nt + l.group - 1) / l.group;
    const uint64_t cols = j->w.cols, n_blocks = blocks(cols), rb = col_dtype_row_bytes(j->w.dtype, cols);
    const uint8_t *a0 = (const uint8_t *)j->w.data + r * rb, *a1 = a0 + ROWS * rb;
    const row_group g[2] = {{a0, rb, r, 1, ROWS}, {a1, rb, r + ROWS, 1, ROWS}};
    for (uint32_t g0 = 0; g0 < n_groups; g0 += 2) {
        const int two_b = g0 + 1 < n_groups;
        float *cc = carry + (uint64_t)(g0 / 2) * 4 * ROWS * 16;
        if (kb0 == 0) {
            _tile_zero(4);
            _tile_zero(5);
            _tile_zero(6);
            _tile_zero(7);
        } else {
            _tile_loadd(4, cc, 64);
            _tile_loadd(5, cc + ROWS * 16, 64);
            _tile_loadd(6, cc + 2 * ROWS * 16, 64);
            _tile_loadd(7, cc + 3 * ROWS * 16, 64);
        }
        _tile_loadd(0, a0 + kb0 * 64, (long)rb);
        _tile_loadd(1, a1 + kb0 * 64, (long)rb);
        _tile_loadd(2, B_TILE(g0, kb0), B_STRIDE);
        if (two_b) _tile_loadd(3, B_TILE(g0 + 1, kb0), B_STRIDE);
        for (uint64_t kb = kb0; kb < kb1; kb++) {
            const int more = kb + 1 < kb1;
            _tile_dpbf16ps(4, 0, 2);
            if (two_b) _tile_dpbf16ps(5, 0, 3);
            if (more) _tile_loadd(0, a0 + (kb + 1) * 64, (long)rb);
            _tile_dpbf16ps(6, 1, 2);
            if (more) _tile_loadd(2, B_TILE(g0, kb + 1), B_STRIDE);
            if (two_b) _tile_dpbf16ps(7, 1, 3);
            if (more) _tile_loadd(1, a1 + (kb + 1) * 64, (long)rb);
            if (more && two_b) _tile_loadd(3, B_TILE(g0 + 1, kb + 1), B_STRIDE);
        }
        if (kb1 < n_blocks) {
            _tile_stored(4, cc, 64);
            _tile_stored(5, cc + ROWS * 16, 64);
            _tile_stored(6, cc + 2 * ROWS * 16, 64);
            _tile_stored(7, cc + 3 * ROWS * 16, 64);
            continue;
        }
        store_pair_outputs(j, l, g, g0, 1, two_b);
    }
}

static COL_AMX_T void rows_amx(const col_matvec_job *j, amx_layout l, const uint8_t *packed, uint8_t *stage,
                                uint64_t stage_bytes, uint64_t r0, uint64_t r1)
{
    const tile_config c = config_for(j->n_tokens, l);
    _tile_loadconfig(&c);
    const uint64_t rb = col_dtype_row_bytes(j->w.dtype, j->w.cols);
    const uint8_t *data = j->w.data;
    uint64_t r = r0;
    if (j->n_tokens > l.group) {
        /* long whole rows: up to CHUNK_ROW_BLOCKS 32-row blocks walk each chunk of blocks together */
        const uint64_t n_blocks = blocks(j->w.cols), per_block = chunk_carry_bytes(j->n_tokens, l);
        uint64_t fit = stage_bytes / per_block;
        if (fit > CHUNK_ROW_BLOCKS) fit = CHUNK_ROW_BLOCKS;
        if (j->w.cols % KB == 0 && n_blocks > CHUNK_BLOCKS)
            while (fit > 0 && r + 2 * ROWS <= r1) {
                const uint64_t nb = (r1 - r) / (2 * ROWS) < fit ? (r1 - r) / (2 * ROWS) : fit;
                for (uint64_t kb0 = 0; kb0 < n_blocks; kb0 += CHUNK_BLOCKS) {
                    const uint64_t kb1 = n_blocks - kb0 < CHUNK_BLOCKS ? n_blocks : kb0 + CHUNK_BLOCKS;
                    for (uint64_t b = 0; b < nb; b++)
                        run_rows_chunk(j, l, r + b * 2 * ROWS, packed, kb0, kb1, (float *)(void *)(stage + b * per_block));
                }
                r += nb * 2 * ROWS;
            }
        for (; r < r1; r += 2 * ROWS) run_rows_batch(j, l, r, r1 - r < 2 * ROWS ? r1 - r : 2 * ROWS, packed, stage);
    } else if (j->n_tokens == 1 && j->w.cols % KB == 0 && r1 - r0 >= DECODE_ROWS) {
        /* one token: DECODE_ROWS distant rows per tile (as many streams through memory), then the
         * rows left over, staged */
        const uint64_t q = (r1 - r0) / DECODE_ROWS, left = (r1 - r0) % DECODE_ROWS;
        run_decode(j, l, r0, q, packed);
        if (left) {
            row_group g = {data + (r1 - left) * rb, rb, r1 - left, 1, (uint32_t)left};
            run_group(j, l, &g, packed, stage);
        }
    } else {
        /* one token (partial blocks, or fewer than DECODE_ROWS rows): DECODE_ROWS distant rows per
         * tile; a few tokens: 16 neighbours */
        const uint32_t tile_rows = j->n_tokens == 1 ? DECODE_ROWS : ROWS;
        const uint64_t q = j->n_tokens == 1 ? (r1 - r0) / tile_rows : 1;
        const uint64_t n_full = j->n_tokens == 1 ? q : (r1 - r0) / ROWS;
        for (uint64_t i = 0; i < n_full; i++) {
            uint64_t first = j->n_tokens == 1 ? r0 + i : r0 + i * ROWS;
            row_group g = {data + first * rb, q * rb, first, q, tile_rows};
            run_group(j, l, &g, packed, stage);
        }
        r = r0 + n_full * tile_rows;
        if (r < r1) {
            row_group g = {data + r * rb, rb, r, 1, (uint32_t)(r1 - r)};
            run_group(j, l, &g, packed, stage);
        }
    }
    _tile_release();
}

uint64_t col_amx_tile_rows(uint32_t n_tokens, int x_bf16)
{
    return n_tokens == 1 ? 1 : n_tokens > layout_of(x_bf16).group ? 2 * ROWS : ROWS;
}

void col_amx_rows(const col_matvec_job *j, int x_bf16, const uint8_t *packed, uint8_t *stage, uint64_t stage_bytes,
                  uint64_t r0, uint64_t r1)
{
    rows_amx(j, layout_of(x_bf16), packed, stage, stage_bytes, r0, r1);
}

/* ---- q8_0 and q4_0 on AMX-INT8 ----------------------------------------------------------------
 *
 * One tile multiply (TDPBSSD) adds A[16 x 32] . B[32 x 16] int8 into C[16 x 16] int32, 4 bytes a
 * column along the 32. K = 32 is one block (each block has its own scales, so no multiply spans
 * two): A is 16 tokens' activations of the block, straight from their quantised rows (q4_0, whose
 * rows keep a block's low and high 16 values apart: two multiplies of K = 16); B is 16 weight
 * rows' block, 4-byte group g of row n at row g, column n: a stored q8_0x8 panel's block holds
 * exactly that for 8 rows, so two panels side by side make the tile, copied per 32 rows into the
 * thread's staging with the scales as f32 (q4_0: the nibbles minus 8; rows: gathered).
 *
 * A unit is 32 tokens x 32 rows, 2 x 2 tiles a block (two token groups, two 16-row panels); a
 * batch's last tokens make a unit of one or two shorter groups (tiles configured as tall). Each
 * block's four C tiles go to memory and the vector code adds them to the unit's accumulators,
 * (float)isum times d_w * d_x, AMX_I8_LAG blocks behind the tile unit; its loads of a block's
 * sums come before the next tile stores in program order (a load behind a store to the same
 * address mod 4 KiB waits for it, and each block's four tiles cover all 4 KiB). The next unit's
 * weights are prefetched into L2 a slice per block. The tile stores and that addition (a convert,
 * a multiply and an FMA per 16 outputs per block) bound the unit, not the tile multiplies.
 *
 * q8_0x8 batches of up to AMX_I8_DIRECT_TOKENS tokens skip the staging, a floor that few tokens do
 * not pay back: their B tiles are the stored panels' blocks as they lie (8 rows x 32 bytes), so
 * a unit is 32 tokens x 16 rows, and a token group's two C tiles (8 columns each) are stored side
 * by side as one 16-row image, the same addition after it.
 */

#define COL_AMX_I8 __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,f16c,amx-tile,amx-int8")))

/* AMX-INT8 (TDPBSSD) beside the tile state col_amx_enable asked for: CPUID leaf 7 EDX bit 25.
 * Asked once; a race only asks twice. */
static int has_amx_int8(void)
{
    static _Atomic int known = -1;
    int v = atomic_load_explicit(&known, memory_order_relaxed);
    if (v < 0) {
        unsigned a, b, c, d;
        v = __get_cpuid_count(7, 0, &a, &b, &c, &d) && ((d >> 25) & 1) && ((d >> 24) & 1);
        atomic_store_explicit(&known, v, memory_order_relaxed);
    }
    return v;
}

int col_amx_int8_runs(const col_matvec_job *j, uint64_t stage_bytes)
{
    const uint32_t least = col_block_kind(j->w.dtype) == COL_DTYPE_Q4_0 ? COL_AMX_INT8_MIN_TOKENS_Q4
                         : is_panel_dtype(j->w.dtype)                   ? COL_AMX_INT8_MIN_TOKENS_Q8
                                                                        : COL_AMX_INT8_MIN_TOKENS_Q8_ROWS;
    return is_block_dtype(j->w.dtype) && j->n_tokens >= least &&
           stage_bytes >= col_amx_int8_stage_bytes(j->w.cols) && has_amx_int8();
}

/* Blocks [0, nb) of weight rows pr .. pr + nr - 1 (nr <= 16; lanes past nr repeat row pr) staged
 * as AMX_I8_BLOCK bytes a block: the 16 rows' scales as f32, then the B tile(s): row g holds each
 * weight row's 4-byte group g in its lane (a column of the tile). q8_0: 8 rows of the int8 values;
 * q4_0: 4 rows of the low nibbles minus 8, then 4 of the high ones, as int8. From stored panels
 * two 32-byte loads make a tile row; from rows, a 32-bit gather over the 16 rows. */
static COL_AMX_I8 void stage_int8(const col_weight *w, uint64_t pr, uint32_t nr, uint8_t *stage)
{
    const int q4 = col_block_kind(w->dtype) == COL_DTYPE_Q4_0, groups = q4 ? 4 : 8;
    const uint64_t nb = w->cols / QK, rb = col_dtype_row_bytes(w->dtype, w->cols);
    const uint8_t *first = (const uint8_t *)w->data + pr * rb;
    const __m512i low4 = _mm512_set1_epi8(0x0F), eight = _mm512_set1_epi8(8);
    if (is_panel_dtype(w->dtype)) {
        const uint8_t *second = nr > COL_STORED_PANEL_ROWS ? first + COL_STORED_PANEL_ROWS * rb : first;
        const uint64_t bb = q4 ? 128 : 256; /* payload bytes of a stored panel's block */
        for (uint64_t k = 0; k < nb; k++) {
            uint8_t *dst = stage + k * AMX_I8_BLOCK;
            const __m128i s0 = _mm_loadu_si128((const __m128i *)(const void *)(first + 16 * k));
            const __m128i s1 = _mm_loadu_si128((const __m128i *)(const void *)(second + 16 * k));
            _mm512_store_ps((void *)dst, _mm512_cvtph_ps(_mm256_inserti128_si256(_mm256_castsi128_si256(s0), s1, 1)));
            const uint8_t *p0 = first + 16 * nb + bb * k, *p1 = second + 16 * nb + bb * k;
            _mm_prefetch((const char *)(p0 + AMX_I8_AHEAD), _MM_HINT_T0);
            _mm_prefetch((const char *)(p1 + AMX_I8_AHEAD), _MM_HINT_T0);
            for (int g = 0; g < groups; g++) {
                const __m256i lo = _mm256_loadu_si256((const __m256i *)(const void *)(p0 + 32 * g));
                const __m256i hi = _mm256_loadu_si256((const __m256i *)(const void *)(p1 + 32 * g));
                const __m512i v = _mm512_inserti64x4(_mm512_castsi256_si512(lo), hi, 1);
                if (!q4) {
                    _mm512_store_si512((void *)(dst + 64 + 64 * g), v);
                    continue;
                }
                _mm512_store_si512((void *)(dst + 64 + 64 * g), _mm512_sub_epi8(_mm512_and_si512(v, low4), eight));
                _mm512_store_si512((void *)(dst + 320 + 64 * g),
                                   _mm512_sub_epi8(_mm512_and_si512(_mm512_srli_epi16(v, 4), low4), eight));
            }
        }
        TILE_SOURCES_WRITTEN();
        return;
    }
    int32_t off[16];
    for (uint32_t r = 0; r < 16; r++) off[r] = (int32_t)((r < nr ? r : 0) * rb);
    const __m512i offs = _mm512_loadu_si512((const void *)off);
    const uint64_t pb = q4 ? 16 : QK; /* payload bytes of a row's block */
    for (uint64_t k = 0; k < nb; k++) {
        uint8_t *dst = stage + k * AMX_I8_BLOCK;
        /* 4 bytes at the scale: inside the row even for the last block (its payload follows) */
        const __m512i s = _mm512_i32gather_epi32(offs, (const void *)(first + 2 * k), 1);
        _mm512_store_ps((void *)dst, _mm512_cvtph_ps(_mm512_cvtepi32_epi16(s)));
        for (int g = 0; g < groups; g++) {
            const __m512i v = _mm512_i32gather_epi32(offs, (const void *)(first + 2 * nb + pb * k + 4 * (uint64_t)g), 1);
            if (!q4) {
                _mm512_store_si512((void *)(dst + 64 + 64 * g), v);
                continue;
            }
            _mm512_store_si512((void *)(dst + 64 + 64 * g), _mm512_sub_epi8(_mm512_and_si512(v, low4), eight));
            _mm512_store_si512((void *)(dst + 320 + 64 * g), _mm512_sub_epi8(_mm512_and_si512(_mm512_srli_epi16(v, 4), low4), eight));
        }
    }
    TILE_SOURCES_WRITTEN();
}

/* Accumulators of a unit (32 tokens x 32 rows, f32) in the thread's staging after the two panels. */
#define UNIT_ACC(stage, nb) ((float *)(void *)((stage) + 2 * (nb) * AMX_I8_BLOCK))

/* The int32 sums of one block of m tokens x 16 rows (at c, 16 a token) into their accumulators
 * (acc, 32 floats a token), the definition's step: acc = fma((float)isum, d_w * d_x, acc), d_w * d_x
 * one multiply. */
COL_AMX_INLINE COL_AMX_I8 void add_block(const int32_t *c, const uint8_t *panel, const uint8_t *xq, uint64_t qb,
                                         uint64_t cols, uint64_t k, uint32_t m, float *acc)
{
    const __m512 dw = _mm512_load_ps((const void *)(panel + k * AMX_I8_BLOCK));
    for (uint32_t t = 0; t < m; t++) {
        const float dx = ((const float *)(const void *)(xq + t * qb + cols))[k];
        const __m512 isum = _mm512_cvtepi32_ps(_mm512_load_si512((const void *)(c + 16 * t)));
        _mm512_store_ps(acc + 32 * t, _mm512_fmadd_ps(isum, _mm512_mul_ps(dw, _mm512_set1_ps(dx)), _mm512_load_ps(acc + 32 * t)));
    }
}

/* Palette 1 for a unit of token groups of m0 and m1 tokens (m1 0: one group). Tiles 0 and 1 the
 * groups' activations of a block (q8_0: 32 bytes a token; q4_0: 16, its low or its high values),
 * 2 and 3 the two panels' weights (q8_0: 8 x 64 bytes; q4_0: 4 x 64, low or high nibbles), 4..7 the
 * sums: group 0 x panel 0, group 0 x panel 1, group 1 x panel 0, group 1 x panel 1. */
static tile_config int8_config(int q4, uint32_t m0, uint32_t m1)
{
    tile_config c = config;
    const uint8_t m[8] = {(uint8_t)m0, (uint8_t)(m1 ? m1 : m0), q4 ? 4 : 8, q4 ? 4 : 8, (uint8_t)m0, (uint8_t)m0,
                          (uint8_t)(m1 ? m1 : m0), (uint8_t)(m1 ? m1 : m0)};
    for (int t = 0; t < 8; t++) c.rows[t] = m[t];
    c.colsb[0] = c.colsb[1] = q4 ? 16 : 32;
    return c;
}

/* The next unit's weights, fetched into L2 a slice per block while this unit computes, so its
 * staging does not wait for memory (a batch of few tokens spends as long reading weights as
 * multiplying them). */
typedef struct ahead {
    const char *next;
    uint64_t lines, done, per_block;
} ahead;

/* One unit: tokens t0 .. t0 + m0 + m1 - 1 (groups of m0 and m1 <= 16 tokens, the tiles configured
 * by int8_config(q4, m0, m1)) against rows pr .. pr + nr - 1 (nr <= 32: panel 0 the first 16, panel
 * 1 the rest), every block in order. The tile unit's sums of block k are added AMX_I8_LAG blocks
 * later, while later blocks' multiplies run. */
COL_AMX_INLINE COL_AMX_I8 void int8_unit(const col_matvec_job *j, const uint8_t *qx, uint8_t *stage, int q4,
                                         uint32_t t0, uint32_t m0, uint32_t m1, uint64_t pr, uint32_t nr, ahead *pf)
{
    const uint64_t cols = j->w.cols, nb = cols / QK, qb = col_qrow_bytes(cols), kind = col_block_kind(j->w.dtype);
    const uint8_t *x0 = qx + t0 * qb, *x1 = x0 + 16 * qb, *p0 = stage, *p1 = stage + nb * AMX_I8_BLOCK;
    const int two_b = nr > 16, two_a = m1 > 0;
    float *acc = UNIT_ACC(stage, nb);
    int32_t c[AMX_I8_LAG + 1][4][16 * 16] __attribute__((aligned(64)));
    memset(acc, 0, 32 * 32 * sizeof *acc);
    for (uint64_t k = 0; k < nb + AMX_I8_LAG; k++) {
        if (k < nb) {
            const uint64_t lo = col_xq_pos(kind, nb, k, 0), w = k * AMX_I8_BLOCK + 64;
            _tile_zero(4);
            _tile_zero(5);
            _tile_zero(6);
            _tile_zero(7);
            for (int half = 0; half <= q4; half++) { /* q4_0: the low values, then the high ones */
                const uint64_t at = half ? col_xq_pos(kind, nb, k, 16) : lo, wb = w + (uint64_t)half * 256;
                _tile_loadd(0, x0 + at, (long)qb);
                _tile_loadd(2, p0 + wb, 64);
                if (two_a) _tile_loadd(1, x1 + at, (long)qb);
                if (two_b) _tile_loadd(3, p1 + wb, 64);
                _tile_dpbssd(4, 0, 2);
                if (two_b) _tile_dpbssd(5, 0, 3);
                if (two_a) _tile_dpbssd(6, 1, 2);
                if (two_a && two_b) _tile_dpbssd(7, 1, 3);
            }
        }
        for (uint64_t end = pf->done + pf->per_block; pf->done < end && pf->done < pf->lines; pf->done++)
            _mm_prefetch(pf->next + pf->done * 64, _MM_HINT_T1);
        if (k >= AMX_I8_LAG) { /* the previous block's sums */
            const uint64_t kp = k - AMX_I8_LAG;
            const int32_t(*cp)[16 * 16] = c[kp % (AMX_I8_LAG + 1)];
            add_block(cp[0], p0, x0, qb, cols, kp, m0, acc);
            if (two_b) add_block(cp[1], p1, x0, qb, cols, kp, m0, acc + 16);
            if (two_a) add_block(cp[2], p0, x1, qb, cols, kp, m1, acc + 16 * 32);
            if (two_a && two_b) add_block(cp[3], p1, x1, qb, cols, kp, m1, acc + 16 * 32 + 16);
        }
        if (k < nb) { /* after the loads above: a load behind a tile store to the same offset mod 4 KiB waits for it */
            int32_t(*cs)[16 * 16] = c[k % (AMX_I8_LAG + 1)];
            _tile_stored(4, cs[0], 64);
            if (two_b) _tile_stored(5, cs[1], 64);
            if (two_a) _tile_stored(6, cs[2], 64);
            if (two_a && two_b) _tile_stored(7, cs[3], 64);
        }
    }
    const __mmask32 mask = nr >= 32 ? (__mmask32)0xFFFFFFFFu : (__mmask32)((1u << nr) - 1u);
    for (uint32_t t = 0; t < m0 + m1; t++) {
        float *y = j->y + (uint64_t)(t0 + t) * j->w.rows + pr;
        _mm512_mask_storeu_ps(y, (__mmask16)mask, _mm512_load_ps(acc + 32 * t));
        _mm512_mask_storeu_ps(y + 16, (__mmask16)(mask >> 16), _mm512_load_ps(acc + 32 * t + 16));
    }
}

static COL_AMX_I8 void int8_full_unit(const col_matvec_job *j, const uint8_t *qx, uint8_t *stage, int q4, uint32_t t0,
                                      uint64_t pr, uint32_t nr, ahead *pf)
{
    int8_unit(j, qx, stage, q4, t0, 16, 16, pr, nr, pf);
}

/* ---- q8_0x8: the weights straight from the stored panels ---- */

/* Palette 1 for direct units of token groups of m0 and m1 tokens: tiles 0 and 1 the groups'
 * activations (m x 32 bytes), 2 and 3 two stored panels' blocks as they lie (8 x 32 bytes: 8 rows),
 * 4..7 the sums (m x 8 int32): group 0 x panel 0, group 0 x panel 1, group 1 x panel 0, group 1 x
 * panel 1. */
static tile_config direct_config(uint32_t m0, uint32_t m1)
{
    tile_config c = config;
    const uint8_t m1r = (uint8_t)(m1 ? m1 : m0);
    const uint8_t r[8] = {(uint8_t)m0, m1r, 8, 8, (uint8_t)m0, (uint8_t)m0, m1r, m1r};
    for (int t = 0; t < 8; t++) c.rows[t] = r[t], c.colsb[t] = 32;
    return c;
}

/* One block's sums of m tokens x 16 rows (at c, 16 a token) into acc (16 floats a token). */
COL_AMX_INLINE COL_AMX_I8 void add_block16(const int32_t *c, const float *dw16, const uint8_t *xq, uint64_t qb,
                                           uint64_t cols, uint64_t k, uint32_t m, float *acc)
{
    const __m512 dw = _mm512_load_ps(dw16);
    for (uint32_t t = 0; t < m; t++) {
        const float dx = ((const float *)(const void *)(xq + t * qb + cols))[k];
        const __m512 isum = _mm512_cvtepi32_ps(_mm512_load_si512((const void *)(c + 16 * t)));
        _mm512_store_ps(acc + 16 * t, _mm512_fmadd_ps(isum, _mm512_mul_ps(dw, _mm512_set1_ps(dx)), _mm512_load_ps(acc + 16 * t)));
    }
}

/* Tokens t0 .. t0 + m0 + m1 - 1 against the 16 rows of two stored panels (second: the first again
 * at the matrix's end), B tiles loaded where the panels lie; the C tiles of a token group are
 * stored side by side (8 columns each, rows 64 bytes apart) as one 16-row image. dws: the 16 rows'
 * scales as f32, 16 a block. */
COL_AMX_INLINE COL_AMX_I8 void direct_unit(const col_matvec_job *j, const uint8_t *qx, const float *dws, uint32_t t0,
                                           uint32_t m0, uint32_t m1, uint64_t pr, uint32_t nr, ahead *pf)
{
    const uint64_t cols = j->w.cols, nb = cols / QK, qb = col_qrow_bytes(cols), rb = col_dtype_row_bytes(j->w.dtype, cols);
    const uint8_t *x0 = qx + t0 * qb, *x1 = x0 + 16 * qb;
    const uint8_t *b0 = (const uint8_t *)j->w.data + pr * rb, *b1 = nr > 8 ? b0 + 8 * rb : b0;
    const uint8_t *w0 = b0 + 16 * nb, *w1 = b1 + 16 * nb;
    const int two_a = m1 > 0;
    float acc[32 * 16] __attribute__((aligned(64)));
    int32_t c[AMX_I8_LAG + 1][2][16 * 16] __attribute__((aligned(64)));
    memset(acc, 0, sizeof acc);
    for (uint64_t k = 0; k < nb + AMX_I8_LAG; k++) {
        if (k < nb) {
            _tile_zero(4);
            _tile_zero(5);
            _tile_zero(6);
            _tile_zero(7);
            _tile_loadd(0, x0 + QK * k, (long)qb);
            _tile_loadd(2, w0 + 256 * k, 32);
            if (two_a) _tile_loadd(1, x1 + QK * k, (long)qb);
            _tile_loadd(3, w1 + 256 * k, 32);
            _tile_dpbssd(4, 0, 2);
            _tile_dpbssd(5, 0, 3);
            if (two_a) _tile_dpbssd(6, 1, 2);
            if (two_a) _tile_dpbssd(7, 1, 3);
        }
        for (uint64_t end = pf->done + pf->per_block; pf->done < end && pf->done < pf->lines; pf->done++)
            _mm_prefetch(pf->next + pf->done * 64, _MM_HINT_T1);
        if (k >= AMX_I8_LAG) {
            const uint64_t kp = k - AMX_I8_LAG;
            add_block16(c[kp % (AMX_I8_LAG + 1)][0], dws + 16 * kp, x0, qb, cols, kp, m0, acc);
            if (two_a) add_block16(c[kp % (AMX_I8_LAG + 1)][1], dws + 16 * kp, x1, qb, cols, kp, m1, acc + 16 * 16);
        }
        if (k < nb) {
            int32_t(*cs)[16 * 16] = c[k % (AMX_I8_LAG + 1)];
            _tile_stored(4, cs[0], 64);
            _tile_stored(5, cs[0] + 8, 64);
            if (two_a) _tile_stored(6, cs[1], 64);
            if (two_a) _tile_stored(7, cs[1] + 8, 64);
        }
    }
    const __mmask16 mask = nr >= 16 ? (__mmask16)0xFFFF : (__mmask16)((1u << nr) - 1u);
    for (uint32_t t = 0; t < m0 + m1; t++) _mm512_mask_storeu_ps(j->y + (uint64_t)(t0 + t) * j->w.rows + pr, mask, _mm512_load_ps(acc + 16 * t));
}

static COL_AMX_I8 void direct_full_unit(const col_matvec_job *j, const uint8_t *qx, const float *dws, uint32_t t0,
                                        uint64_t pr, uint32_t nr, ahead *pf)
{
    direct_unit(j, qx, dws, t0, 16, 16, pr, nr, pf);
}

static COL_AMX_I8 void direct_rows(const col_matvec_job *j, const uint8_t *qx, uint8_t *stage, uint64_t r0, uint64_t r1)
{
    const uint64_t nb = j->w.cols / QK, rb = col_dtype_row_bytes(j->w.dtype, j->w.cols);
    const uint32_t nt = j->n_tokens, full = nt / 32, rest = nt % 32;
    const uint32_t m0 = rest > 16 ? 16 : rest, m1 = rest > 16 ? rest - 16 : 0;
    const tile_config cf = direct_config(16, 16), cr = direct_config(m0 ? m0 : 16, m1);
    const uint64_t steps = (full + (rest > 0)) * nb;
    float *dws = (float *)(void *)stage;
    int loaded = -1;
    for (uint64_t pr = r0; pr < r1; pr += 16) {
        const uint32_t nr = r1 - pr < 16 ? (uint32_t)(r1 - pr) : 16;
        const uint64_t next_rows = r1 - pr - nr < 16 ? r1 - pr - nr : 16, lines = next_rows * rb / 64;
        ahead pf = {(const char *)j->w.data + (pr + nr) * rb, lines, 0, (lines + steps - 1) / steps};
        const uint8_t *b0 = (const uint8_t *)j->w.data + pr * rb, *b1 = nr > 8 ? b0 + 8 * rb : b0;
        for (uint64_t k = 0; k < nb; k++) {
            const __m128i s0 = _mm_loadu_si128((const __m128i *)(const void *)(b0 + 16 * k));
            const __m128i s1 = _mm_loadu_si128((const __m128i *)(const void *)(b1 + 16 * k));
            _mm512_store_ps(dws + 16 * k, _mm512_cvtph_ps(_mm256_inserti128_si256(_mm256_castsi128_si256(s0), s1, 1)));
        }
        if (full && loaded != 0) _tile_loadconfig(&cf), loaded = 0;
        for (uint32_t g = 0; g < full; g++) direct_full_unit(j, qx, dws, 32 * g, pr, nr, &pf);
        if (rest) {
            if (loaded != 1) _tile_loadconfig(&cr), loaded = 1;
            direct_unit(j, qx, dws, 32 * full, m0, m1, pr, nr, &pf);
        }
    }
    _tile_release();
}

COL_AMX_I8 void col_amx_int8_rows(const col_matvec_job *j, const uint8_t *qx, uint8_t *stage, uint64_t r0, uint64_t r1)
{
    const int q4 = col_block_kind(j->w.dtype) == COL_DTYPE_Q4_0;
    if (j->w.dtype == COL_DTYPE_Q8_0X8 && j->n_tokens <= AMX_I8_DIRECT_TOKENS) {
        direct_rows(j, qx, stage, r0, r1);
        return;
    }
    const uint64_t nb = j->w.cols / QK;
    const uint32_t nt = j->n_tokens, full = nt / 32, rest = nt % 32;
    const uint32_t m0 = rest > 16 ? 16 : rest, m1 = rest > 16 ? rest - 16 : 0;
    const tile_config cf = int8_config(q4, 16, 16), cr = int8_config(q4, m0 ? m0 : 16, m1);
    const uint64_t rb = col_dtype_row_bytes(j->w.dtype, j->w.cols), steps = (full + (rest > 0)) * (nb + 1);
    int loaded = -1; /* 0: cf, 1: cr */
    for (uint64_t pr = r0; pr < r1; pr += 32) {
        const uint32_t nr = r1 - pr < 32 ? (uint32_t)(r1 - pr) : 32;
        const uint64_t next_rows = r1 - pr - nr < 32 ? r1 - pr - nr : 32, lines = next_rows * rb / 64;
        ahead pf = {(const char *)j->w.data + (pr + nr) * rb, lines, 0, (lines + steps - 1) / steps};
        stage_int8(&j->w, pr, nr < 16 ? nr : 16, stage);
        if (nr > 16) stage_int8(&j->w, pr + 16, nr - 16, stage + nb * AMX_I8_BLOCK);
        if (full && loaded != 0) _tile_loadconfig(&cf), loaded = 0;
        for (uint32_t g = 0; g < full; g++) int8_full_unit(j, qx, stage, q4, 32 * g, pr, nr, &pf);
        if (rest) {
            if (loaded != 1) _tile_loadconfig(&cr), loaded = 1;
            int8_unit(j, qx, stage, q4, 32 * full, m0, m1, pr, nr, &pf);
        }
    }
    _tile_release();
}

#else /* no AMX on this system */

int col_amx_enable(void)
{
    return 0;
}

void col_amx_pack(const float *x, uint32_t n_tokens, uint64_t cols, int x_bf16, uint32_t t0, uint32_t t1,
                  uint8_t *out)
{
    (void)x, (void)n_tokens, (void)cols, (void)x_bf16, (void)t0, (void)t1, (void)out;
}

uint64_t col_amx_tile_rows(uint32_t n_tokens, int x_bf16)
{
    (void)n_tokens, (void)x_bf16;
    return 1;
}

void col_amx_rows(const col_matvec_job *j, int x_bf16, const uint8_t *packed, uint8_t *stage, uint64_t stage_bytes,
                  uint64_t r0, uint64_t r1)
{
    (void)j, (void)x_bf16, (void)packed, (void)stage, (void)stage_bytes, (void)r0, (void)r1;
}

int col_amx_int8_runs(const col_matvec_job *j, uint64_t stage_bytes)
{
    (void)j, (void)stage_bytes;
    return 0;
}

void col_amx_int8_rows(const col_matvec_job *j, const uint8_t *qx, uint8_t *stage, uint64_t r0, uint64_t r1)
{
    (void)j, (void)qx, (void)stage, (void)r0, (void)r1;
}

#endif
