/* tools/cli_opts.c: a command's options as a table (cli_opt, tools/cli.h): parsing,
 * "did you mean", the JSON start record, the resume adoption and the ranks' fingerprints. */
#include "config.h"

#include <math.h>
#include <stdio.h>
#include <string.h>

#include <cjson/cJSON.h>

#include "cli.h"

#define AT(o, row, type) ((type *)((char *)(o) + (row)->off))
#define AT_C(o, row, type) ((const type *)((const char *)(o) + (row)->off))

/* The upper bound of row r: its own, or the value of the row it names (hi_of). */
static double upper(const cli_opt *t, size_t n, const cli_opt *r, const void *o)
{
    for (size_t i = 0; r->hi_of && i < n; i++)
        if (t[i].off + 1 == r->hi_of)
            return t[i].type == CLI_F64   ? *AT_C(o, &t[i], double)
                   : t[i].type == CLI_I64 ? (double)*AT_C(o, &t[i], int64_t)
                                          : (double)*AT_C(o, &t[i], uint64_t);
    return r->hi;
}

int cli_opts_given(const cli_opt *t, size_t n, const unsigned char *given, const char *flag)
{
    for (size_t i = 0; i < n; i++)
        if (!strcmp(t[i].flag, flag))
            return given[i];
    return 0;
}

/* "--decay takes all or matrices": the choices of r, listed. */
static int bad_choice(const char *cmd, const cli_opt *r)
{
    char list[200] = "";
    size_t k = 0, len = 0;
    while (r->choices[k])
        k++;
    for (size_t i = 0; i < k && len < sizeof list; i++)
        len += (size_t)snprintf(list + len, sizeof list - len, "%s%s",
                                i == 0 ? "" : i + 1 == k ? " or " : ", ", r->choices[i]);
    return cli_usage_error(cmd, "%s takes %s", r->flag, list);
}

/* ---- --help from the table ------------------------------------------------------------- */

enum { HELP_COLS = 80, HELP_INDENT = 18 };

/* The value's name of row r: its own, or from its type ("N", "X", "on|off", "all|matrices"). */
static const char *arg_of(const cli_opt *r, char *buf, size_t len)
{
    if (r->arg)
        return r->arg;
    switch (r->type) {
    case CLI_FLAG:
        return "";
    case CLI_ONOFF:
        return "on|off";
    case CLI_I64:
    case CLI_U64:
        return "N";
    case CLI_F64:
        return "X";
    case CLI_CHOICE:
    case CLI_LEVEL: {
        size_t at = 0;
        buf[0] = 0;
        for (size_t k = 0; r->choices && r->choices[k] && at < len; k++)
            at += (size_t)snprintf(buf + at, len - at, "%s%s", k ? "|" : "", r->choices[k]);
        if (r->type == CLI_LEVEL) { /* the value is optional */
            char inner[160];
            snprintf(inner, sizeof inner, "[%s]", buf);
            snprintf(buf, len, "%s", inner);
        }
        return buf;
    }
    default:
        return "VALUE";
    }
}

/* Words of text from column *col (sep: a space before the first), wrapped at HELP_COLS with
 * continuation lines at indent. */
static void wrap(FILE *f, const char *text, int *col, int indent, int sep)
{
    while (*text) {
        size_t w = strcspn(text, " ");
        if (*col > indent && *col + sep + (int)w > HELP_COLS) {
            fprintf(f, "\n%*s", indent, "");
            *col = indent;
        } else if (sep) {
            fputc(' ', f);
            (*col)++;
        }
        sep = 1;
        fprintf(f, "%.*s", (int)w, text);
        *col += (int)w;
        text += w;
        text += strspn(text, " ");
    }
}

static void usage_rows(FILE *f, const cli_opt *t, size_t n, int synopsis, int *col, int indent)
{
    for (size_t i = 0; i < n; i++) {
        char buf[200], item[260];
        if (!t[i].help)
            continue;
        const char *a = arg_of(&t[i], buf, sizeof buf);
        if (synopsis) { /* one item, never broken */
            int w = snprintf(item, sizeof item, "[%s%s%s]", t[i].flag, *a ? " " : "", a);
            if (*col > indent && *col + 1 + w > HELP_COLS) {
                fprintf(f, "\n%*s", indent, "");
                *col = indent;
            } else if (*col > indent) {
                fputc(' ', f);
                (*col)++;
            }
            fputs(item, f);
            *col += w;
            continue;
        }
        int w = fprintf(f, "  %s%s%s", t[i].flag, *a ? " " : "", a);
        if (w < HELP_INDENT - 1)
            fprintf(f, "%*s", HELP_INDENT - w, "");
        else
            fputs("  ", f);
        int c = w < HELP_INDENT - 1 ? HELP_INDENT : w + 2;
        wrap(f, t[i].help, &c, HELP_INDENT, 0);
        fputc('\n', f);
    }
}

/* text's lines (paragraphs), each wrapped at HELP_COLS. */
static void paragraphs(FILE *f, const char *text)
{
    char line[1024];
    while (text && *text) {
        size_t len = strcspn(text, "\n");
        snprintf(line, sizeof line, "%.*s", (int)len, text);
        int col = 0;
        wrap(f, line, &col, 0, 0);
        fputc('\n', f);
        text += len + (text[len] == '\n');
    }
}

void cli_opts_usage(FILE *f, const cli_usage *u, const cli_opt *t, size_t n)
{
    int col = fprintf(f, "usage: %s ", u->synopsis), indent = col;
    usage_rows(f, u->pre, u->npre, 1, &col, indent);
    usage_rows(f, t, n, 1, &col, indent);
    fputs("\n\n", f);
    paragraphs(f, u->intro);
    usage_rows(f, u->pre, u->npre, 0, NULL, 0);
    usage_rows(f, t, n, 0, NULL, 0);
    paragraphs(f, u->outro);
}

int cli_opts_parse(const char *cmd, const char *what, const cli_opt *t, size_t n, int argc,
                   char **argv, void *o, unsigned char *given, const cli_usage *usage,
                   int (*other)(void *o, const char *arg, const char *value),
                   const char *const *other_flags)
{
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            cli_opts_usage(stdout, usage, t, n);
            return -1;
        }
        const cli_opt *r = NULL;
        for (size_t k = 0; k < n && !r; k++)
            if (!strcmp(a, t[k].flag))
                r = &t[k];
        if (!r && other) {
            int took = other(o, a, v);
            if (took < 0)
                return 2;
            if (took) {
                i++;
                continue;
            }
        }
        if (!r) {
            const char *flags[128];
            size_t nf = 0;
            for (size_t k = 0; k < n && nf < 128; k++)
                flags[nf++] = t[k].flag;
            for (size_t k = 0; other_flags && other_flags[k] && nf < 128; k++)
                flags[nf++] = other_flags[k];
            const char *near = a[0] == '-' ? cli_did_you_mean(a, flags, nf) : NULL;
            if (near)
                return cli_usage_error(cmd, "unexpected argument '%s'%s%s (did you mean '%s'?)",
                                       a, what ? " " : "", what ? what : "", near);
            return cli_usage_error(cmd, "unexpected argument '%s'%s%s", a, what ? " " : "",
                                   what ? what : "");
        }
        given[r - t] = 1;
        int bad = 0;
        switch (r->type) {
        case CLI_FLAG:
            *AT(o, r, int) = 1;
            continue;
        case CLI_LEVEL: {
            int k = 0;
            while (v && r->choices && r->choices[k] && strcmp(v, r->choices[k]))
                k++;
            if (!v || !r->choices || !r->choices[k]) {
                *AT(o, r, int) = 1;
                continue;
            }
            *AT(o, r, int) = 2 + k;
            break;
        }
        case CLI_ONOFF:
            if (!v || (strcmp(v, "on") && strcmp(v, "off")))
                return cli_usage_error(cmd, "%s takes on or off", r->flag);
            *AT(o, r, int) = !strcmp(v, "on");
            break;
        case CLI_CHOICE: {
            size_t k = 0;
            while (v && r->choices[k] && strcmp(v, r->choices[k]))
                k++;
            if (!v || !r->choices[k])
                return bad_choice(cmd, r);
            *AT(o, r, const char *) = r->choices[k];
            break;
        }
        case CLI_STR:
            if (!v)
                return cli_usage_error(cmd, "%s needs a value", r->flag);
            *AT(o, r, const char *) = v;
            break;
        case CLI_I64:
            bad = cli_parse_i64(cmd, r->flag, v, (int64_t)r->lo, (int64_t)r->hi,
                                AT(o, r, int64_t));
            break;
        case CLI_U64:
            bad = cli_parse_u64(cmd, r->flag, v, (uint64_t)r->lo,
                                r->hi >= 18446744073709551615.0 ? UINT64_MAX : (uint64_t)r->hi,
                                AT(o, r, uint64_t));
            break;
        case CLI_F64:
            bad = cli_parse_double(cmd, r->flag, v, r->lo, r->lo_open, r->hi, AT(o, r, double));
            break;
        }
        if (bad)
            return 2;
        i++;
    }
    return 0;
}

int cli_opts_adopt(const cli_opt *t, size_t n, const unsigned char *given,
                   const ts_checkpoint *ck, const char *path, void *o)
{
    for (size_t i = 0; i < n; i++) {
        const cli_opt *r = &t[i];
        if (!r->ckpt)
            continue;
        cli_run_key k = {r->ckpt, r->flag, given[i], r->refuse, r->refuse};
        double hi = upper(t, n, r, o);
        int rc;
        if (r->type == CLI_F64) {
            rc = cli_adopt_f64(ck, path, k, r->lo, r->lo_open, hi, AT(o, r, double));
        } else if (r->type == CLI_CHOICE) {
            rc = cli_adopt_choice(ck, path, k, r->choices, AT(o, r, const char *));
        } else {
            uint64_t v = r->type == CLI_I64   ? (uint64_t)*AT(o, r, int64_t)
                         : r->type == CLI_U64 ? *AT(o, r, uint64_t)
                                              : (uint64_t)*AT(o, r, int);
            uint64_t top = r->type == CLI_ONOFF ? 1
                           : hi >= 18446744073709551615.0 ? UINT64_MAX
                                                          : (uint64_t)hi;
            rc = cli_adopt_int(ck, path, k, (uint64_t)r->lo, top, &v);
            if (r->type == CLI_I64)
                *AT(o, r, int64_t) = (int64_t)v;
            else if (r->type == CLI_U64)
                *AT(o, r, uint64_t) = v;
            else
                *AT(o, r, int) = (int)v;
        }
        if (rc)
            return rc;
    }
    return 0;
}

void cli_opts_record(const cli_opt *t, size_t n, const void *o, cJSON *j)
{
    for (size_t i = 0; i < n; i++) {
        const cli_opt *r = &t[i];
        if (!r->json)
            continue;
        switch (r->type) {
        case CLI_I64:
            cJSON_AddNumberToObject(j, r->json, (double)*AT_C(o, r, int64_t));
            break;
        case CLI_U64: { /* exact as a JSON number, else a string */
            uint64_t v = *AT_C(o, r, uint64_t);
            char b[24];
            snprintf(b, sizeof b, "%llu", (unsigned long long)v);
            if (v < ((uint64_t)1 << 53))
                cJSON_AddNumberToObject(j, r->json, (double)v);
            else
                cJSON_AddStringToObject(j, r->json, b);
            break;
        }
        case CLI_F64:
            cJSON_AddNumberToObject(j, r->json, *AT_C(o, r, double));
            break;
        case CLI_STR:
        case CLI_CHOICE:
            cli_json_str_or_null(j, r->json, *AT_C(o, r, const char *));
            break;
        case CLI_FLAG:
        case CLI_ONOFF:
            cJSON_AddBoolToObject(j, r->json, *AT_C(o, r, int));
            break;
        case CLI_LEVEL:
            cJSON_AddNumberToObject(j, r->json, *AT_C(o, r, int));
            break;
        }
    }
}

uint64_t cli_opts_fingerprint(const cli_opt *t, size_t n, const void *o, int group)
{
    uint64_t h = 0xcbf29ce484222325ull; /* FNV-1a over the values' text */
    for (size_t i = 0; i < n; i++) {
        const cli_opt *r = &t[i];
        if (r->agree != group)
            continue;
        char b[64];
        const char *s = b;
        switch (r->type) {
        case CLI_I64:
            snprintf(b, sizeof b, "%lld;", (long long)*AT_C(o, r, int64_t));
            break;
        case CLI_U64:
            snprintf(b, sizeof b, "%llu;", (unsigned long long)*AT_C(o, r, uint64_t));
            break;
        case CLI_F64:
            snprintf(b, sizeof b, "%.17g;", *AT_C(o, r, double));
            break;
        case CLI_STR:
        case CLI_CHOICE:
            s = *AT_C(o, r, const char *) ? *AT_C(o, r, const char *) : "";
            break;
        case CLI_FLAG:
        case CLI_ONOFF:
        case CLI_LEVEL:
            snprintf(b, sizeof b, "%d;", *AT_C(o, r, int));
            break;
        }
        for (; *s; s++)
            h = (h ^ (unsigned char)*s) * 0x100000001b3ull;
        h = (h ^ 0xff) * 0x100000001b3ull; /* a separator no value contains */
    }
    return h;
}
