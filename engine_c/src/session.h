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

    col_allocator alloc;        /* what the session and its arena were allocated with */
    void *arena;                /* the single allocation everything below points into */
    uint64_t arena_size;

    /* Attention geometry: GQA reads kv_heads = n_kv_heads caches of att_dim = head_dim, each
     * shared by att_group = n_heads / n_kv_heads query heads; MLA one latent row of att_dim =
     * kv_lora_rank + qk_rope_head_dim per position, read by all n_heads query heads as key and
     * as value (v_cache == k_cache). */
    uint32_t kv_heads, att_dim, att_group;

    /* KV cache: [n_layers][kv_heads][capacity][att_dim] elements of kv_bytes (4: f32, 2: f16 by
     * col_session_config.kv_precision), head-major so that the heads read each KV head's keys
     * and values as one contiguous stream (attention.c, kv_rows) */
    void *k_cache;
    void *v_cache;
    uint32_t kv_bytes;

    /* RoPE inverse frequencies [rotary_dim / 2] */
    float *inv_freq;

    /* scratch for a block of up to COL_BATCH positions ([B] below); a decode step is the block
     * of one */
    float *x;                   /* [B][d_model] residual streams */
    float *xn;                  /* [B][d_model] normed inputs of a sublayer */
    float *q;                   /* [B][n_heads * head_dim] */
    float *k;                   /* [B][n_kv_heads * head_dim] */
    float *v;                   /* [B][n_kv_heads * head_dim] */
    float *att;                 /* [B][n_heads * head_dim] attention outputs before o-proj */
    float *scores;              /* [n_threads][att_group][capacity] attention scores of one KV group's heads */
    float *tmp;                 /* [B][d_model] a sublayer's outputs */
    float *norm_weight;         /* [max(d_model, (n_heads + n_kv_heads) * head_dim, kv_lora_rank, q_lora_rank)]
                                   a norm's weights as f32 (the q and k norms' side by side) */
    float *router_logits;       /* [B][n_experts] */
    int32_t *route_ids;         /* [B][k_slots] */
    float *route_weights;       /* [B][k_slots] */
    float *route_selection;     /* [B][n_experts] selection scores of each decision */
    int32_t *route_groups;      /* [B][max(1, n_chosen_groups)] their kept groups */
    uint8_t *route_bias_changed; /* [B] the correction bias changed the choice */
    uint32_t *route_count;      /* [B] experts chosen per position (fewer than k_slots when interventions forbid) */
    int32_t *route_run;         /* [B][k_slots] the expert whose weights each slot runs (a swap's), beside route_ids */
    uint8_t *route_edits;       /* [B] bits of the intervention kinds that acted on each decision */
    uint8_t *edit_forbidden;    /* [n_experts] one decision's forbidden experts (intervene.c) */
    float *edit_bias;           /* [n_experts] one decision's correction bias with its edits */
    col_router_scratch router_scratch;
    uint32_t *route_rows;       /* [B][k_slots] row of (token, slot) in the expert-grouped batch */
    uint32_t *expert_count;     /* [n_experts] */
    uint32_t *expert_offset;    /* [n_experts] */
    float *shared_gate;         /* [B] shared-expert gate */
    float *expert_x;            /* [B * k_slots][d_model] expert inputs grouped by expert (or, for quantised
                                   experts and bf16 ones under bf16 dot products, the same rows
                                   quantised or packed: col_pool_qrow_bytes each) */
    float *h1;                  /* [B * max(k_slots * d_ff_expert, d_ff_dense, d_ff_shared)] */
    float *h3;                  /* same */
    float *expert_out;          /* [B * k_slots][d_model] expert outputs, grouped as expert_x */
    float *shared_h1;           /* [B][d_ff_shared] the shared expert's up-projections (0 without one) */
    float *shared_h3;           /* same */
    float *shared_out;          /* [B][d_model] (0 without a shared expert) */
    float *logits;              /* [vocab_size] logits of the last position */
    col_matvec_job *jobs;       /* [3 * n_experts + 4] one kernel dispatch's products */
    uint32_t *job_group;        /* [3 * n_experts + 4] each job's group in a chain (col_matmul_chain) */
    uint32_t *group_expert;     /* [n_experts] the expert of each group of the experts' chain */
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
    void *cache_saved;          /* [cache.bytes] the state when a call (or the position in progress) began,
                                 * put back if it fails */
    int32_t *cache_log_ids;     /* [capacity][n_moe_layers][k_slots] every decision, for col_session_truncate */
    uint8_t *cache_log_kept;    /* [capacity][n_moe_layers], cached routing only */
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
    uint8_t *trace_intervened;  /* [capacity][n_moe_layers] */
    uint8_t *trace_cache_kept;  /* [capacity][n_moe_layers], cached routing only */
    float *trace_cache_margin;  /* [capacity][n_moe_layers], cached routing only */
    int32_t *trace_fresh_ids;   /* [capacity][n_moe_layers][k_slots], cached routing only */
    uint8_t *trace_cache_hits;  /* [capacity][n_moe_layers][k_slots], with an expert cache only */

    /* interventions, borrowed from the caller (col_session_set_interventions) */
    const col_intervention *interventions; /* [n_interventions] */
    uint32_t n_interventions;

    /* stepping one layer at a time (col_session_begin_token) */
    uint32_t layers_done;       /* of the position in progress; COL_NO_LAYER when none */
    int32_t layer_token;        /* its token; -1 for an embedding row (col_session_begin_embedding) */
    int layer_undo;             /* layer_input holds the input of the last layer run */
    float *layer_input;         /* [d_model] the residual stream before the last layer run */
    uint64_t layer_ns;          /* engine time of the position so far (trace) */

    /* hidden-state capture (col_session_capture): rows of positions capture_first.. +
     * capture_rows, each [n_layers][d_model]; NULL when off. capture_own is the arena's
     * [capacity][n_layers][d_model] buffer (config.capture_hidden), else NULL. */
    float *capture;
    uint32_t capture_first;
    uint32_t capture_rows;
    float *capture_own;
};

/* Positions processed together by prefill (matrix-matrix products over the block): each block reads
 * the experts' weights once, so a longer prompt's blocks re-read them less often. */
#ifndef COL_BATCH
#define COL_BATCH 256
#endif

/* attention.c: RoPE tables, then self-attention of the n positions from s->position for
 * `layer`: reads s->xn [n][d_model], writes s->tmp (the attention block's outputs, o-proj and
 * bias applied). */
void col_rope_init(const col_hparams *hp, const float *freq_factors, float *inv_freq);
void col_attention(col_session *s, uint32_t layer, uint32_t n);

/* experts.c: the feed-forward block of `layer` (MoE or dense) on s->xn [n][d_model], outputs in
 * s->tmp. Records routing into the trace when on; `phase_ns` (may be NULL) gets router/experts/
 * combine timings. */
void col_feed_forward(col_session *s, uint32_t layer, uint32_t n, uint64_t *phase_ns);

/* rmsnorm: out = w * (x / sqrt(mean(x^2) + eps)), w stored in `w` (any dtype, n elements), loaded
 * into w_scratch [n] as f32 for col_rmsnorm_row (kernels.h, which defines the sum's order). */
void col_rmsnorm(col_isa isa, const float *x, const col_tensor_info *w, float eps, uint64_t n, float *out,
                 float *w_scratch);
/* The residual stream's norm (the model's norm_kind: RMSNorm, or LayerNorm with the bias `b`
 * when not NULL) of `rows` rows of d_model values (x and out [rows][d_model]) with the model's
 * eps, the weight loaded once and the rows split among the pool's threads; a row's result does
 * not depend on the others. Uses s->norm_weight. */
void col_norm_rows(col_session *s, const float *x, const col_tensor_info *w, const col_tensor_info *b, uint32_t rows,
                   float *out);

/* forward.c: 1 <= n <= COL_BATCH positions from s->position (a decode step is n = 1): token ids,
 * or when `embeddings` is not NULL its [n][d_model] rows instead of the lookup (tokens unused;
 * the trace records -1). logits (may be NULL) receives [n][vocab]; s->logits gets the last row
 * either way. A position's results do not depend on n or on the block it is in. */
void col_forward(col_session *s, const int32_t *tokens, const float *embeddings, uint32_t n, float *logits);

/* The pieces of col_forward, for stepping one layer at a time (session.c): the input rows of n
 * positions into s->x (as col_forward takes them), and decoder layer `l` over the n positions
 * from s->position, each returning the engine time it took when tracing is on (else 0); then the
 * final norm, the LM head, the trace's tokens (-1 each when `tokens` is NULL) and times
 * (`elapsed_ns`: the time of the pieces before it), and s->position += n. */
uint64_t col_forward_embed(col_session *s, const int32_t *tokens, const float *embeddings, uint32_t n);
uint64_t col_forward_layer(col_session *s, uint32_t l, uint32_t n);
void col_forward_head(col_session *s, const int32_t *tokens, uint32_t n, float *logits, uint64_t elapsed_ns);

/* intervene.c: the interventions of one decision at (position, layer), before the rule runs:
 * edits `logits` in place, points *bias at the edited correction bias when a BIAS edit applies,
 * sets params' forbidden set and forced choice; returns the bits of the kinds applied. */
uint32_t col_intervene_route(col_session *s, uint32_t layer_index, uint32_t position, float *logits,
                             const float **bias, col_router_params *params);
/* After the rule: a WEIGHTS edit into weights[0..n); returns its bit or 0. */
uint32_t col_intervene_weights(const col_session *s, uint32_t layer_index, uint32_t position, float *weights,
                               uint32_t n);
/* The expert whose weights run for a slot that chose `expert` (SWAP); its bit into *applied. */
int32_t col_intervene_run_expert(const col_session *s, uint32_t layer_index, uint32_t position, int32_t expert,
                                 uint32_t *applied);
/* The checks of col_session_set_interventions (k_slots: the session's experts per decision). */
int32_t col_interventions_check(const col_model *m, uint32_t k_slots, const col_intervention *items, uint32_t n,
                                uint32_t *bad, char *err, size_t errlen);

#endif
