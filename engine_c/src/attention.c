/*
 * attention.c - rotary position embedding and grouped-query self-attention for one position,
 * with the layer's KV cache.
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

/* Rotate each of n_heads vectors of head_dim values in place (rotate_half layout). */
static void rope_apply(float *vec, uint32_t n_heads, uint32_t head_dim, uint32_t position,
                       const float *inv_freq)
{
    uint32_t half = head_dim / 2;
    for (uint32_t i = 0; i < half; i++) {
        float angle = (float)position * inv_freq[i];
        float c = cosf(angle), s = sinf(angle);
        for (uint32_t h = 0; h < n_heads; h++) {
            float *v = vec + (uint64_t)h * head_dim;
            float x1 = v[i], x2 = v[i + half];
            v[i] = x1 * c - x2 * s;
            v[i + half] = x2 * c + x1 * s;
        }
    }
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

static void project(col_session *s, const col_tensor_info *w, const float *x, float *y)
{
    col_weight view = col_weight_of(w);
    col_matvec(s->pool, &view, x, y);
}

void col_attention(col_session *s, uint32_t layer_index)
{
    const col_model *m = s->model;
    const col_hparams *hp = &m->hp;
    const col_layer *layer = &m->layers[layer_index];

    /* q, k and v in one kernel dispatch: their rows are split among the threads as one range */
    col_matvec_job qkv[3] = {{col_weight_of(layer->attn_q), s->xn, s->q, 1},
                             {col_weight_of(layer->attn_k), s->xn, s->k, 1},
                             {col_weight_of(layer->attn_v), s->xn, s->v, 1}};
    col_matmul_many(s->pool, qkv, 3);
    col_attend(s, layer_index);
    project(s, layer->attn_o, s->att, s->tmp);
    add_bias(s->tmp, layer->attn_o_bias, hp->d_model);
}

void col_attend(col_session *s, uint32_t layer_index)
{
    const col_model *m = s->model;
    const col_hparams *hp = &m->hp;
    const col_layer *layer = &m->layers[layer_index];
    uint32_t d = hp->head_dim, nh = hp->n_heads, nkv = hp->n_kv_heads;
    uint64_t q_dim = (uint64_t)nh * d, kv_dim = (uint64_t)nkv * d;
    uint32_t pos = s->position;

    add_bias(s->q, layer->attn_q_bias, q_dim);
    add_bias(s->k, layer->attn_k_bias, kv_dim);
    add_bias(s->v, layer->attn_v_bias, kv_dim);

    if (hp->flags & COL_FLAG_QK_NORM_FULL) {
        col_rmsnorm(s->q, layer->attn_q_norm, hp->norm_eps, q_dim, s->q, s->norm_weight);
        col_rmsnorm(s->k, layer->attn_k_norm, hp->norm_eps, kv_dim, s->k, s->norm_weight);
    }
    if (hp->clip_qkv > 0.0f) {
        clamp_all(s->q, q_dim, hp->clip_qkv);
        clamp_all(s->k, kv_dim, hp->clip_qkv);
        clamp_all(s->v, kv_dim, hp->clip_qkv);
    }
    if (hp->flags & COL_FLAG_QK_NORM_HEAD) {
        for (uint32_t h = 0; h < nh; h++)
            col_rmsnorm(s->q + (uint64_t)h * d, layer->attn_q_norm, hp->norm_eps, d, s->q + (uint64_t)h * d, s->norm_weight);
        for (uint32_t h = 0; h < nkv; h++)
            col_rmsnorm(s->k + (uint64_t)h * d, layer->attn_k_norm, hp->norm_eps, d, s->k + (uint64_t)h * d, s->norm_weight);
    }
    rope_apply(s->q, nh, d, pos, s->inv_freq);
    rope_apply(s->k, nkv, d, pos, s->inv_freq);

    float *k_layer = s->k_cache + (uint64_t)layer_index * s->capacity * kv_dim;
    float *v_layer = s->v_cache + (uint64_t)layer_index * s->capacity * kv_dim;
    for (uint64_t i = 0; i < kv_dim; i++) {
        k_layer[(uint64_t)pos * kv_dim + i] = s->k[i];
        v_layer[(uint64_t)pos * kv_dim + i] = s->v[i];
    }

    uint32_t first = 0;
    if (hp->sliding_window > 0 && pos + 1 > hp->sliding_window) first = pos + 1 - hp->sliding_window;
    float scale = (float)(1.0 / sqrt((double)d));
    uint32_t group = nh / nkv;
    for (uint32_t h = 0; h < nh; h++) {
        const float *qh = s->q + (uint64_t)h * d;
        uint64_t kv_off = (uint64_t)(h / group) * d;
        float max = -INFINITY;
        for (uint32_t t = first; t <= pos; t++) {
            const float *kt = k_layer + (uint64_t)t * kv_dim + kv_off;
            float dot = 0.0f;
            for (uint32_t i = 0; i < d; i++) dot += qh[i] * kt[i];
            s->scores[t] = dot * scale;
            if (s->scores[t] > max) max = s->scores[t];
        }
        float sum = 0.0f;
        for (uint32_t t = first; t <= pos; t++) {
            s->scores[t] = expf(s->scores[t] - max);
            sum += s->scores[t];
        }
        float *out = s->att + (uint64_t)h * d;
        for (uint32_t i = 0; i < d; i++) out[i] = 0.0f;
        for (uint32_t t = first; t <= pos; t++) {
            float p = s->scores[t] / sum;
            const float *vt = v_layer + (uint64_t)t * kv_dim + kv_off;
            for (uint32_t i = 0; i < d; i++) out[i] += p * vt[i];
        }
    }
}

/* A block of n positions (s->position .. +n-1): q/k/v and the o-projection as matrix-matrix
 * products over the block, the per-position part (bias, norms, RoPE, cache, scores) by
 * col_attend, position by position, so every output is bit-identical to col_attention.
 * Reads s->bxn [n][d_model], writes s->btmp [n][d_model]. */
void col_attention_batch(col_session *s, uint32_t layer_index, uint32_t n)
{
    const col_hparams *hp = &s->model->hp;
    const col_layer *layer = &s->model->layers[layer_index];
    uint64_t q_dim = (uint64_t)hp->n_heads * hp->head_dim, kv_dim = (uint64_t)hp->n_kv_heads * hp->head_dim;
    col_matvec_job qkv[3] = {{col_weight_of(layer->attn_q), s->bxn, s->bq, n},
                             {col_weight_of(layer->attn_k), s->bxn, s->bk, n},
                             {col_weight_of(layer->attn_v), s->bxn, s->bv, n}};
    col_matmul_many(s->pool, qkv, 3);
    uint32_t base = s->position;
    for (uint32_t t = 0; t < n; t++) {
        s->position = base + t;
        memcpy(s->q, s->bq + t * q_dim, q_dim * sizeof(float));
        memcpy(s->k, s->bk + t * kv_dim, kv_dim * sizeof(float));
        memcpy(s->v, s->bv + t * kv_dim, kv_dim * sizeof(float));
        col_attend(s, layer_index);
        memcpy(s->batt + t * q_dim, s->att, q_dim * sizeof(float));
    }
    s->position = base;
    col_matvec_job o = {col_weight_of(layer->attn_o), s->batt, s->btmp, n};
    col_matmul_many(s->pool, &o, 1);
    for (uint32_t t = 0; t < n; t++) add_bias(s->btmp + (uint64_t)t * hp->d_model, layer->attn_o_bias, hp->d_model);
}
