/* Model and cache setup shared by the CLI and the server (see setup.h). */
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "setup/setup.h"

static void load_progress(double f, void *user) {
    int *last = user;
    int pct = (int)(f * 100);
    if (pct / 10 != *last / 10 || pct == 100) {
        fprintf(stderr, "\rloading: %3d%%", pct);
        if (pct == 100) fputc('\n', stderr);
        *last = pct;
    }
}

pkv_model *pkv_setup_open_model(const char *cmd, const pkv_setup_model_opts *o) {
    pkv_model_params mp = pkv_model_default_params();
    mp.device = o->device;
    mp.devices = o->devices;
    mp.split = o->split;
    mp.rank_split = o->rank_split;
    mp.kv_on_host = o->kv_on_host;
    mp.no_mmap = o->no_mmap;
    mp.n_threads = o->threads;
    static int last = -1;
    pkv_model *m;
    if (o->n_lora && pkv_dist_size() > 1) {
        fprintf(stderr, "pagekv %s: --lora under %d MPI ranks is not supported\n", cmd, pkv_dist_size());
        return NULL;
    }
    if (o->model) {
        FILE *f = fopen(o->model, "rb");
        long size = 0;
        if (f) {
            fseek(f, 0, SEEK_END);
            size = ftell(f);
            fclose(f);
        }
        if (size > (64L << 20) && isatty(STDERR_FILENO)) { /* progress where loading takes a while, on a terminal */
            mp.progress = load_progress;
            mp.progress_user = &last;
        }
        m = pkv_model_load(o->model, mp);
    } else {
        fprintf(stderr, "pagekv %s: no -m given: using the built-in tiny model (random weights, made in memory)\n", cmd);
        m = pkv_model_builtin(mp);
    }
    if (!m) {
        /* a device error is not the file's fault, and a message that already names
         * the file needs no second prefix */
        const char *msg = pkv_errmsg();
        if (!strncmp(msg, "no device", 9) || !strncmp(msg, "device ", 7) ||
            (o->model && !strncmp(msg, o->model, strlen(o->model))))
            fprintf(stderr, "pagekv %s: %s\n", cmd, msg);
        else
            fprintf(stderr, "pagekv %s: cannot load %s: %s\n", cmd, o->model ? o->model : "the built-in model", msg);
    }
    if (m && pkv_dist_size() > 1) { /* the placement (I5), as rank 0 sees it: every rank's layers */
        char buf[512];
        int k = snprintf(buf, sizeof buf, "pagekv %s: layers over %d MPI ranks:", cmd, pkv_dist_size());
        for (int r = 0, a, b; r < pkv_dist_size() && k < (int)sizeof buf && !pkv_model_rank_layers(m, r, &a, &b); r++)
            k += snprintf(buf + k, sizeof buf - (size_t)k, "%s rank %d [%d, %d)", r ? "," : "", r, a, b);
        fprintf(stderr, "%s\n", buf);
    }
    pkv_lora_use uses[PKV_MAX_LORA];
    for (int i = 0; m && i < o->n_lora; i++) {
        if (!(uses[i].lora = pkv_lora_load(m, o->lora[i]))) {
            fprintf(stderr, "pagekv %s: --lora: %s\n", cmd, pkv_errmsg());
            pkv_model_free(m); /* (frees the adapters loaded before) */
            return NULL;
        }
        uses[i].scale = o->lora_scale[i];
    }
    if (m && o->n_lora && pkv_model_lora_apply(m, uses, o->n_lora)) {
        fprintf(stderr, "pagekv %s: --lora: %s\n", cmd, pkv_errmsg());
        pkv_model_free(m);
        return NULL;
    }
    pkv_model_info info;
    if (m && o->n_ctx > 0 && pkv_model_get_info(m, &info) == PKV_OK && info.n_ctx_train > 0 &&
        o->n_ctx > info.n_ctx_train) /* allowed (RoPE goes on), but the user should know: llama.cpp warns too */
        fprintf(stderr, "pagekv %s: warning: -c %lld is beyond the model's training context (%d tokens, the GGUF's "
                        "%s.context_length): positions past it are outside what the model was trained on\n",
                cmd, (long long)o->n_ctx, info.n_ctx_train, info.arch);
    return m;
}

pkv_cache_params pkv_setup_cache_params(const pkv_setup_model_opts *o) {
    pkv_cache_params cp = pkv_cache_default_params();
    cp.n_ctx = o->n_ctx;
    cp.page_size = o->page_size;
    cp.kv_type = (pkv_type)o->kv_type;
    cp.kv_type_v = (pkv_type)o->kv_type_v;
    return cp;
}
