/* core/fileio.c: opening a file the user named, as an input, without trusting what the path
 * is. A FIFO, a device, a socket or a directory is refused by name before anything reads it:
 * the path is checked with stat first (so opening a device node never happens), then opened
 * non-blocking (so a FIFO swapped in after the stat cannot hang the open), and the descriptor
 * is checked again with fstat (so what is read is what was checked). */
#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
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
