/*
 * forward.c - a block of positions through the whole model: embedding, the pre-norm decoder
 * layers (x += attention(norm(x)); x += feed_forward(norm(x))), the final norm and the LM head.
 * The norm is the model's (RMSNorm, or LayerNorm with or without bias); the LM head adds its bias
 * when the file has one. The residual stream's scales (Granite's multipliers: embeddings times a
 * factor, each block's output times a factor before it is added, logits divided by a factor)
 * apply when the header sets them. A prefill runs blocks of up to COL_BATCH positions; a decode
 * step is the block of one, so decode and prefill are one code path and give the same bits by
 * construction. Stepping one layer at a time (session.c, col_session_step_layer) runs the same
 * pieces one by one.
 *
 * It also owns per-layer timing: phases are read from the monotonic clock only when tracing is
 * on, so a session without a trace pays nothing for it.
 */
#include "session.h"

#include <string.h>

/* The input row of one position: the token's embedding, or the caller's row (token -1). */
static void input_row(const col_model *m, int32_t token, const float *embedding, float *x)
{
    uint32_t d_model = m->hp.d_model;
    if (embedding) {
        memcpy(x, embedding, (uint64_t)d_model * sizeof(float));
        return;
    }
    const col_tensor_info *embd = m->token_embd;
    col_load_matrix_range(embd->data, embd->dtype, d_model, (uint64_t)token, 0, d_model, x);
}

/* Rows of x [n][d_model] += the block's output rows, scaled first when the model says so (Granite's
 * residual_multiplier; times 1 is exact otherwise), as pool items by row. */
typedef struct residual_task {
    const col_session *s;
    float *x;
    const float *out;
} residual_task;

static void residual_rows(void *ctx, uint32_t thread, uint64_t t0, uint64_t t1)
{
    const residual_task *r = ctx;
    const uint64_t d = r->s->model->hp.d_model;
    const float scale = r->s->model->hp.residual_scale;
    (void)thread;
    const float w = scale == 0.0f ? 1.0f : scale;
    col_add_scaled(col_pool_isa(r->s->pool), r->x + t0 * d, w, r->out + t0 * d, (t1 - t0) * d);
}

static void add_residual(col_session *s, float *x, const float *out, uint32_t n)
{
    residual_task task = {s, x, out};
    col_pool_run(s->pool, residual_rows, &task, n);
}

/* The residual stream of positions base..base+n-1 (rows of x) after `layer` into the capture
 * buffer, for the positions its window covers (col_session_capture). */
static void capture_layer(col_session *s, uint32_t layer, uint32_t base, uint32_t n, const float *x)
{
    if (!s->capture) return;
    uint64_t d = s->model->hp.d_model, n_layers = s->model->hp.n_layers;
    for (uint32_t t = 0; t < n; t++) {
        uint64_t p = (uint64_t)base + t;
        if (p < s->capture_first || p - s->capture_first >= s->capture_rows) continue;
        memcpy(s->capture + ((p - s->capture_first) * n_layers + layer) * d, x + t * d, d * sizeof(float));
    }
}

/* Every weight product is a matrix-matrix product over the block (weights read once per block,
 * not once per token); with n = 1 the kernels run their single-token tiles. Phase timings of the
 * block are shared equally among its positions. */
void col_forward(col_session *s, const int32_t *tokens, const float *embeddings, uint32_t n, float *logits)
{
    uint64_t ns = col_forward_embed(s, tokens, embeddings, n);
    for (uint32_t l = 0; l < s->model->hp.n_layers; l++) ns += col_forward_layer(s, l, n);
    col_forward_head(s, embeddings ? NULL : tokens, n, logits, ns);
}

uint64_t col_forward_embed(col_session *s, const int32_t *tokens, const float *embeddings, uint32_t n)
{
    const col_model *m = s->model;
    const col_hparams *hp = &m->hp;
    uint32_t d_model = hp->d_model;
    uint64_t n_x = (uint64_t)n * d_model;
    uint64_t start = s->trace_ids ? col_now_ns() : 0;
    for (uint32_t t = 0; t < n; t++)
        input_row(m, embeddings ? -1 : tokens[t], embeddings ? embeddings + (uint64_t)t * d_model : NULL,
                  s->x + (uint64_t)t * d_model);
    if (hp->embedding_scale != 0.0f) /* Granite's embedding_multiplier, on caller rows too as transformers does */
        for (uint64_t i = 0; i < n_x; i++) s->x[i] *= hp->embedding_scale;
    col_numerics_round(&s->numerics, s->pool, s->x, n_x); /* numerics variant: rounded residual stream */
    return s->trace_ids ? col_now_ns() - start : 0;
}

uint64_t col_forward_layer(col_session *s, uint32_t l, uint32_t n)
{
    const col_model *m = s->model;
    const col_hparams *hp = &m->hp;
    const col_layer *layer = &m->layers[l];
    uint64_t n_x = (uint64_t)n * hp->d_model;
    int tracing = s->trace_ids != NULL;
    uint64_t phase[COL_PHASE_COUNT] = {0};
    uint64_t t0 = tracing ? col_now_ns() : 0;
    col_norm_rows(s, s->x, layer->attn_norm, layer->attn_norm_bias, n, s->xn);
    col_attention(s, l, n);
    add_residual(s, s->x, s->tmp, n);
    col_numerics_round(&s->numerics, s->pool, s->x, n_x);
    uint64_t t1 = tracing ? col_now_ns() : 0;
    col_norm_rows(s, s->x, layer->ffn_norm, layer->ffn_norm_bias, n, s->xn);
    col_feed_forward(s, l, n, tracing ? phase : NULL);
    add_residual(s, s->x, s->tmp, n);
    col_numerics_round(&s->numerics, s->pool, s->x, n_x);
    capture_layer(s, l, s->position, n, s->x);
    if (!tracing) return 0;
    phase[COL_PHASE_ATTENTION] = t1 - t0;
    phase[COL_PHASE_LAYER] = col_now_ns() - t0;
    for (uint32_t t = 0; t < n; t++) {
        uint64_t *dst = s->trace_phase_ns + ((uint64_t)(s->position + t) * hp->n_layers + l) * COL_PHASE_COUNT;
        for (int p = 0; p < COL_PHASE_COUNT; p++) dst[p] = phase[p] / n;
    }
    return phase[COL_PHASE_LAYER];
}

void col_forward_head(col_session *s, const int32_t *tokens, uint32_t n, float *logits, uint64_t elapsed_ns)
{
    const col_model *m = s->model;
    const col_hparams *hp = &m->hp;
    uint32_t d_model = hp->d_model, base = s->position;
    int tracing = s->trace_ids != NULL;
    uint64_t start = tracing ? col_now_ns() : 0;
    /* The LM head over every position when all logits are wanted, else over the last only,
     * straight into s->logits. */
    uint32_t first = logits ? 0 : n - 1, rows = n - first;
    col_norm_rows(s, s->x + (uint64_t)first * d_model, m->output_norm, m->output_norm_bias, rows, s->xn);
    float *out = logits ? logits : s->logits;
    col_matvec_job head = {col_weight_of(m->output), s->xn, out, rows, NULL};
    col_matmul_many(s->pool, &head, 1);
    if (m->output_bias) {
        const float *b = (const float *)m->output_bias->data; /* 1-D, so f32 (format.c checks) */
        for (uint32_t r = 0; r < rows; r++)
            for (uint32_t i = 0; i < hp->vocab_size; i++) out[(uint64_t)r * hp->vocab_size + i] += b[i];
    }
    if (hp->logit_divisor != 0.0f) /* divided, not multiplied by the inverse: the bits transformers gets */
        for (uint64_t i = 0; i < (uint64_t)rows * hp->vocab_size; i++) out[i] /= hp->logit_divisor;
    if (logits)
        memcpy(s->logits, logits + (uint64_t)(rows - 1) * hp->vocab_size, (uint64_t)hp->vocab_size * sizeof(float));

    if (tracing) {
        uint64_t each = (elapsed_ns + col_now_ns() - start) / n;
        for (uint32_t t = 0; t < n; t++) {
            s->trace_tokens[base + t] = tokens ? tokens[t] : -1;
            s->trace_token_ns[base + t] = each;
        }
    }
    s->position = base + n;
}
