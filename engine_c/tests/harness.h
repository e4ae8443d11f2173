/* harness.h - a two-macro unit-test harness (redis style). Each test binary is a main() calling
 * test functions; CHECK records a failure and continues, TEST_REPORT prints the tally and returns
 * the exit status ("N passed, N failed"). */
#ifndef COLIBRI_TEST_HARNESS_H
#define COLIBRI_TEST_HARNESS_H
#include <stdio.h>

static int harness_passed, harness_failed;

#define CHECK(cond)                                                                      \
    do {                                                                                 \
        if (cond) {                                                                      \
            harness_passed++;                                                            \
        } else {                                                                         \
            harness_failed++;                                                            \
            fprintf(stderr, "%s:%d: CHECK failed: %s\n", __FILE__, __LINE__, #cond);     \
        }                                                                                \
    } while (0)

#define TEST_REPORT()                                                                    \
    (printf("%d passed, %d failed\n", harness_passed, harness_failed), harness_failed ? 1 : 0)

#endif
