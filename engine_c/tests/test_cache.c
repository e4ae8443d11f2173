/* test_cache.c - expert caching's state (cache.c): the LRU of resident experts against a
 * sequence worked out by hand, per-layer independence, the previous set and the counters. */
#include "harness.h"
#include "cache.h"

#include <stdlib.h>
#include <string.h>

static void *block_for(col_cache *c, uint32_t n_moe, uint32_t k, uint32_t n_experts, uint32_t capacity)
{
    uint64_t bytes = col_cache_bytes(n_moe, k, n_experts, capacity);
    void *block = NULL;
    if (posix_memalign(&block, 64, bytes) != 0) return NULL;
    memset(block, 0, bytes);
    col_cache_bind(c, block, n_moe, k, n_experts, capacity);
    return block;
}

/* Three resident experts of eight, two per decision:
 *   {1,2} miss miss            resident 1 2
 *   {2,3} hit miss             resident 1 2 3
 *   {4,1} miss (evicts 1) miss (evicts 2, used before 3)   resident 3 4 1
 *   {3,1} hit hit
 *   {2,4} miss (evicts 4) miss (evicts 3)                  resident 1 2 4 */
static void test_lru_sequence_by_hand(void)
{
    col_cache c;
    void *block = block_for(&c, 2, 2, 8, 3);
    CHECK(block != NULL);
    if (!block) return;
    const int32_t steps[5][2] = {{1, 2}, {2, 3}, {4, 1}, {3, 1}, {2, 4}};
    const uint8_t want[5][2] = {{0, 0}, {1, 0}, {0, 0}, {1, 1}, {0, 0}};
    for (int p = 0; p < 5; p++) {
        uint8_t hits[2] = {9, 9};
        col_cache_record(&c, 1, (uint32_t)p, steps[p], 2, (uint8_t)(p == 3), hits);
        CHECK(hits[0] == want[p][0] && hits[1] == want[p][1]);
    }
    CHECK(c.layers[1].hits == 3 && c.layers[1].misses == 7 && c.layers[1].resident == 3);
    CHECK(c.layers[1].decisions == 5 && c.layers[1].kept == 1);
    CHECK(c.previous[2] == 2 && c.previous[3] == 4);
    /* the other layer has its own LRU: untouched */
    CHECK(c.layers[0].hits == 0 && c.layers[0].misses == 0 && c.layers[0].resident == 0);
    uint8_t hits[2];
    const int32_t again[2] = {1, 4};
    col_cache_record(&c, 0, 0, again, 2, 0, hits);
    CHECK(hits[0] == 0 && hits[1] == 0);
    col_cache_record(&c, 1, 5, again, 2, 0, hits);
    CHECK(hits[0] == 1 && hits[1] == 1);
    col_cache_clear(&c);
    CHECK(c.layers[1].hits == 0 && c.layers[1].resident == 0 && c.previous[2] == 0);
    col_cache_record(&c, 1, 5, again, 2, 0, hits);
    CHECK(hits[0] == 0 && hits[1] == 0);
    free(block);
}

/* Without an LRU (capacity 0) the previous set and the decision counts are still kept. */
static void test_no_lru_keeps_the_previous_set(void)
{
    col_cache c;
    void *block = block_for(&c, 1, 2, 8, 0);
    CHECK(block != NULL && c.stamp == NULL);
    if (!block) return;
    CHECK(col_cache_bytes(1, 2, 8, 0) < col_cache_bytes(1, 2, 8, 4));
    uint8_t hits[2] = {9, 9};
    const int32_t ids[2] = {5, 6};
    col_cache_record(&c, 0, 0, ids, 2, 1, hits);
    CHECK(hits[0] == 0 && hits[1] == 0);
    CHECK(c.layers[0].hits == 0 && c.layers[0].misses == 0);
    CHECK(c.layers[0].decisions == 1 && c.layers[0].kept == 1);
    CHECK(c.previous[0] == 5 && c.previous[1] == 6);
    free(block);
}

/* A short decision (interventions forbade all but one expert) leaves -1 in the previous set's
 * other slots. */
static void test_short_set_pads_the_previous_set(void)
{
    col_cache c;
    void *block = block_for(&c, 1, 2, 8, 3);
    CHECK(block != NULL);
    if (!block) return;
    const int32_t two[2] = {5, 6}, one[1] = {3};
    col_cache_record(&c, 0, 0, two, 2, 0, NULL);
    col_cache_record(&c, 0, 1, one, 1, 0, NULL);
    CHECK(c.previous[0] == 3 && c.previous[1] == -1);
    CHECK(c.layers[0].misses == 3 && c.layers[0].resident == 3);
    free(block);
}

/* Replaying the log of the first P positions gives the state those positions left, byte for
 * byte, whatever came after them; the per-layer restore puts one layer back and no other. */
static void test_rebuild_and_restore_layer(void)
{
    enum { N_MOE = 2, K = 2, N_EXP = 6, CAP = 3, POS = 7 };
    col_cache c, fresh;
    void *block = block_for(&c, N_MOE, K, N_EXP, CAP);
    void *other = block_for(&fresh, N_MOE, K, N_EXP, CAP);
    void *saved = malloc(c.bytes);
    int32_t log_ids[POS * N_MOE * K];
    uint8_t log_kept[POS * N_MOE];
    CHECK(block && other && saved);
    if (!block || !other || !saved) return;
    col_cache_bind_log(&c, log_ids, log_kept, POS);
    const int32_t steps[POS][N_MOE][K] = {{{0, 1}, {2, 3}}, {{1, 2}, {3, 4}}, {{4, 5}, {0, -1}}, {{0, 5}, {1, 2}},
                                          {{2, 3}, {5, 0}}, {{1, 4}, {4, 5}}, {{3, 0}, {2, 1}}};
    const uint32_t counts[POS][N_MOE] = {{2, 2}, {2, 2}, {2, 1}, {2, 2}, {2, 2}, {2, 2}, {2, 2}};
    for (uint32_t cut = 0; cut <= POS; cut++) {
        col_cache_clear(&c);
        col_cache_clear(&fresh);
        for (uint32_t p = 0; p < POS; p++)
            for (uint32_t m = 0; m < N_MOE; m++) {
                uint8_t kept = (uint8_t)((p + m) % 3 == 1);
                col_cache_record(&c, m, p, steps[p][m], counts[p][m], kept, NULL);
                if (p < cut) col_cache_record(&fresh, m, p, steps[p][m], counts[p][m], kept, NULL);
            }
        col_cache_rebuild(&c, cut);
        CHECK(memcmp(c.block, fresh.block, c.bytes) == 0);
    }
    /* layer 1 moves on, then is put back from the copy; layer 0's move stays */
    col_cache_rebuild(&c, 4);
    memcpy(saved, c.block, c.bytes);
    col_cache_record(&c, 0, 4, steps[4][0], 2, 0, NULL);
    memcpy(fresh.block, c.block, c.bytes);
    col_cache_record(&c, 1, 4, steps[4][1], 2, 1, NULL);
    col_cache_restore_layer(&c, saved, 1);
    CHECK(memcmp(c.block, fresh.block, c.bytes) == 0);
    free(saved);
    free(other);
    free(block);
}

int main(void)
{
    test_short_set_pads_the_previous_set();
    test_rebuild_and_restore_layer();
    test_lru_sequence_by_hand();
    test_no_lru_keeps_the_previous_set();
    return TEST_REPORT();
}
