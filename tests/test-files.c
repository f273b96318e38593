// labels: unit
/* Output files: every writer (GGUF via mkmodel, KV sequence save, context save,
 * `pagekv logits -o`, `pagekv mkmodel -o`) refuses a target that is a device node,
 * a FIFO, a directory or a symlink, leaves it untouched, and leaves no temporary
 * file behind; a regular file is replaced whole. (mkmodel -o /dev/null used to
 * rename its output over the device node.) */
#include <fcntl.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>

#include "testhelp.h"

typedef pkv_status (*writer_fn)(const char *path, void *user);

static pkv_status write_gguf(const char *path, void *user) {
    (void)user;
    pkv_mkmodel_params p = pkv_mkmodel_default_params();
    return pkv_mkmodel_write(&p, path);
}

static pkv_status write_ctx(const char *path, void *user) { return pkv_context_save((pkv_context *)user, path); }

static pkv_status write_seq(const char *path, void *user) {
    pkv_context *ctx = user;
    return pkv_kv_seq_save(pkv_context_cache(ctx), pkv_context_seq(ctx), path);
}

/* Files in dir whose names start with prefix (temporaries left behind). */
static int count_prefixed(const char *dir, const char *prefix) {
    char cmd[1024];
    snprintf(cmd, sizeof cmd, "ls -1 '%s' | grep -c '^%s' ", dir, prefix);
    FILE *f = popen(cmd, "r");
    int n = -1;
    if (f) {
        if (fscanf(f, "%d", &n) != 1) n = -1;
        pclose(f);
    }
    return n;
}

static void refuse_all(const char *tag, writer_fn fn, void *user) {
    char dir[512], p[600], target[600];
    snprintf(dir, sizeof dir, "%s", th_tmp(tag));
    mkdir(dir, 0755);
    struct stat st;

    /* FIFO */
    snprintf(p, sizeof p, "%s/fifo", dir);
    unlink(p);
    REQUIRE_VOID(mkfifo(p, 0644) == 0);
    CHECK_STATUS(fn(p, user), PKV_ERR_IO);
    CHECK_MSG("FIFO");
    CHECK(lstat(p, &st) == 0 && S_ISFIFO(st.st_mode));

    /* symlink: neither the link nor its target changes */
    snprintf(target, sizeof target, "%s/target", dir);
    FILE *t = fopen(target, "wb");
    REQUIRE_VOID(t);
    fputs("keep", t);
    fclose(t);
    snprintf(p, sizeof p, "%s/link", dir);
    unlink(p);
    REQUIRE_VOID(symlink(target, p) == 0);
    CHECK_STATUS(fn(p, user), PKV_ERR_IO);
    CHECK_MSG("symbolic link");
    CHECK(lstat(p, &st) == 0 && S_ISLNK(st.st_mode));
    CHECK(stat(target, &st) == 0 && st.st_size == 4);

    /* directory */
    snprintf(p, sizeof p, "%s/adir", dir);
    mkdir(p, 0755);
    CHECK_STATUS(fn(p, user), PKV_ERR_IO);
    CHECK_MSG("directory");
    CHECK(lstat(p, &st) == 0 && S_ISDIR(st.st_mode));

    /* a character device node (a private copy of /dev/null's numbers, made only
     * when we may: the real /dev/null is never a target of this test) */
    snprintf(p, sizeof p, "%s/null", dir);
    unlink(p);
    if (mknod(p, S_IFCHR | 0666, makedev(1, 3)) == 0) {
        CHECK_STATUS(fn(p, user), PKV_ERR_IO);
        CHECK_MSG("character device");
        CHECK(lstat(p, &st) == 0 && S_ISCHR(st.st_mode));
        unlink(p);
    } else {
        fprintf(stderr, "%s: mknod not permitted here; device-node case not run\n", tag);
    }

    /* a regular file is replaced whole; no temporary is left anywhere */
    snprintf(p, sizeof p, "%s/out.bin", dir);
    t = fopen(p, "wb");
    REQUIRE_VOID(t);
    for (int i = 0; i < 100000; i++) fputc('x', t);
    fclose(t);
    CHECK_OK(fn(p, user));
    CHECK(stat(p, &st) == 0 && S_ISREG(st.st_mode));
    t = fopen(p, "rb");
    REQUIRE_VOID(t);
    int c0 = fgetc(t);
    fclose(t);
    CHECK(c0 != 'x');
    CHECK_INT(count_prefixed(dir, "out.bin.tmp"), 0);
    CHECK_INT(count_prefixed(dir, "fifo.tmp"), 0);
    CHECK_INT(count_prefixed(dir, "link.tmp"), 0);
    CHECK_INT(count_prefixed(dir, "null.tmp"), 0);
    CHECK_INT(count_prefixed(dir, "adir.tmp"), 0);
}

static void cli_refuses(void) {
    char dir[512], p[600], model[600];
    snprintf(dir, sizeof dir, "%s", th_tmp("files-cli"));
    mkdir(dir, 0755);
    snprintf(p, sizeof p, "%s/fifo", dir);
    unlink(p);
    REQUIRE_VOID(mkfifo(p, 0644) == 0);
    CHECK_INT(th_cli("", true, "mkmodel -o %s", p), 1);
    HAS("FIFO");
    snprintf(model, sizeof model, "%s/m.gguf", dir);
    CHECK_INT(th_cli("", true, "mkmodel -o %s", model), 0);
    CHECK_INT(th_cli("", true, "logits -m %s -t 1 --tokens 1,2,3 -o %s", model, p), 1);
    HAS("FIFO");
    struct stat st;
    CHECK(lstat(p, &st) == 0 && S_ISFIFO(st.st_mode));
    snprintf(p, sizeof p, "%s/logits.f32", dir);
    CHECK_INT(th_cli("", true, "logits -m %s -t 1 --tokens 1,2,3 -o %s", model, p), 0);
    CHECK(stat(p, &st) == 0 && st.st_size > 0 && st.st_size % 4 == 0);
}

int main(void) {
    refuse_all("files-gguf", write_gguf, NULL);

    pkv_model_params mp = pkv_model_default_params();
    mp.n_threads = 1;
    pkv_model *m = pkv_model_builtin(mp);
    REQUIRE(m);
    pkv_cache_params cp = pkv_cache_default_params();
    cp.n_ctx = 64;
    pkv_kv_cache *c = pkv_model_cache_create(m, cp);
    REQUIRE(c);
    pkv_context *ctx = pkv_context_create(m, c, 0);
    REQUIRE(ctx);
    int32_t toks[5] = {1, 2, 3, 4, 5};
    CHECK_OK(pkv_context_decode(ctx, toks, 5));
    refuse_all("files-ctx", write_ctx, ctx);
    refuse_all("files-seq", write_seq, ctx);
    pkv_context_free(ctx);
    pkv_kv_cache_free(c);
    pkv_model_free(m);

    if (getenv("PKV_CLI")) cli_refuses();
    return th_done();
}
