/* tools/cmd_convert.c: `tessera convert`: NumPy .npy arrays to a safetensors file and back,
 * chosen by what the input files hold (the .npy magic, or a safetensors header), whatever
 * their names. Every input is read through the validating loaders
 * (ts_npy_load, ts_checkpoint_load) and every output written atomically and link-safe
 * (ts_checkpoint_save, ts_npy_save); a tensor name that is no safe file name is refused
 * rather than turned into a path. */
#include "config.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "cli.h"

static const char usage[] =
    "usage: tessera convert INPUT... -o OUTPUT [--name NAME]\n"
    "       tessera convert CKPT --to bf16|fp16|fp32 -o OUTPUT\n"
    "\n"
    "Converts between NumPy .npy files and safetensors files (checkpoints), by what the inputs\n"
    "hold, whatever their names:\n"
    "  tessera convert a.npy b.npy -o model.safetensors\n"
    "      one tensor per array, named after its file (a, b); --name NAME names a single one\n"
    "  tessera convert model.safetensors -o DIR/\n"
    "      every tensor to DIR/NAME.npy (DIR must exist)\n"
    "  tessera convert model.safetensors --name NAME -o w.npy\n"
    "      one tensor\n"
    "  tessera convert a.npy -o b.npy\n"
    "      rewrites an array as float32/64, int32/64 or uint8, C order, little-endian\n"
    "  tessera convert run.ckpt --to bf16 -o model-bf16.safetensors\n"
    "      every float tensor of a safetensors file stored as bfloat16 (fp16: float16; fp32\n"
    "      widens back), the metadata kept and the optimizer's state tensors left out: a model\n"
    "      in half the bytes, which loads into a float32 model (widened exactly) for eval and\n"
    "      generate; training resumes from the original\n"
    "Arrays in, a safetensors file out (any name: run.ckpt), unless one array goes to a .npy\n"
    "name; a safetensors file in, arrays out: to a directory, or one to a file.\n"
    "Arrays keep float32, float64, float16, int32, int64 and uint8; bool becomes uint8,\n"
    "int8/int16/uint16 int32 and uint32 int64 (exactly). safetensors F16 and BF16 stay as they\n"
    "are (NumPy has no bfloat16: a BF16 tensor is refused as an array; convert --to fp32\n"
    "first), BOOL becomes uint8. Outputs are written atomically; an existing output that is\n"
    "not a regular file (a link, a directory, a FIFO) is refused.\n";

static int ends_with(const char *s, const char *suffix)
{
    size_t n = strlen(s), m = strlen(suffix);
    return n >= m && strcmp(s + n - m, suffix) == 0;
}

enum { K_OTHER, K_NPY, K_ST, K_UNREADABLE };

/* What the file at path holds, from its first bytes: a NumPy array (\x93NUMPY), a safetensors
 * file (an 8-byte little-endian header length, then '{'), something else, or nothing this can
 * read (missing, not a regular file: the loaders say why). Never blocks on a FIFO. */
static int sniff(const char *path)
{
    int fd = open(path, O_RDONLY | O_NONBLOCK | O_NOCTTY | O_CLOEXEC);
    if (fd < 0)
        return K_UNREADABLE;
    struct stat st;
    unsigned char b[9] = {0};
    ssize_t n = fstat(fd, &st) == 0 && S_ISREG(st.st_mode) ? read(fd, b, sizeof b) : -1;
    close(fd);
    if (n < 0)
        return K_UNREADABLE;
    if (n >= 6 && !memcmp(b, "\x93NUMPY", 6))
        return K_NPY;
    uint64_t len = 0;
    for (int i = 7; i >= 0; i--)
        len = len << 8 | b[i];
    if (n == 9 && b[8] == '{' && len >= 2) /* a length past the end: the loader says so */
        return K_ST;
    return K_OTHER;
}

/* The file's name without its directory and a ".npy": a tensor's name. */
static void stem(const char *path, char *out, size_t len)
{
    const char *base = strrchr(path, '/') ? strrchr(path, '/') + 1 : path;
    size_t n = strlen(base) - (ends_with(base, ".npy") ? 4 : 0);
    snprintf(out, len, "%.*s", (int)n, base);
}

/* A tensor name that can be a file name in DIR: no '/', not empty, not "." or "..", no
 * control characters, not over 200 bytes. */
static int safe_file_name(const char *name)
{
    if (!*name || strlen(name) > 200 || !strcmp(name, ".") || !strcmp(name, ".."))
        return 0;
    for (const unsigned char *p = (const unsigned char *)name; *p; p++)
        if (*p == '/' || *p < 0x20 || *p == 0x7f)
            return 0;
    return 1;
}

static int npy_to_safetensors(char **in, int nin, const char *name, const char *out)
{
    ts_checkpoint *ck = NULL;
    ts_status s = ts_checkpoint_new(&ck);
    int rc = 1;
    for (int i = 0; !s && i < nin; i++) {
        char nm[4096];
        if (name)
            snprintf(nm, sizeof nm, "%s", name);
        else
            stem(in[i], nm, sizeof nm);
        if (!*nm) {
            rc = cli_usage_error("convert", "'%s' gives an empty tensor name: use --name", in[i]);
            goto out;
        }
        for (size_t j = 0; j < ts_checkpoint_count(ck); j++)
            if (!strcmp(ts_checkpoint_name(ck, j), nm)) {
                rc = cli_usage_error("convert", "two inputs give the tensor name '%s' ('%s' "
                                     "and an earlier one): rename one", nm, in[i]);
                goto out;
            }
        ts_tensor *t = NULL;
        if ((s = ts_npy_load(in[i], NULL, &t)))
            break;
        s = ts_checkpoint_add(ck, nm, t);
        ts_tensor_unref(t); /* the checkpoint holds it */
    }
    if (!s)
        s = ts_checkpoint_save(ck, out);
    if (s) {
        cli_fail(s, "convert");
        goto out;
    }
    printf("%s: %zu tensor%s\n", out, ts_checkpoint_count(ck),
           ts_checkpoint_count(ck) == 1 ? "" : "s");
    rc = 0;
out:
    ts_checkpoint_free(ck);
    return rc;
}

/* to_dir: out names a directory (ends with '/', or is one), as the caller found. */
static int safetensors_to_npy(const char *in, const char *name, const char *out, int to_dir)
{
    ts_checkpoint *ck = NULL;
    ts_status s = ts_checkpoint_load(in, NULL, &ck);
    if (s)
        return cli_fail(s, "convert");
    int rc = 1;
    struct stat st;
    size_t n = ts_checkpoint_count(ck);
    if (!to_dir && !name && n != 1) {
        rc = cli_usage_error("convert", "%s holds %zu tensors: name one with --name, or give a "
                             "directory as -o DIR/ for all of them", in, n);
        goto out;
    }
    if (to_dir && name) {
        rc = cli_usage_error("convert", "--name writes one file: give -o FILE.npy, not a "
                             "directory");
        goto out;
    }
    if (to_dir && stat(out, &st) != 0) {
        fprintf(stderr, "tessera: error: convert: directory '%s': %s\n", out, strerror(errno));
        goto out;
    }
    for (size_t i = 0; to_dir && i < n; i++) { /* every name first: nothing written if one is bad */
        const char *nm = ts_checkpoint_name(ck, i);
        if (!safe_file_name(nm)) {
            char b[640];
            fprintf(stderr, "tessera: error: convert: %s: tensor name '%s' is not a safe "
                    "file name ('/', control characters, '.', '..', over 200 bytes): "
                    "convert it alone with --name and -o FILE.npy\n", in,
                    cli_printable(nm, 120, b, sizeof b));
            goto out;
        }
    }
    size_t written = 0;
    for (size_t i = 0; i < n; i++) {
        const char *nm = ts_checkpoint_name(ck, i);
        if (name && strcmp(nm, name))
            continue;
        char path[8192];
        if (to_dir) {
            snprintf(path, sizeof path, "%s%s%s.npy", out, ends_with(out, "/") ? "" : "/", nm);
        } else {
            snprintf(path, sizeof path, "%s", out);
        }
        ts_tensor *t = ts_checkpoint_get(ck, nm);
        if (!t || (s = ts_npy_save(t, path))) {
            cli_fail(t ? s : TS_ECORRUPT, "convert");
            goto out;
        }
        written++;
    }
    if (!written && name) {
        char b[640];
        fprintf(stderr, "tessera: error: convert: %s has no tensor named '%s' (tessera inspect "
                "%s lists them)\n", in, cli_printable(name, 120, b, sizeof b), in);
        goto out;
    }
    printf("%s: %zu array%s\n", out, written, written == 1 ? "" : "s");
    rc = 0;
out:
    ts_checkpoint_free(ck);
    return rc;
}

/* --to: every float tensor of in stored as dtype, the metadata kept (the run's settings, for
 * eval), the optimizer's state tensors (optim.*) left out. */
static int safetensors_to_dtype(const char *in, int32_t dtype, const char *out)
{
    ts_checkpoint *ck = NULL, *o = NULL;
    ts_status s = ts_checkpoint_load(in, NULL, &ck);
    if (!s)
        s = ts_checkpoint_new(&o);
    size_t n = ck ? ts_checkpoint_count(ck) : 0, converted = 0, dropped = 0;
    for (size_t i = 0; !s && i < ts_checkpoint_meta_count(ck); i++) {
        const char *k = ts_checkpoint_meta_key(ck, i);
        s = ts_checkpoint_set_meta(o, k, ts_checkpoint_meta(ck, k));
    }
    for (size_t i = 0; !s && i < n; i++) {
        const char *nm = ts_checkpoint_name(ck, i);
        ts_tensor *t = ts_checkpoint_get(ck, nm), *c = NULL;
        if (!strncmp(nm, "optim.", 6)) {
            dropped++;
            continue;
        }
        int32_t dt = t ? ts_tensor_dtype(t) : -1;
        int fl = dt == TS_F32 || dt == TS_F64 || dt == TS_BF16 || dt == TS_F16;
        if (!t) {
            s = TS_ECORRUPT;
            break;
        }
        if (fl && dt != dtype && (s = ts_cast(t, dtype, &c)))
            break;
        converted += fl && dt != dtype;
        s = ts_checkpoint_add(o, nm, c ? c : t);
        ts_tensor_unref(c);
    }
    if (!s)
        s = ts_checkpoint_save(o, out);
    int rc = 0;
    if (s)
        rc = cli_fail(s, "convert");
    else
        printf("%s: %zu tensor%s, %zu of them converted to %s; %zu optimizer-state tensor%s left "
               "out\n", out, ts_checkpoint_count(o), ts_checkpoint_count(o) == 1 ? "" : "s",
               converted, ts_dtype_name(dtype), dropped, dropped == 1 ? "" : "s");
    ts_checkpoint_free(o);
    ts_checkpoint_free(ck);
    return rc;
}

int cmd_convert(int argc, char **argv, const cli_common *common)
{
    const char *out = NULL, *name = NULL, *config = common->config, *to = NULL;
    char **in = calloc((size_t)argc, sizeof *in);
    int nin = 0, rc;
    if (!in)
        return cli_fail(TS_ENOMEM, "convert");
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            fputs(usage, stdout);
            free(in);
            return 0;
        } else if (!strcmp(a, "-o") || !strcmp(a, "--name") || !strcmp(a, "--to")) {
            if (!v || !*v) {
                free(in);
                return cli_usage_error("convert", "%s needs a value", a);
            }
            *(!strcmp(a, "-o") ? &out : !strcmp(a, "--name") ? &name : &to) = v;
            i++;
        } else if (!strcmp(a, "--config")) {
            if (!v || !*v) {
                free(in);
                return cli_usage_error("convert", "--config needs a FILE");
            }
            config = v, i++;
        } else if (a[0] == '-' && a[1]) {
            free(in);
            return cli_usage_error("convert", "unknown option '%s'", a);
        } else {
            in[nin++] = argv[i];
        }
    }
    if (!nin || !out) {
        free(in);
        return cli_usage_error("convert", "which files? (tessera convert INPUT... -o OUTPUT)");
    }
    /* by content: arrays in, a safetensors file out (or one array to a .npy name); one
     * safetensors file in, arrays out */
    int n_npy = 0, n_st = 0;
    for (int i = 0; i < nin; i++) {
        int k = sniff(in[i]);
        n_npy += k == K_NPY;
        n_st += k == K_ST;
        if (k == K_OTHER) {
            rc = cli_usage_error("convert", "'%s' is neither a NumPy .npy array (it starts with "
                                 "\\x93NUMPY) nor a safetensors file (a header length, then a "
                                 "JSON header)", in[i]);
            free(in);
            return rc;
        }
    }
    struct stat st, ist;
    int out_dir = ends_with(out, "/") || (stat(out, &st) == 0 && S_ISDIR(st.st_mode));
    for (int i = 0; i < nin && !out_dir && stat(out, &st) == 0; i++)
        if (stat(in[i], &ist) == 0 && ist.st_dev == st.st_dev && ist.st_ino == st.st_ino) {
            rc = cli_usage_error("convert", "-o %s is the input '%s': write the result elsewhere "
                                 "(the input would be lost)", out, in[i]);
            free(in);
            return rc;
        }
    int32_t to_dt = !to ? -1 : cli_precision_find(to) ? cli_precision_dtype(to) : -2;
    if (to_dt == -2 || (to && (n_st != 1 || nin != 1 || out_dir || ends_with(out, ".npy") ||
                               name))) {
        rc = to_dt == -2 ? cli_usage_error("convert", "--to takes bf16, fp16 or fp32, not '%s'",
                                           to)
                         : cli_usage_error("convert", "--to converts one safetensors file into "
                                           "another: tessera convert CKPT --to %s -o FILE",
                                           to);
        free(in);
        return rc;
    }
    int kind = to ? 4
               : n_st == 0 && !(nin == 1 && ends_with(out, ".npy")) && !out_dir ? 1
               : n_st == 0 && nin == 1 && ends_with(out, ".npy")           ? 2
               : n_npy == 0 && nin == 1                                     ? 3
                                                                            : 0;
    if (kind == 3 && ends_with(out, ".safetensors")) {
        rc = cli_usage_error("convert", "'%s' is a safetensors file already: convert it to "
                             "arrays (-o DIR/ or -o FILE.npy), or copy it", in[0]);
        free(in);
        return rc;
    }
    if (!kind) {
        free(in);
        if (n_st && nin > 1)
            return cli_usage_error("convert", "%d inputs with a safetensors file among them: "
                                   "convert takes arrays (.npy) to one safetensors file, or one "
                                   "safetensors file to arrays", nin);
        return cli_usage_error("convert", "arrays (.npy) go to one safetensors file (-o FILE), "
                               "not to a directory");
    }
    if (kind == 1 && name && nin > 1) {
        free(in);
        return cli_usage_error("convert", "--name names one tensor, and %d inputs were given",
                               nin);
    }
    if (kind == 2 && name) {
        free(in);
        return cli_usage_error("convert", "--name is for safetensors files");
    }
    ts_status s = ts_init(config);
    if (s) {
        free(in);
        return cli_fail(s, "convert");
    }
    if (kind == 4) {
        rc = safetensors_to_dtype(in[0], to_dt, out);
    } else if (kind == 1) {
        rc = npy_to_safetensors(in, nin, name, out);
    } else if (kind == 3) {
        rc = safetensors_to_npy(in[0], name, out, out_dir);
    } else {
        ts_tensor *t = NULL;
        if (!(s = ts_npy_load(in[0], NULL, &t)))
            s = ts_npy_save(t, out);
        ts_tensor_unref(t);
        rc = s ? cli_fail(s, "convert") : (printf("%s: 1 array\n", out), 0);
    }
    ts_shutdown();
    free(in);
    return rc;
}
