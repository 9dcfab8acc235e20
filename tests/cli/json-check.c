/* tests/cli/json-check.c: reads JSON on stdin, exits 0 if it parses and every PATH given
 * (dot-separated object keys, [N] for array items) exists, printing each value found. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cjson/cJSON.h>

static const cJSON *walk(const cJSON *node, const char *path)
{
    char buf[512];
    snprintf(buf, sizeof buf, "%s", path);
    for (char *tok = strtok(buf, "."); tok && node; tok = strtok(NULL, ".")) {
        if (tok[0] == '[')
            node = cJSON_GetArrayItem(node, atoi(tok + 1));
        else
            node = cJSON_GetObjectItemCaseSensitive(node, tok);
    }
    return node;
}

int main(int argc, char **argv)
{
    size_t cap = 1 << 16, n = 0;
    char *text = malloc(cap);
    size_t r;
    while (text && (r = fread(text + n, 1, cap - n - 1, stdin)) > 0) {
        n += r;
        if (n + 1 == cap)
            text = realloc(text, cap *= 2);
    }
    if (!text)
        return 2;
    text[n] = 0;
    cJSON *root = cJSON_Parse(text);
    free(text);
    if (!root) {
        fprintf(stderr, "json-check: invalid JSON near: %.40s\n", cJSON_GetErrorPtr());
        return 1;
    }
    int rc = 0;
    for (int i = 1; i < argc; i++) {
        const cJSON *v = walk(root, argv[i]);
        if (!v) {
            fprintf(stderr, "json-check: missing %s\n", argv[i]);
            rc = 1;
            continue;
        }
        char *s = cJSON_PrintUnformatted(v);
        printf("%s=%s\n", argv[i], s ? s : "?");
        free(s);
    }
    cJSON_Delete(root);
    return rc;
}
