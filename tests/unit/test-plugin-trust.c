/* tests/unit/test-plugin-trust.c: where a plugin may be loaded from. A plugin runs code in the
 * process (as root, often), so the loader takes one only from a file and a chain of directories
 * that no other user can change (docs/configuration.md, "Which plugin files are trusted"). Each
 * test plants the `planted` fixture, whose constructor creates a marker file when it is mapped,
 * in a place an attacker could have written, and checks that the load is refused by name and
 * that the marker never appears: the refusal comes before dlopen, not after the planted code
 * ran. Planted files owned by another user need root to make (chown); without root those cases
 * skip, saying so. The program links the core statically to reach the loader's test hook
 * (ts__loader_after_check_hook, core/internal.h). */
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include "../tap.h"
#include "internal.h"

static char src[4096], marker[4200];

/* The planted fixture's path in the build tree. */
static const char *planted_so(void)
{
    const char *b = getenv("TS_BUILDDIR");
    snprintf(src, sizeof src, "%s/tests/fixtures/.libs/planted.so", b ? b : ".");
    CHECK_MSG(access(src, F_OK) == 0, "fixture %s missing", src);
    return src;
}

/* Copies the fixture to dir/name.so with mode, dir made with dir_mode. Returns the path. */
static const char *plant(const char *dir, mode_t dir_mode, const char *name, mode_t mode)
{
    static char path[4400];
    char cmd[9200];
    mkdir(dir, 0700);
    CHECK(chmod(dir, dir_mode) == 0);
    snprintf(path, sizeof path, "%s/%s.so", dir, name);
    snprintf(cmd, sizeof cmd, "cp '%s' '%s'", planted_so(), path);
    CHECK(system(cmd) == 0);
    CHECK(chmod(path, mode) == 0);
    return path;
}

static void arm_marker(void)
{
    snprintf(marker, sizeof marker, "%s/constructor-ran", tap_tmpdir());
    unlink(marker);
    CHECK(setenv("TS_PLANTED_MARKER", marker, 1) == 0);
}

static int marker_written(void)
{
    return access(marker, F_OK) == 0;
}

/* Loads path: must be refused with every needle in the message, the constructor never run. */
static void refused(const char *path, const char *n1, const char *n2)
{
    ts_device *dev = (ts_device *)1;
    arm_marker();
    CHECK_FAILS(ts_device_load(NULL, path, &dev), TS_EPLUGIN, "refusing to load", n1, n2);
    CHECK(dev == NULL);
    CHECK_MSG(!marker_written(), "the planted constructor ran before the refusal of %s", path);
}

static void loads(const char *path)
{
    ts_device *dev = NULL;
    arm_marker();
    CHECK_OK(ts_device_load(NULL, path, &dev));
    CHECK_MSG(marker_written(), "the marker did not appear: the fixture is not what it claims");
    ts_device_unload(dev);
}

/* The control: the fixture in a safe place loads, and its constructor writes the marker (so
 * a missing marker elsewhere means the code never ran, not that the fixture is broken). */
static void test_trusted_loads(void)
{
    tap_start();
    char dir[4200];
    snprintf(dir, sizeof dir, "%s/safe", tap_tmpdir());
    loads(plant(dir, 0755, "planted", 0755));
    /* Read-only and owner-writable files are fine; so is a sticky world-writable ancestor
     * (/tmp itself is one when TMPDIR is unset). */
    char sticky[4200], sub[4300];
    snprintf(sticky, sizeof sticky, "%s/sticky", tap_tmpdir());
    CHECK(mkdir(sticky, 0700) == 0 && chmod(sticky, 01777) == 0);
    snprintf(sub, sizeof sub, "%s/lib", sticky);
    loads(plant(sub, 0755, "planted", 0444));
    /* A file directly in a sticky world-writable directory: no one else can replace it. */
    loads(plant(sticky, 01777, "direct", 0755));
    tap_end();
}

/* A 0755 directory inside a 0777 one: whoever can write the outer directory can rename the
 * inner one away and put their own in its place. */
static void test_world_writable_ancestor(void)
{
    tap_start();
    char open_dir[4200], inner[4300];
    snprintf(open_dir, sizeof open_dir, "%s/open", tap_tmpdir());
    CHECK(mkdir(open_dir, 0700) == 0 && chmod(open_dir, 0777) == 0);
    snprintf(inner, sizeof inner, "%s/lib", open_dir);
    refused(plant(inner, 0755, "planted", 0755), open_dir, "writable by every user");
    /* Group-writable and not sticky: the group's members can do the same. */
    CHECK(chmod(open_dir, 0775) == 0);
    refused(plant(inner, 0755, "planted", 0755), open_dir, "writable by its group");
    tap_end();
}

/* A symbolic link in a safe directory that points into an unsafe one: the rule applies to the
 * resolved path, not to the link's directory. */
static void test_symlink_into_unsafe_dir(void)
{
    tap_start();
    char open_dir[4200], safe[4200], link[4300];
    snprintf(open_dir, sizeof open_dir, "%s/open", tap_tmpdir());
    const char *target = plant(open_dir, 0777, "planted", 0755);
    snprintf(safe, sizeof safe, "%s/safe", tap_tmpdir());
    CHECK(mkdir(safe, 0755) == 0);
    snprintf(link, sizeof link, "%s/planted.so", safe);
    CHECK(symlink(target, link) == 0);
    refused(link, open_dir, "writable by every user");
    tap_end();
}

static void test_group_or_world_writable_file(void)
{
    tap_start();
    char dir[4200];
    snprintf(dir, sizeof dir, "%s/safe", tap_tmpdir());
    refused(plant(dir, 0755, "planted", 0775), "the file", "writable by its group");
    refused(plant(dir, 0755, "planted", 0757), "the file", "writable by every user");
    tap_end();
}

/* A file or a directory owned by another user: that user can replace the plugin. */
static void test_other_owner(void)
{
    tap_start();
    if (geteuid() != 0)
        SKIP("needs root to give a file to another user (chown)");
    const uid_t nobody = 65534;
    char dir[4200], theirs[4300];
    snprintf(dir, sizeof dir, "%s/safe", tap_tmpdir());
    const char *so = plant(dir, 0755, "planted", 0755);
    CHECK(chown(so, nobody, nobody) == 0);
    refused(so, "owned by uid 65534", "neither root nor this user");
    snprintf(theirs, sizeof theirs, "%s/theirs", tap_tmpdir());
    so = plant(theirs, 0755, "planted", 0755);
    CHECK(chown(theirs, nobody, nobody) == 0);
    refused(so, "its directory", "owned by uid 65534");
    tap_end();
}

/* TESSERA_PLUGIN_PATH naming an unsafe directory: the plugin found there by name is refused
 * before it is mapped (the adversary's demonstration). */
static void test_plugin_path_env(void)
{
    char open_dir[4200];
    snprintf(open_dir, sizeof open_dir, "%s/open", tap_tmpdir());
    plant(open_dir, 0777, "planted", 0755);
    char path[8400];
    const char *was = getenv("TESSERA_PLUGIN_PATH"); /* cpu_blas's directory: see main */
    snprintf(path, sizeof path, "%s%s%s", open_dir, was ? ":" : "", was ? was : "");
    CHECK(setenv("TESSERA_PLUGIN_PATH", path, 1) == 0);
    tap_start();
    refused("planted", open_dir, "writable by every user");
    tap_end();
}

/* Special files as the plugin path are refused at once; a FIFO must not block the open. */
static void test_special_files(void)
{
    tap_start();
    alarm(20);
    char fifo[4200], dir[4200];
    snprintf(fifo, sizeof fifo, "%s/fifo.so", tap_tmpdir());
    CHECK(mkfifo(fifo, 0600) == 0);
    ts_device *dev = (ts_device *)1;
    CHECK_FAILS(ts_device_load(NULL, fifo, &dev), TS_EPLUGIN, "fifo.so", "FIFO");
    CHECK(dev == NULL);
    snprintf(dir, sizeof dir, "%s/dir.so", tap_tmpdir());
    CHECK(mkdir(dir, 0755) == 0);
    CHECK_FAILS(ts_device_load(NULL, dir, &dev), TS_EPLUGIN, "dir.so", "a directory");
    CHECK_FAILS(ts_device_load(NULL, "/dev/null", &dev), TS_EPLUGIN, "character device");
    tap_end();
}

/* The escape hatch still works for a user who knows what they are doing. */
static void test_allow_insecure(void)
{
    tap_start();
    char open_dir[4200];
    snprintf(open_dir, sizeof open_dir, "%s/open", tap_tmpdir());
    const char *so = plant(open_dir, 0777, "planted", 0777);
    ts_config *cfg;
    CHECK_OK(ts_config_parse("[core]\nallow_insecure_plugin_path = true\n", "t.ini", NULL, &cfg));
    ts_device *dev = NULL;
    CHECK_OK(ts_device_load(cfg, so, &dev));
    ts_device_unload(dev);
    ts_config_free(cfg);
    tap_end();
}

/* Loading several different plugin files, each twice, in turn: every load gets the plugin it
 * names (the loader dlopens a checked descriptor by its /proc/self/fd name, and a reused
 * descriptor number must never hand back an earlier plugin). */
static void test_each_load_gets_its_file(void)
{
    tap_start();
    const char *names[] = {"planted", "withkeys", "hostonly", "nodevice"};
    char dir[4200], so[4400], cmd[9000];
    snprintf(dir, sizeof dir, "%s/many", tap_tmpdir());
    CHECK(mkdir(dir, 0755) == 0);
    const char *b = getenv("TS_BUILDDIR");
    for (size_t i = 0; i < sizeof names / sizeof *names; i++) {
        snprintf(cmd, sizeof cmd, "cp '%s/tests/fixtures/.libs/%s.so' '%s/'", b ? b : ".",
                 names[i], dir);
        CHECK(system(cmd) == 0);
    }
    for (int round = 0; round < 2; round++) {
        for (size_t i = 0; i < sizeof names / sizeof *names; i++) {
            snprintf(so, sizeof so, "%s/%s.so", dir, names[i]);
            ts_device *dev = NULL;
            ts_status s = ts_device_load(NULL, so, &dev);
            if (strcmp(names[i], "nodevice") == 0) {
                CHECK_MSG(s != TS_OK, "round %d: nodevice loaded", round);
                continue;
            }
            CHECK_OK(s);
            CHECK_MSG(strcmp(ts_device_name(dev), names[i]) == 0,
                      "round %d: loading %s gave plugin '%s'", round, so, ts_device_name(dev));
            ts_device_unload(dev);
        }
    }
    tap_end();
}

/* The file swapped between the trust check and the open: whoever can rename in the plugin's
 * directory at that moment (the user's own other process, or anyone when insecure paths are
 * allowed) puts another file there. The swapped-in copy is as trusted-looking as the checked
 * one (same owner, mode 0755, a safe directory) and only its inode differs, so only the
 * loader's dev/inode comparison of the opened descriptor with the checked file can see it. */
static char swap_from[4400];
static int swap_errno = -1; /* -1: the hook never ran; 0: renamed; else rename's errno */

static void swap_in(const char *real)
{
    swap_errno = rename(swap_from, real) == 0 ? 0 : errno;
}

static void test_swap_between_check_and_open(void)
{
    tap_start();
    char dir[4200], checked[4400];
    snprintf(dir, sizeof dir, "%s/safe", tap_tmpdir());
    snprintf(checked, sizeof checked, "%s", plant(dir, 0755, "planted", 0755));
    snprintf(swap_from, sizeof swap_from, "%s", plant(dir, 0755, "other", 0755));
    struct stat a, b;
    CHECK(stat(checked, &a) == 0 && stat(swap_from, &b) == 0);
    CHECK(a.st_ino != b.st_ino);
    ts__loader_after_check_hook = swap_in;
    refused(checked, "changed between its check and its open", "planted.so");
    ts__loader_after_check_hook = NULL;
    CHECK_MSG(swap_errno == 0, "the swap did not happen: %s",
              swap_errno < 0 ? "the hook never ran" : strerror(swap_errno));
    /* What was swapped in is itself loadable: the refusal was about the swap alone. */
    loads(checked);
    tap_end();
}

int main(int argc, char **argv)
{
    /* Linked statically, the core cannot tell the build tree from where libtessera.so lies
     * (core/loader.c, build_tree): name the default device's directory (tests/data/test.ini)
     * instead. */
    char dir[4200];
    const char *b = getenv("TS_BUILDDIR");
    snprintf(dir, sizeof dir, "%s/plugins/cpu_blas/.libs", b ? b : ".");
    if (setenv("TESSERA_PLUGIN_PATH", dir, 1) != 0)
        return 1;
    static const tap_test tests[] = {
        TAP_TEST(test_trusted_loads),          TAP_TEST(test_world_writable_ancestor),
        TAP_TEST(test_symlink_into_unsafe_dir), TAP_TEST(test_group_or_world_writable_file),
        TAP_TEST(test_other_owner),            TAP_TEST(test_plugin_path_env),
        TAP_TEST(test_special_files),          TAP_TEST(test_allow_insecure),
        TAP_TEST(test_each_load_gets_its_file), TAP_TEST(test_swap_between_check_and_open),
    };
    return tap_run(tests, sizeof tests / sizeof tests[0], argc, argv);
}
