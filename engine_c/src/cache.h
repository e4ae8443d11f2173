/*
 * cache.h - expert caching's state across positions (internal): per MoE layer, the set the
 * layer used at the last position (what cached routing may keep) and an LRU of resident experts
 * with its hit and miss counts.
 */
#ifndef COLIBRI_CACHE_H
#define COLIBRI_CACHE_H

#include "internal.h"

/* Counters of one MoE layer since the session was created or reset. */
typedef struct col_cache_layer {
    uint64_t tick;          /* LRU clock: lookups so far */
    uint64_t hits, misses;  /* LRU lookups that found the expert resident / had to load it */
    uint64_t decisions;     /* routing decisions */
    uint64_t kept;          /* decisions where cached routing kept the previous set */
    uint32_t resident;      /* experts resident now */
    uint32_t unused;
} col_cache_layer;

/* Every array lives in one block of `bytes` bytes (session memory), so saving and restoring the
 * whole state is one copy. */
typedef struct col_cache {
    uint32_t n_moe, k_slots, n_experts;
    uint32_t capacity;      /* LRU experts per MoE layer; 0 = no LRU */
    uint64_t bytes;
    void *block;
    col_cache_layer *layers; /* [n_moe] */
    int32_t *previous;      /* [n_moe][k_slots] the set each layer used at the last position */
    uint64_t *stamp;        /* [n_moe][n_experts] tick of each expert's last use, 0 = not resident;
                             * NULL without an LRU */
    /* Every decision so far, outside the block, so the state at an earlier position can be
     * rebuilt (col_cache_rebuild); NULL: no log. */
    uint32_t log_positions;
    int32_t *log_ids;       /* [log_positions][n_moe][k_slots] each decision's experts, -1 past its size */
    uint8_t *log_kept;      /* [log_positions][n_moe] its kept flag; NULL = all 0 (no cached routing) */
} col_cache;

/* Bytes of the block for these dimensions (a multiple of 64). */
uint64_t col_cache_bytes(uint32_t n_moe, uint32_t k_slots, uint32_t n_experts, uint32_t capacity);

/* Point `c` into `block` (col_cache_bytes bytes, 64-byte aligned, zeroed = an empty state); no log. */
void col_cache_bind(col_cache *c, void *block, uint32_t n_moe, uint32_t k_slots, uint32_t n_experts,
                    uint32_t capacity);

/* Keep a log of the decisions of positions 0..positions-1 in `ids` ([positions][n_moe][k_slots])
 * and `kept` ([positions][n_moe], may be NULL when nothing is ever kept). */
void col_cache_bind_log(col_cache *c, int32_t *ids, uint8_t *kept, uint32_t positions);

/* Forget everything: no previous sets, no resident expert, counters at zero. */
void col_cache_clear(col_cache *c);

/* The decision of MoE layer `moe` at `position` (layer by layer, positions in order): remember
 * its n experts as the layer's previous set (n <= k_slots; -1 in the slots past n), count it (and
 * whether cached routing kept the previous set), and look each expert up in the layer's LRU in
 * slot order: a resident expert is a hit and becomes the most recent; a missing one is a miss and
 * is loaded, evicting the least recently used when `capacity` are resident. hits (may be NULL;
 * [n]) gets 1 per hit, 0 per miss; all 0 without an LRU. Logged when a log is bound. */
void col_cache_record(col_cache *c, uint32_t moe, uint32_t position, const int32_t *ids, uint32_t n, uint8_t kept,
                      uint8_t *hits);

/* The state after the logged decisions of positions 0..positions-1 (positions <= the log's),
 * replayed from an empty state: what those decisions left, counters included. Needs a log. */
void col_cache_rebuild(col_cache *c, uint32_t positions);

/* Put MoE layer `moe`'s part of the state (previous set, LRU, counters) back from `saved`, a
 * copy of the block taken earlier (the other layers keep theirs). */
void col_cache_restore_layer(col_cache *c, const void *saved, uint32_t moe);

#endif
