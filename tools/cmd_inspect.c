/* tools/cmd_inspect.c: `tessera inspect FILE`: what a safetensors file holds (tessera's
 * checkpoints, PyTorch's and Hugging Face's files): every tensor's name, stored dtype (and the
 * dtype it loads as when tessera converts it), shape and bytes, and the metadata. Reads the
 * header only, through the same validating loader as --resume: a damaged or hostile file is
 * refused with the reason, never half-listed. */
#include "config.h"

#include <stdio.h>
#include <string.h>

#include <cjson/cJSON.h>

#include "cli.h"

static const char usage[] =
    "usage: tessera inspect [--json] FILE\n"
    "\n"
    "Lists the tensors of a safetensors file (a tessera checkpoint, or a PyTorch or Hugging\n"
    "Face file): name, dtype as stored (F16, BF16 and BOOL load as float32, float32 and\n"
    "uint8), shape and bytes, then its metadata. Only the header is read; the file is checked\n"
    "as --resume checks it, so a damaged file is an error naming the defect.\n"
    "  --json   one JSON object: file, bytes, tensors [{name, dtype, loads_as, shape, bytes}],\n"
    "           metadata {key: value}\n";

/* Prints s with control characters and non-ASCII bytes escaped, at most max bytes of it. */
static void print_clean(const char *s, size_t max)
{
    size_t n = 0;
    for (; *s && n < max; s++, n++) {
        unsigned char c = (unsigned char)*s;
        if (c >= 0x20 && c < 0x7f)
            putchar(c);
        else
            printf("\\x%02x", c);
    }
    if (*s)
        printf("... (%zu bytes)", n + strlen(s));
}

/* Prints item as cJSON writes it, and frees it. */
static void print_json(cJSON *item)
{
    char *text = item ? cJSON_PrintUnformatted(item) : NULL;
    if (text)
        fputs(text, stdout);
    cJSON_free(text);
    cJSON_Delete(item);
}

int cmd_inspect(int argc, char **argv, const cli_common *common)
{
    const char *file = NULL;
    int json = common->json;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--json")) {
            json = 1;
        } else if (!strcmp(argv[i], "-h") || !strcmp(argv[i], "--help")) {
            fputs(usage, stdout);
            return 0;
        } else if (argv[i][0] == '-' && argv[i][1]) {
            return cli_usage_error("inspect", "unknown option '%s'", argv[i]);
        } else if (file) {
            return cli_usage_error("inspect", "one FILE at a time ('%s', then '%s')", file,
                                   argv[i]);
        } else {
            file = argv[i];
        }
    }
    if (!file)
        return cli_usage_error("inspect", "which file? (tessera inspect FILE)");
    /* The loader validates the whole header; no device is needed to list it. */
    ts_set_log_level(TS_LOG_ERROR); /* the conversion notice is shown per tensor below */
    ts_checkpoint *ck = NULL;
    ts_status s = ts_checkpoint_load(file, NULL, &ck);
    if (s)
        return cli_fail(s, "inspect");
    size_t n = ts_checkpoint_count(ck), nm = ts_checkpoint_meta_count(ck);
    unsigned long long total = 0;
    /* The JSON is written entry by entry (the same text as one cJSON tree printed whole), so
     * its memory is one entry's, not a multiple of a header of hundreds of thousands. */
    if (json) {
        fputs("{\"file\":", stdout);
        print_json(cJSON_CreateString(file));
        fputs(",\"tensors\":[", stdout);
    } else {
        printf("%s: %zu tensors, %zu metadata entries\n", file, n, nm);
    }
    for (size_t i = 0; i < n; i++) {
        const char *name = ts_checkpoint_name(ck, i);
        int32_t dtype = 0;
        int ndim = 0;
        int64_t shape[TS_MAX_DIMS];
        ts_checkpoint_tensor_info(ck, name, &dtype, &ndim, shape);
        const char *stored = ts_checkpoint_stored_dtype(ck, name);
        int64_t numel = 1;
        for (int d = 0; d < ndim; d++)
            numel *= shape[d];
        size_t esize = !strcmp(stored, "F16") || !strcmp(stored, "BF16") ? 2
                       : !strcmp(stored, "BOOL")                          ? 1
                                                                          : ts_dtype_size(dtype);
        unsigned long long bytes = (unsigned long long)numel * esize;
        total += bytes;
        int converted = esize != ts_dtype_size(dtype) || !strcmp(stored, "BOOL");
        if (json) {
            cJSON *t = cJSON_CreateObject(), *sh = cJSON_CreateArray();
            cJSON_AddStringToObject(t, "name", name);
            cJSON_AddStringToObject(t, "dtype", stored);
            cJSON_AddStringToObject(t, "loads_as", ts_dtype_name(dtype));
            for (int d = 0; d < ndim; d++)
                cJSON_AddItemToArray(sh, cJSON_CreateNumber((double)shape[d]));
            cJSON_AddItemToObject(t, "shape", sh);
            cJSON_AddNumberToObject(t, "bytes", (double)bytes);
            if (i)
                putchar(',');
            print_json(t);
            continue;
        }
        char sh[160] = "(";
        for (int d = 0; d < ndim; d++)
            snprintf(sh + strlen(sh), sizeof sh - strlen(sh), "%s%lld", d ? ", " : "",
                     (long long)shape[d]);
        snprintf(sh + strlen(sh), sizeof sh - strlen(sh), ")");
        char b[32];
        printf("  ");
        print_clean(name, 80);
        printf("  %s%s%s%s  %s  %s\n", stored, converted ? " (loads as " : "",
               converted ? ts_dtype_name(dtype) : "", converted ? ")" : "", sh,
               cli_bytes(bytes, b, sizeof b));
    }
    if (json)
        fputs("],\"metadata\":{", stdout);
    for (size_t i = 0; i < nm; i++) {
        const char *k = ts_checkpoint_meta_key(ck, i), *v = ts_checkpoint_meta(ck, k);
        if (json) {
            if (i)
                putchar(',');
            print_json(cJSON_CreateString(k));
            putchar(':');
            print_json(cJSON_CreateString(v ? v : ""));
            continue;
        }
        printf("  meta ");
        print_clean(k, 80);
        printf(" = ");
        print_clean(v ? v : "", 200);
        putchar('\n');
    }
    if (json) {
        fputs("},\"bytes\":", stdout);
        print_json(cJSON_CreateNumber((double)total));
        fputs("}\n", stdout);
    } else {
        char b[32];
        printf("%s of tensor data\n", cli_bytes(total, b, sizeof b));
    }
    ts_checkpoint_free(ck);
    return 0;
}
