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
#include "cache.h"
#include "router.h"

struct col_session {
    const col_model *model;
    col_session_config config;
    col_numerics numerics;      /* the config's numerics variant (numerics.c); the pool points here */
    col_pool *pool;
    uint32_t position;          /* positions processed so far */
    uint32_t capacity;          /* max positions (KV cache and trace rows) */
    uint32_t k_slots;           /* routing slots per decision: top-k, or n_experts when soft */
    uint32_t d_ff_max;          /* largest intermediate size of any MLP */

    col_allocator alloc;        /* what the session and its arena were allocated with */
    void *arena;                /* the single allocation everything below points into */
    uint64_t arena_size;

    /* Attention geometry: GQA reads kv_heads = n_kv_heads caches of att_dim = head_dim, each
     * shared by att_group = n_heads / n_kv_heads query heads; MLA one latent row of att_dim =
     * kv_lora_rank + qk_rope_head_dim per position, read by all n_heads query heads as key and
     * as value (v_cache == k_cache). */
    uint32_t kv_heads, att_dim, att_group;

    /* KV cache: [n_layers][kv_heads][capacity][att_dim], head-major so that the heads read
     * each KV head's keys and values as one contiguous stream (attention.c, kv_rows) */
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
    float *scores;              /* [n_threads][n_heads / n_kv_heads][capacity] attention scores of one KV group's heads */
    float *tmp;                 /* [d_model] a sublayer's output */
    float *acc;                 /* [d_model] MoE accumulator */
    float *h1;                  /* [d_ff_max] */
    float *h3;                  /* [d_ff_max] */
    float *router_logits;       /* [n_experts] */
    float *route_selection;     /* [n_experts] selection scores of the step's decision */
    int32_t *route_groups;      /* [max(1, n_chosen_groups)] its kept groups */
    uint8_t *route_bias_changed; /* [1] */
    float *norm_weight;         /* [max(d_model, n_heads*head_dim)] a norm's weights as f32 */
    int32_t *route_ids;         /* [n_experts] */
    float *route_weights;       /* [n_experts] */
    col_router_scratch router_scratch;
    float *logits;              /* [vocab_size] logits of the last position */
    col_matvec_job *expert_jobs; /* [2 * k_slots] one dispatch's products */
    float *expert_h1;           /* [k_slots][d_ff_expert] */
    float *expert_h3;           /* [k_slots][d_ff_expert] */
    float *expert_out;          /* [k_slots][d_model] */
    /* a block of up to COL_BATCH positions (prefill): [B] below is COL_BATCH */
    float *bx;                  /* [B][d_model] residual streams */
    float *bxn;                 /* [B][d_model] */
    float *bq;                  /* [B][n_heads * head_dim] */
    float *bk;                  /* [B][n_kv_heads * head_dim] */
    float *bv;                  /* [B][n_kv_heads * head_dim] */
    float *batt;                /* [B][n_heads * head_dim] */
    float *btmp;                /* [B][d_model] */
    float *bacc;                /* [B][d_model] */
    float *brl;                 /* [B][n_experts] router logits */
    float *bsel;                /* [B][n_experts] selection scores */
    int32_t *bgroups;           /* [B][max(1, n_chosen_groups)] kept groups */
    uint8_t *bbias;             /* [B] the correction bias changed the choice */
    int32_t *bids;              /* [B][k_slots] */
    float *bw;                  /* [B][k_slots] */
    uint32_t *bmap;             /* [B][k_slots] row of (token, slot) in the expert-grouped batch */
    uint32_t *bcount;           /* [n_experts] */
    uint32_t *boffset;          /* [n_experts] */
    float *bsgate;              /* [B] shared-expert gate */
    float *gx;                  /* [B * k_slots][d_model] expert inputs grouped by expert */
    float *gh1;                 /* [B * max(k_slots * d_ff_expert, d_ff_dense, d_ff_shared)] */
    float *gh3;                 /* same */
    float *go;                  /* [B * k_slots][d_model] expert outputs */
    float *blogits;             /* [B][vocab_size] */
    col_matvec_job *bjobs;      /* [2 * n_experts + 4] */
    /* MLA (attention.c; empty otherwise), for up to B positions; nope/r/c/ql/vd as in docs/format.md */
    float *mla_qa;              /* [B][q_lora_rank] */
    float *mla_kv;              /* [B][c + r] */
    float *mla_q;               /* [B][n_heads * (nope + r)] */
    float *mla_heads;           /* [n_heads][B][max(nope, r, vd)] per-head gathers */
    float *mla_lat;             /* [n_heads][B][c] */
    float *mla_qatt;            /* [B][n_heads * (c + r)] the heads' queries */
    float *mla_att;             /* [B][n_heads * (c + r)] their attended sums */
    float *mla_o;               /* [B][n_heads * vd] */
    col_matvec_job *mla_jobs;   /* [n_heads] */
    col_cache cache;            /* expert caching's state (cache.c); block NULL without cached routing or LRU */
    void *cache_block;          /* [cache.bytes] */
    void *cache_saved;          /* [cache.bytes] the state when a call began, put back if the call fails */
    int32_t *route_fresh;       /* [k_slots] cached routing's fresh choice when the trace does not keep it */
    void *kernel_scratch;       /* kernel_scratch_bytes: col_pool_scratch_size(kernel_limits) */
    uint64_t kernel_scratch_bytes;

    /* trace (NULL when tracing is off) */
    int32_t *trace_tokens;      /* [capacity] */
    int32_t *trace_ids;         /* [capacity][n_moe_layers][k_slots] */
    float *trace_weights;       /* [capacity][n_moe_layers][k_slots] */
    float *trace_logits;        /* [capacity][n_moe_layers][n_experts] */
    float *trace_selection;     /* [capacity][n_moe_layers][n_experts] */
    int32_t *trace_groups;      /* [capacity][n_moe_layers][n_chosen_groups], NULL without groups */
    uint8_t *trace_bias_changed; /* [capacity][n_moe_layers] */
    float *trace_shared_gate;   /* [capacity][n_moe_layers] */
    float *trace_hidden_norm;   /* [capacity][n_moe_layers] */
    uint64_t *trace_phase_ns;   /* [capacity][n_layers][COL_PHASE_COUNT] */
    uint64_t *trace_token_ns;   /* [capacity] */
    uint8_t *trace_cache_kept;  /* [capacity][n_moe_layers], cached routing only */
    float *trace_cache_margin;  /* [capacity][n_moe_layers], cached routing only */
    int32_t *trace_fresh_ids;   /* [capacity][n_moe_layers][k_slots], cached routing only */
    uint8_t *trace_cache_hits;  /* [capacity][n_moe_layers][k_slots], with an expert cache only */
};

/* attention.c: RoPE tables, then self-attention of the current position for `layer`:
 * reads s->xn, writes s->tmp (the attention block's output, o-proj and bias applied). */
void col_rope_init(const col_hparams *hp, float *inv_freq);
void col_attention(col_session *s, uint32_t layer);
/* The part after the q/k/v projection, for s->position: s->q/k/v -> KV cache -> s->att. */
void col_attend(col_session *s, uint32_t layer);
/* n positions from s->position: s->bxn -> s->btmp (bit-identical to col_attention each). */
void col_attention_batch(col_session *s, uint32_t layer, uint32_t n);

/* experts.c: the feed-forward block of `layer` (MoE or dense) on s->xn, output in s->tmp.
 * Records routing into the trace when on; `phase_ns` (may be NULL) gets router/experts/combine
 * timings. */
void col_feed_forward(col_session *s, uint32_t layer, uint64_t *phase_ns);
void col_feed_forward_batch(col_session *s, uint32_t layer, uint32_t n, uint64_t *phase_ns);

/* rmsnorm: out = w * (x / sqrt(mean(x^2) + eps)), w stored in `w` (any dtype, n elements). */
void col_rmsnorm(const float *x, const col_tensor_info *w, float eps, uint64_t n, float *out,
                 float *w_scratch);
/* col_rmsnorm of `rows` rows of d_model values (x and out [rows][d_model]) with the session's
 * eps, the weight loaded once and the rows split among the pool's threads; each row's result is
 * what col_rmsnorm gives it. Uses s->norm_weight. */
void col_rmsnorm_rows(col_session *s, const float *x, const col_tensor_info *w, uint32_t rows, float *out);

/* forward.c: process one token at the session's current position; logits into s->logits. */
void col_forward_token(col_session *s, int32_t token, const float *embedding);

/* Positions processed together by prefill (matrix-matrix products over the block). */
#define COL_BATCH 128

/* forward.c: n <= COL_BATCH tokens at positions s->position..+n-1, bit-identical to n calls of
 * col_forward_token. logits (may be NULL) receives [n][vocab]; s->logits gets the last row. */
void col_forward_batch(col_session *s, const int32_t *tokens, const float *embeddings, uint32_t n, float *logits);

#endif
