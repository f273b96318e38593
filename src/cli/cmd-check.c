/* pagekv check: the conformance suite of invariant I2 on each chosen device,
 * cross-device copies between every pair, and every kernel against the CPU
 * reference. Prints a table; exits 1 when anything fails. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli/cli.h"
#include "cli/commands.h"
#include "pagekv.h"

#define MAX_DEV 80

typedef struct {
    int rows, failed, skipped;
    char first_failure[512];
} table;

static void print_row(const pkv_check_result *r, void *user) {
    table *t = user;
    const char *res = r->skipped ? "skip" : r->passed ? "pass" : "FAIL";
    printf("%-22s %-26s %-5s %9ld %9.3f  %s\n", r->device, r->test, res, r->count, r->seconds, r->detail);
    fflush(stdout);
    t->rows++;
    if (r->skipped) t->skipped++;
    else if (!r->passed) {
        if (!t->failed)
            snprintf(t->first_failure, sizeof t->first_failure, "%s: %s: %s", r->device, r->test, r->detail);
        t->failed++;
    }
}

static void usage(FILE *f) {
    fprintf(f,
            "usage: pagekv check [--device NAME|all]... [--seed N] [--iterations N] [--no-kernels]\n"
            "Runs the conformance suite: random transfers at random offsets and sizes against a\n"
            "host shadow copy, batched region copies, cross-device copies between every pair of\n"
            "the chosen devices, and every kernel against the CPU reference.\n"
            "  --device NAME   a device from 'pagekv devices', a comma list, or 'all' (default)\n"
            "  --seed N        random seed (default 1)\n"
            "  --iterations N  random operations per transfer test (default 2000)\n"
            "  --no-kernels    transfers only\n"
            "Exit status: 0 all passed, 1 a test failed, 2 bad usage or a device could not be opened.\n");
}

static int add_names(const char *spec, char (*names)[64], int *n) {
    if (!strcmp(spec, "all")) {
        char why[256];
        int total = 0;
        pkv_status s = pkv_device_enumerate(pkv_cli_extra_cpus(), names + *n, MAX_DEV - *n, &total, why, sizeof why);
        if (s) return pkv_cli_fail("check", "enumerate", s);
        *n += total < MAX_DEV - *n ? total : MAX_DEV - *n;
        if (why[0]) printf("note: %s\n", why);
        return 0;
    }
    char buf[512];
    snprintf(buf, sizeof buf, "%s", spec);
    for (char *tok = strtok(buf, ","); tok; tok = strtok(NULL, ",")) {
        if (*n >= MAX_DEV) break;
        snprintf(names[(*n)++], 64, "%s", tok);
    }
    return 0;
}

int pkv_cli_check(int argc, char **argv) {
    static char names[MAX_DEV][64];
    int n_names = 0;
    pkv_check_params p = pkv_check_default_params();
    p.seed = 1;
    bool kernels = true;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v;
        long long x;
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            usage(stdout);
            return 0;
        } else if (!strcmp(a, "--device") || !strcmp(a, "-d")) {
            if (!(v = pkv_cli_value(argc, argv, &i)) || add_names(v, names, &n_names)) return 2;
        } else if (!strcmp(a, "--seed")) {
            if (!(v = pkv_cli_value(argc, argv, &i)) || !pkv_cli_int(a, v, 0, INT64_MAX, &x)) return 2;
            p.seed = (uint64_t)x;
        } else if (!strcmp(a, "--iterations")) {
            if (!(v = pkv_cli_value(argc, argv, &i)) || !pkv_cli_int(a, v, 1, 10000000, &x)) return 2;
            p.iterations = (int)x;
        } else if (!strcmp(a, "--no-kernels")) {
            kernels = false;
        } else {
            fprintf(stderr, "pagekv check: unknown option '%s' (see 'pagekv check --help')\n", a);
            return 2;
        }
    }
    /* Vulkan devices are checked under the validation layer where it is
     * installed (PKV_VK_VALIDATE=0 turns that off); set before any device call. */
    setenv("PKV_VK_VALIDATE", "1", 0);
    if (n_names == 0 && add_names("all", names, &n_names)) return 2;

    pkv_device *devs[MAX_DEV] = {0};
    int rc = 0;
    for (int i = 0; i < n_names; i++) {
        devs[i] = pkv_device_open(names[i], pkv_device_default_params());
        if (!devs[i]) {
            fprintf(stderr, "pagekv check: cannot open device '%s': %s\n", names[i], pkv_errmsg());
            rc = 2;
        }
    }
    if (rc) goto out;

    table t = {0};
    printf("%-22s %-26s %-5s %9s %9s  %s\n", "device", "test", "result", "count", "seconds", "detail");
    for (int i = 0; i < n_names; i++) {
        pkv_status s = pkv_check_transfers(devs[i], p, print_row, &t);
        if (s && s != PKV_ERR_DEVICE) {
            rc = pkv_cli_fail("check", names[i], s);
            goto out;
        }
        if (kernels) {
            s = pkv_check_kernels(devs[i], p, print_row, &t);
            if (s && s != PKV_ERR_DEVICE) {
                rc = pkv_cli_fail("check", names[i], s);
                goto out;
            }
        }
    }
    for (int i = 0; i < n_names; i++)
        for (int j = i + 1; j < n_names; j++) {
            pkv_status s = pkv_check_cross(devs[i], devs[j], p, print_row, &t);
            if (s && s != PKV_ERR_DEVICE) {
                rc = pkv_cli_fail("check", "cross-device", s);
                goto out;
            }
        }
    for (int i = 0; i < n_names; i++) {
        /* Device memory allocations: a handful, however many buffers (Vulkan
         * suballocates; drivers allow 4096 on many GPUs). */
        pkv_device_memory_stats ms;
        if (pkv_device_memory_stats_get(devs[i], &ms) || ms.peak_allocations < 0) continue;
        pkv_check_result r = {.device = names[i], .test = "memory allocations"};
        r.count = (long)ms.peak_allocations;
        r.passed = !ms.allocation_limit || (uint64_t)ms.peak_allocations <= ms.allocation_limit;
        snprintf(r.detail, sizeof r.detail, "at most %lld allocations held for up to %lld buffers (limit %llu)",
                 (long long)ms.peak_allocations, (long long)ms.peak_buffers, (unsigned long long)ms.allocation_limit);
        print_row(&r, &t);
    }
    bool any_vk = false;
    for (int i = 0; i < n_names; i++) any_vk |= pkv_device_get_caps(devs[i])->kind == PKV_DEVICE_VULKAN;
    if (any_vk) {
        /* Everything above ran under the layer: one row for what it said. */
        pkv_check_result r = {.device = "vulkan", .test = "validation layer"};
        char vmsg[1024];
        for (int i = 0; i < n_names; i++) pkv_device_sync(devs[i]);
        int64_t nv = pkv_vulkan_validation_messages(vmsg, sizeof vmsg);
        r.skipped = nv < 0;
        r.passed = nv == 0;
        r.count = nv < 0 ? 0 : (long)nv;
        if (nv < 0) snprintf(r.detail, sizeof r.detail, "not active: %.200s", vmsg);
        else if (nv == 0) snprintf(r.detail, sizeof r.detail, "no errors or warnings (synchronization, best practices)");
        else snprintf(r.detail, sizeof r.detail, "%lld messages; first: %.200s", (long long)nv, vmsg);
        print_row(&r, &t);
    }
    printf("\n%d tests on %d device%s: %d passed, %d failed, %d skipped\n", t.rows, n_names, n_names == 1 ? "" : "s",
           t.rows - t.failed - t.skipped, t.failed, t.skipped);
    if (t.failed) {
        fprintf(stderr, "pagekv check: FAILED: %s\n", t.first_failure);
        rc = 1;
    }
out:
    for (int i = 0; i < n_names; i++) pkv_device_close(devs[i]);
    return rc;
}
