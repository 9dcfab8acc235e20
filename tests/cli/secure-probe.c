/* tests/cli/secure-probe.c: for tests/cli/test-secure-env.sh. Loads plugin argv[1] by name
 * and prints "loaded" or "refused: <error>", then whether the kernel ran it in secure mode
 * (AT_SECURE: setuid/setgid). Linked -no-install so it runs without libtool's wrapper script,
 * which a setgid bit would not survive. */
#include <stdio.h>
#include <sys/auxv.h>

#include <tessera/tessera.h>

int main(int argc, char **argv)
{
    if (argc != 2)
        return 2;
    ts_device *dev;
    ts_status s = ts_device_load(NULL, argv[1], &dev);
    if (s == TS_OK) {
        printf("loaded %s\n", ts_device_path(dev));
        ts_device_unload(dev);
    } else {
        printf("refused: %s\n", ts_last_error());
    }
    printf("secure=%lu\n", getauxval(AT_SECURE));
    return 0;
}
