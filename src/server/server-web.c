/* The web page of pagekv serve (GET /): the files of src/server/web/, compiled
 * into the binary at build time (cmake/web.cmake writes web-assets.c), served
 * as they are. "/" is index.html; the others are at /web/NAME. */
#include <string.h>

#include "server/server-http.h"

typedef struct { const char *name, *type; const unsigned char *data; size_t len; } pkv_web_file;
extern const pkv_web_file pkv_web_files[];
extern const int pkv_web_n_files;

bool srv_web_asset(const char *url, const void **data, size_t *len, const char **ctype) {
    const char *name = NULL;
    if (!strcmp(url, "/") || !strcmp(url, "/index.html")) name = "index.html";
    else if (!strncmp(url, "/web/", 5)) name = url + 5;
    if (!name) return false;
    for (int i = 0; i < pkv_web_n_files; i++)
        if (!strcmp(pkv_web_files[i].name, name)) {
            *data = pkv_web_files[i].data;
            *len = pkv_web_files[i].len;
            *ctype = pkv_web_files[i].type;
            return true;
        }
    return false;
}
