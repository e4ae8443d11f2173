/*
 * cache.c - expert caching's state from one position to the next (the source articles' third
 * jitter remedy): the set each MoE layer used at the last position, which cached routing may
 * keep (router.c, col_route_cached), and an LRU of the experts a memory holding `capacity` of
 * them per layer would have resident, with its hits and misses.
 *
 * The LRU models residency; it moves no memory (every expert stays mapped). It answers what a
 * deployment that keeps only some experts in fast memory would hit, and how much cached routing
 * helps it. The state is updated on the calling thread, position after position and layer
 * after layer in the order a run makes its decisions, so it does not depend on the thread count
 * or on how positions are grouped into blocks. Each expert's last use is a tick of a per-layer
 * clock; eviction takes the smallest tick among the resident (ticks are unique: no ties).
 * A log of every decision lets a session truncated to an earlier position (a counterfactual
 * rerun) rebuild the state it had there by replaying the decisions before it.
 */
#include "cache.h"

#include <stddef.h>
#include <string.h>

static uint64_t round64(uint64_t n)
{
    return (n + 63) & ~(uint64_t)63;
}

uint64_t col_cache_bytes(uint32_t n_moe, uint32_t k_slots, uint32_t n_experts, uint32_t capacity)
{
    uint64_t bytes = round64((uint64_t)n_moe * sizeof(col_cache_layer));
    bytes += round64((uint64_t)n_moe * k_slots * sizeof(int32_t));
    if (capacity) bytes += round64((uint64_t)n_moe * n_experts * sizeof(uint64_t));
    return bytes;
}

void col_cache_bind(col_cache *c, void *block, uint32_t n_moe, uint32_t k_slots, uint32_t n_experts,
                    uint32_t capacity)
{
    uint8_t *at = block;
    c->n_moe = n_moe;
    c->k_slots = k_slots;
    c->n_experts = n_experts;
    c->capacity = capacity;
    c->bytes = col_cache_bytes(n_moe, k_slots, n_experts, capacity);
    c->block = block;
    c->layers = (col_cache_layer *)at;
    at += round64((uint64_t)n_moe * sizeof(col_cache_layer));
    c->previous = (int32_t *)at;
    at += round64((uint64_t)n_moe * k_slots * sizeof(int32_t));
    c->stamp = capacity ? (uint64_t *)at : NULL;
    col_cache_bind_log(c, NULL, NULL, 0);
}

void col_cache_bind_log(col_cache *c, int32_t *ids, uint8_t *kept, uint32_t positions)
{
    c->log_ids = ids;
    c->log_kept = kept;
    c->log_positions = positions;
}

void col_cache_clear(col_cache *c)
{
    if (c->block) memset(c->block, 0, c->bytes);
}

/* The resident expert of `stamp` used least recently. */
static uint32_t least_recent(const uint64_t *stamp, uint32_t n)
{
    uint32_t victim = 0;
    uint64_t oldest = UINT64_MAX;
    for (uint32_t e = 0; e < n; e++)
        if (stamp[e] && stamp[e] < oldest) {
            oldest = stamp[e];
            victim = e;
        }
    return victim;
}

/* col_cache_record without the log (the replay reads it). */
static void account(col_cache *c, uint32_t moe, const int32_t *ids, uint32_t n, uint8_t kept, uint8_t *hits)
{
    col_cache_layer *layer = &c->layers[moe];
    int32_t *previous = c->previous + (uint64_t)moe * c->k_slots;
    memcpy(previous, ids, (uint64_t)n * sizeof *ids);
    for (uint32_t slot = n; slot < c->k_slots; slot++) previous[slot] = -1;
    layer->decisions++;
    layer->kept += kept;
    for (uint32_t slot = 0; slot < n; slot++) {
        uint8_t hit = 0;
        if (c->stamp && ids[slot] >= 0) {
            uint64_t *stamp = c->stamp + (uint64_t)moe * c->n_experts;
            uint32_t e = (uint32_t)ids[slot];
            hit = stamp[e] != 0;
            if (hit) {
                layer->hits++;
            } else {
                layer->misses++;
                if (layer->resident == c->capacity) {
                    stamp[least_recent(stamp, c->n_experts)] = 0;
                    layer->resident--;
                }
                layer->resident++;
            }
            stamp[e] = ++layer->tick;
        }
        if (hits) hits[slot] = hit;
    }
}

void col_cache_record(col_cache *c, uint32_t moe, uint32_t position, const int32_t *ids, uint32_t n, uint8_t kept,
                      uint8_t *hits)
{
    if (c->log_ids && position < c->log_positions) {
        uint64_t row = (uint64_t)position * c->n_moe + moe;
        int32_t *logged = c->log_ids + row * c->k_slots;
        for (uint32_t slot = 0; slot < c->k_slots; slot++) logged[slot] = slot < n ? ids[slot] : -1;
        if (c->log_kept) c->log_kept[row] = kept;
    }
    account(c, moe, ids, n, kept, hits);
}

void col_cache_rebuild(col_cache *c, uint32_t positions)
{
    col_cache_clear(c);
    if (!c->block || !c->log_ids) return;
    if (positions > c->log_positions) positions = c->log_positions;
    for (uint32_t p = 0; p < positions; p++)
        for (uint32_t moe = 0; moe < c->n_moe; moe++) {
            uint64_t row = (uint64_t)p * c->n_moe + moe;
            const int32_t *ids = c->log_ids + row * c->k_slots;
            uint32_t n = 0;
            while (n < c->k_slots && ids[n] >= 0) n++;
            account(c, moe, ids, n, c->log_kept ? c->log_kept[row] : 0, NULL);
        }
}

void col_cache_restore_layer(col_cache *c, const void *saved, uint32_t moe)
{
    if (!c->block) return;
    const uint8_t *from = saved;
    ptrdiff_t at = (const uint8_t *)&c->layers[moe] - (const uint8_t *)c->block;
    memcpy(&c->layers[moe], from + at, sizeof c->layers[moe]);
    at = (const uint8_t *)(c->previous + (uint64_t)moe * c->k_slots) - (const uint8_t *)c->block;
    memcpy(c->previous + (uint64_t)moe * c->k_slots, from + at, (uint64_t)c->k_slots * sizeof *c->previous);
    if (c->stamp) {
        at = (const uint8_t *)(c->stamp + (uint64_t)moe * c->n_experts) - (const uint8_t *)c->block;
        memcpy(c->stamp + (uint64_t)moe * c->n_experts, from + at, (uint64_t)c->n_experts * sizeof *c->stamp);
    }
}
