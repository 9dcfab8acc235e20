/* core/fileio.c: files the user names, read or written without trusting what a path is.
 * Inputs: anything but a regular file (a FIFO, a device, a directory) is refused by name
 * before it is read (stat first, a non-blocking open, fstat again). Outputs: the atomic,
 * link-safe writer every save goes through (a temporary created exclusively next to the
 * target, synced and renamed), the output path rule (links only of root's or the caller's,
 * directories no one else can change, another user's file never replaced), and the trust
 * rule plugins and configuration files pass. */
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <pthread.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <sys/stat.h>
#include <sys/random.h>
#include <unistd.h>

#include "internal.h"

const char *ts__file_kind(mode_t mode)
{
    if (S_ISREG(mode))
        return "a regular file";
    if (S_ISDIR(mode))
        return "a directory";
    if (S_ISFIFO(mode))
        return "a FIFO (named pipe)";
    if (S_ISCHR(mode))
        return "a character device";
    if (S_ISBLK(mode))
        return "a block device";
    if (S_ISSOCK(mode))
        return "a socket";
    if (S_ISLNK(mode))
        return "a symbolic link";
    return "not a regular file";
}

static ts_status not_regular(const char *path, const char *what, mode_t mode)
{
    return ts__fail(TS_EIO, "%s '%s' is %s, not a regular file: name a regular file", what, path,
                    ts__file_kind(mode));
}

ts_status ts__open_input(const char *path, const char *what, int *fd_out, struct stat *st_out)
{
    *fd_out = -1;
    struct stat st;
    if (stat(path, &st) != 0)
        return ts__fail(errno == ENOMEM ? TS_ENOMEM : TS_EIO, "%s '%s': cannot open: %s", what,
                        path, strerror(errno));
    if (!S_ISREG(st.st_mode))
        return not_regular(path, what, st.st_mode);
    int fd = open(path, O_RDONLY | O_NONBLOCK | O_NOCTTY | O_CLOEXEC);
    if (fd < 0)
        return ts__fail(errno == ENOMEM ? TS_ENOMEM : TS_EIO, "%s '%s': cannot open: %s", what,
                        path, strerror(errno));
    if (fstat(fd, &st) != 0) {
        int err = errno;
        close(fd);
        return ts__fail(TS_EIO, "%s '%s': cannot stat: %s", what, path, strerror(err));
    }
    if (!S_ISREG(st.st_mode)) {
        close(fd);
        return not_regular(path, what, st.st_mode);
    }
    /* Regular files never block; clear the flag so reads behave as usual. */
    int fl = fcntl(fd, F_GETFL);
    if (fl >= 0)
        (void)fcntl(fd, F_SETFL, fl & ~O_NONBLOCK);
    *fd_out = fd;
    if (st_out)
        *st_out = st;
    return TS_OK;
}

ts_status ts__fopen_input(const char *path, const char *what, FILE **out, struct stat *st_out)
{
    *out = NULL;
    int fd;
    ts_status s = ts__open_input(path, what, &fd, st_out);
    if (s)
        return s;
    FILE *f = fdopen(fd, "rb");
    if (!f) {
        int err = errno;
        close(fd);
        return ts__fail(err == ENOMEM ? TS_ENOMEM : TS_EIO, "%s '%s': cannot open: %s", what,
                        path, strerror(err));
    }
    *out = f;
    return TS_OK;
}

/* ---- the trust rule -------------------------------------------------------------------- */

int ts__trusted_owner(uid_t uid)
{
    return uid == 0 || uid == geteuid();
}

static int untrusted(char *why, size_t len, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static int untrusted(char *why, size_t len, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(why, len, fmt, ap);
    va_end(ap);
    return 1;
}

int ts__trust_check(const char *real, struct stat *st, char *why, size_t len)
{
    if (lstat(real, st) != 0) {
        int err = errno;
        snprintf(why, len, "cannot stat '%s': %s", real, strerror(err));
        errno = err;
        return -1;
    }
    if (!S_ISREG(st->st_mode)) {
        snprintf(why, len, "'%s' is %s, not a regular file", real, ts__file_kind(st->st_mode));
        errno = EINVAL;
        return -1;
    }
    if (!ts__trusted_owner(st->st_uid))
        return untrusted(why, len, "the file '%s' is owned by uid %ld, neither root nor this user",
                         real, (long)st->st_uid);
    if (st->st_mode & (S_IWGRP | S_IWOTH))
        return untrusted(why, len, "the file '%s' is writable by %s", real,
                         st->st_mode & S_IWOTH ? "every user" : "its group (or an ACL entry)");
    return ts__trust_dirs(real, why, len);
}

int ts__trust_dirs(const char *real, char *why, size_t len)
{
    size_t n = strlen(real);
    char *dir = ts__malloc(n + 2);
    if (!dir) {
        snprintf(why, len, "out of host memory");
        errno = ENOMEM;
        return -1;
    }
    memcpy(dir, real, n + 1);
    int r = 0;
    for (;;) {
        char *slash = strrchr(dir, '/');
        if (!slash)
            break; /* realpath gives absolute paths; nothing above a relative one to check */
        slash == dir ? (void)(slash[1] = 0) : (void)(*slash = 0);
        /* lstat: real has no link in it, so anything but a directory here means the path
         * changed since it was resolved (a directory swapped for a link, say). */
        struct stat ds;
        if (lstat(dir, &ds) != 0) {
            int err = errno;
            snprintf(why, len, "cannot stat directory '%s': %s", dir, strerror(err));
            errno = err;
            r = -1;
            break;
        }
        if (!S_ISDIR(ds.st_mode)) {
            r = untrusted(why, len, "'%s' is %s, not the directory it was a moment ago", dir,
                          ts__file_kind(ds.st_mode));
            break;
        }
        if (!ts__trusted_owner(ds.st_uid)) {
            r = untrusted(why, len, "its directory '%s' is owned by uid %ld, neither root nor "
                          "this user", dir, (long)ds.st_uid);
            break;
        }
        if ((ds.st_mode & (S_IWGRP | S_IWOTH)) && !(ds.st_mode & S_ISVTX)) {
            r = untrusted(why, len, "its directory '%s' is writable by %s and not sticky", dir,
                          ds.st_mode & S_IWOTH ? "every user" : "its group (or an ACL entry)");
            break;
        }
        if (strcmp(dir, "/") == 0)
            break;
    }
    free(dir);
    return r;
}

/* Appends "/" and the n bytes of name to buf (len bytes) unless it is "." or "..", which pop
 * (".." of "/" is "/"). 0, or -1 when it does not fit. */
static int push(char *buf, size_t len, const char *name, size_t n)
{
    if (n == 1 && name[0] == '.')
        return 0;
    if (n == 2 && name[0] == '.' && name[1] == '.') {
        char *slash = strrchr(buf, '/');
        if (slash)
            slash == buf ? (void)(buf[1] = 0) : (void)(*slash = 0);
        return 0;
    }
    size_t at = strlen(buf);
    if (at + (at > 1) + n + 1 > len)
        return -1;
    if (at > 1)
        buf[at++] = '/';
    memcpy(buf + at, name, n);
    buf[at + n] = 0;
    return 0;
}

int ts__resolve_trusted(const char *path, char **real_out, char *why, size_t len)
{
    *real_out = NULL;
    enum { CAP = 4096, MAX_LINKS = 40 };
    char *cur = ts__malloc(CAP), *todo = ts__malloc(2 * CAP + 2), *link = ts__malloc(CAP);
    int r = -1, links = 0;
    if (!cur || !todo || !link) {
        snprintf(why, len, "out of host memory");
        errno = ENOMEM;
        goto out;
    }
    /* cur: the part resolved so far (absolute, no link in it); todo: what is left. */
    if (path[0] == '/') {
        snprintf(cur, CAP, "/");
    } else if (!getcwd(cur, CAP)) {
        snprintf(why, len, "cannot tell the working directory: %s", strerror(errno));
        goto out;
    }
    if (snprintf(todo, 2 * CAP + 2, "%s", path) >= 2 * CAP + 2)
        goto too_long;
    for (char *p = todo; *p;) {
        while (*p == '/')
            p++;
        size_t n = strcspn(p, "/");
        if (!n)
            break;
        char *name = p;
        p += n;
        size_t at = strlen(cur);
        if (push(cur, CAP, name, n) != 0)
            goto too_long;
        struct stat st;
        if (lstat(cur, &st) != 0) {
            int err = errno;
            snprintf(why, len, "'%s': %s", cur, strerror(err));
            errno = err;
            goto out;
        }
        if (S_ISDIR(st.st_mode))
            continue;
        if (!S_ISLNK(st.st_mode)) { /* every component of a directory path is one */
            snprintf(why, len, "'%s': %s", cur, strerror(ENOTDIR));
            errno = ENOTDIR;
            goto out;
        }
        /* A link is followed only when root or this user made it: one another user put in a
         * directory they can write (theirs, or a sticky one) would steer the path anywhere. */
        if (!ts__trusted_owner(st.st_uid)) {
            r = untrusted(why, len, "'%s' is a symbolic link owned by uid %ld, neither root "
                          "nor this user", cur, (long)st.st_uid);
            goto out;
        }
        if (++links > MAX_LINKS) {
            snprintf(why, len, "more than %d symbolic links in '%s'", MAX_LINKS, path);
            errno = ELOOP;
            goto out;
        }
        ssize_t k = readlink(cur, link, CAP - 1);
        if (k <= 0) {
            snprintf(why, len, "cannot read the link '%s': %s", cur,
                     k < 0 ? strerror(errno) : "empty");
            goto out;
        }
        link[k] = 0;
        cur[at] = 0; /* back to the link's directory */
        if (link[0] == '/')
            snprintf(cur, CAP, "/");
        /* the rest after the link's text */
        size_t rest = strlen(p);
        if ((size_t)k + 1 + rest + 1 > 2 * CAP + 2)
            goto too_long;
        memmove(todo + k + 1, p, rest + 1);
        memcpy(todo, link, (size_t)k);
        todo[k] = '/';
        p = todo;
    }
    *real_out = ts__strdup(cur);
    if (!*real_out) {
        snprintf(why, len, "out of host memory");
        errno = ENOMEM;
        goto out;
    }
    r = 0;
    goto out;
too_long:
    snprintf(why, len, "the path '%s' is too long once its links are resolved", path);
    errno = ENAMETOOLONG;
out:
    free(cur);
    free(todo);
    free(link);
    return r;
}

/* ---- outputs: the atomic, link-safe writer ---------------------------------------------- */

/* What one save is doing, for TS_FAULT_IO and for its messages. */
struct ts__saver {
    const char *path;
    const char *what; /* "the checkpoint", "the array": for messages */
    char *tmp;        /* the temporary file's name */
    int injected;     /* the last failure came from TS_FAULT_IO */
};
typedef struct ts__saver saver;

/* The TS_FAULT_IO hook in front of each disk step: 1 (errno EIO) when it fires. */
static int io_fault(saver *sv)
{
    sv->injected = ts__fault_hit(TS_FAULT_IO);
    if (sv->injected)
        errno = EIO;
    return sv->injected;
}

/* fsync and rename behind the hook: each disk step is one call, so none can be dropped
 * without the fault walk noticing. */
static int io_fsync(saver *sv, int fd)
{
    return io_fault(sv) ? -1 : fsync(fd);
}

static int io_rename(saver *sv, const char *from, const char *to)
{
    return io_fault(sv) ? -1 : rename(from, to);
}

static int write_all(saver *sv, int fd, const void *buf, size_t n)
{
    const char *p = buf;
    while (n) {
        if (io_fault(sv))
            return -1;
        ssize_t w = write(fd, p, n);
        if (w < 0 && errno == EINTR)
            continue;
        if (w <= 0) {
            if (w == 0)
                errno = EIO;
            return -1;
        }
        p += w;
        n -= (size_t)w;
    }
    return 0;
}

/* The directory part of path ("." when none). (transfer full) */
static char *dir_of(const char *path)
{
    const char *slash = strrchr(path, '/');
    if (!slash)
        return ts__strdup(".");
    while (slash > path && slash[-1] == '/')
        slash--;
    if (slash == path)
        return ts__strdup("/");
    size_t n = (size_t)(slash - path);
    char *d = ts__malloc(n + 1);
    if (d) {
        memcpy(d, path, n);
        d[n] = 0;
    }
    return d;
}

/* Creates the temporary file next to path, exclusively (O_EXCL | O_NOFOLLOW) under a name with
 * 64 random bits, so nothing planted in the directory can be opened, followed or predicted.
 * mode: the permission bits to create with (the umask applies). */
static int create_tmp(saver *sv, mode_t mode)
{
    for (int tries = 0; tries < 64; tries++) {
        uint64_t r = 0;
        if (getrandom(&r, sizeof r, GRND_NONBLOCK) != (ssize_t)sizeof r) {
            /* No entropy yet (early boot): O_EXCL keeps this safe, only less unpredictable. */
            struct timespec ts;
            clock_gettime(CLOCK_MONOTONIC, &ts);
            r ^= (uint64_t)ts.tv_nsec * 0x9e3779b97f4a7c15u ^ (uint64_t)ts.tv_sec ^
                 (uint64_t)(uintptr_t)&r ^ (uint64_t)tries << 56;
        }
        free(sv->tmp);
        sv->tmp = ts__asprintf("%s.tmp.%016" PRIx64, sv->path, r);
        if (!sv->tmp) {
            errno = ENOMEM;
            return -1;
        }
        int fd = open(sv->tmp, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, mode);
        if (fd >= 0 || errno != EEXIST)
            return fd;
    }
    errno = EEXIST;
    return -1;
}

/* The text for a failed step: strerror, or what fault injection did. */
static const char *io_error(const saver *sv, int err)
{
    return sv->injected ? "injected I/O error (TS_FAULT_IO)" : strerror(err);
}

/* Refuses a target that exists and is not a regular file; *st gets what lstat saw, *exists
 * whether there was anything. */
static ts_status check_target(const char *at, const char *path, const char *what,
                              struct stat *st, int *exists)
{
    *exists = 0;
    if (lstat(at, st) != 0) {
        if (errno == ENOENT)
            return TS_OK;
        return ts__fail(TS_EIO, "%s: cannot save %s: %s", path, what, strerror(errno));
    }
    *exists = 1;
    if (S_ISLNK(st->st_mode))
        return ts__fail(TS_EIO, "%s: cannot save %s: the path is a symbolic link, which a save "
                        "never follows or replaces; save to the file it names instead",
                        path, what);
    if (!S_ISREG(st->st_mode))
        return ts__fail(TS_EIO, "%s: cannot save %s: the path is %s; a save only creates a new "
                        "file or replaces a regular one",
                        path, what, ts__file_kind(st->st_mode));
    /* Another user's file at the name we write (pre-created in a shared directory) would make
     * what we save theirs to read and change: never adopted, never replaced. */
    if (st->st_uid != geteuid())
        return ts__fail(TS_EIO, "%s: cannot save %s: the file there belongs to uid %ld, not to "
                        "you (uid %ld), and a save never replaces another user's file; remove "
                        "it or save under another name",
                        path, what, (long)st->st_uid, (long)geteuid());
    return TS_OK;
}

/* Where path really is, for a file written there: its directory with every symbolic link
 * resolved, following only links of root's or the caller's (one another user planted in a
 * directory they can write would send the file anywhere: into a root-only directory, over
 * another file of the same name), and that directory and every one above it changeable by no
 * one else (owned by root or the caller, writable by no group or other unless sticky), so
 * nothing can be swapped in along the way between the checks and the writes. *at gets the
 * resolved path (transfer full); messages name path. */
static ts_status resolve_output(const char *path, const char *what, char **at)
{
    *at = NULL;
    const char *slash = strrchr(path, '/');
    const char *base = slash ? slash + 1 : path;
    if (!*base)
        return ts__fail(TS_EIO, "%s: cannot save %s: the name ends with '/', which names a "
                        "directory; name a file", path, what);
    char *dir = dir_of(path), *real = NULL, why[1024];
    if (!dir)
        return ts__fail(TS_ENOMEM, "%s: out of memory saving %s", path, what);
    int r = ts__resolve_trusted(dir, &real, why, sizeof why);
    free(dir);
    char *full = r == 0 ? ts__asprintf("%s%s%s", real, strcmp(real, "/") ? "/" : "", base)
                        : NULL;
    free(real);
    if (r == 0 && !full)
        return ts__fail(TS_ENOMEM, "%s: out of memory saving %s", path, what);
    if (r == 0)
        r = ts__trust_dirs(full, why, sizeof why);
    if (r > 0) {
        free(full);
        return ts__fail(TS_EIO, "%s: refusing to save %s there: %s; another user could "
                        "redirect or replace what is written (and what is read back later). "
                        "Save it in a directory that only you or root can change",
                        path, what, why);
    }
    if (r < 0) {
        free(full);
        return ts__fail(errno == ENOMEM ? TS_ENOMEM : TS_EIO, "%s: cannot save %s there: %s",
                        path, what, why);
    }
    *at = full;
    return TS_OK;
}

/* The mode of a file that replaces old, fd created with 0666 less the umask: old's permission
 * bits where they are no wider than that (a user's 0600 stays 0600), never wider. The file at
 * the name may not be one the caller chose: a hard link to some 0666 file of root's, or an old
 * output renamed there by whoever can write the directory. */
static int keep_mode(int fd, const struct stat *old)
{
    struct stat fresh;
    if (fstat(fd, &fresh) != 0)
        return -1;
    return fchmod(fd, old->st_mode & fresh.st_mode & 0777);
}

TS_API ts_status ts_file_check_path(const char *path, const char *what)
{
    if (!path || !*path)
        return ts__fail(TS_EINVAL, "ts_file_check_path: NULL or empty path");
    what = what ? what : "the file";
    struct stat st;
    int exists = 0;
    char *at;
    ts_status s = resolve_output(path, what, &at);
    if (s)
        return s;
    if ((s = check_target(at, path, what, &st, &exists))) {
        free(at);
        return s;
    }
    saver sv = {.path = at, .what = what};
    int fd = create_tmp(&sv, 0600);
    if (fd < 0) {
        int err = errno;
        char *dir = dir_of(path);
        s = ts__fail(TS_EIO, "%s: cannot save %s there: creating a file in '%s' failed: %s",
                     path, what, dir ? dir : ".", strerror(err));
        free(dir);
    } else {
        close(fd);
        unlink(sv.tmp);
    }
    free(sv.tmp);
    free(at);
    return s;
}

int ts__save_write(ts__saver *sv, int fd, const void *buf, size_t n)
{
    return write_all(sv, fd, buf, n);
}

ts_status ts__save_atomic(const char *path, const char *what, ts__save_body body, void *user)
{
    if (!path || !*path)
        return ts__fail(TS_EINVAL, "saving %s: NULL or empty path", what);
    ts_status s = TS_OK;
    char *dir = NULL, *at = NULL;
    int fd = -1, dfd = -1, created = 0, exists = 0, err = 0;
    saver sv = {.path = path, .what = what};
    const char *step = "creating";
    struct stat old;
    /* Blocked, SIGXFSZ (the file size limit) cannot kill the process: write() fails with
     * EFBIG instead, and the signal it leaves pending on this thread is taken back below. The
     * mask is this thread's alone and is restored, so the process's dispositions stay as the
     * caller set them. */
    sigset_t xfsz, saved_mask, pending;
    sigemptyset(&xfsz);
    sigaddset(&xfsz, SIGXFSZ);
    pthread_sigmask(SIG_BLOCK, &xfsz, &saved_mask);
    sigemptyset(&pending);
    sigpending(&pending);
    int xfsz_was_pending = sigismember(&pending, SIGXFSZ);

    if ((s = resolve_output(path, what, &at)))
        goto out;
    sv.path = at;
    if ((s = check_target(at, path, what, &old, &exists)))
        goto out;
    dir = dir_of(at);
    if (!dir) {
        s = ts__fail(TS_ENOMEM, "%s: out of memory saving %s", path, what);
        goto out;
    }
    fd = create_tmp(&sv, 0666);
    if (fd < 0)
        goto io_fail;
    created = 1;
    step = "setting the mode of";
    if (exists && keep_mode(fd, &old) != 0)
        goto io_fail;
    step = "writing";
    int b = body(&sv, fd, user);
    if (b == TS__SAVE_IO)
        goto io_fail;
    if (b != TS_OK) {
        s = (ts_status)b;
        goto out;
    }
    step = "syncing the temporary file";
    if (io_fsync(&sv, fd) != 0)
        goto io_fail;
    step = "closing";
    int rc = close(fd);
    fd = -1;
    if (rc != 0)
        goto io_fail;
    /* Narrow the window: something put at the target since the first look is refused too. */
    if ((s = check_target(at, path, what, &old, &exists)))
        goto out;
    step = "renaming";
    if (io_rename(&sv, sv.tmp, at) != 0)
        goto io_fail;
    created = 0;
    /* Make the rename itself durable. Some filesystems cannot fsync a directory (EINVAL). */
    dfd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (dfd < 0 || (io_fsync(&sv, dfd) != 0 && (sv.injected || errno != EINVAL))) {
        s = ts__fail(TS_EIO, "%s: saved, but syncing the directory '%s' failed, so the rename "
                     "may not survive a crash: %s",
                     path, dir, io_error(&sv, errno));
        goto out;
    }
    goto out;
io_fail:
    err = errno;
    if (err == EFBIG && !sv.injected)
        s = ts__fail(TS_EIO, "%s: cannot save %s: %s '%s' went past the file size limit "
                     "(ulimit -f, RLIMIT_FSIZE): %s",
                     path, what, step, sv.tmp, strerror(err));
    else if (strcmp(step, "renaming") == 0)
        s = ts__fail(TS_EIO, "%s: cannot save %s: renaming '%s' over it: %s", path, what,
                     sv.tmp, io_error(&sv, err));
    else
        s = ts__fail(TS_EIO, "%s: cannot save %s (%s '%s'): %s", path, what, step,
                     sv.tmp ? sv.tmp : path, io_error(&sv, err));
out:
    if (fd >= 0)
        close(fd);
    if (created)
        unlink(sv.tmp);
    if (dfd >= 0)
        close(dfd);
    /* Take back a SIGXFSZ this save raised, then unblock as before. */
    sigemptyset(&pending);
    sigpending(&pending);
    if (!xfsz_was_pending && sigismember(&pending, SIGXFSZ)) {
        struct timespec zero = {0, 0};
        while (sigtimedwait(&xfsz, NULL, &zero) < 0 && errno == EINTR)
            ;
    }
    pthread_sigmask(SIG_SETMASK, &saved_mask, NULL);
    free(dir);
    free(at);
    free(sv.tmp);
    return s;
}

/* ts_file_save's body: the caller's writer on a stdio stream over a duplicate of fd. */
typedef struct file_body {
    ts_file_writer write;
    void *user;
} file_body;

static int write_file_body(ts__saver *sv, int fd, void *user)
{
    (void)sv;
    file_body *fb = user;
    int dfd = dup(fd);
    FILE *f = dfd >= 0 ? fdopen(dfd, "wb") : NULL;
    if (!f) {
        int err = errno;
        if (dfd >= 0)
            close(dfd);
        errno = err;
        return TS__SAVE_IO;
    }
    int rc = fb->write(f, fb->user);
    int werr = ferror(f) ? EIO : 0;
    if (fflush(f) != 0 && !werr)
        werr = errno;
    if (fclose(f) != 0 && !werr)
        werr = errno;
    if (rc != 0)
        return ts__fail(TS_EIO, "the writer gave up (%d)", rc);
    if (werr) {
        errno = werr;
        return TS__SAVE_IO;
    }
    return TS_OK;
}

TS_API ts_status ts_file_save(const char *path, const char *what, ts_file_writer write,
                              void *user)
{
    if (!write)
        return ts__fail(TS_EINVAL, "ts_file_save: no writer");
    file_body fb = {write, user};
    return ts__save_atomic(path, what ? what : "the file", write_file_body, &fb);
}

ts_status ts__create_output(const char *path, const char *what, int new_only, int *fd_out)
{
    *fd_out = -1;
    if (!path || !*path)
        return ts__fail(TS_EINVAL, "creating %s: NULL or empty path", what);
    struct stat old;
    int exists, fd = -1;
    char *at;
    ts_status s = resolve_output(path, what, &at);
    if (s)
        return s;
    saver sv = {.path = at, .what = what};
    const char *step = "creating";
    if ((s = check_target(at, path, what, &old, &exists)))
        goto out;
    if (new_only) { /* exclusively at the name itself: nothing is ever replaced */
        /* O_EXCL: a new regular file or nothing (no FIFO, link or device is ever opened) */
        fd = open(at, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0666);
        if (fd < 0 && errno == EEXIST)
            s = ts__fail(TS_EIO, "%s: cannot create %s: the file exists, and a name from the "
                         "environment only ever makes a new file; remove it or choose another "
                         "name", path, what);
        else if (fd < 0)
            s = ts__fail(TS_EIO, "%s: cannot create %s: %s", path, what, strerror(errno));
        free(at);
        *fd_out = fd;
        return s;
    }
    fd = create_tmp(&sv, 0666);
    if (fd < 0)
        goto io_fail;
    step = "setting the mode of";
    if (exists && keep_mode(fd, &old) != 0)
        goto io_fail;
    if ((s = check_target(at, path, what, &old, &exists)))
        goto out;
    step = "renaming";
    if (rename(sv.tmp, at) != 0)
        goto io_fail;
    free(sv.tmp);
    free(at);
    *fd_out = fd;
    return TS_OK;
io_fail:
    s = ts__fail(TS_EIO, "%s: cannot create %s (%s '%s'): %s", path, what, step,
                 sv.tmp ? sv.tmp : path, strerror(errno));
out:
    if (fd >= 0) {
        close(fd);
        unlink(sv.tmp);
    }
    free(sv.tmp);
    free(at);
    return s;
}

const char *ts__save_path(const ts__saver *sv)
{
    return sv->path;
}
