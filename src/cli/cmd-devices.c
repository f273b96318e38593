/* pagekv devices: what can be opened here, with capabilities. */
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "cli/cli.h"
#include "cli/commands.h"
#include "base/base.h"
#include "pagekv.h"

/* Under MPI ranks: every rank's host, and with -m FILE the layers each holds
 * (placement as data, I5), printed by rank 0. */
static int ranks_report(const char *model) {
    char mine[512], *all = pkv_malloc(sizeof mine * (size_t)pkv_dist_size());
    char host[128] = "?";
    gethostname(host, sizeof host - 1);
    int k = snprintf(mine, sizeof mine, "rank %d of %d: host %s", pkv_dist_rank(), pkv_dist_size(), host);
    pkv_model *m = NULL;
    if (model) {
        pkv_model_params mp = pkv_model_default_params();
        pkv_model_info info;
        if ((m = pkv_model_load(model, mp)) && !pkv_model_get_info(m, &info))
            snprintf(mine + k, sizeof mine - (size_t)k, ", layers [%d, %d) of %d, %.1f MiB of weights on %s",
                     info.layer_first, info.layer_end, info.n_layer, (double)info.weight_bytes / (1 << 20),
                     pkv_device_name(pkv_model_device(m)));
        else
            snprintf(mine + k, sizeof mine - (size_t)k, ", cannot load %s: %s", model, pkv_errmsg());
    }
    pkv_status s = all ? pkv_dist_gather(mine, sizeof mine, all) : PKV_ERR_NOMEM;
    for (int r = 0; !s && pkv_dist_rank() == 0 && r < pkv_dist_size(); r++) printf("%s\n", all + (size_t)r * sizeof mine);
    pkv_model_free(m);
    pkv_free(all);
    return s ? pkv_cli_fail("devices", "ranks", s) : model && !m ? 1 : 0;
}

int pkv_cli_devices(int argc, char **argv) {
    int extra = pkv_cli_extra_cpus();
    const char *model = NULL;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "-m") || !strcmp(argv[i], "--model")) {
            if (!(model = pkv_cli_value(argc, argv, &i))) return 2;
        } else if (!strcmp(argv[i], "--cpu-devices")) {
            const char *v = pkv_cli_value(argc, argv, &i);
            long long n;
            if (!v || !pkv_cli_int("--cpu-devices", v, 0, 64, &n)) return 2;
            extra = (int)n;
        } else if (!strcmp(argv[i], "-h") || !strcmp(argv[i], "--help")) {
            printf("usage: pagekv devices [--cpu-devices N] [-m FILE.gguf]\n"
                   "Lists cpu, the extra CPU devices cpu:1..cpu:N (default 1, or PKV_CPU_DEVICES),\n"
                   "Vulkan devices, and the faulty test device when PKV_FAULTY_DEVICE=1.\n"
                   "Under mpirun (docs/distributed.md) it lists rank 0's devices, then every rank's host\n"
                   "and, with -m, the layers of FILE each rank holds.\n");
            return 0;
        } else {
            fprintf(stderr, "pagekv devices: unknown option '%s' (see 'pagekv devices --help')\n", argv[i]);
            return 2;
        }
    }
    char names[80][64], why[256];
    int n = 0;
    pkv_status s = pkv_device_enumerate(extra, names, 80, &n, why, sizeof why);
    if (s) return pkv_cli_fail("devices", "enumerate", s);
    printf("%-10s %-8s %12s  %s\n", "device", "kind", "memory MiB", "description");
    for (int i = 0; i < n && i < 80; i++) {
        pkv_device *d = pkv_device_open(names[i], pkv_device_default_params());
        if (!d) {
            printf("%-10s %-8s %12s  cannot open: %s\n", names[i], "-", "-", pkv_errmsg());
            continue;
        }
        const pkv_device_caps *c = pkv_device_get_caps(d);
        static const char *kinds[] = {"cpu", "vulkan", "cuda", "test"};
        printf("%-10s %-8s %12llu  %s%s\n", c->name, kinds[c->kind], (unsigned long long)(c->memory_bytes >> 20),
               c->description, c->has_kernels ? "" : " (no kernels)");
        if (c->has_kernels) {
            char list[512];
            pkv_cli_weight_types(d, 0, PKV_WEIGHT_SLOW, false, list, sizeof list);
            if (list[0]) printf("%-10s   weight types on a slow fallback path: %s\n", "", list);
            pkv_cli_weight_types(d, 0, PKV_WEIGHT_NONE, false, list, sizeof list);
            if (list[0]) printf("%-10s   weight types not supported: %s\n", "", list);
        }
        pkv_device_memory_stats ms;
        if (!pkv_device_memory_stats_get(d, &ms) && ms.allocations >= 0)
            printf("%-10s   device memory: %lld allocations now (buffers are placed inside a few; limit %llu)\n", "",
                   (long long)ms.allocations, (unsigned long long)ms.allocation_limit);
        if (c->kind == PKV_DEVICE_VULKAN && c->limits[0]) printf("%-10s   limits: %s\n", "", c->limits);
        pkv_device_close(d);
    }
    if (why[0]) printf("note: %s\n", why);
    if (pkv_dist_size() > 1) return ranks_report(model);
    if (model) fprintf(stderr, "pagekv devices: -m shows the layers of each MPI rank: run under mpirun\n");
    return 0;
}
