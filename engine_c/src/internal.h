/*
 * internal.h - declarations shared between the engine's source files; not API.
 *
 * The model struct is filled by format.c (open + validate) and read by the forward pass. Every
 * pointer in it points into the read-only mapping and was bounds-checked before it was set.
 */
#ifndef COLIBRI_INTERNAL_H
#define COLIBRI_INTERNAL_H

#include "colibri.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

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
    const col_tensor_info *attn_norm, *ffn_norm;
    const col_tensor_info *attn_q, *attn_k, *attn_v, *attn_o;
    const col_tensor_info *attn_q_bias, *attn_k_bias, *attn_v_bias, *attn_o_bias; /* NULL if absent */
    const col_tensor_info *attn_q_norm, *attn_k_norm;                             /* NULL if absent */
    const col_tensor_info *moe_gate, *moe_w1, *moe_w2, *moe_w3;                   /* MoE layers */
    const col_tensor_info *shared_w1, *shared_w2, *shared_w3, *shared_gate;       /* NULL if absent */
    const col_tensor_info *mlp_w1, *mlp_w2, *mlp_w3;                              /* dense layers */
} col_layer;

struct col_model {
    const uint8_t *base;            /* read-only mapping of the whole file */
    uint64_t size;
    col_hparams hp;
    uint32_t n_tensors;
    col_tensor_info *tensors;       /* [n_tensors], data pointers into the mapping */
    col_routing_info *routing;      /* [n_layers] */
    col_layer *layers;              /* [n_layers] */
    int32_t *moe_layers;            /* [n_moe_layers] layer index of each MoE layer */
    const col_tensor_info *token_embd, *output_norm, *output; /* output == token_embd when tied */
    const uint8_t *tokenizer;
    uint64_t tokenizer_size;
    const uint8_t *metadata;
    uint64_t metadata_size;
};

/* Write a formatted message to err (may be NULL) and return `status`. */
int32_t col_set_error(char *err, size_t errlen, int32_t status, const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 4, 5)))
#endif
    ;

/* Monotonic clock in nanoseconds. */
uint64_t col_now_ns(void);

#endif /* COLIBRI_INTERNAL_H */
