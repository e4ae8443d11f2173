/*
 * attention.c - rotary position embedding and grouped-query self-attention for a block of
 * positions (one in a decode step), with the layer's KV cache.
 *
 * Follows transformers' eager attention for the v1 families: q/k/v projections (+ bias), the
 * optional q/k RMSNorm (per head before RoPE for Qwen3-MoE, over the whole projection for OLMoE,
 * then OLMoE's clip), rotate-half RoPE with inverse frequencies computed in f32 as
 * transformers does, scores scaled by head_dim^-1/2, softmax in f32, and head h reading KV
 * head h / (n_heads / n_kv_heads). The sliding window admits key k for query q iff q - W < k <= q.
 */
#include "session.h"

#include <math.h>
#include <string.h>

void col_rope_init(const col_hparams *hp, float *inv_freq)
{
    uint32_t half = hp->head_dim / 2;
    for (uint32_t i = 0; i < half; i++) {
        /* base ** (arange(0, d, 2) / d) in f32, as torch computes it */
        float exponent = (float)(2 * i) / (float)hp->head_dim;
        inv_freq[i] = 1.0f / powf((float)hp->rope_theta, exponent);
        if (hp->rope_type == COL_ROPE_LINEAR) inv_freq[i] /= hp->rope_factor;
    }
}

/* Rotate each of n_heads vectors of head_dim values in place by the angles whose cosines and
 * sines are c and s [head_dim / 2] (rotate_half layout). */
static void rope_rotate(float *vec, uint32_t n_heads, uint32_t head_dim, const float *c, const float *s)
{
    uint32_t half = head_dim / 2;
    for (uint32_t h = 0; h < n_heads; h++) {
        float *v = vec + (uint64_t)h * head_dim;
        for (uint32_t i = 0; i < half; i++) {
            float x1 = v[i], x2 = v[i + half];
            v[i] = x1 * c[i] - x2 * s[i];
            v[i + half] = x2 * c[i] + x1 * s[i];
        }
    }
}

/* RoPE of q [n_heads] and k [n_kv_heads] at `position`, with the cosines and sines computed once
 * for both, and before the heads' loops rather than inside them (perf put RoPE at 1.1 % of a bf16
 * prefill's calling thread). The same values as before, so the same bits. */
static void rope_apply(float *q, uint32_t n_heads, float *k, uint32_t n_kv_heads, uint32_t head_dim, uint32_t position,
                       const float *inv_freq)
{
    float c[COL_MAX_HEAD_DIM / 2], s[COL_MAX_HEAD_DIM / 2];
    for (uint32_t i = 0; i < head_dim / 2; i++) {
        float angle = (float)position * inv_freq[i];
        c[i] = cosf(angle);
        s[i] = sinf(angle);
    }
    rope_rotate(q, n_heads, head_dim, c, s);
    rope_rotate(k, n_kv_heads, head_dim, c, s);
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
 * are each one contiguous stream: in the position-major layout a position's four 256-byte head
 * rows sat 1 KiB apart, which put a head's lines in 16 of L1's 64 sets. Same bits; a KV group's
 * heads over 1551 cached positions ran 2x faster warm in a C driver; paired in-process, prefill
 * 1.04-1.07x at 1536 positions and 1.05x at 128, decode unchanged (it reads the cache from
 * memory at about 9 GB/s per thread either way). */
static float *kv_rows(const col_session *s, float *cache, uint32_t layer_index, uint32_t g)
{
    const col_hparams *hp = &s->model->hp;
    return cache + ((uint64_t)layer_index * hp->n_kv_heads + g) * s->capacity * hp->head_dim;
}

/* The per-position part before the scores: biases, q/k norms, clip, RoPE, and k/v into the
 * layer's cache at `pos`. q [q_dim], k and v [kv_dim] are updated in place. */
static void prepare_position(col_session *s, uint32_t layer_index, uint32_t pos, float *q, float *k, float *v)
{
    const col_model *m = s->model;
    const col_hparams *hp = &m->hp;
    const col_layer *layer = &m->layers[layer_index];
    uint32_t d = hp->head_dim, nh = hp->n_heads, nkv = hp->n_kv_heads;
    uint64_t q_dim = (uint64_t)nh * d, kv_dim = (uint64_t)nkv * d;

    add_bias(q, layer->attn_q_bias, q_dim);
    add_bias(k, layer->attn_k_bias, kv_dim);
    add_bias(v, layer->attn_v_bias, kv_dim);

    if (hp->flags & COL_FLAG_QK_NORM_FULL) {
        col_rmsnorm(q, layer->attn_q_norm, hp->norm_eps, q_dim, q, s->norm_weight);
        col_rmsnorm(k, layer->attn_k_norm, hp->norm_eps, kv_dim, k, s->norm_weight);
    }
    if (hp->clip_qkv > 0.0f) {
        clamp_all(q, q_dim, hp->clip_qkv);
        clamp_all(k, kv_dim, hp->clip_qkv);
        clamp_all(v, kv_dim, hp->clip_qkv);
    }
    if (hp->flags & COL_FLAG_QK_NORM_HEAD) {
        for (uint32_t h = 0; h < nh; h++)
            col_rmsnorm(q + (uint64_t)h * d, layer->attn_q_norm, hp->norm_eps, d, q + (uint64_t)h * d, s->norm_weight);
        for (uint32_t h = 0; h < nkv; h++)
            col_rmsnorm(k + (uint64_t)h * d, layer->attn_k_norm, hp->norm_eps, d, k + (uint64_t)h * d, s->norm_weight);
    }
    rope_apply(q, nh, k, nkv, d, pos, s->inv_freq);

    for (uint32_t g = 0; g < nkv; g++) {
        memcpy(kv_rows(s, s->k_cache, layer_index, g) + (uint64_t)pos * d, k + (uint64_t)g * d, d * sizeof(float));
        memcpy(kv_rows(s, s->v_cache, layer_index, g) + (uint64_t)pos * d, v + (uint64_t)g * d, d * sizeof(float));
    }
}

/* The heads of n positions from `base`, as pool items (head-major): queries q [n][q_dim],
 * outputs att [n][q_dim]; each thread scores into its own row of s->scores. */
typedef struct heads_task {
    col_session *s;
    uint32_t layer, base, n;
    const float *q;
    float *att;
} heads_task;

/* A step reads its layer's cache from memory (the weights read since the last step flushed it),
 * so its heads prefetch keys and values this many positions ahead; a prefill block's positions
 * find the cache warm from the block's earlier ones (prefetching there measured 0.93-0.96x).
 * Paired in-process runs at 1536 positions: decode 1.13x (q4 bench model; 1.29x at 96 and 1.45x
 * at 48 in shorter series, 0.99x at 16), 1.03x (bf16, whose weights dominate); at 8-56
 * positions 1.00x. */
#define COL_DECODE_KV_PREFETCH 64

static void run_heads(void *ctx, uint32_t thread, uint64_t i0, uint64_t i1)
{
    const heads_task *task = ctx;
    const col_session *s = task->s;
    const col_hparams *hp = &s->model->hp;
    const uint64_t q_dim = (uint64_t)hp->n_heads * hp->head_dim, d = hp->head_dim;
    const uint32_t group = hp->n_heads / hp->n_kv_heads; /* query heads per KV head */
    float *scores = s->scores + (uint64_t)thread * group * s->capacity;
    float scale = (float)(1.0 / sqrt((double)hp->head_dim));
    for (uint64_t i = i0; i < i1; i++) {
        /* KV-head-major, so each thread's share holds early and late positions alike (a late
         * position attends to more keys); the query heads of a KV head run together, so each key
         * and value read from the cache serves all of them */
        uint64_t n = task->n, t = i % n;
        uint32_t g = (uint32_t)(i / n);
        uint64_t at = t * q_dim + (uint64_t)g * group * hp->head_dim;
        uint32_t pos = task->base + (uint32_t)t, first = 0;
        if (hp->sliding_window > 0 && pos + 1 > hp->sliding_window) first = pos + 1 - hp->sliding_window;
        col_head_job job = {task->q + at, kv_rows(s, s->k_cache, task->layer, g) + first * d,
                            kv_rows(s, s->v_cache, task->layer, g) + first * d, d, pos + 1 - first, hp->head_dim, scale,
                            group, n == 1 ? COL_DECODE_KV_PREFETCH : 0};
        col_attend_head(s->pool, &job, scores, task->att + at);
    }
}

/* Attention of the n positions base.. whose q/k/v rows are in q, k, v (updated in place), into att.
 * Every position is prepared (and its k/v cached) before any head runs, so a position of a block
 * sees the earlier positions of the same block; the heads then run on the pool's threads. */
static void attend_positions(col_session *s, uint32_t layer_index, uint32_t base, uint32_t n, float *q, float *k,
                             float *v, float *att)
{
    const col_hparams *hp = &s->model->hp;
    uint64_t q_dim = (uint64_t)hp->n_heads * hp->head_dim, kv_dim = (uint64_t)hp->n_kv_heads * hp->head_dim;
    for (uint32_t t = 0; t < n; t++)
        prepare_position(s, layer_index, base + t, q + t * q_dim, k + t * kv_dim, v + t * kv_dim);
    heads_task task = {s, layer_index, base, n, q, att};
    col_pool_run(s->pool, run_heads, &task, (uint64_t)n * hp->n_kv_heads);
}

/* A block of n positions (s->position .. +n-1): q/k/v and the o-projection as matrix-matrix
 * products over the block, then attend_positions. Reads s->xn [n][d_model], writes s->tmp
 * [n][d_model]. */
void col_attention(col_session *s, uint32_t layer_index, uint32_t n)
{
    const col_hparams *hp = &s->model->hp;
    const col_layer *layer = &s->model->layers[layer_index];
    /* q, k and v in one kernel dispatch: their rows are split among the threads as one range */
    col_matvec_job qkv[3] = {{col_weight_of(layer->attn_q), s->xn, s->q, n},
                             {col_weight_of(layer->attn_k), s->xn, s->k, n},
                             {col_weight_of(layer->attn_v), s->xn, s->v, n}};
    col_matmul_many(s->pool, qkv, 3);
    attend_positions(s, layer_index, s->position, n, s->q, s->k, s->v, s->att);
    col_matvec_job o = {col_weight_of(layer->attn_o), s->att, s->tmp, n};
    col_matmul_many(s->pool, &o, 1);
    for (uint32_t t = 0; t < n; t++) add_bias(s->tmp + (uint64_t)t * hp->d_model, layer->attn_o_bias, hp->d_model);
}
