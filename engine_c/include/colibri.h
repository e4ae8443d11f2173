/*
 * colibri.h - the public interface of the Colibri MoE inference engine.
 *
 * If it is not in this header it is not API. Two opaque handles:
 *   col_model   - a read-only mapping of a .colibri file plus its parsed, validated header.
 *                 Immutable after col_model_open; any number of threads may read it and create
 *                 sessions on it concurrently.
 *   col_session - the mutable state of one inference stream: arena, KV cache, scratch, trace.
 *                 One thread at a time. A session borrows its model: close the model only after
 *                 freeing every session made on it.
 *
 * Errors are values: every fallible function returns a col_status (0 = COL_OK) and fills either a
 * caller-supplied col_problem (format problems: code, byte offset, tensor, message) or a
 * caller-supplied `char *err, size_t errlen` buffer (may be NULL/0). Nothing here exits, aborts or
 * longjmps on bad input.
 *
 * File format summary (full byte tables in docs/format.md). All little-endian.
 *   0x000 "COLI" | 0x004 u32 version (1 or 2) | 0x008 u32 num_experts | 0x00C u32 num_layers
 *   0x010 u32 header_size | 0x014 u32 tensor_count | 0x018 u64 routing_offset | 0x020 u64 data_offset
 *   then the rest of the fixed header (section offsets, hyper-parameters, CRCs; 256 bytes in
 *   version 1, 512 in version 2, whose bytes 0x0C8.. declare the attention and RoPE features),
 *   the routing section (one entry per layer: 32 bytes in version 1; 128 in version 2, stating
 *   the layer's whole routing rule and attention kind), the tensor table (128 bytes per tensor,
 *   sorted by offset), the tokenizer (tokenizer.json bytes), user metadata (UTF-8 JSON), and
 *   tensor data, every tensor 64-byte aligned.
 *
 * The block between COL_CDEF_BEGIN and COL_CDEF_END is read verbatim by the Python binding's cffi
 * build: keep it plain C declarations (no macros, no inline functions, no preprocessor lines).
 */
#ifndef COLIBRI_H
#define COLIBRI_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define COL_ABI_VERSION 21  /* 4: format version 2 (col_hparams, col_routing_info and col_trace_view
                                grew; col_routing_describe); 5: col_routing_scores; 6: hidden-state
                                capture (col_session_config.capture_hidden, col_session_capture,
                                col_session_hidden); 7: expert caching (COL_ROUTING_CACHED,
                                col_session_config and col_trace_view grew, col_session_cache_stats,
                                col_session_prefill_embeddings); 8: col_hparams grew (norm_kind,
                                the residual-stream scales); 9: GPT-OSS's and Llama 4's fields in
                                col_hparams (attention_chunk_size) and col_routing_info; 10:
                                interventions, col_session_truncate, layer stepping (col_trace_view
                                grew; col_session_begin_embedding); 11: COL_REDUCTION_BF16_DOT; 12: the
                                compute probe (col_arith, col_measure_compute); 13: q8_0/q4_0 products
                                in block order on every path (one fused multiply-add per block and
                                output, docs/performance.md): their bits changed, no declaration did;
                                14: the panel dtypes COL_DTYPE_Q8_0X8 and COL_DTYPE_Q4_0X8; 15:
                                COL_KERNELS_AVX512F, between AVX2 and AVX-512 (the later values
                                moved up one: a ceiling orders the paths); 16: the panel dtype
                                COL_DTYPE_BF16X16; 17: col_session_config.kv_precision (the KV cache
                                in f16); 18: col_thread_stats, col_session_thread_stats; 19:
                                col_session_generate; 20: col_measure_read_latency; 21:
                                col_session_set_routing */
#define COL_FORMAT_VERSION 2          /* the version writers write; readers also read version 1 */
#define COL_HEADER_SIZE 256           /* version 1's fixed header */
#define COL_HEADER_SIZE_V2 512
#define COL_ROUTING_ENTRY_SIZE 32     /* version 1's routing entry */
#define COL_ROUTING_ENTRY_SIZE_V2 128
#define COL_TENSOR_ENTRY_SIZE 128
#define COL_TENSOR_NAME_MAX 64
#define COL_ALIGNMENT 64
#define COL_NO_TENSOR 0xFFFFFFFFu
#define COL_NO_LAYER 0xFFFFFFFFu       /* col_session_layers_done: no position in progress */
#define COL_LAST_POSITION 0xFFFFFFFFu  /* col_intervention.last_position: to the end of the run */

/* COL_CDEF_BEGIN */

/* Status codes. Append-only: values are part of the ABI and of `colibri validate --json`. */
typedef enum col_status {
    COL_OK = 0,
    COL_ERR_IO = 1,              /* cannot open, stat, read or map the file */
    COL_ERR_NOMEM = 2,           /* an allocation failed */
    COL_ERR_INVALID_ARG = 3,     /* a caller broke a documented precondition */
    COL_ERR_TRUNCATED = 4,       /* file shorter than the header or than its declared file_size */
    COL_ERR_BAD_MAGIC = 5,       /* first four bytes are not "COLI" */
    COL_ERR_BAD_VERSION = 6,     /* format version this engine does not read */
    COL_ERR_LIMIT = 7,           /* a count or size beyond a stated limit, or that would overflow */
    COL_ERR_HEADER = 8,          /* a header field is inconsistent (header_size, hyper-parameters) */
    COL_ERR_SECTION_BOUNDS = 9,  /* routing section, tensor table, tokenizer or metadata outside the file */
    COL_ERR_TENSOR_BOUNDS = 10,  /* tensor data outside the file or before data_offset */
    COL_ERR_MISALIGNED = 11,     /* an offset that must be 64-byte aligned is not */
    COL_ERR_SIZE_MISMATCH = 12,  /* tensor byte size != product(shape) * dtype size */
    COL_ERR_OVERLAP = 13,        /* two tensors' data ranges overlap, or table not sorted by offset */
    COL_ERR_MISSING_TENSOR = 14, /* a tensor the architecture requires is absent */
    COL_ERR_SHAPE = 15,          /* a tensor's shape does not match the hyper-parameters */
    COL_ERR_DTYPE = 16,          /* unknown dtype, or a dtype not allowed for that tensor */
    COL_ERR_NAME = 17,           /* tensor name not NUL-terminated, empty, bad characters, duplicate */
    COL_ERR_CHECKSUM = 18,       /* CRC-32 mismatch (header, tables, or a tensor's data) */
    COL_ERR_NONFINITE = 19,      /* NaN or Inf in a tensor */
    COL_ERR_UNSUPPORTED = 20,    /* architecture or feature this engine does not run */
    COL_ERR_ROUTING = 21,        /* routing section inconsistent with header or tensor table */
    COL_ERR_CONTEXT_FULL = 22,   /* session has no room for another position */
    COL_ERR_BAD_TOKEN = 23,      /* token id outside [0, vocab_size) */
    COL_ERR_UNKNOWN_TENSOR = 24, /* warning: a tensor no architecture rule uses */
    COL_ERR_FILE_CHANGED = 25    /* the mapped file was truncated or rewritten while open: reopen it */
} col_status;

typedef enum col_severity {
    COL_SEVERITY_ERROR = 0,
    COL_SEVERITY_WARNING = 1
} col_severity;

/* One validation finding. `offset` is the absolute byte offset in the file the finding is about
 * (the field, table entry or data byte); `tensor` is the tensor's name or "" when none applies. */
typedef struct col_problem {
    int32_t code;        /* col_status */
    int32_t severity;    /* col_severity */
    uint64_t offset;
    char tensor[64];
    char message[256];
} col_problem;

typedef enum col_dtype {
    COL_DTYPE_F32 = 0,
    COL_DTYPE_F16 = 1,
    COL_DTYPE_BF16 = 2,
    /* 3 and 4 were q8_0/q4_0 with each block's scale beside its payload (files converted before
     * 2026-11-29); they are refused with COL_ERR_DTYPE and a request to convert again. */
    COL_DTYPE_Q8_0 = 5,            /* blocks of 32 along a row: a row holds its f16 scales, then 32 int8 per block (34 bytes per block) */
    COL_DTYPE_Q4_0 = 6,            /* blocks of 32: f16 scales, then 16 bytes of nibbles per block, (q-8)*scale (18 bytes per block) */
    /* (since ABI 14) the blocks of q8_0 / q4_0, the same sizes and products, in panels of 8 rows (a
     * tensor's rows % 8 == 0): per panel the 8 rows' scales block by block, then per block their
     * 4-byte groups interleaved (docs/format.md "Quantised panels"), the order the AVX2 kernels read */
    COL_DTYPE_Q8_0X8 = 7,
    COL_DTYPE_Q4_0X8 = 8,
    /* (since ABI 16) bf16 in panels of 16 rows (a tensor's rows % 16 == 0, columns even): per
     * panel, for each pair of columns 2q, 2q + 1, the 16 rows' pairs side by side (64 bytes), so
     * one vector holds a pair of 16 rows (docs/format.md "bf16 panels"); the same bytes as bf16 */
    COL_DTYPE_BF16X16 = 9
} col_dtype;

/* The family a file was converted from: a label for people and tools. The engine runs what the
 * header fields and routing entries say, never a family's name. 5.. are format version 2. */
typedef enum col_arch {
    COL_ARCH_MIXTRAL = 1,
    COL_ARCH_QWEN2_MOE = 2,
    COL_ARCH_QWEN3_MOE = 3,
    COL_ARCH_OLMOE = 4,
    COL_ARCH_DEEPSEEK_V2 = 5,
    COL_ARCH_DEEPSEEK_V3 = 6,
    COL_ARCH_GLM4_MOE = 7,
    COL_ARCH_ERNIE4_5_MOE = 8,
    COL_ARCH_GPT_OSS = 9,
    COL_ARCH_LLAMA4 = 10,
    COL_ARCH_PHIMOE = 11,
    COL_ARCH_GRANITEMOE = 12,
    COL_ARCH_GRANITEMOESHARED = 13,
    COL_ARCH_DBRX = 14
} col_arch;

/* Bits of col_hparams.flags (header offset 0x05C). NORM_TOPK, SHARED_EXPERT and
 * SHARED_EXPERT_GATE are version 1's: a version-2 file states them in each routing entry. */
typedef enum col_model_flag {
    COL_FLAG_NORM_TOPK = 1,          /* v1: renormalise the k selected weights to sum to 1 */
    COL_FLAG_TIED_EMBEDDINGS = 2,    /* logits use token_embd; no "output" tensor */
    COL_FLAG_SHARED_EXPERT = 4,      /* v1: MoE layers have a shared expert (shared_w1/w2/w3) */
    COL_FLAG_SHARED_EXPERT_GATE = 8, /* v1: shared expert output scaled by sigmoid(shared_gate . x) */
    COL_FLAG_QKV_BIAS = 16,          /* attn_q_bias, attn_k_bias, attn_v_bias present (MLA: attn_q_a_bias, attn_kv_a_bias) */
    COL_FLAG_O_BIAS = 32,            /* attn_o_bias present */
    COL_FLAG_QK_NORM_HEAD = 64,      /* RMSNorm of each head's q and k ([head_dim] weights), before RoPE */
    COL_FLAG_QK_NORM_FULL = 128,     /* RMSNorm over the whole projected q and k (OLMoE), before RoPE */
    COL_FLAG_OUTPUT_BIAS = 256       /* v2: output_bias [vocab_size] added to the logits (PhiMoE's lm_head bias) */
} col_model_flag;

/* The norm of the residual stream: attn_norm, ffn_norm and output_norm (header 0x100, v2). The
 * q/k norms and MLA's latent norms are RMSNorms whatever it says. */
typedef enum col_norm_kind {
    COL_NORM_KIND_RMS = 0,         /* w * x / sqrt(mean(x^2) + eps) */
    COL_NORM_KIND_LAYER = 1,       /* w * (x - mean) / sqrt(var + eps), no bias (DBRX) */
    COL_NORM_KIND_LAYER_BIAS = 2   /* the same + b: the *_norm_bias tensors (PhiMoE) */
} col_norm_kind;

typedef enum col_rope_type {
    COL_ROPE_DEFAULT = 0,
    COL_ROPE_LINEAR = 1,
    COL_ROPE_YARN = 2,             /* v2: inverse frequencies ramped between interpolation and extrapolation */
    COL_ROPE_LONGROPE = 3,         /* v2: inverse frequencies divided by the rope_freq_factors tensor (PhiMoE's LongRoPE) */
    COL_ROPE_LLAMA3 = 4            /* v2: low frequencies divided by rope_factor, high ones kept, smoothed between */
} col_rope_type;

/* Which dimensions RoPE pairs (header 0x0E4, v2). */
typedef enum col_rope_layout {
    COL_ROPE_HALVES = 0,           /* dimension i with i + rotary_dim/2 (rotate_half, NeoX) */
    COL_ROPE_INTERLEAVED = 1       /* dimension 2i with 2i + 1 (GPT-J; DeepSeek, ERNIE) */
} col_rope_layout;

/* The attention block (header 0x0C8, v2). */
typedef enum col_attention_kind {
    COL_ATTENTION_GQA = 0,         /* q/k/v projections, n_kv_heads key/value heads */
    COL_ATTENTION_MLA = 1          /* DeepSeek's multi-head latent attention (compressed KV) */
} col_attention_kind;

typedef enum col_layer_kind {
    COL_LAYER_DENSE = 0,
    COL_LAYER_MOE = 1
} col_layer_kind;

/* Per-layer attention mask (routing entry 0x48, v2; version 1: every layer sliding when the
 * header's sliding_window is set). */
typedef enum col_layer_attention {
    COL_LAYER_FULL = 0,            /* causal */
    COL_LAYER_SLIDING = 1,         /* key allowed iff q - sliding_window < k <= q */
    COL_LAYER_CHUNKED = 2          /* key allowed iff k <= q in the same chunk: k / C == q / C, C =
                                    * attention_chunk_size (Llama 4) */
} col_layer_attention;

/* What a MoE layer's routed experts compute between their up and down projections (routing
 * entry 0x54, v2); g = w1 . x (+ bias), u = w3 . x (+ bias). */
typedef enum col_expert_activation {
    COL_EXPERT_SWIGLU = 0,         /* silu(g) * u */
    COL_EXPERT_SWIGLU_CLAMPED = 1  /* (clamp(u, -limit, limit) + 1) * g' * sigmoid(alpha * g'),
                                    * g' = min(g, limit) (GPT-OSS) */
} col_expert_activation;

/* How a MoE layer turns router logits into scores (routing entry 0x18). */
typedef enum col_scoring {
    COL_SCORING_SOFTMAX = 0,
    COL_SCORING_SIGMOID = 1,
    COL_SCORING_SPARSEMIXER = 2    /* PhiMoE: two arg-maxes of the logits, each weighted by a masked softmax */
} col_scoring;

/* What the top-k ranks (routing entry 0x1C, v2). */
typedef enum col_select_on {
    COL_SELECT_SCORES = 0,         /* score every expert, select on score (+ correction bias), weight = score */
    COL_SELECT_LOGITS = 1          /* select on the logits, then score only the chosen (softmax over the k, or sigmoid) */
} col_select_on;

/* A group's score in group-limited routing (routing entry 0x2C, v2). */
typedef enum col_group_score {
    COL_GROUP_NONE = 0,            /* no group limit (n_groups = 1) */
    COL_GROUP_MAX = 1,             /* the group's best selection score (DeepSeek-V2) */
    COL_GROUP_TOP2_SUM = 2         /* the sum of the group's two best selection scores (DeepSeek-V3) */
} col_group_score;

/* Normalisation of the k weights before scaling (routing entry 0x30, v2). */
typedef enum col_normalize {
    COL_NORM_NONE = 0,
    COL_NORM_SUM = 1,              /* w / (sum w + norm_eps) */
    COL_NORM_SUM_CLAMPED = 2,      /* w / max(sum w, norm_eps) (ERNIE's moe_norm_min) */
    COL_NORM_P = 3                 /* w / (sum |w|^norm_p)^(1/norm_p) (DBRX) */
} col_normalize;

/* A MoE layer's shared expert (routing entry 0x40, v2). */
typedef enum col_shared {
    COL_SHARED_NONE = 0,
    COL_SHARED_PLAIN = 1,          /* shared_w1/w2/w3 output added to the routed mix */
    COL_SHARED_SIGMOID_GATE = 2    /* ... scaled by sigmoid(shared_gate . x) (Qwen2-MoE) */
} col_shared;

/* Decoded hyper-parameters (header bytes 0x000..0x0BF, and 0x0C8..0x1FF in version 2). Fields a
 * version-1 file does not have are filled with what version 1 means: GQA, v_head_dim = rotary_dim
 * = head_dim, halves layout, attn_scale = head_dim^-1/2, rope_attn_factor = 1. */
typedef struct col_hparams {
    uint32_t version;
    uint32_t arch;                 /* col_arch */
    uint32_t flags;                /* col_model_flag bits */
    uint32_t n_layers;
    uint32_t n_experts;            /* routed experts per MoE layer */
    uint32_t n_experts_active;     /* top-k */
    uint32_t n_moe_layers;
    uint32_t d_model;
    uint32_t n_heads;
    uint32_t n_kv_heads;
    uint32_t head_dim;
    uint32_t vocab_size;
    uint32_t max_context;
    uint32_t d_ff_expert;
    uint32_t d_ff_dense;           /* 0 when every layer is MoE */
    uint32_t d_ff_shared;          /* 0 without shared expert */
    uint32_t sliding_window;       /* 0 = full causal attention */
    uint32_t rope_type;            /* col_rope_type */
    uint32_t rope_original_max_context;
    int32_t bos_token_id;          /* -1 = none */
    int32_t eos_token_id;          /* -1 = none */
    double rope_theta;
    float rope_factor;
    float rope_low_freq_factor;
    float rope_high_freq_factor;
    float norm_eps;
    float clip_qkv;                /* 0 = no clipping */
    float default_epsilon;         /* suggested stable-top-k epsilon */
    uint32_t attention;            /* col_attention_kind */
    uint32_t q_lora_rank;          /* MLA: 0 = q straight from attn_q, else the rank of attn_q_a / attn_q_b */
    uint32_t kv_lora_rank;         /* MLA: width of the cached latent */
    uint32_t qk_nope_head_dim;     /* MLA: query/key dims without position (head_dim = nope + rope) */
    uint32_t qk_rope_head_dim;     /* MLA: query/key dims with RoPE */
    uint32_t v_head_dim;           /* value (and attention output) dims per head */
    uint32_t rotary_dim;           /* dims of a head that RoPE rotates (the first ones; MLA: the rope part) */
    uint32_t rope_layout;          /* col_rope_layout */
    uint32_t rope_truncate;        /* YaRN: 1 = floor/ceil the correction range */
    float attn_scale;              /* attention scores are multiplied by this */
    float latent_norm_eps;         /* MLA: epsilon of the attn_q_a_norm / attn_kv_a_norm RMSNorms */
    float rope_attn_factor;        /* cos and sin multiplied by this (YaRN's attention factor, LongRoPE's mscale; else 1) */
    float rope_beta_fast;          /* YaRN */
    float rope_beta_slow;          /* YaRN */
    uint32_t norm_kind;            /* col_norm_kind (v1: RMS) */
    float embedding_scale;         /* 0 = none, else the embeddings are multiplied by it (Granite) */
    float residual_scale;          /* 0 = none, else each block's output is multiplied by it before the residual add */
    float logit_divisor;           /* 0 = none, else the logits are divided by it (Granite's logits_scaling) */
    uint32_t attention_chunk_size; /* C of chunked layers (COL_LAYER_CHUNKED); 0 when no layer is chunked */
} col_hparams;

/* One tensor table entry, decoded. `data` points into the read-only mapping (never write it). */
typedef struct col_tensor_info {
    char name[64];
    uint32_t index;
    uint32_t dtype;                /* col_dtype */
    uint32_t ndim;                 /* 1..4 */
    uint64_t shape[4];             /* row-major; unused trailing dims are 0 */
    uint64_t offset;               /* absolute file offset of the first data byte */
    uint64_t nbytes;
    uint32_t crc32;                /* CRC-32 (IEEE, zlib) of the data bytes */
    uint64_t table_offset;         /* absolute offset of this entry in the tensor table */
    const void *data;
} col_tensor_info;

/* One routing section entry (per layer): the layer's whole routing rule (docs/format.md, "The
 * routing rule"), the form of its routed experts and its attention. Version-1 entries are decoded
 * to the rule version 1 means (softmax over every expert, top-k of the scores, NORM_TOPK and the
 * shared-expert flags of the header). Dense layers have kind DENSE and zero routing and expert
 * fields; their attention fields (attention, sinks, no_rope, qk_l2_norm, temperature) apply. */
typedef struct col_routing_info {
    uint32_t layer;
    uint32_t kind;                 /* col_layer_kind */
    uint32_t gate_tensor;          /* tensor index of layers.L.moe_gate, COL_NO_TENSOR for dense */
    uint32_t gate_bias_tensor;     /* layers.L.moe_gate_bias, added to the logits; COL_NO_TENSOR when none */
    uint32_t top_k;
    uint32_t n_experts;
    uint32_t scoring;              /* col_scoring */
    uint32_t select_on;            /* col_select_on */
    uint32_t correction_bias_tensor; /* layers.L.moe_correction_bias, added to the scores for selection only */
    uint32_t n_groups;             /* experts in n_groups equal groups of consecutive indices; 1 = no groups */
    uint32_t n_groups_kept;        /* groups whose experts may be chosen */
    uint32_t group_score;          /* col_group_score */
    uint32_t normalize;            /* col_normalize */
    float norm_eps;
    float norm_p;
    float scale;                   /* the k weights are multiplied by this last (routed_scaling_factor) */
    float sparsemixer_eps;         /* PhiMoE's router_jitter_noise (scoring SPARSEMIXER only) */
    uint32_t shared;               /* col_shared */
    uint32_t attention;            /* col_layer_attention */
    uint32_t sinks;                /* 1: layers.L.attn_sinks [n_heads], one more logit per head whose
                                    * probability is dropped (GPT-OSS) */
    uint32_t expert_bias;          /* 1: the routed experts add moe_w1_bias, moe_w3_bias, moe_w2_bias */
    uint32_t activation;           /* col_expert_activation of the routed experts */
    float act_alpha;               /* COL_EXPERT_SWIGLU_CLAMPED: the sigmoid's gain; else 0 */
    float act_limit;               /* COL_EXPERT_SWIGLU_CLAMPED: the clamp; else 0 */
    uint32_t weight_inputs;        /* 1: each chosen expert's input is scaled by its weight and the outputs
                                    * are summed unscaled (Llama 4); 0: the outputs are weighted */
    uint32_t no_rope;              /* 1: the layer applies no RoPE (Llama 4's NoPE layers) */
    uint32_t qk_l2_norm;           /* 1: each q and k head is divided by its RMS (norm_eps, no weight) after
                                    * RoPE (Llama 4's L2 norm) */
    uint32_t temperature_floor;    /* F > 0: the queries at position p are multiplied by
                                    * log1p(floor((p + 1) / F)) * temperature_scale + 1; 0: none */
    float temperature_scale;       /* with temperature_floor (Llama 4's attn_scale); else 0 */
} col_routing_info;

/* One field of the fixed header, for structure views (a hex editor's template). */
typedef enum col_field_kind {
    COL_FIELD_BYTES = 0,
    COL_FIELD_U32 = 1,
    COL_FIELD_I32 = 2,
    COL_FIELD_U64 = 3,
    COL_FIELD_F32 = 4,
    COL_FIELD_F64 = 5
} col_field_kind;

typedef struct col_field {
    char name[48];
    char group[32];                /* "identity", "sections", "hyper-parameters", "integrity", ... */
    uint64_t offset;
    uint32_t size;
    uint32_t kind;                 /* col_field_kind */
    int32_t present;               /* 0 when the buffer ends before this field */
    int32_t in_version;            /* 1 when the field is part of the fixed header of the format version the
                                    * bytes declare (version 1's when the version is absent or unknown) */
    uint64_t u;                    /* value for U32/U64 */
    int64_t i;                     /* value for I32 */
    double f;                      /* value for F32/F64 */
} col_field;

/* Validation flags (bit set). Structural checks always run. */
typedef enum col_check_flag {
    COL_CHECK_CHECKSUMS = 1,       /* verify every tensor's CRC-32 (reads all data) */
    COL_CHECK_NONFINITE = 2        /* scan every float tensor for NaN/Inf (reads all data) */
} col_check_flag;

/* Routing modes change only what is *chosen*: they perturb the selection score (see
 * col_trace_view), and the weights always follow the layer's rule from the unperturbed values. */
typedef enum col_routing_mode {
    COL_ROUTING_TOPK = 0,          /* the family's own math */
    COL_ROUTING_STABLE = 1,        /* select on (double)selection_score[j] + j*epsilon */
    COL_ROUTING_SOFT = 2,          /* every expert, no group limit, weights by the rule's scoring of all of them */
    COL_ROUTING_GUMBEL = 3,        /* select on selection_score[j] + Gumbel noise from (seed, position, layer, j) */
    COL_ROUTING_CACHED = 4         /* top-k, but keep the previous position's set while the new top-k's margin
                                    * over it is below cache_threshold (docs/interface-spec.md) */
} col_routing_mode;

/* Reduction order of every dot product of a session (col_session_config.reduction). SEQUENTIAL,
 * PAIRWISE and BLOCKED are defined by reference loops over weights converted to f32 (the vector
 * paths give their bits); the default runs the kernels. Append-only. */
typedef enum col_reduction {
    COL_REDUCTION_DEFAULT = 0,     /* the session's kernel path (with fma/split set: sequential) */
    COL_REDUCTION_SEQUENTIAL = 1,  /* one accumulator, left to right */
    COL_REDUCTION_PAIRWISE = 2,    /* recursive halving: sum(left half) + sum(right half), leaves of 8 */
    COL_REDUCTION_BLOCKED = 3,     /* element i into lane i % lanes, lanes summed pairwise */
    COL_REDUCTION_BF16_DOT = 4     /* (since ABI 11) bf16 weights by bf16 dot products, the activations rounded to
                                    * bf16 for them, pairs added as AVX512-BF16's vdpbf16ps adds
                                    * them (faster where the CPU has it; the same bits elsewhere);
                                    * other weights as the default; no fma or split */
} col_reduction;

/* Precision activations are rounded to between operations (round to nearest even). */
typedef enum col_activation_precision {
    COL_ACTIVATION_F32 = 0,
    COL_ACTIVATION_BF16 = 1,
    COL_ACTIVATION_F16 = 2
} col_activation_precision;

/* Precision of the KV cache's keys and values (col_session_config.kv_precision, since ABI 17):
 * F16 rounds each key and value to IEEE half (round to nearest even, as F16C converts; beyond
 * +-65504 to infinity) when it is cached and stores it in 2 bytes, so the heads read half the
 * bytes (llama.cpp's default cache type); the heads compute on the rounded values in f32. */
typedef enum col_kv_precision {
    COL_KV_F32 = 0,
    COL_KV_F16 = 1
} col_kv_precision;

/* Kernel paths (col_session_config.kernels): the most capable one a session may use. The paths
 * compute the same products and differ in the last bits (lane order; the AMX path's tile
 * accumulation), each bit-identical for any thread count and between prefill and stepping. */
typedef enum col_kernels {
    COL_KERNELS_BEST = 0,      /* the best this machine has */
    COL_KERNELS_PORTABLE = 1,  /* plain C */
    COL_KERNELS_AVX2 = 2,      /* AVX2 + FMA + F16C */
    COL_KERNELS_AVX512F = 3,   /* AVX-512 F/BW/VL without VNNI (Skylake-SP/X): AVX-512 for floats, AVX2 for
                                * q8_0/q4_0 (since ABI 15) */
    COL_KERNELS_AVX512 = 4,    /* AVX-512 F/BW/VL + VNNI */
    COL_KERNELS_AMX = 5        /* AVX-512, and AMX tiles for bf16 weights (Linux) */
} col_kernels;

/* Timing phases recorded per (position, layer). */
typedef enum col_phase {
    COL_PHASE_ATTENTION = 0,
    COL_PHASE_ROUTER = 1,
    COL_PHASE_EXPERTS = 2,
    COL_PHASE_COMBINE = 3,
    COL_PHASE_LAYER = 4,
    COL_PHASE_COUNT = 5
} col_phase;

typedef struct col_session_config {
    uint32_t routing;              /* col_routing_mode */
    uint32_t n_threads;            /* >= 1; results are bit-identical for any value */
    uint32_t max_context;          /* positions the KV cache and trace hold; 0 = min(model max_context, 4096) */
    uint32_t trace;                /* 1 = record the routing trace and timings, 0 = off */
    double epsilon;                /* stable-top-k epsilon (COL_ROUTING_STABLE) */
    uint64_t seed;                 /* Gumbel seed (COL_ROUTING_GUMBEL) */
    /* Numerics variant (routing-jitter lab, numerics.c). All zero = the default kernels. */
    uint32_t reduction;            /* col_reduction */
    uint32_t lanes;                /* COL_REDUCTION_BLOCKED: accumulator lanes, 1..256 */
    uint32_t fma;                  /* 1 = fused multiply-add in the variant reductions */
    uint32_t split;                /* 0/1 = none; S >= 2: each dot product in S contiguous parts, combined last to first */
    uint32_t activation;           /* col_activation_precision */
    uint32_t router_noise_ulps;    /* N: each router logit moved by k ULPs, k uniform in [-N, N] */
    uint64_t noise_seed;           /* k is a hash of (noise_seed, position, layer, expert) */
    /* col_kernels: the most capable kernel path the session may use; it runs the best of those
     * the machine has at or below it (the environment variable COLIBRI_KERNELS can lower it too).
     * col_session_kernels names the one chosen. */
    uint32_t kernels;
    /* 1 = the arena holds a [capacity][n_layers][d_model] float32 buffer and every processed
     * position's hidden state after each layer is captured into it (col_session_hidden);
     * capacity * n_layers * d_model * 4 bytes, in the memory estimate. 0 = none. */
    uint32_t capture_hidden;
    /* Expert caching (since ABI 7). cache_threshold: COL_ROUTING_CACHED keeps the previous
     * position's set while the fresh top-k's margin over it is below this (finite, >= 0; 0 =
     * plain top-k). expert_cache: an LRU of this many resident experts per MoE layer, whose hits
     * and misses the trace records (a model of residency: nothing is moved); 0 = none, else at
     * least the experts one decision takes (top-k, every expert in soft routing) and at most
     * n_experts. */
    double cache_threshold;
    uint32_t expert_cache;
    uint32_t kv_precision;         /* col_kv_precision (since ABI 17); a numerics choice, 0 = f32 */
} col_session_config;

/* Pointers into session memory; valid until the session is freed. Arrays are row-major and
 * sized for `capacity` positions; only the first `n_positions` rows are filled.
 * `k` is n_experts_active, or n_experts in soft routing. Dense layers have no routing rows.
 * The selection score of an expert is the value whose order decides the choice (router.h):
 * the logit itself for softmax scoring without a correction bias (softmax keeps the order),
 * sigmoid(logit) + correction bias for DeepSeek-V3, softmax + bias for ERNIE, the logit for
 * rules that select on logits. Routing modes perturb it only to choose: the trace keeps it
 * unperturbed. */
typedef struct col_trace_view {
    uint32_t n_positions;
    uint32_t capacity;
    uint32_t n_layers;
    uint32_t n_moe_layers;
    uint32_t k;
    uint32_t n_experts;
    const int32_t *moe_layers;     /* [n_moe_layers] layer index of each MoE layer */
    const int32_t *tokens;         /* [capacity] token id at each position */
    const int32_t *expert_ids;     /* [capacity][n_moe_layers][k], in selection order */
    const float *expert_weights;   /* [capacity][n_moe_layers][k] combination weights */
    const float *router_logits;    /* [capacity][n_moe_layers][n_experts] raw router logits (+ router bias) */
    const float *selection_scores; /* [capacity][n_moe_layers][n_experts] selection scores */
    uint32_t n_chosen_groups;      /* groups kept per decision (largest over the layers); 0 without groups */
    const int32_t *chosen_groups;  /* [capacity][n_moe_layers][n_chosen_groups] kept groups, best first; -1
                                    * in layers without groups and in soft routing; NULL when 0 */
    const uint8_t *bias_changed;   /* [capacity][n_moe_layers] 1 when the layer's correction bias changed the
                                    * choice (the same ranking of the scores alone chose another set) */
    const float *shared_gate;      /* [capacity][n_moe_layers] sigmoid gate of the shared expert, NaN if none */
    const float *hidden_norm;      /* [capacity][n_moe_layers] L2 norm of the router's input */
    const uint64_t *phase_ns;      /* [capacity][n_layers][COL_PHASE_COUNT] monotonic nanoseconds */
    const uint64_t *token_ns;      /* [capacity] whole forward pass of the position */
    /* Expert caching (since ABI 7). The cached-routing arrays are NULL unless the routing is
     * COL_ROUTING_CACHED; cache_hits is NULL without an expert cache (expert_cache 0). */
    const uint8_t *cache_kept;     /* [capacity][n_moe_layers] 1 when the previous position's set was used
                                    * instead of a different fresh top-k */
    const float *cache_margin;     /* [capacity][n_moe_layers] the fresh top-k's margin over the previous
                                    * set: 0 when they are the same, NaN at position 0 (no previous set) */
    const int32_t *fresh_ids;      /* [capacity][n_moe_layers][k] the rule's own top-k (what plain routing
                                    * chooses from the same values), in selection order */
    uint32_t expert_cache;         /* LRU experts per MoE layer (the config's), 0 = none */
    const uint8_t *cache_hits;     /* [capacity][n_moe_layers][k] 1 when slot's expert was resident in the
                                    * layer's LRU, 0 when it had to be loaded (or the slot is empty) */
    /* Interventions (since ABI 10). */
    const uint8_t *intervened;     /* [capacity][n_moe_layers] bit (1 << col_intervention_kind) set for each
                                    * kind of intervention that acted on the decision; 0 = none */
} col_trace_view;

/* Expert-caching counts of a session since creation or the last reset (col_session_cache_stats). */
typedef struct col_cache_stats {
    uint32_t expert_cache;         /* LRU experts per MoE layer, 0 = no expert cache */
    uint32_t resident;             /* experts resident now */
    uint64_t hits;                 /* lookups that found the expert resident */
    uint64_t misses;               /* lookups that had to load it (evicting the least recently used) */
    uint64_t decisions;            /* routing decisions made */
    uint64_t kept;                 /* cached routing: decisions that kept the previous position's set */
} col_cache_stats;

/* What one thread of a session did since creation or the last reset (col_session_thread_stats). */
typedef struct col_thread_stats {
    uint64_t multiply_adds; /* of the weight products' rows it ran (a row of k columns for n tokens: k * n) */
    uint64_t batches;       /* batches of work handed to every thread that it entered (the calling
                               thread enters each; a worker the machine did not run in time misses some) */
} col_thread_stats;

typedef struct col_model col_model;
typedef struct col_session col_session;

/* ABI version of the compiled engine (COL_ABI_VERSION); the Python binding refuses a mismatch. */
uint32_t col_abi_version(void);

/* Human-readable name of a status code ("COL_ERR_SHAPE"); static storage, thread safe. */
const char *col_status_name(int32_t status);

/* Byte size of one element of `dtype`, 0 for an unknown dtype. Thread safe. */
uint32_t col_dtype_size(uint32_t dtype);

/* Bytes of `n` consecutive elements of `dtype` (one row): n * element size, or for the block
 * dtypes (q8_0, q4_0 and their panels q8_0x8, q4_0x8, whose panel of 8 rows takes 8 rows' bytes)
 * n / 32 * block size. 0 for an unknown dtype or n not a multiple of 32 for a
 * block dtype. Thread safe. */
uint64_t col_dtype_row_bytes(uint32_t dtype, uint64_t n);

/* CRC-32 (IEEE 802.3 polynomial, zlib-compatible) of `n` bytes, continuing from `crc` (0 to start). */
uint32_t col_crc32(uint32_t crc, const void *data, size_t n);

/* Validate the bytes of a whole .colibri file held in memory. Never reads outside
 * [data, data+size). Writes up to `max_problems` findings to `problems` (may be NULL when 0) and
 * the total count found to `*n_problems` (may exceed max_problems). Warnings do not fail it.
 * Returns COL_OK when there is no error-severity finding, else the code of the first error.
 * Allocates nothing; thread safe. */
int32_t col_validate_buffer(const uint8_t *data, uint64_t size, uint32_t check_flags,
                            col_problem *problems, uint32_t max_problems, uint32_t *n_problems);

/* Same, for a file on disk: maps it read-only, validates, unmaps. Returns COL_ERR_IO (with one
 * problem describing why) when the file cannot be opened or mapped. Thread safe. */
int32_t col_validate_file(const char *path, uint32_t check_flags,
                          col_problem *problems, uint32_t max_problems, uint32_t *n_problems);

/* Number of field descriptions of the fixed headers of every format version (constant); a
 * version's fields are those with in_version set, and cover its header exactly. */
uint32_t col_header_field_count(void);

/* Describe fixed-header field `index` decoded from `data` (which may be any bytes, of any size:
 * fields past `size` get present = 0). Returns COL_ERR_INVALID_ARG for index out of range. */
int32_t col_header_field(const uint8_t *data, uint64_t size, uint32_t index, col_field *out);

/* Map `path` read-only and run every structural check (not checksums or NaN scans: see
 * col_model_check_tensor). On success *out owns the mapping; release it with col_model_close.
 * On failure *out is NULL and `problem` (may be NULL) holds the first error. */
int32_t col_model_open(const char *path, col_model **out, col_problem *problem);

/* Unmap and free. NULL is a no-op. All sessions on the model must have been freed. */
void col_model_close(col_model *model);

/* The whole mapped file (read-only) and its size. */
const uint8_t *col_model_bytes(const col_model *model, uint64_t *size);

/* Copy the decoded hyper-parameters to *out. */
int32_t col_model_hparams(const col_model *model, col_hparams *out);

uint32_t col_model_tensor_count(const col_model *model);

/* Describe tensor `index` (table order, which is offset order). COL_ERR_INVALID_ARG if out of range. */
int32_t col_model_tensor(const col_model *model, uint32_t index, col_tensor_info *out);

/* Index of the tensor called `name`, or COL_ERR_MISSING_TENSOR. */
int32_t col_model_find_tensor(const col_model *model, const char *name, uint32_t *index);

/* Routing entry of `layer` (0..n_layers-1). */
int32_t col_model_routing(const col_model *model, uint32_t layer, col_routing_info *out);

/* A routing entry's rule in words ("sigmoid over 256 experts, + correction bias for the choice
 * only, top-8 within the 4 best of 8 groups (by the sum of their best two), divided by their sum
 * + 1e-20, times 2.5; plus a shared expert"), NUL-terminated and truncated to n bytes. The one
 * wording of a rule: the command-line tools and the Inspector show it. COL_ERR_INVALID_ARG for a
 * NULL argument or n == 0. Thread safe. */
int32_t col_routing_describe(const col_routing_info *rule, char *out, size_t n);

/* Step 1 of a MoE rule over every expert, as the router computes it: scores [rule->n_experts]
 * = each logit's sigmoid (sigmoid scoring), or a softmax over all the logits (softmax and
 * sparsemixer scoring; what soft routing weighs by). logits: [n_experts] router logits, the
 * router bias included (a trace's router_logits). Lets a debugger show a decision's scores
 * beside its logits and selection scores without recomputing the rule. COL_ERR_INVALID_ARG for
 * a NULL argument, a dense entry or an unknown scoring. Pure; thread safe. */
int32_t col_routing_scores(const col_routing_info *rule, const float *logits, float *scores);

/* The embedded tokenizer.json and user-metadata JSON bytes (not NUL-terminated; size may be 0). */
const uint8_t *col_model_tokenizer(const col_model *model, uint64_t *size);
const uint8_t *col_model_metadata(const col_model *model, uint64_t *size);

/* Data checks of one tensor (COL_CHECK_* flags): CRC-32 against the table, NaN/Inf scan.
 * Findings as in col_validate_buffer. Thread safe; reads only that tensor's bytes. */
int32_t col_model_check_tensor(const col_model *model, uint32_t index, uint32_t check_flags,
                               col_problem *problems, uint32_t max_problems, uint32_t *n_problems);

/* Bytes col_session_create would allocate for `config` (arena: KV cache, scratch, trace). */
uint64_t col_session_memory_estimate(const col_model *model, const col_session_config *config);

/* Create a session: allocates every buffer it will ever use. The per-token path never allocates.
 * Returns COL_ERR_NOMEM, or COL_ERR_INVALID_ARG for a config col_session_config_check refuses. */
int32_t col_session_create(const col_model *model, const col_session_config *config,
                           col_session **out, char *err, size_t errlen);

/* Free a session and everything it allocated. NULL is a no-op. */
void col_session_free(col_session *session);

/* Forget every position (KV cache and trace) but keep the configuration and buffers. */
int32_t col_session_reset(col_session *session);

/* Process `n` tokens at positions position..position+n-1. When `logits` is not NULL it receives
 * [n][vocab_size] float32 logits of every processed position; when it is NULL the LM head runs
 * for the last position only (what generation needs; over 128 positions of a 32000-token
 * vocabulary at hidden 1024 it is a sixth of a prefill's multiply-adds). The last position's
 * logits are readable with col_session_logits either way, with the same bits. Errors: COL_ERR_CONTEXT_FULL, COL_ERR_BAD_TOKEN (nothing
 * processed in either case). */
int32_t col_session_prefill(col_session *session, const int32_t *tokens, uint32_t n,
                            float *logits, char *err, size_t errlen);

/* col_session_prefill with the input rows given instead of looked up: `embeddings` is
 * [n][d_model] float32, row i what the token embedding lookup would produce at position
 * position + i (a file with embedding_scale multiplies it by that, as it does looked-up rows and
 * transformers' Granite does inputs_embeds; the caller keeps ownership, nothing is kept after
 * the call). The trace records token -1 at these positions. A step is n = 1; the session's
 * interventions apply as to token ids. Errors: COL_ERR_CONTEXT_FULL; COL_ERR_INVALID_ARG for
 * NULL embeddings, a NaN or infinite element (its row and element in err) or a position in
 * progress (col_session_begin_token); nothing processed in any case. Owner thread; no
 * allocation. Since ABI 7. */
int32_t col_session_prefill_embeddings(col_session *session, const float *embeddings, uint32_t n,
                                       float *logits, char *err, size_t errlen);

/* Process one token; `logits` (may be NULL) receives [vocab_size] float32 logits. The same as
 * col_session_prefill with n = 1 (one code path; the same bits as the token inside a prefill). */
int32_t col_session_step(col_session *session, int32_t token, float *logits,
                         char *err, size_t errlen);

/* Greedy decoding in the engine, so a caller's language runs once per n steps rather than once a
 * token: step i processes `token` (i = 0) or out[i - 1] at the next position, then writes to
 * out[i] the first index of its largest logit (a NaN counted as -inf), the same bits and choices
 * as col_session_step and an arg-max after each. Stops after n steps, or after the step whose
 * choice is `eos` (eos < 0: never). *steps receives the steps that completed, on an error too
 * (the failing step processed nothing: col_session_step's errors and guarantees); the last
 * step's logits are col_session_logits. COL_ERR_INVALID_ARG for a NULL session or steps, or a
 * NULL out with n > 0. Owner thread; no allocation. Since ABI 19. */
int32_t col_session_generate(col_session *session, int32_t token, uint32_t n, int32_t eos, int32_t *out,
                             uint32_t *steps, char *err, size_t errlen);

/* Logits of the most recently processed position: [vocab_size], owned by the session. */
const float *col_session_logits(const col_session *session);

/* Number of positions processed since creation or the last reset. */
uint32_t col_session_position(const col_session *session);

/* Expert-caching counts of MoE layer `moe_index` (0..n_moe_layers-1), or of every MoE layer
 * summed when moe_index is -1: LRU hits, misses and residents, routing decisions, and the
 * decisions cached routing kept. Counted whether or not the trace is on; a session with neither
 * cached routing nor an expert cache counts nothing (all 0). COL_ERR_INVALID_ARG for a NULL argument or an index out of range. Owner thread. */
int32_t col_session_cache_stats(const col_session *session, int32_t moe_index, col_cache_stats *out);

/* Each thread's counts since creation or the last col_session_reset: out[0] the calling thread's,
 * out[i] worker i's, for i < min(capacity, threads); returns the session's threads (0 for a NULL
 * session; out may be NULL when capacity is 0). Their multiply-adds sum to those of the weight
 * products the session ran (not the attention heads'); how they split shows how much of the work
 * the workers got, which a machine that runs them late moves to the calling thread. Counted
 * whether or not the trace is on. Owner thread, between calls. */
uint32_t col_session_thread_stats(const col_session *session, col_thread_stats *out, uint32_t capacity);

/* Fill *out with pointers to the trace (zero-copy). All counts are 0 and pointers NULL when
 * tracing is off. */
int32_t col_session_trace(const col_session *session, col_trace_view *out);

/* Measure this machine's read bandwidth: `n_threads` threads each sum their share of a freshly
 * allocated, touched buffer of `bytes` bytes, reading eight places of it at once (the most
 * memory-level parallelism a kernel can use); best of `repeats` passes. Returns bytes per second
 * (0.0 on allocation or thread failure). For benchmarks: run it in the same process and moment
 * as the measurement it bounds. */
double col_measure_read_bandwidth(uint64_t bytes, uint32_t n_threads, uint32_t repeats);

/* Measure this machine's memory latency: one thread follows a chain of dependent loads through
 * a freshly allocated buffer of `bytes` bytes, cut into 2^19 equal parts (fewer when it has fewer
 * 64-byte lines), one line of each part, in one random cycle through the parts: no load can start
 * before the last one ends, and no prefetcher can guess the next line. Best of `repeats` passes of
 * 2^19 loads. A buffer of 2 MiB or more is asked for in 2 MiB pages (Linux madvise), as the mapped
 * model file is, so a buffer well beyond the last-level cache measures the memory's latency rather
 * than page walks'. Returns nanoseconds per load (0.0 for fewer than two lines, repeats 0, or an
 * allocation failure). Thread safe; for benchmarks, like the bandwidth probe. (since ABI 20) */
double col_measure_read_latency(uint64_t bytes, uint32_t repeats);

/* Arithmetic a product multiplies with (col_measure_compute). Append-only. (since ABI 12) */
typedef enum col_arith {
    COL_ARITH_F32_FMA = 0,   /* f32 fused multiply-adds: f32, f16 and (exact) bf16 weights, the heads */
    COL_ARITH_BF16_DOT = 1,  /* bf16 pair dot products (AVX512-BF16 vdpbf16ps): dot-bf16 */
    COL_ARITH_INT8_DOT = 2   /* int8 dot products (VNNI vpdpbusd; AVX2 vpmaddubsw + vpmaddwd): q8_0, q4_0 */
} col_arith;

/* Measure this machine's multiply-add throughput for `arith` (a col_arith) with the instructions
 * of the kernel path a session with `kernels` (a col_kernels ceiling) would run: `n_threads`
 * threads each run independent chains of the instruction on register operands (f32 FMA: 16
 * multiply-adds per AVX-512 instruction, 8 per AVX2; bf16 dot: 32; int8 dot: 64, or 32 per three
 * AVX2 instructions); best of `repeats` passes of a few milliseconds. Returns multiply-adds per
 * second over all threads: the compute limit a prefill on that path is measured against. 0.0 when
 * the path has no such instruction (the portable path; bf16 dot without AVX512-BF16), for a
 * bad argument, or on thread failure. Thread safe; for benchmarks, like the bandwidth probe. */
double col_measure_compute(uint32_t arith, uint32_t kernels, uint32_t n_threads, uint32_t repeats);

/* Name of the kernel path the session runs ("portable", "avx2", "avx512f", "avx512", "amx"); static storage. */
const char *col_session_kernels(const col_session *session);

/* The col_kernels value of the path a session with kernels = COL_KERNELS_BEST would run on this
 * machine now (CPUID, the OS granting AMX state, COLIBRI_KERNELS). Thread safe. */
uint32_t col_best_kernels(void);

/* ---- Hostile environments: allocators, files changing under the mapping -------------------- */

/* A caller-supplied allocator for col_model_open_ex and col_session_create_ex (a host's own heap,
 * or a test that fails the Nth allocation). `alloc` returns `size` bytes aligned to `alignment`
 * (a power of two, at most 64) or NULL; `free` releases a block `alloc` returned. `user` is
 * passed to both. The object made with it keeps a copy of the struct and frees through it, so the
 * functions must stay callable until the object is closed; thread safety is the caller's to give
 * when objects are made or freed on several threads. The plain functions use malloc. */
typedef struct col_allocator {
    void *(*alloc)(void *user, size_t size, size_t alignment);
    void (*free)(void *user, void *ptr);
    void *user;
} col_allocator;

/* col_model_open with every allocation (the model and its decoded tables) made through
 * `allocator` (NULL = malloc). Each allocation failure returns COL_ERR_NOMEM with nothing leaked. */
int32_t col_model_open_ex(const char *path, const col_allocator *allocator, col_model **out,
                          col_problem *problem);

/* col_session_create with the session struct and its arena from `allocator` (NULL = malloc).
 * The thread pool's bookkeeping comes from `allocator` too; the threads' own stacks come from pthreads. */
int32_t col_session_create_ex(const col_model *model, const col_session_config *config,
                              const col_allocator *allocator, col_session **out, char *err,
                              size_t errlen);

/* Is the mapping still the file it was? Compares the open file's size and modification time with
 * the values at open, and whether a read of the mapping ever faulted (see below). Returns
 * COL_ERR_FILE_CHANGED (reason in err) when the file was truncated or rewritten in place: the
 * mapping must not be trusted, close the model and reopen the path. Otherwise COL_OK, with
 * *replaced (may be NULL) set to 1 when the path now names a different file (an atomic replace:
 * the mapping is intact, reopen to see the new file) and 0 when it names the mapped one.
 * Thread safe; two system calls.
 *
 * Every entry point that reads tensor data (col_session_prefill/step, col_model_check_tensor,
 * col_validate_file) makes this check first and, because a truncation can land between the check
 * and the read, also runs under a SIGBUS guard: a read past the file's new end gets a page of
 * zeros instead of killing the process, the call returns COL_ERR_FILE_CHANGED, and a session's
 * position is left where it was before the call. */
int32_t col_model_check_file(const col_model *model, uint32_t *replaced, char *err, size_t errlen);

/* ---- Since ABI 3: one-pass open, sections, the engine as the judge of session configs ------ */

/* col_model_open_ex keeping every finding of its one validation pass (col_model_open keeps the
 * first error only). Up to `max_problems` findings go to `problems` (may be NULL when 0) and the
 * total count to *n_problems (may exceed max_problems: call again with a larger array for the
 * rest). On success *out owns the model and the findings are its warnings; on failure *out is
 * NULL, the return is the first error's code and the findings are every error and warning of the
 * file, or the one finding that says why it could not be opened, mapped, allocated for or read
 * (COL_ERR_IO, COL_ERR_NOMEM, COL_ERR_FILE_CHANGED). */
int32_t col_model_open_report(const char *path, const col_allocator *allocator, col_model **out,
                              col_problem *problems, uint32_t max_problems, uint32_t *n_problems);

/* One region of a file, for structure views: the fixed header, the routing section, the tensor
 * table, the tokenizer, the user metadata and the tensor data. An absent tokenizer or metadata
 * section has size 0 and offset 0. */
typedef struct col_section {
    char name[32];                 /* "header", "routing", "tensor_table", "tokenizer", "metadata", "data" */
    uint64_t offset;               /* absolute file offset */
    uint64_t size;                 /* bytes; "data" runs from data_offset to the end of the file */
} col_section;

/* Number of sections col_model_section describes (constant, in the order above). */
uint32_t col_model_section_count(void);

/* Section `index` of an open model, from the header it validated at open. COL_ERR_INVALID_ARG
 * for an index out of range. Thread safe. */
int32_t col_model_section(const col_model *model, uint32_t index, col_section *out);

/* Check `config` for `model` exactly as col_session_create does, allocating nothing. The engine
 * is the one judge of every range: routing mode (col_routing_mode), n_threads 1..256,
 * max_context up to the model's, epsilon finite and >= 0, trace 0 or 1, capture_hidden 0 or 1,
 * kernels (col_kernels), and the numerics fields (reduction, lanes 1..256 with the blocked
 * reduction only, fma 0 or 1, split 0..256, activation, router_noise_ulps up to 2^22). Returns
 * COL_OK, or COL_ERR_INVALID_ARG with the reason in err. Thread safe. */
int32_t col_session_config_check(const col_model *model, const col_session_config *config,
                                 char *err, size_t errlen);

/* ---- Since ABI 6: each layer's hidden state, for comparing with a reference ------------------ */

/* Where a session captures hidden states: the residual stream after each layer (after the
 * feed-forward block's residual add, and the numerics variant's rounding when one is set), row
 * r holding position first_position + r. */
typedef struct col_hidden_view {
    const float *data;             /* [n_rows][n_layers][d_model]; NULL when nothing is captured */
    uint32_t first_position;
    uint32_t n_rows;
    uint32_t n_layers;
    uint32_t d_model;
} col_hidden_view;

/* Capture into a caller buffer from now on: `buffer` [n_rows][n_layers][d_model] float32
 * receives the hidden states of positions first_position..first_position + n_rows - 1 as they
 * are processed (positions outside that window are not captured; rows of positions not yet
 * processed are left as they are). The caller owns the buffer and keeps it valid until it is
 * detached, the session is freed, or another call replaces it; the engine writes it only during
 * col_session_prefill/step. buffer NULL detaches it: capture goes back to the session's own
 * buffer when the session was created with capture_hidden = 1 (first_position 0, capacity
 * rows), else stops. Costs a copy of d_model floats per captured (position, layer); nothing is
 * allocated. Same thread rules as the session. COL_ERR_INVALID_ARG for a NULL session, or a
 * non-NULL buffer with n_rows 0. */
int32_t col_session_capture(col_session *session, float *buffer, uint32_t first_position,
                            uint32_t n_rows, char *err, size_t errlen);

/* The capture target now (zero-copy; see col_hidden_view): the caller's buffer, or the
 * session's own (valid until the session is freed; rows 0..col_session_position - 1 filled),
 * or data NULL and n_rows 0 when nothing is captured. COL_ERR_INVALID_ARG for NULL arguments. */
int32_t col_session_hidden(const col_session *session, col_hidden_view *out);

/* ---- Since ABI 10: interventions, rewinding, stepping one layer at a time ------------------- */

/* What an intervention does to a routing decision (docs/interventions.md). Append-only. */
typedef enum col_intervention_kind {
    COL_INTERVENE_FORCE = 0,       /* experts: the choice itself, in selection order (1..k of them), weighted by the rule */
    COL_INTERVENE_FORBID = 1,      /* experts: may not be chosen; the rule chooses among the others */
    COL_INTERVENE_WEIGHTS = 2,     /* values: the combine weights of the first chosen slots, in selection order */
    COL_INTERVENE_LOGITS = 3,      /* experts, values[0]: their router logits plus (op ADD) or set to (op SET) the value */
    COL_INTERVENE_BIAS = 4,        /* experts, values[0]: the same for their correction bias (zeros without one) */
    COL_INTERVENE_ABLATE = 5,      /* experts: removed from the layer: never chosen (FORBID, meant for every position) */
    COL_INTERVENE_SWAP = 6         /* experts[0], experts[1]: a slot choosing one runs the other's weights */
} col_intervention_kind;

typedef enum col_intervention_op {
    COL_INTERVENE_ADD = 0,
    COL_INTERVENE_SET = 1
} col_intervention_op;

/* One intervention. It acts on the decisions at positions first_position..last_position
 * (inclusive; COL_LAST_POSITION = to the end) of MoE layer `layer` (a model layer index; -1 =
 * every MoE layer). Operands as the kind says; unused ones are 0/NULL. */
typedef struct col_intervention {
    uint32_t kind;                 /* col_intervention_kind */
    uint32_t op;                   /* col_intervention_op for LOGITS and BIAS, else 0 */
    uint32_t first_position;
    uint32_t last_position;
    int32_t layer;
    uint32_t n_experts;
    const int32_t *experts;        /* [n_experts] distinct expert ids */
    uint32_t n_values;
    const float *values;           /* [n_values] finite */
} col_intervention;

/* Set the interventions the session applies from now on (replacing any before; n = 0 clears
 * them, items may then be NULL). The session borrows `items` and the arrays they point to: the
 * caller keeps them alive and unchanged until the next call or col_session_free. Checked against
 * the model first: kind, positions (first <= last), layer (a MoE layer, or -1), the number and
 * range of experts (FORCE at most the session's experts per decision; SWAP exactly two;
 * distinct ids below n_experts), values (finite; WEIGHTS at most the experts per decision), op,
 * and a BIAS on a layer whose rule selects on its logits. On COL_ERR_INVALID_ARG nothing
 * changes, *bad (may be NULL) is the index of the first refused item and err says which field
 * and why ("experts: expert 9 outside 0..7"). Positions already processed keep their results:
 * col_session_truncate first to recompute them. The order and semantics of the kinds at one
 * decision are in docs/interventions.md. Allocates nothing; owner thread. */
int32_t col_session_set_interventions(col_session *session, const col_intervention *items, uint32_t n,
                                      uint32_t *bad, char *err, size_t errlen);

/* Forget the positions from `position` on (0 <= position <= col_session_position): the next
 * token is processed at `position`, reusing the KV cache and trace rows before it (a
 * counterfactual reruns only what follows an intervention). Expert caching's state (each MoE
 * layer's previous set, the LRU and the counts of col_session_cache_stats) becomes what the
 * positions before `position` left, replayed from the session's record of their decisions, so a
 * rerun from here has the bits of a run from scratch. Also abandons a position in progress
 * (col_session_begin_token). COL_ERR_INVALID_ARG for a position beyond the processed ones. Owner
 * thread; no allocation. */
int32_t col_session_truncate(col_session *session, uint32_t position, char *err, size_t errlen);

/* Change the routing of the positions processed from now on to `routing` (top-k, stable or
 * Gumbel; the session's mode must be one of them too) with `epsilon` and `seed` (as
 * col_session_config's), and set *first_changed (may be NULL) to the first processed position
 * whose decisions the new routing makes differently: the session's trace rows are routed again
 * from their recorded router logits, and a decision differs when its experts, their order, their
 * weights' bits, its kept groups or its bias flag do, or when an intervention acted on it.
 * Positions before *first_changed are what a session created with the new routing would have
 * computed; col_session_truncate(*first_changed) and processing the rest again gives that
 * session's bits (an epsilon sweep recomputes only from the first decision an epsilon changes).
 * *first_changed is col_session_position when no decision changes, and 0 without a trace.
 * Processed positions are not touched. Errors (COL_ERR_INVALID_ARG, nothing changed): a position
 * in progress, another mode (soft and cached routing change the slots or depend on the previous
 * position's set), an epsilon not finite or below 0. Owner thread; no allocation. Since ABI 21. */
int32_t col_session_set_routing(col_session *session, uint32_t routing, double epsilon, uint64_t seed,
                                uint32_t *first_changed, char *err, size_t errlen);

/* Stepping one layer at a time (a debugger pausing between the layers of one position, to
 * change the next layer's routing before it runs). col_session_begin_token starts `token` at the
 * next position (its embedding is looked up; no layer runs yet); each col_session_step_layer
 * runs the next layer and sets *layers_done (may be NULL) to the layers run so far; the one that
 * runs the last layer also runs the final norm and LM head, writes `logits` [vocab_size] (may be
 * NULL; col_session_logits has them too) and completes the position. A position stepped so has
 * the same bits as col_session_step, for any thread count. The trace rows of the layers run are
 * readable before the position completes (at row col_session_position). While a position is in
 * progress col_session_prefill/step refuse (COL_ERR_INVALID_ARG); col_session_truncate or
 * col_session_reset abandon it. Errors: begin as col_session_step (COL_ERR_CONTEXT_FULL,
 * COL_ERR_BAD_TOKEN; COL_ERR_INVALID_ARG when a position is already in progress); step_layer
 * COL_ERR_INVALID_ARG when none is; COL_ERR_FILE_CHANGED as col_session_prefill (the position is
 * abandoned). Owner thread; no allocation. */
int32_t col_session_begin_token(col_session *session, int32_t token, char *err, size_t errlen);

/* col_session_begin_token with an embedding row instead of a token: `row` is [d_model] float32,
 * what the lookup would produce (as col_session_prefill_embeddings takes it, embedding_scale
 * included; copied, the caller keeps ownership). The trace records token -1. Errors: as col_session_begin_token, and
 * COL_ERR_INVALID_ARG for a NULL row or a NaN or infinite element (named in err). */
int32_t col_session_begin_embedding(col_session *session, const float *row, char *err, size_t errlen);
int32_t col_session_step_layer(col_session *session, float *logits, uint32_t *layers_done, char *err,
                               size_t errlen);

/* Undo the last layer run of the position in progress (its input and its expert-caching state
 * are restored; the KV cache and trace rows it wrote are rewritten when it runs again), so the
 * next col_session_step_layer runs it again, e.g. under new interventions. One level: COL_ERR_INVALID_ARG when no layer of the
 * position in progress was run since the last undo. Owner thread. */
int32_t col_session_rewind_layer(col_session *session, char *err, size_t errlen);

/* Layers run of the position in progress (0..n_layers-1), or COL_NO_LAYER when none is. */
uint32_t col_session_layers_done(const col_session *session);

/* COL_CDEF_END */

#ifdef __cplusplus
}
#endif

#endif /* COLIBRI_H */
