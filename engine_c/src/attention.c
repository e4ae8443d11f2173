/*
 * attention.c - rotary position embedding and grouped-query self-attention for a block of
 * positions (one in a decode step), with the layer's KV cache.
 *
 * Follows transformers' eager attention: q/k/v projections (+ bias), the optional q/k RMSNorm
 * (per head before RoPE for Qwen3-MoE and GLM-4.5, over the whole projection for OLMoE, then
 * OLMoE's clip), RoPE on each head's first rotary_dim dims (partial rotary: GLM-4.5) paired as
 * halves (rotate_half) or interleaved (DeepSeek, ERNIE, Llama 4), with inverse frequencies
 * computed in f32 as transformers does (default, linear, YaRN, LongRoPE, llama3), unless the layer
 * has none (Llama 4's NoPE layers); then Llama 4's per-layer q/k L2 norm and query temperature;
 * scores scaled by attn_scale (head_dim^-1/2 unless the family says otherwise), softmax in f32
 * (with GPT-OSS's per-head sink logit when the layer has one), and head h reading KV head
 * h / (n_heads / n_kv_heads). A sliding layer admits key k for query q iff q - W < k <= q, a
 * chunked one iff k <= q in the same chunk of C positions.
 */
#include "session.h"

#include <assert.h>
#include <math.h>
#include <string.h>

/* YaRN's correction dimension of `rotations` (transformers' find_correction_dim), in double. */
static double yarn_dim(double rotations, double dim, double base, double max_positions)
{
    return dim * log(max_positions / (rotations * 2.0 * 3.14159265358979323846)) / (2.0 * log(base));
}

/* Llama 3's scaling of one inverse frequency, in the f32 steps of _compute_llama3_parameters:
 * wavelengths longer than original / low_freq_factor are divided by the factor, those shorter
 * than original / high_freq_factor kept, and the ones between smoothly mixed. */
static float llama3_inv_freq(const col_hparams *hp, float inv)
{
    const double original = hp->rope_original_max_context;
    const double low = hp->rope_low_freq_factor, high = hp->rope_high_freq_factor;
    const float wavelen = (float)(2.0 * 3.14159265358979323846) / inv;
    const float low_wavelen = (float)(original / low), high_wavelen = (float)(original / high);
    float scaled = wavelen > low_wavelen ? inv / hp->rope_factor : inv;
    if (!(wavelen < high_wavelen) && !(wavelen > low_wavelen)) {
        float smooth = ((float)original / wavelen - (float)low) / (float)(high - low);
        scaled = (1.0f - smooth) * scaled / hp->rope_factor + smooth * scaled;
    }
    return scaled;
}

/* inv_freq [rotary_dim / 2] of the model's RoPE type; freq_factors [rotary_dim / 2] is the
 * rope_freq_factors tensor of a LongRoPE model (NULL otherwise). */
void col_rope_init(const col_hparams *hp, const float *freq_factors, float *inv_freq)
{
    uint32_t dim = hp->rotary_dim, half = dim / 2;
    double low = 0.0, high = 0.0;
    if (hp->rope_type == COL_ROPE_YARN) {
        low = yarn_dim(hp->rope_beta_fast, dim, hp->rope_theta, hp->rope_original_max_context);
        high = yarn_dim(hp->rope_beta_slow, dim, hp->rope_theta, hp->rope_original_max_context);
        if (hp->rope_truncate) {
            low = floor(low);
            high = ceil(high);
        }
        low = low > 0.0 ? low : 0.0;
        high = high < dim - 1.0 ? high : dim - 1.0;
        if (low == high) high += 0.001; /* transformers' guard against a zero-width ramp */
    }
    for (uint32_t i = 0; i < half; i++) {
        /* base ** (arange(0, d, 2) / d) in f32, as torch computes it */
        float exponent = (float)(2 * i) / (float)dim;
        float pos_freq = powf((float)hp->rope_theta, exponent);
        inv_freq[i] = 1.0f / pos_freq;
        if (hp->rope_type == COL_ROPE_LINEAR) inv_freq[i] /= hp->rope_factor;
        if (hp->rope_type == COL_ROPE_LONGROPE) inv_freq[i] = 1.0f / (freq_factors[i] * pos_freq);
        if (hp->rope_type == COL_ROPE_YARN) { /* the f32 steps of _compute_yarn_parameters */
            float interpolation = 1.0f / (hp->rope_factor * pos_freq);
            float ramp = ((float)i - (float)low) / (float)(high - low);
            ramp = ramp < 0.0f ? 0.0f : ramp > 1.0f ? 1.0f : ramp;
            float extrapolation_factor = 1.0f - ramp;
            inv_freq[i] = interpolation * (1.0f - extrapolation_factor) + inv_freq[i] * extrapolation_factor;
        }
        if (hp->rope_type == COL_ROPE_LLAMA3) inv_freq[i] = llama3_inv_freq(hp, inv_freq[i]);
    }
}

/* Rotate the first rotary_dim values of each of n vectors (stride apart) in place by the angles
 * whose cosines and sines are c and s [rotary_dim / 2], pairing dims as the layout says; `isa`
 * chooses the code, never the bits. */
static void rope_rotate(col_isa isa, float *vec, uint32_t n, uint64_t stride, uint32_t rotary_dim, uint32_t layout,
                        const float *c, const float *s)
{
    uint32_t half = rotary_dim / 2;
    for (uint32_t h = 0; h < n; h++) {
        float *v = vec + (uint64_t)h * stride;
        if (layout != COL_ROPE_INTERLEAVED) {
            col_rotate_half(isa, v, half, c, s);
            continue;
        }
        for (uint32_t i = 0; i < half; i++) {
            float x1 = v[2 * i], x2 = v[2 * i + 1];
            v[2 * i] = x1 * c[i] - x2 * s[i];
            v[2 * i + 1] = x2 * c[i] + x1 * s[i];
        }
    }
}

/* The cosines and sines of `position` [rotary_dim / 2], times YaRN's attention factor (1 for the
 * other types, which leaves the bits as they were). */
static void rope_angles(const col_hparams *hp, uint32_t position, const float *inv_freq, float *c, float *s)
{
    for (uint32_t i = 0; i < hp->rotary_dim / 2; i++) {
        float angle = (float)position * inv_freq[i];
        c[i] = cosf(angle) * hp->rope_attn_factor;
        s[i] = sinf(angle) * hp->rope_attn_factor;
    }
}

/* RoPE of q [n_heads] and k [n_kv_heads] at `position`, with the cosines and sines computed once
 * for both, before the heads' loops rather than inside them. */
static void rope_apply(col_isa isa, const col_hparams *hp, float *q, float *k, uint32_t position, const float *inv_freq)
{
    float c[COL_MAX_HEAD_DIM / 2], s[COL_MAX_HEAD_DIM / 2];
    rope_angles(hp, position, inv_freq, c, s);
    rope_rotate(isa, q, hp->n_heads, hp->head_dim, hp->rotary_dim, hp->rope_layout, c, s);
    rope_rotate(isa, k, hp->n_kv_heads, hp->head_dim, hp->rotary_dim, hp->rope_layout, c, s);
}

static void add_bias(float *y, const col_tensor_info *bias, uint64_t n)
{
    if (!bias) return;
    for (uint64_t i = 0; i < n; i++) y[i] += col_load_elem(bias->data, bias->dtype, i);
}

static void clamp_all(float *v, uint64_t n, float c)
{
    for (uint64_t i = 0; i < n; i++) v[i] = v[i] < -c ? -c : (v[i] > c ? c : v[i]);
}

/* The cached rows of KV head g in a layer. Head-major (session.h), so a head's keys and values
 * are each one contiguous stream (position-major, a head's rows 1 KiB apart crowded a few L1 sets). */
static uint8_t *kv_rows(const col_session *s, void *cache, uint32_t layer_index, uint32_t g)
{
    return (uint8_t *)cache + ((uint64_t)layer_index * s->kv_heads + g) * s->capacity * s->att_dim * s->kv_bytes;
}

/* Position `pos`'s row of n values into rows (kv_rows), in the cache's precision. */
static void kv_store(const col_session *s, uint8_t *rows, uint32_t pos, const float *x, uint64_t n)
{
    uint8_t *at = rows + (uint64_t)pos * n * s->kv_bytes;
    if (s->kv_bytes == sizeof(uint16_t))
        col_f16_row(col_pool_isa(s->pool), x, n, (uint16_t *)(void *)at);
    else
        memcpy(at, x, n * sizeof(float));
}

/* Each of n heads of d values (x [n][d]) divided by its RMS, eps inside the root: Llama 4's
 * weightless L2Norm. */
static void rms_heads(float *x, uint32_t n, uint32_t d, float eps)
{
    for (uint32_t h = 0; h < n; h++) {
        float *v = x + (uint64_t)h * d, sum = 0.0f;
        for (uint32_t i = 0; i < d; i++) sum += v[i] * v[i];
        float inv = 1.0f / sqrtf(sum / (float)d + eps);
        for (uint32_t i = 0; i < d; i++) v[i] *= inv;
    }
}

/* The per-position part before the scores: biases, q/k norms (their weights as f32, q_norm and
 * k_norm, loaded by the caller), clip, RoPE (unless the layer has none), the layer's q/k L2 norm
 * and query temperature, and k/v into the layer's cache at `pos`. q [q_dim], k and v [kv_dim]
 * are updated in place; positions are independent of each other, so any thread may run any. */
static void prepare_position(const col_session *s, uint32_t layer_index, uint32_t pos, float *q, float *k, float *v,
                             const float *q_norm, const float *k_norm)
{
    const col_model *m = s->model;
    const col_hparams *hp = &m->hp;
    const col_layer *layer = &m->layers[layer_index];
    uint32_t d = hp->head_dim, nh = hp->n_heads, nkv = hp->n_kv_heads;
    uint64_t q_dim = (uint64_t)nh * d, kv_dim = (uint64_t)nkv * d;
    const col_isa isa = col_pool_isa(s->pool);

    add_bias(q, layer->attn_q_bias, q_dim);
    add_bias(k, layer->attn_k_bias, kv_dim);
    add_bias(v, layer->attn_v_bias, kv_dim);

    if (hp->flags & COL_FLAG_QK_NORM_FULL) {
        col_rmsnorm_row(isa, q, q_norm, hp->norm_eps, q_dim, q);
        col_rmsnorm_row(isa, k, k_norm, hp->norm_eps, kv_dim, k);
    }
    if (hp->clip_qkv > 0.0f) {
        clamp_all(q, q_dim, hp->clip_qkv);
        clamp_all(k, kv_dim, hp->clip_qkv);
        clamp_all(v, kv_dim, hp->clip_qkv);
    }
    if (hp->flags & COL_FLAG_QK_NORM_HEAD) {
        col_rmsnorm_rows(isa, q, q_norm, hp->norm_eps, d, nh, q);
        col_rmsnorm_rows(isa, k, k_norm, hp->norm_eps, d, nkv, k);
    }
    const col_routing_info *route = layer->route;
    if (!route->no_rope) rope_apply(isa, hp, q, k, pos, s->inv_freq);
    if (route->qk_l2_norm) {
        rms_heads(q, nh, d, hp->norm_eps);
        rms_heads(k, nkv, d, hp->norm_eps);
    }
    if (route->temperature_floor) { /* Llama 4's attn_temperature_tuning, in its f32 steps */
        float t = log1pf(floorf(((float)pos + 1.0f) / (float)route->temperature_floor)) * route->temperature_scale + 1.0f;
        for (uint64_t i = 0; i < q_dim; i++) q[i] *= t;
    }

    for (uint32_t g = 0; g < nkv; g++) {
        kv_store(s, kv_rows(s, s->k_cache, layer_index, g), pos, k + (uint64_t)g * d, d);
        kv_store(s, kv_rows(s, s->v_cache, layer_index, g), pos, v + (uint64_t)g * d, d);
    }
}

/* The heads of n positions from `base`, as pool items (KV-head-major, then parts of a KV head's
 * query heads): queries q [n][q_dim], outputs att [n][q_dim]; each thread scores into its own row
 * of s->scores. */
typedef struct heads_task {
    col_session *s;
    uint32_t layer, base, n;
    uint32_t part, n_parts; /* query heads per item (the last part may have fewer), parts per KV head */
    const float *q;
    float *att;
} heads_task;

/* Query heads the AVX-512 path attends together (col_attend_group_avx512 takes them four at a
 * time from the first), so parts of this many leave every head's bits as one item of all. */
#define COL_HEAD_PART 4

/* Items for the heads of n positions: a KV head's query heads are split into parts when there are
 * too few (position, KV head) items to keep the threads busy, as in a decode step of latent
 * attention (one KV head for all the query heads), at the cost of reading its keys once a part. */
static heads_task heads_of(col_session *s, uint32_t layer, uint32_t base, uint32_t n, const float *q, float *att)
{
    heads_task task = {s, layer, base, n, s->att_group, 1, q, att};
    const uint64_t items = (uint64_t)n * s->kv_heads, threads = col_pool_threads(s->pool);
    if (threads > 1 && items < 2 * threads && s->att_group > COL_HEAD_PART) {
        task.part = COL_HEAD_PART;
        task.n_parts = (s->att_group + COL_HEAD_PART - 1) / COL_HEAD_PART;
    }
    return task;
}

/* A step reads its layer's cache from memory (the weights read since the last step flushed it),
 * so its heads prefetch keys and values this many positions ahead; a prefill block's positions
 * find the cache warm from the block's earlier ones and do not prefetch. */
#define COL_DECODE_KV_PREFETCH 16

static void run_heads(void *ctx, uint32_t thread, uint64_t i0, uint64_t i1)
{
    const heads_task *task = ctx;
    const col_session *s = task->s;
    const col_hparams *hp = &s->model->hp;
    const uint64_t q_dim = (uint64_t)hp->n_heads * s->att_dim, d = s->att_dim;
    const uint32_t group = s->att_group; /* query heads per KV head */
    float *scores = s->scores + (uint64_t)thread * group * s->capacity;
    float scale = hp->attn_scale;
    const col_layer *layer = &s->model->layers[task->layer];
    const uint32_t mask = layer->route->attention;
    const float *sinks = layer->attn_sinks ? (const float *)layer->attn_sinks->data : NULL; /* f32 (format.c) */
    for (uint64_t i = i0; i < i1; i++) {
        /* KV-head-major, positions in pairs of an early and a late one (0, n - 1, 1, n - 2, ...),
         * so any run of items holds as many keys to attend as another of its length; the query
         * heads of a KV head (or of a part) run together, so each key and value read from the
         * cache serves all of them */
        const uint64_t n = task->n, j = i % n, t = j % 2 ? n - 1 - j / 2 : j / 2;
        uint32_t g = (uint32_t)(i / n / task->n_parts), h0 = (uint32_t)(i / n % task->n_parts) * task->part;
        uint32_t n_q = group - h0 < task->part ? group - h0 : task->part;
        uint64_t at = t * q_dim + ((uint64_t)g * group + h0) * d;
        uint32_t pos = task->base + (uint32_t)t, first = 0;
        if (mask == COL_LAYER_SLIDING && pos + 1 > hp->sliding_window) first = pos + 1 - hp->sliding_window;
        if (mask == COL_LAYER_CHUNKED) first = pos - pos % hp->attention_chunk_size;
        col_head_job job = {.q = task->q + at,
                            .k = kv_rows(s, s->k_cache, task->layer, g) + first * d * s->kv_bytes,
                            .v = kv_rows(s, s->v_cache, task->layer, g) + first * d * s->kv_bytes,
                            .kv_f16 = s->kv_bytes == sizeof(uint16_t),
                            .stride = d,
                            .n_keys = pos + 1 - first,
                            .d = (uint32_t)d,
                            .scale = scale,
                            .n_q = n_q,
                            .prefetch = n == 1 ? COL_DECODE_KV_PREFETCH : 0,
                            .sinks = sinks ? sinks + (uint64_t)g * group + h0 : NULL};
        col_attend_head(s->pool, &job, scores, task->att + at);
    }
}

/* Positions [base + t0, base + t1) of a block prepared, as pool items. */
typedef struct prepare_task {
    const col_session *s;
    uint32_t layer, base;
    float *q, *k, *v;              /* [n][q_dim], [n][kv_dim], [n][kv_dim] */
    const float *q_norm, *k_norm;  /* the q/k norms' weights as f32 (NULL without them) */
} prepare_task;

static void prepare_positions(void *ctx, uint32_t thread, uint64_t t0, uint64_t t1)
{
    const prepare_task *task = ctx;
    const col_hparams *hp = &task->s->model->hp;
    const uint64_t q_dim = (uint64_t)hp->n_heads * hp->head_dim, kv_dim = (uint64_t)hp->n_kv_heads * hp->head_dim;
    (void)thread;
    for (uint64_t t = t0; t < t1; t++)
        prepare_position(task->s, task->layer, task->base + (uint32_t)t, task->q + t * q_dim, task->k + t * kv_dim,
                         task->v + t * kv_dim, task->q_norm, task->k_norm);
}

/* Attention of the n positions base.. whose q/k/v rows are in q, k, v (updated in place), into att.
 * Every position is prepared (and its k/v cached) before any head runs, so a position of a block
 * sees the earlier positions of the same block; both run on the pool's threads. The q/k norms'
 * weights are loaded once for the block, side by side in s->norm_weight. */
static void attend_positions(col_session *s, uint32_t layer_index, uint32_t base, uint32_t n, float *q, float *k,
                             float *v, float *att)
{
    const col_hparams *hp = &s->model->hp;
    const col_layer *layer = &s->model->layers[layer_index];
    prepare_task prep = {s, layer_index, base, q, k, v, NULL, NULL};
    if (hp->flags & (COL_FLAG_QK_NORM_FULL | COL_FLAG_QK_NORM_HEAD)) {
        const int full = (hp->flags & COL_FLAG_QK_NORM_FULL) != 0;
        const uint64_t nq = full ? (uint64_t)hp->n_heads * hp->head_dim : hp->head_dim;
        const uint64_t nk = full ? (uint64_t)hp->n_kv_heads * hp->head_dim : hp->head_dim;
        col_load_row(layer->attn_q_norm->data, layer->attn_q_norm->dtype, nq, s->norm_weight);
        col_load_row(layer->attn_k_norm->data, layer->attn_k_norm->dtype, nk, s->norm_weight + nq);
        prep.q_norm = s->norm_weight;
        prep.k_norm = s->norm_weight + nq;
    }
    col_pool_run(s->pool, prepare_positions, &prep, n);
    heads_task task = heads_of(s, layer_index, base, n, q, att);
    col_pool_run(s->pool, run_heads, &task, (uint64_t)n * s->kv_heads * task.n_parts);
}

/* ---- multi-head latent attention (docs/format.md, "MLA") --------------------------------- */

static void mla_up_heads(col_session *s, uint32_t layer_index, uint32_t n);

/* rows [n][width] <-> heads [nh][n][part]: head h's `part` values at `offset` of each row. */
static void gather_heads(const float *rows, uint64_t width, uint32_t nh, uint64_t stride, uint64_t offset,
                         uint64_t part, uint32_t n, float *heads)
{
    for (uint32_t h = 0; h < nh; h++)
        for (uint32_t t = 0; t < n; t++)
            memcpy(heads + ((uint64_t)h * n + t) * part, rows + t * width + h * stride + offset, part * sizeof(float));
}

static void scatter_heads(const float *heads, uint32_t nh, uint64_t part, uint32_t n, float *rows, uint64_t width,
                          uint64_t stride, uint64_t offset)
{
    for (uint32_t h = 0; h < nh; h++)
        for (uint32_t t = 0; t < n; t++)
            memcpy(rows + t * width + h * stride + offset, heads + ((uint64_t)h * n + t) * part, part * sizeof(float));
}

/* A decode step's latent heads with their projections, as pool items of a part of the query
 * heads each: the part's rows of q_b (its heads' queries) and their RoPE, head h's query
 * [attn_k_b[h] . q_nope[h] | q_rope[h]] straight into its row of mla_qatt, the part's heads over
 * the latent rows, and v[h] = attn_v_b[h] . (the first c values of its sum) straight into mla_o:
 * one pool dispatch where there were four, with the same products and heads as mla_attention's,
 * so the same bits. */
typedef struct mla_decode_task {
    heads_task heads;
    const col_layer *layer;
    const float *cs, *sn; /* the position's RoPE cosines and sines [r / 2] */
} mla_decode_task;

/* Rows [first, first + n) of a 2-D weight: by the kernels' contract a row's bits do not depend on
 * the rows computed with it. Float weights only (col_pool_runs_here), so never rows cut out of a
 * panel of 8. */
static col_weight weight_rows(const col_tensor_info *t, uint64_t first, uint64_t n)
{
    assert(col_dtype_size(t->dtype) != 0);
    col_weight w = col_weight_of(t);
    w.data = (const uint8_t *)w.data + first * col_dtype_row_bytes(w.dtype, w.cols);
    w.rows = n;
    return w;
}

static void run_mla_decode(void *ctx, uint32_t thread, uint64_t i0, uint64_t i1)
{
    mla_decode_task *task = ctx;
    col_session *s = task->heads.s;
    const col_hparams *hp = &s->model->hp;
    const uint32_t nh = hp->n_heads, nope = hp->qk_nope_head_dim, r = hp->qk_rope_head_dim;
    const uint32_t c = hp->kv_lora_rank, vd = hp->v_head_dim, lat = c + r;
    for (uint64_t i = i0; i < i1; i++) {
        const uint32_t h0 = (uint32_t)i * task->heads.part, h1 = h0 + task->heads.part < nh ? h0 + task->heads.part : nh;
        float *q0 = s->mla_q + (uint64_t)h0 * (nope + r);
        if (hp->q_lora_rank) { /* the part's own rows of q_b: its heads' queries */
            col_matvec_job qb = {weight_rows(task->layer->attn_q_b, (uint64_t)h0 * (nope + r), (uint64_t)(h1 - h0) * (nope + r)),
                                 s->mla_qa, q0, 1, NULL};
            col_matmul_here(s->pool, &qb, 1, thread);
        }
        rope_rotate(col_pool_isa(s->pool), q0 + nope, h1 - h0, nope + r, r, hp->rope_layout, task->cs, task->sn);
        col_matvec_job jobs[COL_HEAD_PART];
        for (uint32_t h = h0; h < h1; h++) {
            const float *q = s->mla_q + (uint64_t)h * (nope + r);
            jobs[h - h0] = (col_matvec_job){col_weight_expert(task->layer->attn_k_b, h), q, s->mla_qatt + (uint64_t)h * lat, 1,
                                            NULL};
            memcpy(s->mla_qatt + (uint64_t)h * lat + c, q + nope, r * sizeof(float));
        }
        col_matmul_here(s->pool, jobs, h1 - h0, thread);
        run_heads(&task->heads, thread, i, i + 1);
        for (uint32_t h = h0; h < h1; h++)
            jobs[h - h0] = (col_matvec_job){col_weight_expert(task->layer->attn_v_b, h), s->mla_att + (uint64_t)h * lat,
                                            s->mla_o + (uint64_t)h * vd, 1, NULL};
        col_matmul_here(s->pool, jobs, h1 - h0, thread);
    }
}

/* The latent attention of n positions from s->position: xn [n][d_model] -> out [n][d_model].
 * Queries and the position's latent come from their projections; the latent (RMSNorm'd) and the
 * RoPE'd shared key part are cached as one row of kv_lora_rank + qk_rope_head_dim; head h's query
 * is [attn_k_b[h] . q_nope | RoPE(q_rope)], attending over the cached rows as keys and values
 * (one KV head for all the query heads), and its output is attn_v_b[h] . (the first
 * kv_lora_rank values of the attended sum). Each position's result depends on its own inputs
 * only, so a step equals a prefill block bit for bit. */
static void mla_attention(col_session *s, uint32_t layer_index, uint32_t n, const float *xn, float *out)
{
    const col_hparams *hp = &s->model->hp;
    const col_layer *layer = &s->model->layers[layer_index];
    const uint32_t nh = hp->n_heads, nope = hp->qk_nope_head_dim, r = hp->qk_rope_head_dim;
    const uint32_t c = hp->kv_lora_rank, ql = hp->q_lora_rank;
    const uint64_t qw = (uint64_t)nh * (nope + r), lat = (uint64_t)c + r;
    const float eps = hp->latent_norm_eps;

    /* projections: the query (straight, or through its normalised low-rank pair) and the latent */
    col_matvec_job proj[2] = {{col_weight_of(ql ? layer->attn_q_a : layer->attn_q), xn, ql ? s->mla_qa : s->mla_q, n,
                               NULL},
                              {col_weight_of(layer->attn_kv_a), xn, s->mla_kv, n, NULL}};
    col_matmul_many(s->pool, proj, 2);
    for (uint32_t t = 0; t < n; t++) {
        float *kv = s->mla_kv + t * lat;
        add_bias(kv, layer->attn_kv_a_bias, lat);
        col_rmsnorm(col_pool_isa(s->pool), kv, layer->attn_kv_a_norm, eps, c, kv, s->norm_weight);
        if (ql) {
            float *qa = s->mla_qa + (uint64_t)t * ql;
            add_bias(qa, layer->attn_q_a_bias, ql);
            col_rmsnorm(col_pool_isa(s->pool), qa, layer->attn_q_a_norm, eps, ql, qa, s->norm_weight);
        }
    }
    /* a decode step whose up-projections run on the heads' threads: q_b and the query's RoPE too */
    const int step = n == 1 && col_pool_runs_here(s->pool, layer->attn_k_b->dtype) &&
                     col_pool_runs_here(s->pool, layer->attn_v_b->dtype) &&
                     (!ql || col_pool_runs_here(s->pool, layer->attn_q_b->dtype));
    if (ql && !step) {
        col_matvec_job qb = {col_weight_of(layer->attn_q_b), s->mla_qa, s->mla_q, n, NULL};
        col_matmul_many(s->pool, &qb, 1);
    }
    /* RoPE of each position's query heads and shared key part; the latent row into the cache */
    float cs[COL_MAX_HEAD_DIM / 2], sn[COL_MAX_HEAD_DIM / 2];
    for (uint32_t t = 0; t < n; t++) {
        uint32_t pos = s->position + t;
        rope_angles(hp, pos, s->inv_freq, cs, sn);
        float *q = s->mla_q + t * qw, *kv = s->mla_kv + t * lat;
        if (!step) rope_rotate(col_pool_isa(s->pool), q + nope, nh, nope + r, r, hp->rope_layout, cs, sn);
        rope_rotate(col_pool_isa(s->pool), kv + c, 1, lat, r, hp->rope_layout, cs, sn);
        kv_store(s, kv_rows(s, s->k_cache, layer_index, 0), pos, kv, lat);
    }
    if (step) {
        mla_decode_task task = {heads_of(s, layer_index, s->position, 1, s->mla_qatt, s->mla_att), layer, cs, sn};
        if (task.heads.n_parts == 1) { /* one thread: parts keep the jobs' array small */
            task.heads.part = COL_HEAD_PART;
            task.heads.n_parts = (nh + COL_HEAD_PART - 1) / COL_HEAD_PART;
        }
        col_pool_run(s->pool, run_mla_decode, &task, task.heads.n_parts);
    } else {
        mla_up_heads(s, layer_index, n);
    }
    col_matvec_job o = {col_weight_of(layer->attn_o), s->mla_o, out, n, NULL};
    col_matmul_many(s->pool, &o, 1);
    for (uint32_t t = 0; t < n; t++) add_bias(out + (uint64_t)t * hp->d_model, layer->attn_o_bias, hp->d_model);
}

/* mla_attention's heads with their up-projections, as batches of products over n positions:
 * mla_q -> mla_o. */
static void mla_up_heads(col_session *s, uint32_t layer_index, uint32_t n)
{
    const col_hparams *hp = &s->model->hp;
    const col_layer *layer = &s->model->layers[layer_index];
    const uint32_t nh = hp->n_heads, nope = hp->qk_nope_head_dim, r = hp->qk_rope_head_dim;
    const uint32_t c = hp->kv_lora_rank, vd = hp->v_head_dim;
    const uint64_t qw = (uint64_t)nh * (nope + r), lat = (uint64_t)c + r, aw = (uint64_t)nh * lat;
    /* the key up-projection moved onto the query: q_lat[h] = attn_k_b[h] . q_nope[h] */
    gather_heads(s->mla_q, qw, nh, nope + r, 0, nope, n, s->mla_heads);
    for (uint32_t h = 0; h < nh; h++)
        s->mla_jobs[h] = (col_matvec_job){col_weight_expert(layer->attn_k_b, h), s->mla_heads + (uint64_t)h * n * nope,
                                          s->mla_lat + (uint64_t)h * n * c, n, NULL};
    col_matmul_many(s->pool, s->mla_jobs, nh);
    scatter_heads(s->mla_lat, nh, c, n, s->mla_qatt, aw, lat, 0);
    gather_heads(s->mla_q, qw, nh, nope + r, nope, r, n, s->mla_heads);
    scatter_heads(s->mla_heads, nh, r, n, s->mla_qatt, aw, lat, c);
    /* every head over the latent rows: one KV head, nh query heads of c + r */
    heads_task task = heads_of(s, layer_index, s->position, n, s->mla_qatt, s->mla_att);
    col_pool_run(s->pool, run_heads, &task, (uint64_t)n * task.n_parts);
    /* the value up-projection: v[h] = attn_v_b[h] . (the first c values of head h's sum) */
    gather_heads(s->mla_att, aw, nh, lat, 0, c, n, s->mla_lat);
    for (uint32_t h = 0; h < nh; h++)
        s->mla_jobs[h] = (col_matvec_job){col_weight_expert(layer->attn_v_b, h), s->mla_lat + (uint64_t)h * n * c,
                                          s->mla_heads + (uint64_t)h * n * vd, n, NULL};
    col_matmul_many(s->pool, s->mla_jobs, nh);
    scatter_heads(s->mla_heads, nh, vd, n, s->mla_o, (uint64_t)nh * vd, vd, 0);
}

/* A block of n positions (s->position .. +n-1): q/k/v and the o-projection as matrix-matrix
 * products over the block, then attend_positions. Reads s->xn [n][d_model], writes s->tmp
 * [n][d_model]. */
void col_attention(col_session *s, uint32_t layer_index, uint32_t n)
{
    const col_hparams *hp = &s->model->hp;
    const col_layer *layer = &s->model->layers[layer_index];
    if (hp->attention == COL_ATTENTION_MLA) {
        mla_attention(s, layer_index, n, s->xn, s->tmp);
        return;
    }
    /* q, k and v in one kernel dispatch: their rows are split among the threads as one range */
    col_matvec_job qkv[3] = {{col_weight_of(layer->attn_q), s->xn, s->q, n, NULL},
                             {col_weight_of(layer->attn_k), s->xn, s->k, n, NULL},
                             {col_weight_of(layer->attn_v), s->xn, s->v, n, NULL}};
    col_matmul_many(s->pool, qkv, 3);
    attend_positions(s, layer_index, s->position, n, s->q, s->k, s->v, s->att);
    col_matvec_job o = {col_weight_of(layer->attn_o), s->att, s->tmp, n, NULL};
    col_matmul_many(s->pool, &o, 1);
    for (uint32_t t = 0; t < n; t++) add_bias(s->tmp + (uint64_t)t * hp->d_model, layer->attn_o_bias, hp->d_model);
}
