/*
 * forward.c - one token through the whole model: embedding, the pre-norm decoder layers
 * (x += attention(norm(x)); x += feed_forward(norm(x))), the final norm and the LM head.
 *
 * It also owns per-layer timing: phases are read from the monotonic clock only when tracing is
 * on, so a session without a trace pays nothing for it.
 */
#include "session.h"

#include <string.h>

void col_forward_token(col_session *s, int32_t token)
{
    const col_model *m = s->model;
    const col_hparams *hp = &m->hp;
    uint32_t d_model = hp->d_model;
    int tracing = s->trace_ids != NULL;
    uint64_t start = tracing ? col_now_ns() : 0;

    const col_tensor_info *embd = m->token_embd;
    const uint8_t *row = (const uint8_t *)embd->data + (uint64_t)token * col_dtype_row_bytes(embd->dtype, d_model);
    col_load_row(row, embd->dtype, d_model, s->x);

    for (uint32_t l = 0; l < hp->n_layers; l++) {
        const col_layer *layer = &m->layers[l];
        uint64_t *phase = tracing ? s->trace_phase_ns + ((uint64_t)s->position * hp->n_layers + l) * COL_PHASE_COUNT : NULL;
        uint64_t t0 = tracing ? col_now_ns() : 0;

        col_rmsnorm(s->x, layer->attn_norm, hp->norm_eps, d_model, s->xn, s->norm_weight);
        col_attention(s, l);
        for (uint32_t i = 0; i < d_model; i++) s->x[i] += s->tmp[i];
        uint64_t t1 = tracing ? col_now_ns() : 0;

        col_rmsnorm(s->x, layer->ffn_norm, hp->norm_eps, d_model, s->xn, s->norm_weight);
        if (phase) memset(phase, 0, COL_PHASE_COUNT * sizeof *phase);
        col_feed_forward(s, l, phase);
        for (uint32_t i = 0; i < d_model; i++) s->x[i] += s->tmp[i];

        if (phase) {
            phase[COL_PHASE_ATTENTION] = t1 - t0;
            phase[COL_PHASE_LAYER] = col_now_ns() - t0;
        }
    }

    col_rmsnorm(s->x, m->output_norm, hp->norm_eps, d_model, s->xn, s->norm_weight);
    col_weight head = col_weight_of(m->output);
    col_matvec(s->pool, &head, s->xn, s->logits);

    if (tracing) {
        s->trace_tokens[s->position] = token;
        s->trace_token_ns[s->position] = col_now_ns() - start;
    }
    s->position++;
}
