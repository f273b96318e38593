/* JSON lookups for the server tests (which parse answers with jansson): a path
 * "a.b.0.c" walks objects by key and arrays by index. */
#ifndef PKV_SERVER_JSON_H
#define PKV_SERVER_JSON_H

#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* The value at path, or NULL. */
static inline json_t *jget(json_t *j, const char *path) {
    char buf[256];
    snprintf(buf, sizeof buf, "%s", path);
    json_t *cur = j;
    for (char *tok = strtok(buf, "."); tok && cur; tok = strtok(NULL, "."))
        cur = json_is_array(cur) ? json_array_get(cur, (size_t)atoi(tok)) : json_object_get(cur, tok);
    return cur;
}

/* The integer at path, or -999999 when there is none. */
static inline long long jint(json_t *j, const char *path) {
    json_t *v = jget(j, path);
    return json_is_integer(v) ? json_integer_value(v) : -999999;
}

#endif
