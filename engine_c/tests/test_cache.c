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
        col_cache_record(&c, 1, steps[p], 2, (uint8_t)(p == 3), hits);
        CHECK(hits[0] == want[p][0] && hits[1] == want[p][1]);
    }
    CHECK(c.layers[1].hits == 3 && c.layers[1].misses == 7 && c.layers[1].resident == 3);
    CHECK(c.layers[1].decisions == 5 && c.layers[1].kept == 1);
    CHECK(c.previous[2] == 2 && c.previous[3] == 4);
    /* the other layer has its own LRU: untouched */
    CHECK(c.layers[0].hits == 0 && c.layers[0].misses == 0 && c.layers[0].resident == 0);
    uint8_t hits[2];
    const int32_t again[2] = {1, 4};
    col_cache_record(&c, 0, again, 2, 0, hits);
    CHECK(hits[0] == 0 && hits[1] == 0);
    col_cache_record(&c, 1, again, 2, 0, hits);
    CHECK(hits[0] == 1 && hits[1] == 1);
    col_cache_clear(&c);
    CHECK(c.layers[1].hits == 0 && c.layers[1].resident == 0 && c.previous[2] == 0);
    col_cache_record(&c, 1, again, 2, 0, hits);
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
    col_cache_record(&c, 0, ids, 2, 1, hits);
    CHECK(hits[0] == 0 && hits[1] == 0);
    CHECK(c.layers[0].hits == 0 && c.layers[0].misses == 0);
    CHECK(c.layers[0].decisions == 1 && c.layers[0].kept == 1);
    CHECK(c.previous[0] == 5 && c.previous[1] == 6);
    free(block);
}

int main(void)
{
    test_lru_sequence_by_hand();
    test_no_lru_keeps_the_previous_set();
    return TEST_REPORT();
}
