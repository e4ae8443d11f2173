/*
 * util.c - the two process-wide helpers every engine file uses: formatting an error message into
 * a caller's buffer (the `char *err, size_t errlen` half of "errors are values") and a monotonic
 * clock for the trace's timings. Kept apart from format.c so the forward pass does not depend on
 * the file reader for them.
 */
#include "internal.h"

#include <stdarg.h>
#include <stdio.h>
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
