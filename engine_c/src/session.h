/*
 * session.h - the session struct and the forward-pass entry points shared by session.c,
 * forward.c, attention.c and experts.c (internal).
 *
 * Every buffer below lives in one arena allocated by col_session_create; nothing on the
 * per-token path allocates.
 */
#ifndef COLIBRI_SESSION_H
#define COLIBRI_SESSION_H

#include "internal.h"
#include "kernels.h"
#include "router.h"

struct col_session {
    const col_model *model;
    col_session_config config;
    col_pool *pool;
    uint32_t position;          /* positions processed so far */
    uint32_t capacity;          /* max positions (KV cache and trace rows) */
    uint32_t k_slots;           /* routing slots per decision: top-k, or n_experts when soft */
    uint32_t d_ff_max;          /* largest intermediate size of any MLP */

    void *arena;                /* the single allocation everything below points into */
    uint64_t arena_size;

    /* KV cache: [n_layers][capacity][n_kv_heads * head_dim] */
    float *k_cache;
    float *v_cache;

    /* RoPE inverse frequencies [head_dim / 2] */
    float *inv_freq;

    /* scratch for one position */
    float *x;                   /* [d_model] residual stream */
    float *xn;                  /* [d_model] normed input of a sublayer */
    float *q;                   /* [n_heads * head_dim] */
    float *k;                   /* [n_kv_heads * head_dim] */
    float *v;                   /* [n_kv_heads * head_dim] */
    float *att;                 /* [n_heads * head_dim] attention output before o-proj */
    float *scores;              /* [capacity] attention scores of one head */
    float *tmp;                 /* [d_model] a sublayer's output */
    float *acc;                 /* [d_model] MoE accumulator */
    float *h1;                  /* [d_ff_max] */
    float *h3;                  /* [d_ff_max] */
    float *router_logits;       /* [n_experts] */
    float *norm_weight;         /* [max(d_model, n_heads*head_dim)] a norm's weights as f32 */
    int32_t *route_ids;         /* [n_experts] */
    float *route_weights;       /* [n_experts] */
    col_router_scratch router_scratch;
    float *logits;              /* [vocab_size] logits of the last position */
    col_matvec_job *expert_jobs; /* [2 * k_slots] one dispatch's products */
    float *expert_h1;           /* [k_slots][d_ff_expert] */
    float *expert_h3;           /* [k_slots][d_ff_expert] */
    float *expert_out;          /* [k_slots][d_model] */
    void *kernel_scratch;       /* col_pool_scratch_size(kernel_jobs, kernel_act_cols) bytes */

    /* trace (NULL when tracing is off) */
    int32_t *trace_tokens;      /* [capacity] */
    int32_t *trace_ids;         /* [capacity][n_moe_layers][k_slots] */
    float *trace_weights;       /* [capacity][n_moe_layers][k_slots] */
    float *trace_logits;        /* [capacity][n_moe_layers][n_experts] */
    float *trace_shared_gate;   /* [capacity][n_moe_layers] */
    float *trace_hidden_norm;   /* [capacity][n_moe_layers] */
    uint64_t *trace_phase_ns;   /* [capacity][n_layers][COL_PHASE_COUNT] */
    uint64_t *trace_token_ns;   /* [capacity] */
};

/* attention.c: RoPE tables, then self-attention of the current position for `layer`:
 * reads s->xn, writes s->tmp (the attention block's output, o-proj and bias applied). */
void col_rope_init(const col_hparams *hp, float *inv_freq);
void col_attention(col_session *s, uint32_t layer);

/* experts.c: the feed-forward block of `layer` (MoE or dense) on s->xn, output in s->tmp.
 * Records routing into the trace when on; `phase_ns` (may be NULL) gets router/experts/combine
 * timings. */
void col_feed_forward(col_session *s, uint32_t layer, uint64_t *phase_ns);

/* rmsnorm: out = w * (x / sqrt(mean(x^2) + eps)), w stored in `w` (any dtype, n elements). */
void col_rmsnorm(const float *x, const col_tensor_info *w, float eps, uint64_t n, float *out,
                 float *w_scratch);

/* forward.c: process one token at the session's current position; logits into s->logits. */
void col_forward_token(col_session *s, int32_t token);

#endif
