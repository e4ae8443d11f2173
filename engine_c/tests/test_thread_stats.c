/*
 * test_thread_stats.c - each thread's share of a session's work (col_session_thread_stats) on
 * tests/corpus/valid.colibri:
 *   - the threads' multiply-adds sum to the same total on one thread and on three: the work is
 *     the model's, only its split depends on the threads;
 *   - the calling thread enters every batch handed to all threads, a worker at most as many;
 *   - col_session_reset starts the counts again from zero;
 *   - a NULL session counts no threads, and a capacity of 0 fills nothing.
 */
#include "colibri.h"
#include "harness.h"
#include "corpus.h"

#include <stdio.h>
#include <string.h>

enum { N_TOKENS = 5, MAX_THREADS = 3 };
static const int32_t tokens[N_TOKENS] = {1, 4, 2, 7, 3};

static col_session_config config(uint32_t threads)
{
    col_session_config c;
    memset(&c, 0, sizeof c);
    c.n_threads = threads;
    c.max_context = 8;
    return c;
}

/* A session of `threads` after a prefill of the tokens and one step: the threads' counts into out,
 * their multiply-adds summed. */
static uint64_t run_and_count(const col_model *m, uint32_t threads, col_thread_stats *out)
{
    col_session_config c = config(threads);
    char err[256];
    col_session *s = NULL;
    CHECK(col_session_create(m, &c, &s, err, sizeof err) == COL_OK);
    if (!s) return 0;
    CHECK(col_session_prefill(s, tokens, N_TOKENS, NULL, err, sizeof err) == COL_OK);
    CHECK(col_session_step(s, 5, NULL, err, sizeof err) == COL_OK);
    CHECK(col_session_thread_stats(s, out, MAX_THREADS) == threads);
    uint64_t total = 0;
    for (uint32_t t = 0; t < threads; t++) total += out[t].multiply_adds;

    CHECK(col_session_reset(s) == COL_OK);
    col_thread_stats after[MAX_THREADS];
    memset(after, 0xFF, sizeof after);
    CHECK(col_session_thread_stats(s, after, MAX_THREADS) == threads);
    for (uint32_t t = 0; t < threads; t++) CHECK(after[t].multiply_adds == 0 && after[t].batches == 0);
    col_session_free(s);
    return total;
}

static void test_same_work_on_any_threads(const col_model *m)
{
    col_thread_stats one[MAX_THREADS], three[MAX_THREADS];
    const uint64_t alone = run_and_count(m, 1, one), shared = run_and_count(m, 3, three);
    CHECK(alone > 0);
    CHECK(shared == alone);
    CHECK(one[0].batches == 0); /* one thread: nothing is handed to others */
    CHECK(three[0].batches > 0);
    for (uint32_t t = 1; t < 3; t++) CHECK(three[t].batches <= three[0].batches);
}

static void test_bad_arguments(const col_model *m)
{
    col_thread_stats out[1];
    CHECK(col_session_thread_stats(NULL, out, 1) == 0);
    col_session_config c = config(2);
    char err[256];
    col_session *s = NULL;
    CHECK(col_session_create(m, &c, &s, err, sizeof err) == COL_OK);
    if (!s) return;
    CHECK(col_session_thread_stats(s, NULL, 0) == 2);
    col_session_free(s);
}

int main(void)
{
    col_model *m = open_valid();
    if (!m) return TEST_REPORT();
    test_same_work_on_any_threads(m);
    test_bad_arguments(m);
    col_model_close(m);
    return TEST_REPORT();
}
