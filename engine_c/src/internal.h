/*
 * internal.h - declarations shared between the engine's source files; not API.
 *
 * The model struct is filled by format.c (open + validate) and read by the forward pass. Every
 * pointer in it points into the read-only mapping and was bounds-checked before it was set.
 */
#ifndef COLIBRI_INTERNAL_H
#define COLIBRI_INTERNAL_H

/* The largest head_dim a file may declare (format.c checks it; attention.c sizes by it). */
#define COL_MAX_HEAD_DIM 1024

#include "colibri.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* q8_0x8 / q4_0x8: the blocks of q8_0 / q4_0 stored in panels of COL_STORED_PANEL_ROWS rows
 * (docs/format.md "Quantised panels"); the validator requires whole panels, and a chunk of a
 * product of such weights starts and ends on one. */
#define COL_STORED_PANEL_ROWS 8
static inline int is_panel_dtype(uint32_t dtype)
{
    return dtype == COL_DTYPE_Q8_0X8 || dtype == COL_DTYPE_Q4_0X8;
}

/* bf16x16: bf16 in panels of COL_BF16_PANEL_ROWS rows, each pair of columns of the panel's rows
 * in one 64-byte line (docs/format.md "bf16 panels"). */
#define COL_BF16_PANEL_ROWS 16
static inline int is_bf16_panel(uint32_t dtype)
{
    return dtype == COL_DTYPE_BF16X16;
}

/* Whether `dtype` holds bf16 values, in rows or in panels (what bf16 dot products multiply). */
static inline int holds_bf16(uint32_t dtype)
{
    return dtype == COL_DTYPE_BF16 || is_bf16_panel(dtype);
}

/* Rows of a panel of `dtype` (8 for q8_0x8/q4_0x8, 16 for bf16x16), 0 for a row dtype. */
static inline uint32_t col_panel_rows(uint32_t dtype)
{
    return is_panel_dtype(dtype) ? COL_STORED_PANEL_ROWS : is_bf16_panel(dtype) ? COL_BF16_PANEL_ROWS : 0;
}

/* A 2-D (or stacked 3-D) weight as the kernels see it: rows of `cols` elements of `dtype`.
 * For a stacked expert tensor [E][rows][cols], `data` points at expert 0 and
 * `expert_stride` is the byte distance between experts. */
typedef struct col_weight {
    const void *data;
    uint32_t dtype;
    uint64_t rows;
    uint64_t cols;
    uint64_t expert_stride;
} col_weight;

typedef struct col_layer {
    uint32_t kind;                  /* col_layer_kind */
    uint32_t moe_index;             /* index among MoE layers, valid when kind == MOE */
    const col_routing_info *route;  /* the layer's routing entry, decoded (v1 entries to v1's rule) */
    const col_tensor_info *attn_norm, *ffn_norm;
    const col_tensor_info *attn_norm_bias, *ffn_norm_bias;                        /* LayerNorm with bias */
    const col_tensor_info *attn_q, *attn_k, *attn_v, *attn_o;                     /* GQA (MLA: attn_q without q_lora, attn_o) */
    const col_tensor_info *attn_q_bias, *attn_k_bias, *attn_v_bias, *attn_o_bias; /* NULL if absent */
    const col_tensor_info *attn_q_norm, *attn_k_norm;                             /* NULL if absent */
    const col_tensor_info *attn_q_a, *attn_q_a_norm, *attn_q_a_bias, *attn_q_b;   /* MLA with q_lora_rank */
    const col_tensor_info *attn_kv_a, *attn_kv_a_norm, *attn_kv_a_bias;           /* MLA */
    const col_tensor_info *attn_k_b, *attn_v_b;                                   /* MLA: [n_heads][c][nope], [n_heads][v][c] */
    const col_tensor_info *moe_gate, *moe_w1, *moe_w2, *moe_w3;                   /* MoE layers */
    const col_tensor_info *moe_gate_bias, *moe_correction_bias;                   /* NULL if absent */
    const col_tensor_info *shared_w1, *shared_w2, *shared_w3, *shared_gate;       /* NULL if absent */
    const col_tensor_info *mlp_w1, *mlp_w2, *mlp_w3;                              /* dense layers */
    const col_tensor_info *attn_sinks;                                            /* [n_heads], NULL if absent */
    const col_tensor_info *moe_w1_bias, *moe_w2_bias, *moe_w3_bias;               /* [E][I], [E][H], [E][I] or NULL */
} col_layer;

/* What identifies the mapped file: compared by col_model_check_file (guard.c). */
typedef struct col_file_id {
    uint64_t dev, ino, size;
    int64_t mtime_sec, mtime_nsec;
} col_file_id;

struct col_model {
    const uint8_t *base;            /* read-only mapping of the whole file */
    uint64_t size;
    col_hparams hp;
    uint32_t n_tensors;
    col_tensor_info *tensors;       /* [n_tensors], data pointers into the mapping */
    col_routing_info *routing;      /* [n_layers] */
    col_layer *layers;              /* [n_layers] */
    int32_t *moe_layers;            /* [n_moe_layers] layer index of each MoE layer */
    uint32_t n_chosen_groups;       /* most groups a MoE layer keeps (0 when no layer has groups) */
    const col_tensor_info *token_embd, *output_norm, *output; /* output == token_embd when tied */
    const col_tensor_info *output_norm_bias, *output_bias;    /* NULL if absent */
    const col_tensor_info *rope_freq_factors;                 /* [rotary_dim / 2], LongRoPE only */
    const uint8_t *tokenizer;
    uint64_t tokenizer_size;
    const uint8_t *metadata;
    uint64_t metadata_size;
    col_allocator alloc;            /* what the model and its tables were allocated with */
    int fd;                         /* the mapped file, kept open for identity checks; -1 if none */
    col_file_id file_id;            /* at open */
    int32_t guard;                  /* SIGBUS guard slot (guard.c), -1 when unguarded */
    char path[1024];                /* as opened (truncated if longer), for messages and reopen */
};

/* util.c: allocation through a col_allocator (NULL = malloc). col_alloc_zeroed returns `count`
 * zeroed elements of `size` bytes, 64-byte aligned, or NULL on failure or overflow. */
void col_allocator_or_default(const col_allocator *in, col_allocator *out);
void *col_alloc_zeroed(const col_allocator *a, uint64_t count, uint64_t size);
void col_dealloc(const col_allocator *a, void *p);

/* guard.c: the SIGBUS guard over mappings. register returns a slot, or -1 when the mapping
 * cannot be guarded (it still works; only a truncation race is then fatal). */
int32_t col_guard_register(const void *base, uint64_t size);
void col_guard_unregister(int32_t slot);
bool col_guard_faulted(int32_t slot);
int32_t col_file_identity(int fd, col_file_id *out);

/* Write a formatted message to err (may be NULL) and return `status`. */
int32_t col_set_error(char *err, size_t errlen, int32_t status, const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 4, 5)))
#endif
    ;

/* Monotonic clock in nanoseconds. */
uint64_t col_now_ns(void);

#endif /* COLIBRI_INTERNAL_H */
