/* tools/plugin_check.h: what the suites of `tessera plugin-check` share: the checker (the
 * device under test and the tallies), one report line per check, and the suites in
 * plugin_check_kernels.c (kernels against the float64 reference, error paths, concurrent
 * runs). */
#ifndef TESSERA_TOOLS_PLUGIN_CHECK_H
#define TESSERA_TOOLS_PLUGIN_CHECK_H

#include <stdint.h>

#include "cli.h"

typedef struct checker {
    ts_device *dev;
    int verbose, quick;
    int npass, nfail, nskip;
    uint64_t seed;
    unsigned char kernel_failed[TS_OP_COUNT][TS_DTYPE_COUNT]; /* by pc_check_kernels */
} checker;

/* One line: ok 1 PASS, 0 FAIL, -1 SKIP; name, then the printf-like detail (fmt may be NULL). */
void pc_report(checker *c, int ok, const char *name, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
/* The last error's message, or "(no message)". */
const char *pc_err(void);
/* TS_ENOMEM, saying so on stderr. */
ts_status pc_nomem(void);

/* The suites of plugin_check_kernels.c. */
void pc_check_kernels(checker *c);
void pc_check_errors(checker *c);
void pc_check_threads(checker *c);

#endif /* TESSERA_TOOLS_PLUGIN_CHECK_H */
