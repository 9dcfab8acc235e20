/* tests/unit/test-special-files.c: every input a user names (configuration file, checkpoint,
 * IDX data file, the Fashion-MNIST files inside a data directory) given as a FIFO, a device,
 * a socket or a directory: each is refused at once with a message naming the path and what it
 * is. A FIFO nobody writes to would block a plain open() forever, so every case runs under
 * alarm(): a hang fails the test instead of the suite. */
#include <fcntl.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include "../tap.h"

static char fifo[4096], sock[4096], dir[4096];

/* A FIFO, a bound UNIX socket and a directory in the test's temporary directory. */
static void make_specials(void)
{
    const char *tmp = tap_tmpdir();
    snprintf(fifo, sizeof fifo, "%s/fifo", tmp);
    CHECK(mkfifo(fifo, 0600) == 0);
    snprintf(dir, sizeof dir, "%s/dir", tmp);
    CHECK(mkdir(dir, 0700) == 0);
    snprintf(sock, sizeof sock, "%s/sock", tmp);
    struct sockaddr_un sa = {.sun_family = AF_UNIX};
    CHECK(strlen(sock) < sizeof sa.sun_path);
    strcpy(sa.sun_path, sock);
    int fd = socket(AF_UNIX, SOCK_STREAM, 0);
    CHECK(fd >= 0 && bind(fd, (struct sockaddr *)&sa, sizeof sa) == 0);
    /* the socket file stays after close */
    close(fd);
    alarm(20);
}

static void test_config_special(void)
{
    tap_start();
    make_specials();
    ts_config *cfg = (ts_config *)1;
    CHECK_FAILS(ts_config_load(fifo, &cfg), TS_EIO, fifo, "FIFO", "not a regular file");
    CHECK(cfg == NULL);
    CHECK_FAILS(ts_config_load(dir, &cfg), TS_EIO, dir, "a directory");
    CHECK_FAILS(ts_config_load("/dev/zero", &cfg), TS_EIO, "/dev/zero", "character device");
    CHECK_FAILS(ts_config_load("/dev/urandom", &cfg), TS_EIO, "character device");
    CHECK_FAILS(ts_config_load(sock, &cfg), TS_EIO, "socket");
    CHECK_FAILS(ts_config_load("/nonexistent/tessera.ini", &cfg), TS_EIO, "configuration file",
                "No such file");
    tap_end();
}

static void test_checkpoint_special(void)
{
    ts_device *dev = tap_start();
    make_specials();
    ts_checkpoint *ck = (ts_checkpoint *)1;
    CHECK_FAILS(ts_checkpoint_load(fifo, dev, &ck), TS_EIO, fifo, "checkpoint", "FIFO");
    CHECK(ck == NULL);
    CHECK_FAILS(ts_checkpoint_load(dir, dev, &ck), TS_EIO, "a directory");
    CHECK_FAILS(ts_checkpoint_load("/dev/zero", dev, &ck), TS_EIO, "character device");
    CHECK_FAILS(ts_checkpoint_load("/dev/null", dev, &ck), TS_EIO, "character device");
    CHECK_FAILS(ts_checkpoint_load(sock, dev, &ck), TS_EIO, "socket");
    tap_end();
}

static void test_idx_special(void)
{
    ts_device *dev = tap_start();
    make_specials();
    ts_tensor *t = (ts_tensor *)1;
    CHECK_FAILS(ts_idx_load(fifo, dev, &t), TS_EIO, fifo, "IDX file", "FIFO");
    CHECK(t == NULL);
    CHECK_FAILS(ts_idx_load(dir, dev, &t), TS_EIO, "a directory");
    CHECK_FAILS(ts_idx_load("/dev/zero", dev, &t), TS_EIO, "character device");
    CHECK_FAILS(ts_idx_load("/dev/urandom", dev, &t), TS_EIO, "character device");
    CHECK_FAILS(ts_idx_load(sock, dev, &t), TS_EIO, "socket");
    tap_end();
}

/* A data directory whose training images are a FIFO and whose labels are a directory. */
static void test_fmnist_special(void)
{
    ts_device *dev = tap_start();
    alarm(20);
    const char *tmp = tap_tmpdir();
    char p[4200];
    snprintf(p, sizeof p, "%s/train-images-idx3-ubyte.gz", tmp);
    CHECK(mkfifo(p, 0600) == 0);
    snprintf(p, sizeof p, "%s/train-labels-idx1-ubyte.gz", tmp);
    CHECK(mkdir(p, 0700) == 0);
    ts_tensor *x = NULL, *y = NULL;
    CHECK_FAILS(ts_fashion_mnist_load(tmp, 1, dev, &x, &y), TS_EIO, "train-images", "FIFO");
    CHECK(x == NULL && y == NULL);
    tap_end();
}

/* A regular file behind a symbolic link is still a regular file: accepted. */
static void test_symlink_to_regular(void)
{
    tap_start();
    const char *tmp = tap_tmpdir();
    const char *real = tap_write_file(tmp, "real.ini", "[core]\n");
    char link[4200];
    snprintf(link, sizeof link, "%s/link.ini", tmp);
    CHECK(symlink(real, link) == 0);
    ts_config *cfg = NULL;
    CHECK_OK(ts_config_load(link, &cfg));
    ts_config_free(cfg);
    tap_end();
}

int main(int argc, char **argv)
{
    static const tap_test tests[] = {
        TAP_TEST(test_config_special),     TAP_TEST(test_checkpoint_special),
        TAP_TEST(test_idx_special),        TAP_TEST(test_fmnist_special),
        TAP_TEST(test_symlink_to_regular),
    };
    return tap_run(tests, sizeof tests / sizeof tests[0], argc, argv);
}
