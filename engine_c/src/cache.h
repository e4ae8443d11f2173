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
} col_cache;

/* Bytes of the block for these dimensions (a multiple of 64). */
uint64_t col_cache_bytes(uint32_t n_moe, uint32_t k_slots, uint32_t n_experts, uint32_t capacity);

/* Point `c` into `block` (col_cache_bytes bytes, 64-byte aligned, zeroed = an empty state). */
void col_cache_bind(col_cache *c, void *block, uint32_t n_moe, uint32_t k_slots, uint32_t n_experts,
                    uint32_t capacity);

/* Forget everything: no previous sets, no resident expert, counters at zero. */
void col_cache_clear(col_cache *c);

/* One decision of MoE layer `moe`: remember its n experts as the layer's previous set (n <=
 * k_slots), count it (and whether cached routing kept the previous set), and look each expert up
 * in the layer's LRU in slot order: a resident expert is a hit and becomes the most recent; a
 * missing one is a miss and is loaded, evicting the least recently used when `capacity` are
 * resident. hits (may be NULL; [n]) gets 1 per hit, 0 per miss; all 0 without an LRU. */
void col_cache_record(col_cache *c, uint32_t moe, const int32_t *ids, uint32_t n, uint8_t kept, uint8_t *hits);

#endif
