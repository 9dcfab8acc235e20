/* tests/unit/test-checkpoint-attack.c: checkpoints against a hostile user. Saving (often as
 * root) must not write through a symlink planted at the temporary name, must not replace a
 * FIFO, device, socket, directory or symlink at the target, keeps the old file's mode and
 * owner, survives a file size limit and failing write/fsync/rename calls with the old file
 * intact and no temporary left. Loading refuses \u0000 in names, absurd shapes, never reads a
 * tensor nobody asks for, and the optimizer refuses missing state and bad hyper-parameters. */
#include <dirent.h>
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <pthread.h>
#include <signal.h>
#include <sys/inotify.h>
#include <sys/random.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/sysmacros.h>
#include <sys/types.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include <tessera/fault.h>

#include "../tap.h"

static ts_device *dev;

static void setup(void)
{
    dev = tap_start();
}

/* ---- helpers ------------------------------------------------------------------------- */

static int same_file_bytes(const char *path, const unsigned char *want, size_t n)
{
    size_t m;
    unsigned char *got = tap_read_all(path, &m);
    int same = m == n && memcmp(got, want, n) == 0;
    free(got);
    return same;
}

static int count_tmp(const char *dir)
{
    return tap_count_entries(dir, ".tmp");
}

/* A file with header text and data_len bytes of 0x11. */
static const char *write_ckpt(const char *dir, const char *name, const char *header,
                              size_t data_len)
{
    return tap_write_safetensors(dir, name, strlen(header), header, data_len);
}

#define LOAD_FAILS(path, code, ...)                                                         \
    do {                                                                                    \
        ts_checkpoint *ck_ = (ts_checkpoint *)1;                                            \
        CHECK_FAILS(ts_checkpoint_load((path), dev, &ck_), code, __VA_ARGS__);              \
        CHECK(ck_ == NULL);                                                                 \
    } while (0)

/* A checkpoint with one float32 tensor of n elements, all v. (transfer full) */
static ts_checkpoint *make_ck(int64_t n, double v)
{
    ts_tensor *t;
    CHECK_OK(ts_tensor_full(dev, TS_F32, 1, &n, v, &t));
    ts_checkpoint *ck;
    CHECK_OK(ts_checkpoint_new(&ck));
    CHECK_OK(ts_checkpoint_add(ck, "w", t));
    ts_tensor_unref(t);
    return ck;
}

static long my_tid(void)
{
    return (long)syscall(SYS_gettid);
}

/* fsync and rename as libtessera calls them, interposed by this executable: while recording,
 * each call is logged as "fsync tmp" (a temporary file), "fsync dir", "fsync other" or
 * "rename", so a test sees the durability steps and their order. */
static int recording, nrec;
static char rec[32][32];
/* When set, the fsync of a temporary file replaces this path with a FIFO first: something
 * put at the target while the save is writing. */
static const char *swap_to_fifo;

static void record(const char *what)
{
    if (recording && nrec < 32)
        snprintf(rec[nrec++], sizeof rec[0], "%s", what);
}

__attribute__((visibility("default"))) int fsync(int fd)
{
    int (*real)(int) = (int (*)(int))dlsym(RTLD_NEXT, "fsync");
    if (swap_to_fifo) {
        unlink(swap_to_fifo);
        mkfifo(swap_to_fifo, 0600);
        swap_to_fifo = NULL;
    }
    if (recording) {
        char link[64], target[4096] = "";
        struct stat st;
        snprintf(link, sizeof link, "/proc/self/fd/%d", fd);
        ssize_t r = readlink(link, target, sizeof target - 1);
        target[r > 0 ? r : 0] = 0;
        record(fstat(fd, &st) == 0 && S_ISDIR(st.st_mode) ? "fsync dir"
               : strstr(target, ".tmp.")                   ? "fsync tmp"
                                                           : "fsync other");
    }
    return real(fd);
}

__attribute__((visibility("default"))) int rename(const char *from, const char *to)
{
    int (*real)(const char *, const char *) =
        (int (*)(const char *, const char *))dlsym(RTLD_NEXT, "rename");
    record("rename");
    return real(from, to);
}

/* lstat, interposed too: when swap_dir is set, the second look at that directory (the
 * directory rule's, after the path was resolved) first finds it moved away and a link to
 * swap_link_to in its place: an attacker exchanging a directory for a link in the middle of
 * a save's checks. */
static const char *swap_dir, *swap_link_to;
static int swap_looks;

static int lstat_hook(const char *path, struct stat *st, const char *real_name)
{
    int (*real)(const char *, struct stat *) =
        (int (*)(const char *, struct stat *))dlsym(RTLD_NEXT, real_name);
    if (swap_dir && strcmp(path, swap_dir) == 0 && ++swap_looks == 2) {
        char moved[4300];
        snprintf(moved, sizeof moved, "%s.moved", swap_dir);
        int (*real_rename)(const char *, const char *) =
            (int (*)(const char *, const char *))dlsym(RTLD_NEXT, "rename");
        if (real_rename(swap_dir, moved) == 0)
            (void)!symlink(swap_link_to, swap_dir);
        swap_dir = NULL;
    }
    return real(path, st);
}

__attribute__((visibility("default"))) int lstat(const char *path, struct stat *st)
{
    return lstat_hook(path, st, "lstat");
}

__attribute__((visibility("default"))) int lstat64(const char *path, struct stat64 *st)
{
    return lstat_hook(path, (struct stat *)st, "lstat64");
}

/* getrandom, interposed too: while forced is set, each call yields the next of forced_vals
 * (the last one repeating), so a test knows the temporary name a save will try and can
 * plant a link at exactly that name. */
static int forced, nforced_calls;
static uint64_t forced_vals[2];

__attribute__((visibility("default"))) ssize_t getrandom(void *buf, size_t n, unsigned flags)
{
    if (forced) {
        uint64_t v = forced_vals[nforced_calls < 1 ? 0 : 1];
        nforced_calls++;
        memset(buf, 0, n);
        memcpy(buf, &v, n < sizeof v ? n : sizeof v);
        return (ssize_t)n;
    }
    ssize_t (*real)(void *, size_t, unsigned) =
        (ssize_t(*)(void *, size_t, unsigned))dlsym(RTLD_NEXT, "getrandom");
    return real(buf, n, flags);
}

/* ---- A: saving ----------------------------------------------------------------------- */

/* A local user plants symlinks at every temporary name the save could predict (pid, tid,
 * and neighbours) pointing at a precious file: the save neither follows nor renames them. */
static void test_save_planted_symlinks(void)
{
    setup();
    const char *dir = tap_tmpdir();
    const char *victim = tap_path_in(dir, "victim");
    const char precious[] = "root-owned precious bytes\n";
    tap_write_bytes(victim, precious, sizeof precious - 1);
    const char *path = tap_path_in(dir, "ck.st");
    long pid = (long)getpid(), tid = my_tid();
    int planted = 0;
    for (long dp = -2; dp <= 2; dp++)
        for (long dt = -2; dt <= 2; dt++) {
            char name[4096];
            snprintf(name, sizeof name, "%s.tmp.%ld.%ld", path, pid + dp, tid + dt);
            CHECK(symlink(victim, name) == 0);
            planted++;
        }
    char n2[4096];
    snprintf(n2, sizeof n2, "%s.tmp.%ld.0", path, pid);
    CHECK(symlink(victim, n2) == 0);
    ts_checkpoint *ck = make_ck(1000, 2.5);
    CHECK_OK(ts_checkpoint_save(ck, path));
    CHECK_OK(ts_checkpoint_save(ck, path)); /* over an existing file too */
    CHECK_MSG(same_file_bytes(victim, (const unsigned char *)precious, sizeof precious - 1),
              "the save wrote through a planted symlink into %s", victim);
    struct stat st;
    CHECK(lstat(path, &st) == 0);
    CHECK_MSG(S_ISREG(st.st_mode), "%s is not a regular file after the save", path);
    CHECK(st.st_size > 4000);
    /* Every planted link is still there, still a link to the victim. */
    for (long dp = -2; dp <= 2; dp++)
        for (long dt = -2; dt <= 2; dt++) {
            char name[4096], target[4096];
            snprintf(name, sizeof name, "%s.tmp.%ld.%ld", path, pid + dp, tid + dt);
            ssize_t r = readlink(name, target, sizeof target - 1);
            CHECK_MSG(r > 0, "planted link %s is gone", name);
            target[r] = 0;
            CHECK(strcmp(target, victim) == 0);
        }
    ts_checkpoint *back;
    CHECK_OK(ts_checkpoint_load(path, dev, &back));
    CHECK(ts_checkpoint_get(back, "w") != NULL);
    ts_checkpoint_free(back);
    ts_checkpoint_free(ck);
    tap_end();
}

/* Even a name guessed right cannot be used against the save: the temporary file is created
 * exclusively, so a link planted at the very name is not followed; another name is drawn.
 * If every name drawn is taken, the save fails cleanly. */
static void test_save_guessed_name(void)
{
    setup();
    const char *dir = tap_tmpdir();
    const char *victim = tap_path_in(dir, "victim");
    const char precious[] = "precious\n";
    tap_write_bytes(victim, precious, sizeof precious - 1);
    const char *path = tap_path_in(dir, "g.st");
    char planted[4096];
    snprintf(planted, sizeof planted, "%s.tmp.%016llx", path, 0x1111111111111111ull);
    CHECK(symlink(victim, planted) == 0);
    ts_checkpoint *ck = make_ck(500, 1);
    forced_vals[0] = 0x1111111111111111ull;
    forced_vals[1] = 0x2222222222222222ull;
    forced = 1;
    nforced_calls = 0;
    ts_status s = ts_checkpoint_save(ck, path);
    forced = 0;
    CHECK_MSG(s == TS_OK, "%s", ts_last_error());
    CHECK_MSG(nforced_calls == 2, "%d names drawn", nforced_calls);
    CHECK(same_file_bytes(victim, (const unsigned char *)precious, sizeof precious - 1));
    struct stat st;
    CHECK(lstat(planted, &st) == 0 && S_ISLNK(st.st_mode));
    CHECK(lstat(path, &st) == 0 && S_ISREG(st.st_mode));
    /* Every draw lands on the planted name: refused after a bounded number of tries. */
    forced_vals[1] = forced_vals[0];
    forced = 1;
    nforced_calls = 0;
    CHECK_FAILS(ts_checkpoint_save(ck, path), TS_EIO, path, "File exists");
    forced = 0;
    CHECK(nforced_calls > 1 && nforced_calls <= 1000);
    CHECK(same_file_bytes(victim, (const unsigned char *)precious, sizeof precious - 1));
    CHECK(lstat(planted, &st) == 0 && S_ISLNK(st.st_mode));
    ts_checkpoint *back;
    CHECK_OK(ts_checkpoint_load(path, dev, &back));
    ts_checkpoint_free(back);
    ts_checkpoint_free(ck);
    tap_end();
}

/* The temporary names are not predictable: inotify sees what each save creates; two saves
 * from the same thread use different names, none built from the pid or tid. */
static void test_save_temp_names_unpredictable(void)
{
    setup();
    const char *dir = tap_tmpdir();
    const char *path = tap_path_in(dir, "ck.st");
    ts_checkpoint *ck = make_ck(16, 1);
    int fd = inotify_init1(IN_NONBLOCK | IN_CLOEXEC);
    CHECK(fd >= 0);
    CHECK(inotify_add_watch(fd, dir, IN_CREATE) >= 0);
    char names[8][256];
    int n = 0;
    for (int k = 0; k < 3; k++) {
        CHECK_OK(ts_checkpoint_save(ck, path));
        char buf[8192] __attribute__((aligned(__alignof__(struct inotify_event))));
        ssize_t len;
        while ((len = read(fd, buf, sizeof buf)) > 0)
            for (char *p = buf; p < buf + len;) {
                struct inotify_event *e = (struct inotify_event *)p;
                if (e->len && strcmp(e->name, "ck.st") != 0 && n < 8)
                    snprintf(names[n++], sizeof names[0], "%s", e->name);
                p += sizeof *e + e->len;
            }
    }
    close(fd);
    CHECK_MSG(n == 3, "expected one temporary file per save, saw %d", n);
    char pidtxt[32], tidtxt[32];
    snprintf(pidtxt, sizeof pidtxt, "%ld", (long)getpid());
    snprintf(tidtxt, sizeof tidtxt, "%ld", my_tid());
    for (int i = 0; i < n; i++) {
        CHECK_MSG(!strstr(names[i], pidtxt) && !strstr(names[i], tidtxt),
                  "temporary name %s contains the pid or tid", names[i]);
        for (int j = 0; j < i; j++)
            CHECK_MSG(strcmp(names[i], names[j]) != 0, "two saves used the same name %s",
                      names[i]);
    }
    CHECK_INT_EQ(count_tmp(dir), 0);
    ts_checkpoint_free(ck);
    tap_end();
}

/* What lstat says about path, for "left as it was". */
typedef struct node_id {
    dev_t dev;
    ino_t ino;
    mode_t mode;
} node_id;

static node_id node_of(const char *path)
{
    struct stat st;
    CHECK_MSG(lstat(path, &st) == 0, "lstat %s: %s", path, strerror(errno));
    return (node_id){st.st_dev, st.st_ino, st.st_mode};
}

static void check_refused(ts_checkpoint *ck, const char *dir, const char *path,
                          const char *what)
{
    node_id before = node_of(path);
    CHECK_FAILS(ts_checkpoint_save(ck, path), TS_EIO, path, what);
    node_id after = node_of(path);
    CHECK_MSG(before.dev == after.dev && before.ino == after.ino && before.mode == after.mode,
              "%s was replaced", path);
    CHECK_INT_EQ(count_tmp(dir), 0);
}

/* Targets that exist and are not regular files are refused, and left as they were. */
static void test_save_special_targets(void)
{
    setup();
    const char *dir = tap_tmpdir();
    ts_checkpoint *ck = make_ck(8, 3);

    const char *fifo = tap_path_in(dir, "fifo");
    CHECK(mkfifo(fifo, 0600) == 0);
    check_refused(ck, dir, fifo, "FIFO");

    const char *sdir = tap_path_in(dir, "adir");
    CHECK(mkdir(sdir, 0700) == 0);
    check_refused(ck, dir, sdir, "directory");

    /* A symlink to a regular file: refused (a root save must not be steered by a link). */
    const char *real = tap_path_in(dir, "real.st");
    CHECK_OK(ts_checkpoint_save(ck, real));
    size_t nreal;
    unsigned char *real_bytes = tap_read_all(real, &nreal);
    const char *link = tap_path_in(dir, "link.st");
    CHECK(symlink(real, link) == 0);
    ts_checkpoint *other = make_ck(4, 9);
    check_refused(other, dir, link, "symbolic link");
    CHECK(same_file_bytes(real, real_bytes, nreal));
    /* A dangling symlink too. */
    const char *dangling = tap_path_in(dir, "dangling.st");
    CHECK(symlink(tap_path_in(dir, "nowhere"), dangling) == 0);
    check_refused(other, dir, dangling, "symbolic link");
    CHECK(access(tap_path_in(dir, "nowhere"), F_OK) != 0);

    const char *sock = tap_path_in(dir, "sock");
    int sfd = socket(AF_UNIX, SOCK_STREAM, 0);
    CHECK(sfd >= 0);
    struct sockaddr_un sa = {.sun_family = AF_UNIX};
    CHECK(strlen(sock) < sizeof sa.sun_path);
    strcpy(sa.sun_path, sock);
    CHECK(bind(sfd, (struct sockaddr *)&sa, sizeof sa) == 0);
    check_refused(ck, dir, sock, "socket");
    close(sfd);

    if (geteuid() == 0) { /* only root can make device nodes */
        const char *cdev = tap_path_in(dir, "null");
        CHECK(mknod(cdev, S_IFCHR | 0666, makedev(1, 3)) == 0);
        check_refused(ck, dir, cdev, "character device");
        const char *bdev = tap_path_in(dir, "blk");
        CHECK(mknod(bdev, S_IFBLK | 0600, makedev(7, 0)) == 0);
        check_refused(ck, dir, bdev, "block device");
    }
    free(real_bytes);
    ts_checkpoint_free(other);
    ts_checkpoint_free(ck);
    tap_end();
}

/* Saving over a file keeps its mode (and its owner, for root); a new file gets 0666 minus
 * the umask. */
static void test_save_keeps_mode(void)
{
    setup();
    const char *dir = tap_tmpdir();
    ts_checkpoint *ck = make_ck(8, 3);
    const char *path = tap_path_in(dir, "m.st");
    mode_t old_umask = umask(022);
    CHECK_OK(ts_checkpoint_save(ck, path));
    struct stat st;
    CHECK(stat(path, &st) == 0);
    CHECK_INT_EQ(st.st_mode & 07777, 0644);
    static const mode_t modes[] = {0600, 0640, 0400, 0604};
    for (size_t i = 0; i < sizeof modes / sizeof modes[0]; i++) {
        CHECK(chmod(path, modes[i]) == 0);
        CHECK_OK(ts_checkpoint_save(ck, path));
        CHECK(stat(path, &st) == 0);
        CHECK_MSG((st.st_mode & 07777) == modes[i], "mode %o came back %o", (unsigned)modes[i],
                  (unsigned)(st.st_mode & 07777));
    }
    const char *fresh = tap_path_in(dir, "fresh.st");
    umask(077);
    CHECK_OK(ts_checkpoint_save(ck, fresh));
    CHECK(stat(fresh, &st) == 0);
    CHECK_INT_EQ(st.st_mode & 07777, 0600);
    /* Never wider than a new file would be: the file at the name may be a hard link to some
     * 0666 file, or an old output renamed there by whoever can write the directory. */
    CHECK(chmod(path, 0666) == 0);
    CHECK_OK(ts_checkpoint_save(ck, path));
    CHECK(stat(path, &st) == 0);
    CHECK_INT_EQ(st.st_mode & 07777, 0600);
    umask(022);
    CHECK(chmod(path, 0666) == 0);
    CHECK_OK(ts_checkpoint_save(ck, path));
    CHECK(stat(path, &st) == 0);
    CHECK_INT_EQ(st.st_mode & 07777, 0644);
    umask(old_umask);
    /* Another user's file at the name (planted in a shared directory, mode 0666 so that its
     * owner could read and change what is saved) is refused and left as it was, never
     * adopted; the check before a run says the same. */
    if (geteuid() == 0) {
        CHECK(chown(path, 4321, 8765) == 0);
        CHECK(chmod(path, 0666) == 0);
        struct stat before;
        CHECK(stat(path, &before) == 0);
        CHECK_FAILS(ts_checkpoint_save(ck, path), TS_EIO, path, "belongs to uid 4321",
                    "never replaces another user's file");
        CHECK_FAILS(ts_checkpoint_check_path(path), TS_EIO, "belongs to uid 4321");
        CHECK(stat(path, &st) == 0);
        CHECK_INT_EQ(st.st_uid, 4321);
        CHECK_INT_EQ(st.st_ino, before.st_ino);
        CHECK_INT_EQ(st.st_mtime, before.st_mtime);
        CHECK_INT_EQ(tap_count_entries(dir, ".tmp"), 0);
    }
    ts_checkpoint_free(ck);
    tap_end();
}

/* RLIMIT_FSIZE with SIGXFSZ at its default (which kills): a child saving past the limit gets
 * a clean TS_EIO naming the file and the limit, and lives; the old file is intact, no
 * temporary is left, and the child's signal mask is as it was. */
static void test_save_file_size_limit(void)
{
    setup();
    const char *dir = tap_tmpdir();
    const char *path = tap_path_in(dir, "big.st");
    ts_checkpoint *small = make_ck(4, 1.5);
    CHECK_OK(ts_checkpoint_save(small, path));
    size_t n_old;
    unsigned char *old = tap_read_all(path, &n_old);
    ts_checkpoint *big = make_ck(64 * 1024, 2.5); /* 256 KiB */
    fflush(NULL);
    pid_t pid = fork();
    CHECK(pid >= 0);
    if (pid == 0) {
        signal(SIGXFSZ, SIG_DFL);
        sigset_t none;
        sigemptyset(&none);
        sigprocmask(SIG_SETMASK, &none, NULL);
        struct rlimit rl = {64 * 1024, 64 * 1024};
        int code = 0;
        if (setrlimit(RLIMIT_FSIZE, &rl) != 0)
            code = 10;
        else if (ts_checkpoint_save(big, path) != TS_EIO)
            code = 11;
        else if (!strstr(ts_last_error(), path) ||
                 !strstr(ts_last_error(), "file size limit")) {
            fprintf(stderr, "# message: %s\n", ts_last_error());
            code = 12;
        } else {
            sigset_t now, pend;
            sigprocmask(SIG_SETMASK, NULL, &now);
            sigpending(&pend);
            code = sigismember(&now, SIGXFSZ) ? 13 : sigismember(&pend, SIGXFSZ) ? 14 : 0;
        }
        ts_checkpoint_free(small);
        ts_checkpoint_free(big);
        _exit(code);
    }
    int status;
    CHECK(waitpid(pid, &status, 0) == pid);
    CHECK_MSG(WIFEXITED(status), "the saving child was killed by signal %d",
              WIFSIGNALED(status) ? WTERMSIG(status) : 0);
    CHECK_MSG(WEXITSTATUS(status) == 0, "the saving child failed check %d",
              WEXITSTATUS(status));
    CHECK(same_file_bytes(path, old, n_old));
    CHECK_INT_EQ(count_tmp(dir), 0);
    free(old);
    ts_checkpoint_free(small);
    ts_checkpoint_free(big);
    tap_end();
}

/* Every write, fsync, rename and directory fsync of a save fails in turn (TS_FAULT_IO): each
 * is TS_EIO naming the step; before the rename the old file is byte-identical, after it the
 * new one is complete; no temporary is ever left. The file's fsync and the directory's fsync
 * must both be among the steps. */
static void test_save_io_faults(void)
{
    setup();
    const char *dir = tap_tmpdir();
    const char *path = tap_path_in(dir, "f.st");
    ts_checkpoint *oldck = make_ck(4, 1.5), *newck = make_ck(3000, -2);
    const char *np = tap_path_in(dir, "new.st");
    CHECK_OK(ts_checkpoint_save(newck, np));
    size_t n_new;
    unsigned char *new_bytes = tap_read_all(np, &n_new);
    CHECK(unlink(np) == 0);
    CHECK_OK(ts_checkpoint_save(oldck, path));
    size_t n_old;
    unsigned char *old_bytes = tap_read_all(path, &n_old);
    ts_fault_arm(TS_FAULT_IO, 0);
    CHECK_OK(ts_checkpoint_save(newck, path));
    uint64_t steps = ts_fault_count();
    ts_fault_disarm();
    CHECK_MSG(steps >= 5, "only %llu I/O steps in a save", (unsigned long long)steps);
    int saw_file_sync = 0, saw_dir_sync = 0, saw_rename = 0, saw_write = 0;
    for (uint64_t k = 1; k <= steps; k++) {
        CHECK_OK(ts_checkpoint_save(oldck, path));
        ts_fault_arm(TS_FAULT_IO, k);
        ts_clear_error();
        ts_status s = ts_checkpoint_save(newck, path);
        unsigned fired = ts_fault_fired();
        ts_fault_disarm();
        const char *msg = ts_last_error();
        CHECK_MSG(s == TS_EIO && fired == TS_FAULT_IO, "I/O step %llu: %s: %s",
                  (unsigned long long)k, ts_status_name(s), msg);
        CHECK_STR_CONTAINS(msg, path);
        CHECK_STR_CONTAINS(msg, "injected");
        CHECK_INT_EQ(count_tmp(dir), 0);
        if (strstr(msg, "syncing the directory")) {
            saw_dir_sync++;
            CHECK_MSG(k == steps, "the directory fsync is step %llu of %llu",
                      (unsigned long long)k, (unsigned long long)steps);
            CHECK(same_file_bytes(path, new_bytes, n_new));
        } else {
            CHECK_MSG(same_file_bytes(path, old_bytes, n_old),
                      "I/O step %llu (%s) changed %s", (unsigned long long)k, msg, path);
            saw_file_sync += strstr(msg, "syncing the temporary file") != NULL;
            saw_rename += strstr(msg, "renaming") != NULL;
            saw_write += strstr(msg, "writing") != NULL;
        }
    }
    CHECK_INT_EQ(saw_file_sync, 1);
    CHECK_INT_EQ(saw_dir_sync, 1);
    CHECK_INT_EQ(saw_rename, 1);
    CHECK(saw_write >= 2);
    free(old_bytes);
    free(new_bytes);
    ts_checkpoint_free(oldck);
    ts_checkpoint_free(newck);
    tap_end();
}

/* The durability steps, seen from outside: the temporary file is fsynced before the rename,
 * and the directory after it, exactly once each. */
static void test_save_durability_calls(void)
{
    setup();
    const char *dir = tap_tmpdir();
    const char *path = tap_path_in(dir, "d.st");
    ts_checkpoint *ck = make_ck(100, 4);
    for (int k = 0; k < 2; k++) { /* a new file, then over it */
        nrec = 0;
        recording = 1;
        CHECK_OK(ts_checkpoint_save(ck, path));
        recording = 0;
        CHECK_MSG(nrec == 3 && !strcmp(rec[0], "fsync tmp") && !strcmp(rec[1], "rename") &&
                      !strcmp(rec[2], "fsync dir"),
                  "save %d made %d calls: %s, %s, %s", k, nrec, nrec > 0 ? rec[0] : "-",
                  nrec > 1 ? rec[1] : "-", nrec > 2 ? rec[2] : "-");
    }
    /* A FIFO put at the target while the save writes is refused at the rename too. */
    swap_to_fifo = path;
    CHECK_FAILS(ts_checkpoint_save(ck, path), TS_EIO, path, "FIFO");
    CHECK(swap_to_fifo == NULL);
    struct stat st;
    CHECK(lstat(path, &st) == 0 && S_ISFIFO(st.st_mode));
    CHECK_INT_EQ(count_tmp(dir), 0);
    ts_checkpoint_free(ck);
    tap_end();
}

/* A directory of the path exchanged for a link (to a directory the caller may write, so only
 * the exchange itself can be caught) between the save's resolving the path and its checking
 * the directories: refused, nothing written through the link, no temporary left. */
static void test_save_directory_swapped_for_link(void)
{
    setup();
    const char *dir = tap_tmpdir();
    char sub[4200], elsewhere[4200], path[4300];
    snprintf(sub, sizeof sub, "%s/run", dir);
    snprintf(elsewhere, sizeof elsewhere, "%s/elsewhere", dir);
    CHECK(mkdir(sub, 0700) == 0 && mkdir(elsewhere, 0700) == 0);
    snprintf(path, sizeof path, "%s/model.st", sub);
    ts_checkpoint *ck = make_ck(8, 2);
    swap_looks = 0;
    swap_link_to = elsewhere;
    swap_dir = sub;
    CHECK_FAILS(ts_checkpoint_save(ck, path), TS_EIO, path, "not the directory it was");
    CHECK(swap_dir == NULL); /* the exchange happened */
    CHECK_INT_EQ(tap_count_entries(elsewhere, "model"), 0);
    struct stat st;
    CHECK(lstat(sub, &st) == 0 && S_ISLNK(st.st_mode));
    ts_checkpoint_free(ck);
    tap_end();
}

/* ---- B: hostile files ---------------------------------------------------------------- */

#define A16 "\"a\":{\"dtype\":\"F32\",\"shape\":[4],\"data_offsets\":[0,16]}"

static void test_load_nul_escapes(void)
{
    setup();
    const char *dir = tap_tmpdir();
    LOAD_FAILS(write_ckpt(dir, "n1.st",
                          "{\"a\\u0000b\":{\"dtype\":\"F32\",\"shape\":[4],\"data_offsets\":"
                          "[0,16]}}",
                          16),
               TS_ECORRUPT, "n1.st", "\\u0000");
    LOAD_FAILS(write_ckpt(dir, "n2.st",
                          "{\"__metadata__\":{\"k\\u0000\":\"v\"}," A16 "}", 16),
               TS_ECORRUPT, "n2.st", "\\u0000");
    LOAD_FAILS(write_ckpt(dir, "n3.st",
                          "{\"__metadata__\":{\"k\":\"v\\u0000w\"}," A16 "}", 16),
               TS_ECORRUPT, "n3.st", "\\u0000");
    LOAD_FAILS(write_ckpt(dir, "n4.st",
                          "{\"\\u0000\":{\"dtype\":\"F32\",\"shape\":[4],\"data_offsets\":[0,16]}}",
                          16),
               TS_ECORRUPT, "n4.st", "\\u0000");
    LOAD_FAILS(write_ckpt(dir, "n5.st",
                          "{\"a\":{\"dtype\":\"F32\\u0000x\",\"shape\":[4],\"data_offsets\":"
                          "[0,16]}}",
                          16),
               TS_ECORRUPT, "n5.st", "\\u0000");
    /* Upper-case hex is the same escape. */
    LOAD_FAILS(write_ckpt(dir, "n6.st",
                          "{\"a\\U0000\":1,\"b\\u0000\":{\"dtype\":\"F32\",\"shape\":[4],"
                          "\"data_offsets\":[0,16]}}",
                          16),
               TS_ECORRUPT, "n6.st");
    /* An escaped backslash followed by the text u0000 is an ordinary name. */
    ts_checkpoint *ck;
    CHECK_OK(ts_checkpoint_load(
        write_ckpt(dir, "ok.st",
                   "{\"a\\\\u0000\":{\"dtype\":\"F32\",\"shape\":[4],\"data_offsets\":[0,16]}}",
                   16),
        dev, &ck));
    CHECK(ts_checkpoint_get(ck, "a\\u0000") != NULL);
    ts_checkpoint_free(ck);
    tap_end();
}

static void test_load_huge_shapes(void)
{
    setup();
    const char *dir = tap_tmpdir();
    LOAD_FAILS(write_ckpt(dir, "z1.st",
                          "{\"a\":{\"dtype\":\"F32\",\"shape\":[0,1099511627776,1099511627776],"
                          "\"data_offsets\":[0,0]}}",
                          0),
               TS_ECORRUPT, "z1.st", "'a'", "too large");
    LOAD_FAILS(write_ckpt(dir, "z2.st",
                          "{\"a\":{\"dtype\":\"U8\",\"shape\":[1099511627776,1099511627776,0],"
                          "\"data_offsets\":[0,0]}}",
                          0),
               TS_ECORRUPT, "z2.st", "too large");
    LOAD_FAILS(write_ckpt(dir, "z3.st",
                          "{\"a\":{\"dtype\":\"U8\",\"shape\":[0,4503599627370496,4096],"
                          "\"data_offsets\":[0,0]}}",
                          0),
               TS_ECORRUPT, "z3.st", "too large");
    /* Large but sane zero-size shapes still load. */
    ts_checkpoint *ck;
    CHECK_OK(ts_checkpoint_load(write_ckpt(dir, "ok.st",
                                           "{\"a\":{\"dtype\":\"F64\",\"shape\":[0,1048576,"
                                           "1024],\"data_offsets\":[0,0]}}",
                                           0),
                                dev, &ck));
    ts_tensor *t = ts_checkpoint_get(ck, "a");
    CHECK(t && ts_tensor_numel(t) == 0);
    ts_checkpoint_free(ck);
    tap_end();
}

/* The high-water mark of this process's resident memory, in KiB. */
static long maxrss_kib(void)
{
    struct rusage ru;
    CHECK(getrusage(RUSAGE_SELF, &ru) == 0);
    return ru.ru_maxrss;
}

/* A 2 GiB tensor nobody asks for, in a sparse file: loading and restoring the small tensor
 * neither reads nor allocates it (a child measures its peak resident memory). */
static void test_load_unused_tensor_not_read(void)
{
    setup();
    const char *dir = tap_tmpdir();
    const char *path = tap_path_in(dir, "sparse.st");
    const uint64_t huge = (uint64_t)2 << 30;
    char header[512];
    snprintf(header, sizeof header,
             "{\"small\":{\"dtype\":\"F32\",\"shape\":[4],\"data_offsets\":[0,16]},"
             "\"huge\":{\"dtype\":\"U8\",\"shape\":[%llu],\"data_offsets\":[16,%llu]}}",
             (unsigned long long)huge, (unsigned long long)(huge + 16));
    size_t h = strlen(header);
    FILE *f = fopen(path, "wb");
    CHECK(f);
    unsigned char len8[8];
    for (int i = 0; i < 8; i++)
        len8[i] = (unsigned char)((uint64_t)h >> (8 * i));
    float small[4] = {1, 2, 3, 4};
    CHECK(fwrite(len8, 1, 8, f) == 8 && fwrite(header, 1, h, f) == h &&
          fwrite(small, 1, 16, f) == 16);
    CHECK(fclose(f) == 0);
    CHECK(truncate(path, (off_t)(8 + h + 16 + huge)) == 0);
    fflush(NULL);
    pid_t pid = fork();
    CHECK(pid >= 0);
    if (pid == 0) {
        long before = maxrss_kib();
        ts_checkpoint *ck;
        if (ts_checkpoint_load(path, dev, &ck) != TS_OK) {
            fprintf(stderr, "# load: %s\n", ts_last_error());
            _exit(10);
        }
        ts_tensor *dst;
        if (ts_tensor_zeros(dev, TS_F32, 1, (const int64_t[]){4}, &dst) != TS_OK ||
            ts_checkpoint_restore(ck, "small", dst) != TS_OK)
            _exit(11);
        float got[4];
        if (ts_tensor_to_host(dst, got, sizeof got) != TS_OK || memcmp(got, small, 16) != 0)
            _exit(12);
        long grew = maxrss_kib() - before;
        ts_tensor_unref(dst);
        ts_checkpoint_free(ck);
        printf("# loading and restoring grew the resident set by %ld KiB\n", grew);
        fflush(stdout);
        if (grew > 256 * 1024)
            _exit(13);
        _exit(0);
    }
    int status;
    CHECK(waitpid(pid, &status, 0) == pid);
    CHECK_MSG(WIFEXITED(status) && WEXITSTATUS(status) == 0, "child status %d", status);
    CHECK(unlink(path) == 0);
    tap_end();
}

/* A file that shrinks after the load: reading a tensor from it fails cleanly. */
static void test_load_file_changes_after_load(void)
{
    setup();
    const char *dir = tap_tmpdir();
    const char *path = tap_path_in(dir, "shrink.st");
    ts_checkpoint *ck = make_ck(1000, 7);
    CHECK_OK(ts_checkpoint_save(ck, path));
    ts_checkpoint_free(ck);
    CHECK_OK(ts_checkpoint_load(path, dev, &ck));
    struct stat st;
    CHECK(stat(path, &st) == 0);
    CHECK(truncate(path, st.st_size - 100) == 0);
    ts_tensor *dst;
    CHECK_OK(ts_tensor_zeros(dev, TS_F32, 1, (const int64_t[]){1000}, &dst));
    CHECK_FAILS(ts_checkpoint_restore(ck, "w", dst), TS_ECORRUPT, "shrink.st", "'w'");
    CHECK(ts_checkpoint_get(ck, "w") == NULL);
    CHECK_STR_CONTAINS(ts_last_error(), "shrink.st");
    ts_tensor_unref(dst);
    ts_checkpoint_free(ck);
    tap_end();
}

/* A loaded checkpoint saved elsewhere without reading its tensors: the same bytes. */
static void test_loaded_resave(void)
{
    setup();
    const char *dir = tap_tmpdir();
    const char *a = tap_path_in(dir, "a.st"), *b = tap_path_in(dir, "b.st");
    ts_checkpoint *ck = make_ck(1000, 7);
    ts_tensor *i64;
    CHECK_OK(ts_tensor_arange(dev, TS_I64, 0, 33, 1, &i64));
    CHECK_OK(ts_checkpoint_add(ck, "steps", i64));
    ts_tensor_unref(i64);
    CHECK_OK(ts_checkpoint_set_meta(ck, "k", "v"));
    CHECK_OK(ts_checkpoint_save(ck, a));
    ts_checkpoint_free(ck);
    CHECK_OK(ts_checkpoint_load(a, dev, &ck));
    CHECK_OK(ts_checkpoint_save(ck, b));
    size_t n;
    unsigned char *bytes = tap_read_all(a, &n);
    CHECK(same_file_bytes(b, bytes, n));
    /* and with one tensor read (kept), the other not */
    CHECK(ts_checkpoint_get(ck, "steps") != NULL);
    CHECK_OK(ts_checkpoint_save(ck, b));
    CHECK(same_file_bytes(b, bytes, n));
    int32_t dtype = -1;
    int ndim = -1;
    int64_t shape[TS_MAX_DIMS] = {0};
    CHECK_OK(ts_checkpoint_tensor_info(ck, "w", &dtype, &ndim, shape));
    CHECK(dtype == TS_F32 && ndim == 1 && shape[0] == 1000);
    CHECK_FAILS(ts_checkpoint_tensor_info(ck, "nope", &dtype, &ndim, shape), TS_EINVAL, "nope");
    free(bytes);
    ts_checkpoint_free(ck);
    tap_end();
}

/* Several threads ask for the same unread tensor at once: all get the one kept tensor. */
typedef struct getter {
    ts_checkpoint *ck;
    ts_tensor *got;
} getter;

static void *get_thread(void *arg)
{
    getter *g = arg;
    g->got = ts_checkpoint_get(g->ck, "w");
    return NULL;
}

static void test_concurrent_gets(void)
{
    setup();
    const char *path = tap_path_in(tap_tmpdir(), "c.st");
    ts_checkpoint *ck = make_ck(4096, 3);
    CHECK_OK(ts_checkpoint_save(ck, path));
    ts_checkpoint_free(ck);
    for (int round = 0; round < 20; round++) {
        CHECK_OK(ts_checkpoint_load(path, dev, &ck));
        pthread_t th[4];
        getter g[4];
        for (int i = 0; i < 4; i++) {
            g[i] = (getter){ck, NULL};
            CHECK(pthread_create(&th[i], NULL, get_thread, &g[i]) == 0);
        }
        for (int i = 0; i < 4; i++)
            CHECK(pthread_join(th[i], NULL) == 0);
        for (int i = 0; i < 4; i++)
            CHECK(g[i].got != NULL && g[i].got == g[0].got);
        CHECK(ts_checkpoint_get(ck, "w") == g[0].got);
        ts_checkpoint_free(ck);
    }
    tap_end();
}

/* ---- B: optimizer state -------------------------------------------------------------- */

#define NP 5

typedef struct optfix {
    ts_tensor *p[2];
    ts_named_tensor np[2];
    ts_optim *o;
} optfix;

/* Two parameters; an optimizer of kind 0 sgd (momentum 0.9), 1 adam; `steps` steps where
 * only the first parameter gets a gradient when one_grad. */
static void optfix_init(optfix *f, int kind, int steps, int one_grad)
{
    static const char *const names[2] = {"w", "b"};
    for (int i = 0; i < 2; i++) {
        CHECK_OK(ts_tensor_full(dev, TS_F64, 1, (const int64_t[]){NP}, 0.5 + i, &f->p[i]));
        CHECK_OK(ts_tensor_set_requires_grad(f->p[i], 1));
        snprintf(f->np[i].name, sizeof f->np[i].name, "%s", names[i]);
        f->np[i].tensor = f->p[i];
    }
    if (kind == 0)
        CHECK_OK(ts_optim_sgd(f->np, 2, &(ts_sgd_options){0.1, 0.9, 0, 0.01, 0}, &f->o));
    else
        CHECK_OK(ts_optim_adam(f->np, 2, &(ts_adam_options){0.01, 0.9, 0.999, 1e-8, 0.01},
                               &f->o));
    for (int s = 0; s < steps; s++) {
        for (int i = 0; i < (one_grad ? 1 : 2); i++) {
            ts_tensor *g;
            CHECK_OK(ts_tensor_full(dev, TS_F64, 1, (const int64_t[]){NP}, 0.25 * (s + 1), &g));
            CHECK_OK(ts_tensor_set_grad(f->p[i], g));
            ts_tensor_unref(g);
        }
        CHECK_OK(ts_optim_step(f->o));
    }
}

static void optfix_fini(optfix *f)
{
    ts_optim_free(f->o);
    ts_tensor_unref(f->p[0]);
    ts_tensor_unref(f->p[1]);
}

static const char *const adam_meta[] = {"optim.kind", "optim.steps", "optim.lr", "optim.beta1",
                                        "optim.beta2", "optim.eps", "optim.weight_decay",
                                        "optim.w.state", "optim.b.state", NULL};
static const char *const sgd_meta[] = {"optim.kind", "optim.steps", "optim.lr",
                                       "optim.momentum", "optim.dampening",
                                       "optim.weight_decay", "optim.nesterov", "optim.w.state",
                                       "optim.b.state", NULL};

/* ck's metadata (the keys listed) and tensors, except the tensor named drop. */
static ts_checkpoint *copy_without(const ts_checkpoint *ck, const char *const *keys,
                                   const char *drop)
{
    ts_checkpoint *out;
    CHECK_OK(ts_checkpoint_new(&out));
    for (int i = 0; keys[i]; i++) {
        const char *v = ts_checkpoint_meta(ck, keys[i]);
        if (v)
            CHECK_OK(ts_checkpoint_set_meta(out, keys[i], v));
    }
    for (size_t i = 0; i < ts_checkpoint_count(ck); i++) {
        const char *name = ts_checkpoint_name(ck, i);
        if (drop && strcmp(name, drop) == 0)
            continue;
        CHECK_OK(ts_checkpoint_add(out, name, ts_checkpoint_get(ck, name)));
    }
    return out;
}

/* A fresh optimizer of the same kind with distinct hyper-parameters, for "unchanged". */
static ts_optim *fresh_optim(optfix *f, int kind)
{
    ts_optim *o;
    if (kind == 0)
        CHECK_OK(ts_optim_sgd(f->np, 2, &(ts_sgd_options){0.5, 0.5, 0, 0, 0}, &o));
    else
        CHECK_OK(ts_optim_adam(f->np, 2, &(ts_adam_options){0.5, 0.5, 0.5, 0.5, 0}, &o));
    return o;
}

static void check_untouched(ts_optim *o)
{
    CHECK(ts_optim_lr(o) == 0.5);
    CHECK_INT_EQ(ts_optim_steps(o), 0);
}

static void test_optim_missing_state(void)
{
    setup();
    for (int kind = 0; kind < 2; kind++) {
        optfix f;
        optfix_init(&f, kind, 2, 0);
        ts_checkpoint *ck;
        CHECK_OK(ts_checkpoint_new(&ck));
        CHECK_OK(ts_optim_save_state(f.o, ck));
        const char *const *keys = kind ? adam_meta : sgd_meta;
        /* The complete state loads. */
        ts_optim *o = fresh_optim(&f, kind);
        CHECK_OK(ts_optim_load_state(o, ck));
        CHECK_INT_EQ(ts_optim_steps(o), 2);
        ts_optim_free(o);
        static const char *const drops[2][4] = {
            {"optim.w.momentum_buffer", "optim.b.momentum_buffer", NULL, NULL},
            {"optim.w.exp_avg", "optim.w.exp_avg_sq", "optim.b.exp_avg", "optim.b.exp_avg_sq"}};
        for (int d = 0; d < 4 && drops[kind][d]; d++) {
            ts_checkpoint *cut = copy_without(ck, keys, drops[kind][d]);
            o = fresh_optim(&f, kind);
            CHECK_FAILS(ts_optim_load_state(o, cut), TS_ECORRUPT, drops[kind][d], "missing");
            check_untouched(o);
            ts_optim_free(o);
            ts_checkpoint_free(cut);
        }
        /* A state tensor of the wrong shape is refused before anything changes. */
        ts_checkpoint *bad = copy_without(ck, keys, drops[kind][1]);
        ts_tensor *wrong;
        CHECK_OK(ts_tensor_zeros(dev, TS_F64, 1, (const int64_t[]){NP + 1}, &wrong));
        CHECK_OK(ts_checkpoint_add(bad, drops[kind][1], wrong));
        ts_tensor_unref(wrong);
        o = fresh_optim(&f, kind);
        CHECK_FAILS(ts_optim_load_state(o, bad), TS_ESHAPE, drops[kind][1]);
        check_untouched(o);
        ts_optim_free(o);
        ts_checkpoint_free(bad);
        /* and of the wrong dtype */
        bad = copy_without(ck, keys, drops[kind][1]);
        CHECK_OK(ts_tensor_zeros(dev, TS_F32, 1, (const int64_t[]){NP}, &wrong));
        CHECK_OK(ts_checkpoint_add(bad, drops[kind][1], wrong));
        ts_tensor_unref(wrong);
        o = fresh_optim(&f, kind);
        CHECK_FAILS(ts_optim_load_state(o, bad), TS_EDTYPE, drops[kind][1], "float32");
        check_untouched(o);
        ts_optim_free(o);
        ts_checkpoint_free(bad);
        ts_checkpoint_free(ck);
        optfix_fini(&f);
    }
    /* Half of Adam's pair is refused even before any step was counted. */
    {
        optfix f;
        optfix_init(&f, 1, 1, 0);
        ts_checkpoint *ck;
        CHECK_OK(ts_checkpoint_new(&ck));
        CHECK_OK(ts_optim_save_state(f.o, ck));
        ts_checkpoint *cut = copy_without(ck, adam_meta, "optim.w.exp_avg_sq");
        CHECK_OK(ts_checkpoint_set_meta(cut, "optim.steps", "0"));
        ts_optim *o = fresh_optim(&f, 1);
        CHECK_FAILS(ts_optim_load_state(o, cut), TS_ECORRUPT, "optim.w.exp_avg_sq", "missing");
        check_untouched(o);
        ts_optim_free(o);
        /* a state tensor next to the "none" marker contradicts it */
        ts_checkpoint_free(cut);
        cut = copy_without(ck, adam_meta, NULL);
        CHECK_OK(ts_checkpoint_set_meta(cut, "optim.w.state", "none"));
        o = fresh_optim(&f, 1);
        CHECK_FAILS(ts_optim_load_state(o, cut), TS_ECORRUPT, "optim.w.state");
        check_untouched(o);
        ts_optim_free(o);
        ts_checkpoint_free(cut);
        ts_checkpoint_free(ck);
        optfix_fini(&f);
    }
    /* A parameter that never had a gradient legitimately has no state; the save says so. */
    for (int kind = 0; kind < 2; kind++) {
        optfix f;
        optfix_init(&f, kind, 3, 1);
        ts_checkpoint *ck;
        CHECK_OK(ts_checkpoint_new(&ck));
        CHECK_OK(ts_optim_save_state(f.o, ck));
        ts_optim *o = fresh_optim(&f, kind);
        CHECK_OK(ts_optim_load_state(o, ck));
        CHECK_INT_EQ(ts_optim_steps(o), 3);
        ts_optim_free(o);
        /* Without that word, the missing state is refused. */
        const char *const *keys = kind ? adam_meta : sgd_meta;
        ts_checkpoint *cut = copy_without(ck, keys, NULL);
        CHECK_OK(ts_checkpoint_set_meta(cut, "optim.b.state", "yes"));
        o = fresh_optim(&f, kind);
        CHECK_FAILS(ts_optim_load_state(o, cut), TS_ECORRUPT, "optim.b.state");
        check_untouched(o);
        ts_optim_free(o);
        ts_checkpoint_free(cut);
        ts_checkpoint_free(ck);
        optfix_fini(&f);
    }
    tap_end();
}

/* State tensors a run could not have written: a moment after no step (optim.steps = 0), a NaN
 * or infinite moment, a negative second moment. Refused; the optimizer left as it was. */
static void test_optim_impossible_state(void)
{
    setup();
    static const struct {
        int kind;
        const char *tensor, *steps;
        double value;
        const char *needle;
    } cases[] = {
        {1, "optim.w.exp_avg", "0", 0.25, "'optim.steps' = 0"},
        {1, "optim.w.exp_avg_sq", "0", 0.25, "'optim.steps' = 0"},
        {0, "optim.w.momentum_buffer", "0", -1, "'optim.steps' = 0"},
        {1, "optim.w.exp_avg", NULL, NAN, "not finite"},
        {1, "optim.w.exp_avg_sq", NULL, INFINITY, "not finite"},
        {0, "optim.w.momentum_buffer", NULL, -INFINITY, "not finite"},
        {1, "optim.w.exp_avg_sq", NULL, -1e-3, "never negative"},
    };
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        optfix f;
        optfix_init(&f, cases[c].kind, 2, 0);
        ts_checkpoint *ck;
        CHECK_OK(ts_checkpoint_new(&ck));
        CHECK_OK(ts_optim_save_state(f.o, ck));
        /* The metadata as saved, every state tensor zero (a state a run could have written
         * at any step count) but for one value of the case's tensor. */
        const char *const *keys = cases[c].kind ? adam_meta : sgd_meta;
        ts_checkpoint *bad;
        CHECK_OK(ts_checkpoint_new(&bad));
        for (int i = 0; keys[i]; i++)
            if (ts_checkpoint_meta(ck, keys[i]))
                CHECK_OK(ts_checkpoint_set_meta(bad, keys[i], ts_checkpoint_meta(ck, keys[i])));
        if (cases[c].steps)
            CHECK_OK(ts_checkpoint_set_meta(bad, "optim.steps", cases[c].steps));
        for (size_t i = 0; i < ts_checkpoint_count(ck); i++) {
            const char *name = ts_checkpoint_name(ck, i);
            double v[NP] = {0};
            if (strcmp(name, cases[c].tensor) == 0)
                v[NP - 1] = cases[c].value;
            ts_tensor *t;
            CHECK_OK(ts_tensor_from_host(dev, TS_F64, 1, (const int64_t[]){NP}, v, &t));
            CHECK_OK(ts_checkpoint_add(bad, name, t));
            ts_tensor_unref(t);
        }
        /* zeros everywhere load */
        if (c == 0) {
            ts_checkpoint *zero;
            CHECK_OK(ts_checkpoint_new(&zero));
            for (int i = 0; keys[i]; i++)
                if (ts_checkpoint_meta(bad, keys[i]))
                    CHECK_OK(ts_checkpoint_set_meta(zero, keys[i], ts_checkpoint_meta(bad, keys[i])));
            for (size_t i = 0; i < ts_checkpoint_count(ck); i++) {
                ts_tensor *t;
                CHECK_OK(ts_tensor_zeros(dev, TS_F64, 1, (const int64_t[]){NP}, &t));
                CHECK_OK(ts_checkpoint_add(zero, ts_checkpoint_name(ck, i), t));
                ts_tensor_unref(t);
            }
            ts_optim *z = fresh_optim(&f, cases[c].kind);
            CHECK_OK(ts_optim_load_state(z, zero));
            ts_optim_free(z);
            ts_checkpoint_free(zero);
        }
        ts_optim *o = fresh_optim(&f, cases[c].kind);
        CHECK_FAILS(ts_optim_load_state(o, bad), TS_ECORRUPT, cases[c].tensor, cases[c].needle);
        check_untouched(o);
        ts_optim_free(o);
        ts_checkpoint_free(bad);
        ts_checkpoint_free(ck);
        optfix_fini(&f);
    }
    tap_end();
}

static void test_optim_bad_hyperparameters(void)
{
    setup();
    static const struct {
        int kind;
        const char *key, *value;
    } cases[] = {
        {1, "optim.lr", "nan"},          {1, "optim.lr", "inf"},
        {1, "optim.lr", "-0.1"},         {1, "optim.lr", "-inf"},
        {1, "optim.lr", "1e400"},        {1, "optim.beta1", "1"},
        {1, "optim.beta1", "-0.5"},      {1, "optim.beta1", "nan"},
        {1, "optim.beta2", "1.5"},       {1, "optim.beta2", "inf"},
        {1, "optim.eps", "0"},           {1, "optim.eps", "-1e-8"},
        {1, "optim.eps", "nan"},         {1, "optim.eps", "inf"},
        {1, "optim.weight_decay", "-1"}, {1, "optim.weight_decay", "nan"},
        {1, "optim.weight_decay", "inf"}, {1, "optim.lr", ""},
        {1, "optim.lr", "0x1p-3"},       {1, "optim.lr", " 0.1"},
        {0, "optim.lr", "nan"},          {0, "optim.lr", "-1"},
        {0, "optim.momentum", "-0.9"},   {0, "optim.momentum", "inf"},
        {0, "optim.dampening", "nan"},   {0, "optim.dampening", "2"},
        {0, "optim.weight_decay", "-inf"}, {0, "optim.nesterov", "2"},
        {0, "optim.nesterov", "nan"},
        {1, "optim.steps", "-1"},        {1, "optim.steps", "1e300"},
        {1, "optim.steps", "9223372036854775807"}, {1, "optim.steps", "9223372036854775808"},
        {1, "optim.steps", "99999999999999999999999"}, {1, "optim.steps", "2.5"},
        {1, "optim.steps", "0x10"},      {1, "optim.steps", "nan"},
        {1, "optim.steps", "inf"},       {1, "optim.steps", " 2"},
        {1, "optim.steps", "+2"},        {1, "optim.steps", ""},
        {0, "optim.steps", "-9223372036854775808"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        optfix f;
        optfix_init(&f, cases[i].kind, 2, 0);
        ts_checkpoint *ck;
        CHECK_OK(ts_checkpoint_new(&ck));
        CHECK_OK(ts_optim_save_state(f.o, ck));
        CHECK_OK(ts_checkpoint_set_meta(ck, cases[i].key, cases[i].value));
        ts_optim *o = fresh_optim(&f, cases[i].kind);
        ts_clear_error();
        ts_status s = ts_optim_load_state(o, ck);
        CHECK_MSG(s == TS_ECORRUPT, "%s = '%s' was %s: %s", cases[i].key, cases[i].value,
                  ts_status_name(s), ts_last_error());
        CHECK_STR_CONTAINS(ts_last_error(), cases[i].key);
        check_untouched(o);
        ts_optim_free(o);
        ts_checkpoint_free(ck);
        optfix_fini(&f);
    }
    /* The bounds themselves are accepted. */
    optfix f;
    optfix_init(&f, 1, 2, 0);
    ts_checkpoint *ck;
    CHECK_OK(ts_checkpoint_new(&ck));
    CHECK_OK(ts_optim_save_state(f.o, ck));
    CHECK_OK(ts_checkpoint_set_meta(ck, "optim.beta1", "0"));
    CHECK_OK(ts_checkpoint_set_meta(ck, "optim.lr", "0"));
    CHECK_OK(ts_checkpoint_set_meta(ck, "optim.weight_decay", "0"));
    CHECK_OK(ts_checkpoint_set_meta(ck, "optim.steps", "9007199254740992"));
    ts_optim *o = fresh_optim(&f, 1);
    CHECK_OK(ts_optim_load_state(o, ck));
    CHECK(ts_optim_steps(o) == (int64_t)1 << 53);
    ts_optim_free(o);
    ts_checkpoint_free(ck);
    optfix_fini(&f);
    tap_end();
}

int main(int argc, char **argv)
{
    static const tap_test tests[] = {
        TAP_TEST(test_save_planted_symlinks),
        TAP_TEST(test_save_temp_names_unpredictable),
        TAP_TEST(test_save_guessed_name),
        TAP_TEST(test_save_special_targets),
        TAP_TEST(test_save_keeps_mode),
        TAP_TEST(test_save_file_size_limit),
        TAP_TEST(test_save_io_faults),
        TAP_TEST(test_save_durability_calls),
        TAP_TEST(test_save_directory_swapped_for_link),
        TAP_TEST(test_load_nul_escapes),
        TAP_TEST(test_load_huge_shapes),
        TAP_TEST(test_load_unused_tensor_not_read),
        TAP_TEST(test_load_file_changes_after_load),
        TAP_TEST(test_loaded_resave),
        TAP_TEST(test_concurrent_gets),
        TAP_TEST(test_optim_missing_state),
        TAP_TEST(test_optim_impossible_state),
        TAP_TEST(test_optim_bad_hyperparameters),
    };
    return tap_run(tests, sizeof tests / sizeof tests[0], argc, argv);
}
