/* tools/benchmod/thread_count.c: counts thread creations for `tessera bench train`. The
 * benchmark module (preloaded into `tessera bench` only) defines pthread_create, which every
 * library in the process (libgomp, OpenBLAS, oneDNN) then calls; it adds one to a counter and forwards to the C library's own
 * pthread_create (the next definition in lookup order). A thread made and joined inside one
 * step is counted too, which comparing /proc/self/task before and after would miss: libgomp
 * starts a fresh team for every nested parallel region and ends it with the region.
 *
 * Not built under AddressSanitizer or ThreadSanitizer, which intercept pthread_create
 * themselves: there the counter reports that it is unavailable. */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE 1 /* RTLD_NEXT */
#endif
#include "config.h"

#include <dlfcn.h>
#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <string.h>

#include "benchmod.h"

#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
#define TS_NO_THREAD_COUNT 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer) || __has_feature(thread_sanitizer)
#define TS_NO_THREAD_COUNT 1
#endif
#endif

#ifndef TS_NO_THREAD_COUNT

typedef int (*create_fn)(pthread_t *, const pthread_attr_t *, void *(*)(void *), void *);

static atomic_uint_fast64_t n_created;

/* Visible to every library: the module is preloaded, so this comes before glibc's. */
__attribute__((visibility("default"))) int pthread_create(pthread_t *t, const pthread_attr_t *a,
                                                          void *(*fn)(void *), void *arg)
{
    static _Atomic(create_fn) real;
    create_fn f = atomic_load(&real);
    if (!f) {
        void *sym = dlsym(RTLD_NEXT, "pthread_create");
        memcpy(&f, &sym, sizeof f); /* object to function pointer, without a cast */
        if (!f)
            return EAGAIN;
        atomic_store(&real, f);
    }
    atomic_fetch_add_explicit(&n_created, 1, memory_order_relaxed);
    return f(t, a, fn, arg);
}

TSB_EXPORT int tsb_thread_count_read(uint64_t *created)
{
    *created = atomic_load(&n_created);
    return 1;
}

#else

TSB_EXPORT int tsb_thread_count_read(uint64_t *created)
{
    *created = 0;
    return 0;
}

#endif
