/* corpus.h - where the C tests find tests/corpus/valid.colibri: from engine_c (make test) or from
 * the repository root. Include after colibri.h and harness.h. */
#ifndef COLIBRI_TEST_CORPUS_H
#define COLIBRI_TEST_CORPUS_H
#include <stdbool.h>
#include <stdio.h>
#include <unistd.h>

static char valid_path[512];

/* Point valid_path at the corpus's valid.colibri; false when neither place has it. */
static bool find_valid(void)
{
    const char *dirs[] = {"../tests/corpus", "tests/corpus"};
    for (int i = 0; i < 2; i++) {
        snprintf(valid_path, sizeof valid_path, "%s/valid.colibri", dirs[i]);
        if (access(valid_path, R_OK) == 0) return true;
    }
    return false;
}

/* The corpus's valid.colibri, opened; NULL (with a failed check) when it is missing or refused. */
static inline col_model *open_valid(void)
{
    CHECK(find_valid());
    col_model *m = NULL;
    col_problem p;
    if (find_valid()) CHECK(col_model_open(valid_path, &m, &p) == COL_OK);
    return m;
}

#endif
