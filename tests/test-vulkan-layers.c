// labels: vulkan device timeout=300
/* The Vulkan validation layer enabled from the environment (issue 43 item 7):
 * with VK_INSTANCE_LAYERS=VK_LAYER_KHRONOS_validation set, the loader tells the
 * debug messenger that it added the layer (a "Loader Message"); that notice is
 * not a validation finding, so `pagekv check` on vulkan:0 passes, its
 * validation-layer row included. A real finding is still counted: with the
 * barriers left out on purpose (PKV_VK_TEST_NO_BARRIER=1) the layer's
 * synchronization hazards fail the check, with and without the variable.
 * Skipped without vulkan:0 or without the layer installed. */
#include "testhelp.h"

#define LAYERS "VK_INSTANCE_LAYERS=VK_LAYER_KHRONOS_validation"
#define CHECK_ARGS "check --device vulkan:0 --no-kernels --iterations 10"

int main(void) {
    if (th_cli("", true, "devices") != 0 || !strstr(th_out, "vulkan:0"))
        return th_skip("no vulkan:0 (a build without Vulkan, or no Vulkan device)");
    int rc = th_cli("PKV_VK_VALIDATE=1", true, CHECK_ARGS);
    if (rc == 0 && strstr(th_out, "not active"))
        return th_skip("the Khronos validation layer is not installed (Debian: vulkan-validationlayers)");
    CHECK_INT(rc, 0);
    CHECK(strstr(th_out, "validation layer           pass") != NULL);

    rc = th_cli("PKV_VK_VALIDATE=1 " LAYERS, true, CHECK_ARGS);
    if (rc != 0 || !strstr(th_out, "validation layer           pass")) fprintf(stderr, "%s\n", th_out);
    CHECK_INT(rc, 0);
    CHECK(strstr(th_out, "validation layer           pass") != NULL);
    CHECK(strstr(th_out, "Loader Message") == NULL);

    /* as a user runs it: PKV_VK_VALIDATE unset, check asks for the layer itself */
    rc = th_cli("env -u PKV_VK_VALIDATE " LAYERS, true, CHECK_ARGS);
    CHECK_INT(rc, 0);
    CHECK(strstr(th_out, "validation layer           pass") != NULL);

    /* a real hazard is counted, with the variable set and without */
    for (int with = 0; with < 2; with++) {
        rc = th_cli(with ? "PKV_VK_VALIDATE=1 PKV_VK_TEST_NO_BARRIER=1 PKV_VK_FORCE_STAGING=1 " LAYERS
                         : "PKV_VK_VALIDATE=1 PKV_VK_TEST_NO_BARRIER=1 PKV_VK_FORCE_STAGING=1",
                    true, CHECK_ARGS);
        CHECK_INT(rc, 1);
        CHECK(strstr(th_out, "SYNC-HAZARD") != NULL);
    }
    return th_done();
}
