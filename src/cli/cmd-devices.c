/* pagekv devices: what can be opened here, with capabilities. */
#include <stdio.h>
#include <string.h>

#include "cli/cli.h"
#include "cli/commands.h"
#include "pagekv.h"

int pkv_cli_devices(int argc, char **argv) {
    int extra = pkv_cli_extra_cpus();
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--cpu-devices")) {
            const char *v = pkv_cli_value(argc, argv, &i);
            long long n;
            if (!v || !pkv_cli_int("--cpu-devices", v, 0, 64, &n)) return 2;
            extra = (int)n;
        } else if (!strcmp(argv[i], "-h") || !strcmp(argv[i], "--help")) {
            printf("usage: pagekv devices [--cpu-devices N]\n"
                   "Lists cpu, the extra CPU devices cpu:1..cpu:N (default 1, or PKV_CPU_DEVICES),\n"
                   "Vulkan devices, and the faulty test device when PKV_FAULTY_DEVICE=1.\n");
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
    return 0;
}
