/*
 * util.c - the two process-wide helpers every engine file uses: formatting an error message into
 * a caller's buffer (the `char *err, size_t errlen` half of "errors are values") and a monotonic
 * clock for the trace's timings. Kept apart from format.c so the forward pass does not depend on
 * the file reader for them.
 */
#include "internal.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

int32_t col_set_error(char *err, size_t errlen, int32_t status, const char *fmt, ...)
{
    if (err && errlen) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(err, errlen, fmt, ap);
        va_end(ap);
    }
    return status;
}

uint64_t col_now_ns(void)
{
    /* CLOCK_MONOTONIC: immune to wall-clock steps, which would otherwise produce negative
     * durations in the latency view. */
    struct timespec ts;
    if (clock_gettime(CLOCK_MONOTONIC, &ts) != 0)
        return 0;
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

/* ---- Allocation ------------------------------------------------------------------------------ */

/* Model open and session creation allocate through a col_allocator so a test can fail the Nth
 * allocation (SQLite's and Lua's test allocators) without any global switch; the default is
 * the C library's. */
static void *default_alloc(void *user, size_t size, size_t alignment)
{
    (void)user;
    void *p = NULL;
    if (alignment < sizeof(void *))
        alignment = sizeof(void *);
    return posix_memalign(&p, alignment, size ? size : 1) == 0 ? p : NULL;
}

static void default_free(void *user, void *p)
{
    (void)user;
    free(p);
}

void col_allocator_or_default(const col_allocator *in, col_allocator *out)
{
    if (in && in->alloc && in->free) {
        *out = *in;
    } else {
        out->alloc = default_alloc;
        out->free = default_free;
        out->user = NULL;
    }
}

void *col_alloc_zeroed(const col_allocator *a, uint64_t count, uint64_t size)
{
    if (size && count > (uint64_t)SIZE_MAX / size)
        return NULL;
    size_t n = (size_t)(count * size);
    void *p = a->alloc(a->user, n ? n : 1, 64);
    if (p)
        memset(p, 0, n);
    return p;
}

void col_dealloc(const col_allocator *a, void *p)
{
    if (p)
        a->free(a->user, p);
}
