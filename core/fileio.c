/* core/fileio.c: opening a file the user named, as an input, without trusting what the path
 * is. A FIFO, a device, a socket or a directory is refused by name before anything reads it:
 * the path is checked with stat first (so opening a device node never happens), then opened
 * non-blocking (so a FIFO swapped in after the stat cannot hang the open), and the descriptor
 * is checked again with fstat (so what is read is what was checked). */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
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
