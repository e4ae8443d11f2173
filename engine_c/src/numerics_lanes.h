/*
 * numerics_lanes.h - the numerics variants' reductions with one output row per vector lane: a
 * template that numerics_x86.c includes once per vector width (AVX-512, AVX2), so that both
 * paths run the same code and cannot drift apart. Not a header of its own: it has no guard and
 * reads these macros, which the includer defines and undefines around it:
 *   W              rows of a group, one per lane of V
 *   BW             columns a block holds (a 64-byte line of 16-bit weights on AVX-512)
 *   V              the group's vector type (one lane per row; two machine vectors, see v32)
 *   VX             a machine vector
 *   TGT            the target attribute of every function
 *   FN(name)       name with the path's suffix
 *   V_ZERO(), V_ADD(a, b) (V + V), V_MUL(a, x) (V * VX), V_FMA(a, x, c) = a * x + c rounded once,
 *   V_BCAST(p)     a VX with *p in every lane
 * and these functions, defined before the include:
 *   FN(fill)(FN(lanes) *g, uint64_t block)   columns [block * BW, block * BW + BW) of the group's
 *                                            rows, as f32, transposed into g->col (zero past the row)
 *   FN(store)(float *y, V v, uint32_t n)     the first n lanes of v to y[0..n)
 *
 * Each function is one of numerics.c's reference loops with `float` replaced by a vector of W
 * rows: the same operations (a multiply then an add, or one fused multiply-add; the same tree
 * shapes; the same order of the parts), so every lane has the bits the reference gives its row.
 */

/* The rows of a group and the block of their columns at hand. */
typedef struct FN(lanes) {
    const uint8_t *row[W]; /* the group's rows; a missing row repeats the first (its lanes are dropped);
                            * for the panel dtypes each row's panel (whose 8 or 16 rows share it) */
    uint32_t dtype;
    uint64_t n;            /* columns of a row */
    uint64_t block;        /* the block of BW columns in col[], UINT64_MAX for none */
    const char *next;      /* the next group's rows, prefetched into L2 a slice per block loaded */
    const char *next_end;
    uint64_t next_lines;   /* lines per block */
    V col[BW];             /* col[c]: column block * BW + c of the group's rows, one row per lane */
} FN(lanes);

/* Block b into g->col, and the next slice of the next group's rows into L2: a group reads its rows
 * a line from each at a time, which the hardware prefetchers do not follow, so the group before it
 * brings them in front to back. */
COL_INLINE TGT void FN(load)(FN(lanes) *g, uint64_t b)
{
    for (uint64_t l = 0; l < g->next_lines && g->next < g->next_end; l++, g->next += 64)
        _mm_prefetch(g->next, _MM_HINT_T1);
    FN(fill)(g, b);
}

/* acc[t] += w[i] * x[t][i] for i in [lo, hi), in order (dot_sequential), for NT tokens (a
 * constant after inlining, so the accumulators stay in registers). */
COL_INLINE TGT void FN(seq_nt)(FN(lanes) *g, const float *const *x, const uint32_t NT, int fma, uint64_t lo,
                                uint64_t hi, V *acc)
{
    V a[NX_TOKENS]; /* local, so the compiler need not reload them around the stores to g->col */
#pragma GCC unroll 4
    for (uint32_t t = 0; t < NT; t++) a[t] = acc[t];
    for (uint64_t i = lo; i < hi;) {
        const uint64_t b = i / BW, end = (b + 1) * BW < hi ? (b + 1) * BW : hi;
        if (b != g->block) FN(load)(g, b);
        if (fma) {
            for (; i < end; i++) {
                const V w = g->col[i % BW];
#pragma GCC unroll 4
                for (uint32_t t = 0; t < NT; t++) a[t] = V_FMA(w, V_BCAST(x[t] + i), a[t]);
            }
        } else {
            for (; i < end; i++) {
                const V w = g->col[i % BW];
#pragma GCC unroll 4
                for (uint32_t t = 0; t < NT; t++) a[t] = V_ADD(a[t], V_MUL(w, V_BCAST(x[t] + i)));
            }
        }
    }
#pragma GCC unroll 4
    for (uint32_t t = 0; t < NT; t++) acc[t] = a[t];
}

static TGT void FN(seq)(FN(lanes) *g, const float *const *x, uint32_t nt, int fma, uint64_t lo, uint64_t hi,
                        V *acc)
{
    switch (nt) {
    case 1: FN(seq_nt)(g, x, 1, fma, lo, hi, acc); break;
    case 2: FN(seq_nt)(g, x, 2, fma, lo, hi, acc); break;
    case 3: FN(seq_nt)(g, x, 3, fma, lo, hi, acc); break;
    default: FN(seq_nt)(g, x, 4, fma, lo, hi, acc); break;
    }
}

/* One element into a running sum, as seq_nt adds it. */
COL_INLINE TGT V FN(mac)(V a, V w, VX xv, int fma)
{
    return fma ? V_FMA(w, xv, a) : V_ADD(a, V_MUL(w, xv));
}

/* dot_pairwise for one token, the sums returned in registers. A range of two leaves within one
 * block runs both leaves' chains side by side (each in order from zero, then left + right), where
 * one leaf after the other waited on each addition's latency. */
static TGT V FN(pairwise1)(FN(lanes) *g, const float *x, int fma, uint64_t lo, uint64_t hi)
{
    V a = V_ZERO();
    if (hi - lo <= COL_PAIRWISE_LEAF) {
        FN(seq_nt)(g, &x, 1, fma, lo, hi, &a);
        return a;
    }
    const uint64_t mid = lo + (hi - lo) / 2;
    if (hi - lo <= 2 * COL_PAIRWISE_LEAF && lo / BW == (hi - 1) / BW) {
        if (lo / BW != g->block) FN(load)(g, lo / BW);
        V b = V_ZERO();
        const uint64_t nl = mid - lo, nr = hi - mid; /* nr = nl or nl + 1 */
#pragma GCC unroll 8
        for (uint64_t k = 0; k < COL_PAIRWISE_LEAF; k++) {
            if (k < nl) a = FN(mac)(a, g->col[(lo + k) % BW], V_BCAST(x + lo + k), fma);
            if (k < nr) b = FN(mac)(b, g->col[(mid + k) % BW], V_BCAST(x + mid + k), fma);
        }
        return V_ADD(a, b);
    }
    a = FN(pairwise1)(g, x, fma, lo, mid);
    return V_ADD(a, FN(pairwise1)(g, x, fma, mid, hi));
}

/* dot_pairwise: ranges of at most COL_PAIRWISE_LEAF summed in order from zero, else the left
 * half's sum plus the right half's. */
static TGT void FN(pairwise)(FN(lanes) *g, const float *const *x, uint32_t nt, int fma, uint64_t lo, uint64_t hi,
                             V *out)
{
    if (nt == 1) {
        out[0] = FN(pairwise1)(g, x[0], fma, lo, hi);
        return;
    }
    if (hi - lo <= COL_PAIRWISE_LEAF) {
        for (uint32_t t = 0; t < nt; t++) out[t] = V_ZERO();
        FN(seq)(g, x, nt, fma, lo, hi, out);
        return;
    }
    const uint64_t mid = lo + (hi - lo) / 2;
    V right[NX_TOKENS];
    FN(pairwise)(g, x, nt, fma, lo, mid, out);
    FN(pairwise)(g, x, nt, fma, mid, hi, right);
    for (uint32_t t = 0; t < nt; t++) out[t] = V_ADD(out[t], right[t]);
}

/* sum_tree over v[lo * stride], .., v[(hi - 1) * stride]. */
static TGT void FN(tree)(const V *v, uint32_t stride, uint32_t lo, uint32_t hi, V *out)
{
    if (hi - lo == 1) {
        *out = v[(uint64_t)lo * stride];
        return;
    }
    const uint32_t mid = lo + (hi - lo) / 2;
    V left, right;
    FN(tree)(v, stride, lo, mid, &left);
    FN(tree)(v, stride, mid, hi, &right);
    *out = V_ADD(left, right);
}

/* One element into lane sum k (a constant after inlining). */
COL_INLINE TGT void FN(blocked_step)(V *acc, uint32_t k, V w, VX xv, int fma)
{
    acc[k] = FN(mac)(acc[k], w, xv, fma);
}

/* dot_blocked for one token with L lanes (a constant after inlining) dividing BW. Element i goes to
 * lane (i - lo) % L, held here in sum k = i % L, a constant in each unrolled block, so the sums
 * stay in registers where the general loop below indexes them at run time, through memory; the
 * sums are put back in lane order for the tree. The same operations on every lane. */
COL_INLINE TGT void FN(blocked1)(FN(lanes) *g, const float *x, int fma, const uint32_t L, uint64_t lo, uint64_t hi,
                                  V *out)
{
    V acc[BW], lane[BW];
#pragma GCC unroll 32
    for (uint32_t k = 0; k < L; k++) acc[k] = V_ZERO();
    for (uint64_t i = lo; i < hi;) {
        const uint64_t b = i / BW, end = (b + 1) * BW < hi ? (b + 1) * BW : hi;
        if (b != g->block) FN(load)(g, b);
        if (i == b * BW && end == i + BW) {
#pragma GCC unroll 32
            for (uint32_t c = 0; c < BW; c++) FN(blocked_step)(acc, c % L, g->col[c], V_BCAST(x + i + c), fma);
            i = end;
        } else {
            for (; i < end; i++)
#pragma GCC unroll 32
                for (uint32_t k = 0; k < L; k++)
                    if (i % L == k) FN(blocked_step)(acc, k, g->col[i % BW], V_BCAST(x + i), fma);
        }
    }
#pragma GCC unroll 32
    for (uint32_t k = 0; k < L; k++) lane[k] = acc[(k + lo) % L];
    FN(tree)(lane, 1, 0, L, out);
}

/* dot_blocked: element i into lane (i - lo) % L, the L lane sums (unused lanes zero) added as a
 * pairwise tree. Tokens in passes of as many as NX_BLOCKED_ACC accumulators hold; one token with
 * 4, 8 or 16 lanes by blocked1. */
static TGT void FN(blocked)(FN(lanes) *g, const float *const *x, uint32_t nt, int fma, uint32_t lanes, uint64_t lo,
                            uint64_t hi, V *out)
{
    if (nt == 1) {
        switch (lanes) {
        case 4: FN(blocked1)(g, x[0], fma, 4, lo, hi, out); return;
        case 8: FN(blocked1)(g, x[0], fma, 8, lo, hi, out); return;
        case 16: FN(blocked1)(g, x[0], fma, 16, lo, hi, out); return;
        default: break;
        }
    }
    V acc[NX_BLOCKED_ACC];
    const uint32_t per = NX_BLOCKED_ACC / lanes < nt ? NX_BLOCKED_ACC / lanes : nt;
    for (uint32_t t0 = 0; t0 < nt; t0 += per) {
        const uint32_t m = nt - t0 < per ? nt - t0 : per;
        for (uint32_t a = 0; a < lanes * m; a++) acc[a] = V_ZERO();
        uint32_t l = 0;
        for (uint64_t i = lo; i < hi;) {
            const uint64_t b = i / BW, end = (b + 1) * BW < hi ? (b + 1) * BW : hi;
            if (b != g->block) FN(load)(g, b);
            for (; i < end; i++) {
                const V w = g->col[i % BW];
                V *a = acc + (uint64_t)l * m;
                for (uint32_t t = 0; t < m; t++) {
                    const VX xv = V_BCAST(x[t0 + t] + i);
                    a[t] = FN(mac)(a[t], w, xv, fma);
                }
                l = l + 1 == lanes ? 0 : l + 1;
            }
        }
        for (uint32_t t = 0; t < m; t++) FN(tree)(acc + t, m, 0, lanes, &out[t0 + t]);
    }
}

/* dot_part: [lo, hi) of every dot product of the group by the variant's reduction; zero when empty. */
static TGT void FN(part)(const col_numerics *nx, FN(lanes) *g, const float *const *x, uint32_t nt, uint64_t lo,
                         uint64_t hi, V *out)
{
    if (lo >= hi) {
        for (uint32_t t = 0; t < nt; t++) out[t] = V_ZERO();
        return;
    }
    switch (nx->reduction) {
    case COL_REDUCTION_PAIRWISE: FN(pairwise)(g, x, nt, (int)nx->fma, lo, hi, out); break;
    case COL_REDUCTION_BLOCKED: FN(blocked)(g, x, nt, (int)nx->fma, nx->lanes, lo, hi, out); break;
    default:
        for (uint32_t t = 0; t < nt; t++) out[t] = V_ZERO();
        FN(seq)(g, x, nt, (int)nx->fma, lo, hi, out);
        break;
    }
}

/* dot_variant for rows [r0, r1) of job j, W rows at a time, NX_TOKENS tokens a pass: the last part
 * of the split first, then each earlier part added to it. */
TGT void FN(col_numerics_rows)(const col_numerics *nx, const col_matvec_job *j, uint64_t r0, uint64_t r1)
{
    const uint64_t n = j->w.cols, rb = col_dtype_row_bytes(j->w.dtype, n);
    const uint32_t parts = nx->split > 1 ? nx->split : 1;
    FN(lanes) g;
    g.dtype = j->w.dtype;
    g.n = n;
    const uint64_t loads = (n + BW - 1) / BW * ((j->n_tokens + NX_TOKENS - 1) / NX_TOKENS); /* per group, about */
    for (uint64_t r = r0; r < r1; r += W) {
        const uint32_t nr = r1 - r < W ? (uint32_t)(r1 - r) : W;
        for (uint32_t a = 0; a < W; a++) {
            const uint64_t at = r + (a < nr ? a : 0), panel = at / COL_STORED_PANEL_ROWS * COL_STORED_PANEL_ROWS;
            const uint64_t panel16 = at / COL_BF16_PANEL_ROWS * COL_BF16_PANEL_ROWS;
            g.row[a] = (const uint8_t *)j->w.data + (is_panel_dtype(g.dtype) ? panel : is_bf16_panel(g.dtype) ? panel16 : at) * rb;
        }
        const uint64_t next_rows = r + W >= j->w.rows ? 0 : j->w.rows - (r + W) < W ? j->w.rows - (r + W) : W;
        g.next = (const char *)j->w.data + (r + W) * rb;
        g.next_end = g.next + next_rows * rb;
        g.next_lines = (next_rows * rb / 64 + loads - 1) / loads;
        for (uint32_t t0 = 0; t0 < j->n_tokens; t0 += NX_TOKENS) {
            const uint32_t nt = j->n_tokens - t0 < NX_TOKENS ? j->n_tokens - t0 : NX_TOKENS;
            const float *x[NX_TOKENS];
            for (uint32_t t = 0; t < nt; t++) x[t] = j->x + (uint64_t)(t0 + t) * n;
            V total[NX_TOKENS], part[NX_TOKENS];
            g.block = UINT64_MAX;
            FN(part)(nx, &g, x, nt, n * (parts - 1) / parts, n, total);
            for (uint32_t p = parts - 1; p-- > 0;) {
                FN(part)(nx, &g, x, nt, n * p / parts, n * (p + 1) / parts, part);
                for (uint32_t t = 0; t < nt; t++) total[t] = V_ADD(total[t], part[t]);
            }
            for (uint32_t t = 0; t < nt; t++) FN(store)(j->y + (uint64_t)(t0 + t) * j->w.rows + r, total[t], nr);
        }
    }
}
