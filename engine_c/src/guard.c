/*
 * guard.c - surviving a file that changes under its mapping: file identity checks and the
 * SIGBUS guard.
 *
 * A model is a read-only mapping of a file another process may truncate or rewrite while it is
 * open (a converter writing in place, a download restarted, a user's `cp` over it). Two defences:
 *
 *   1. Identity. col_model keeps the file open and records its device, inode, size and mtime at
 *      open; col_model_check_file compares them with fstat (in-place change: the mapping is no
 *      longer trustworthy) and stat(path) (atomic replace: the mapping is intact, a newer file
 *      exists). Every entry point that reads tensor data checks first.
 *   2. The guard. A truncation can still land between that check and a read, and on Linux a read
 *      of a mapped page past the file's new end raises SIGBUS, whose default action kills the
 *      process. So every live mapping is registered here, and a process-wide SIGBUS handler,
 *      when the faulting address lies inside a registered mapping, maps a page of zeros over the
 *      faulting page (MAP_FIXED from /dev/zero) and marks the mapping faulted. The faulting load
 *      restarts and reads zeros; the entry point sees the mark afterwards, throws its result away
 *      and returns COL_ERR_FILE_CHANGED.
 *
 * Why not sigsetjmp/siglongjmp around the reads: the forward pass runs on the thread pool's
 * workers, a jump cannot cross threads, and unwinding out of a kernel in the middle of a barrier
 * would leave the pool wedged. Patching the page lets every thread finish its share normally,
 * and the engine keeps its "never longjmp" rule. mmap is not on POSIX's async-signal-safe list,
 * but on Linux (the platform that raises SIGBUS here) it is a bare system call with no user-space
 * state. A fault outside every registered mapping is passed on to the handler installed before
 * ours (Python's faulthandler, for instance), or to the default action.
 *
 * The registry is a fixed array of atomic slots (no locks in the handler). A mapping that finds
 * no free slot (more than GUARD_SLOTS models open at once) runs unguarded; identity checks still
 * apply.
 */
#include "internal.h"

#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

/* ---- The registry ---------------------------------------------------------------------------- */

#define GUARD_SLOTS 256

typedef struct guard_slot {
    atomic_int used;
    atomic_int faulted;
    atomic_uintptr_t base;      /* 0 while the slot is being filled or emptied */
    atomic_uintptr_t size;
} guard_slot;

static guard_slot slots[GUARD_SLOTS];
static struct sigaction previous;  /* the SIGBUS action before ours */
static uintptr_t page_size;
static int zero_fd = -1;            /* /dev/zero, opened once */
static pthread_mutex_t install_lock = PTHREAD_MUTEX_INITIALIZER;

static void on_sigbus(int sig, siginfo_t *info, void *context)
{
    uintptr_t a = (uintptr_t)info->si_addr;
    for (int i = 0; i < GUARD_SLOTS; i++) {
        uintptr_t base = atomic_load(&slots[i].base);
        if (!base || a < base || a - base >= atomic_load(&slots[i].size))
            continue;
        uintptr_t page = a & ~(page_size - 1);
        void *r = mmap((void *)page, (size_t)page_size, PROT_READ, MAP_PRIVATE | MAP_FIXED, zero_fd, 0);
        if (r != MAP_FAILED) {
            atomic_store(&slots[i].faulted, 1);
            return; /* the faulting load restarts and reads zeros */
        }
        break;
    }
    /* Not ours: whoever handled SIGBUS before, else the default action (the load faults again
     * on return and the process dies as it would have without us). */
    if ((previous.sa_flags & SA_SIGINFO) && previous.sa_sigaction) {
        previous.sa_sigaction(sig, info, context);
    } else if (previous.sa_handler != SIG_DFL && previous.sa_handler != SIG_IGN) {
        previous.sa_handler(sig);
    } else {
        struct sigaction dfl;
        memset(&dfl, 0, sizeof dfl);
        dfl.sa_handler = SIG_DFL;
        sigaction(SIGBUS, &dfl, NULL);
    }
}

/* Install the handler unless it is already the current one (a runtime such as Python's
 * faulthandler may have replaced it since: then we chain to it). Returns false on failure. */
static bool install(void)
{
    bool ok = true;
    pthread_mutex_lock(&install_lock);
    if (zero_fd < 0) {
        zero_fd = open("/dev/zero", O_RDONLY | O_CLOEXEC);
        long ps = sysconf(_SC_PAGESIZE);
        page_size = ps > 0 ? (uintptr_t)ps : 4096;
    }
    struct sigaction cur;
    if (zero_fd < 0 || sigaction(SIGBUS, NULL, &cur) != 0) {
        ok = false;
    } else if (!((cur.sa_flags & SA_SIGINFO) && cur.sa_sigaction == on_sigbus)) {
        struct sigaction ours;
        memset(&ours, 0, sizeof ours);
        ours.sa_sigaction = on_sigbus;
        ours.sa_flags = SA_SIGINFO;
        sigemptyset(&ours.sa_mask);
        previous = cur;
        ok = sigaction(SIGBUS, &ours, NULL) == 0;
    }
    pthread_mutex_unlock(&install_lock);
    return ok;
}

int32_t col_guard_register(const void *base, uint64_t size)
{
    if (!base || !size || !install())
        return -1;
    for (int i = 0; i < GUARD_SLOTS; i++) {
        int expected = 0;
        if (atomic_compare_exchange_strong(&slots[i].used, &expected, 1)) {
            atomic_store(&slots[i].faulted, 0);
            atomic_store(&slots[i].size, (uintptr_t)size);
            atomic_store(&slots[i].base, (uintptr_t)base);
            return i;
        }
    }
    return -1;
}

void col_guard_unregister(int32_t slot)
{
    if (slot < 0 || slot >= GUARD_SLOTS)
        return;
    atomic_store(&slots[slot].base, 0);
    atomic_store(&slots[slot].size, 0);
    atomic_store(&slots[slot].faulted, 0);
    atomic_store(&slots[slot].used, 0);
}

bool col_guard_faulted(int32_t slot)
{
    return slot >= 0 && slot < GUARD_SLOTS && atomic_load(&slots[slot].faulted) != 0;
}

/* ---- File identity --------------------------------------------------------------------------- */

int32_t col_file_identity(int fd, col_file_id *out)
{
    struct stat st;
    if (fstat(fd, &st) != 0)
        return COL_ERR_IO;
    out->dev = (uint64_t)st.st_dev;
    out->ino = (uint64_t)st.st_ino;
    out->size = (uint64_t)st.st_size;
    out->mtime_sec = (int64_t)st.st_mtim.tv_sec;
    out->mtime_nsec = (int64_t)st.st_mtim.tv_nsec;
    return COL_OK;
}

int32_t col_model_check_file(const col_model *model, uint32_t *replaced, char *err, size_t errlen)
{
    if (replaced)
        *replaced = 0;
    if (!model)
        return col_set_error(err, errlen, COL_ERR_INVALID_ARG, "model is NULL");
    if (col_guard_faulted(model->guard))
        return col_set_error(err, errlen, COL_ERR_FILE_CHANGED,
                             "'%s' changed while mapped: a read past its end faulted (the file "
                             "was truncated); reopen it", model->path);
    if (model->fd < 0)
        return COL_OK;
    col_file_id now;
    if (col_file_identity(model->fd, &now) != COL_OK)
        return col_set_error(err, errlen, COL_ERR_FILE_CHANGED, "cannot stat '%s': %s", model->path,
                             strerror(errno));
    const col_file_id *was = &model->file_id;
    if (now.size != was->size)
        return col_set_error(err, errlen, COL_ERR_FILE_CHANGED,
                             "'%s' changed while mapped: its size is now %llu bytes, was %llu "
                             "(truncated or rewritten in place); reopen it", model->path,
                             (unsigned long long)now.size, (unsigned long long)was->size);
    if (now.mtime_sec != was->mtime_sec || now.mtime_nsec != was->mtime_nsec)
        return col_set_error(err, errlen, COL_ERR_FILE_CHANGED,
                             "'%s' changed while mapped: it was modified in place since it was "
                             "opened; reopen it", model->path);
    if (replaced) {
        struct stat st;
        *replaced = stat(model->path, &st) != 0 || (uint64_t)st.st_ino != was->ino ||
                    (uint64_t)st.st_dev != was->dev;
    }
    return COL_OK;
}
