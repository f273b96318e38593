/* Vulkan backend: instance and device discovery, memory, the in-order queue and
 * transfers at any byte offset.
 *
 * Queue model (I3): everything (transfers and kernels) is recorded into one
 * current command buffer with a full memory barrier between consecutive commands,
 * and submitted on flush, sync or read, so a forward pass is one submission.
 * Work runs on a single queue in submission order.
 *
 * Memory: each buffer is its own device-local allocation. Host data moves through
 * a host-visible staging buffer (a bump allocator, grown as needed, reset when the
 * queue is idle; transfers larger than PKV_VK_STAGING_MAX go in chunks). When the
 * device-local memory is also host-visible and coherent on an integrated or CPU
 * device (lavapipe), buffers are mapped and an idle-queue write/read/fill uses the
 * mapping directly; PKV_VK_FORCE_STAGING=1 turns that off so the staging path can
 * be tested on such devices too.
 *
 * Alignment: vkCmdCopyBuffer takes any offset and size; vkCmdFillBuffer needs
 * multiples of 4, so fill does the aligned middle with vkCmdFillBuffer and the
 * unaligned head and tail bytes through a staged copy. */
#include "device/vulkan/vulkan-impl.h"

#include "base/iq-grids.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define PKV_VK_STAGING_MIN ((size_t)1 << 20)
#define PKV_VK_STAGING_MAX ((size_t)64 << 20)
#define PKV_VK_MAX_DEVICES 16

/* ------------------------------------------------------------------ errors */

const char *pkv_vk_result_str(VkResult r) {
    switch (r) {
#define R(x) case x: return #x;
        R(VK_SUCCESS) R(VK_NOT_READY) R(VK_TIMEOUT) R(VK_EVENT_SET) R(VK_EVENT_RESET) R(VK_INCOMPLETE)
        R(VK_ERROR_OUT_OF_HOST_MEMORY) R(VK_ERROR_OUT_OF_DEVICE_MEMORY) R(VK_ERROR_INITIALIZATION_FAILED)
        R(VK_ERROR_DEVICE_LOST) R(VK_ERROR_MEMORY_MAP_FAILED) R(VK_ERROR_LAYER_NOT_PRESENT)
        R(VK_ERROR_EXTENSION_NOT_PRESENT) R(VK_ERROR_FEATURE_NOT_PRESENT) R(VK_ERROR_INCOMPATIBLE_DRIVER)
        R(VK_ERROR_TOO_MANY_OBJECTS) R(VK_ERROR_FORMAT_NOT_SUPPORTED) R(VK_ERROR_FRAGMENTED_POOL)
        R(VK_ERROR_UNKNOWN) R(VK_ERROR_OUT_OF_POOL_MEMORY) R(VK_ERROR_INVALID_EXTERNAL_HANDLE)
        R(VK_ERROR_FRAGMENTATION)
#undef R
    default: return "VkResult(unknown)";
    }
}

pkv_status pkv_vk_fail(const pkv_vk_ctx *c, const char *call, VkResult r) {
    pkv_status s = (r == VK_ERROR_OUT_OF_DEVICE_MEMORY || r == VK_ERROR_OUT_OF_HOST_MEMORY) ? PKV_ERR_NOMEM
                                                                                          : PKV_ERR_DEVICE;
    return pkv_err(s, "%s: %s failed: %s (%d)", c ? c->name : "vulkan", call, pkv_vk_result_str(r), (int)r);
}

#define VK_TRY(c, call, expr)                                                              \
    do {                                                                                   \
        VkResult _r = (expr);                                                              \
        if (_r != VK_SUCCESS) return pkv_vk_fail((c), (call), _r);                         \
    } while (0)

/* --------------------------------------------------------------- discovery */

/* The instance and the usable physical devices, found once per process. The
 * instance lives until exit: devices opened from it may outlive any caller. */
static struct {
    pthread_once_t once;
    VkInstance instance;
    VkPhysicalDevice phys[PKV_VK_MAX_DEVICES];
    int n;
    char why[256];
    /* Validation (PKV_VK_VALIDATE=1): the Khronos layer with synchronization
     * validation and best practices; its errors and warnings are counted by the
     * messenger below. validate_why says why it is off when it was asked for. */
    bool validate;
    char validate_why[160];
    VkDebugUtilsMessengerEXT messenger;
    pthread_mutex_t msg_lock;
    int64_t messages;
    char first_message[1024];
} g_vk = {PTHREAD_ONCE_INIT, VK_NULL_HANDLE, {0}, 0, "", false, "", VK_NULL_HANDLE, PTHREAD_MUTEX_INITIALIZER, 0, ""};

#define PKV_VK_LAYER "VK_LAYER_KHRONOS_validation"

/* Every warning and error of the validation layer is counted and logged (a
 * test fails on any: pkv_vulkan_validation_messages); the loader's own
 * messages are not counted. Info and verbose messages are not requested. The
 * layer may call this from any thread. */
static VKAPI_ATTR VkBool32 VKAPI_CALL vk_messenger(VkDebugUtilsMessageSeverityFlagBitsEXT sev,
                                                  VkDebugUtilsMessageTypeFlagsEXT type,
                                                  const VkDebugUtilsMessengerCallbackDataEXT *d, void *user) {
    (void)user;
    if (!(sev & (VK_DEBUG_UTILS_MESSAGE_SEVERITY_WARNING_BIT_EXT | VK_DEBUG_UTILS_MESSAGE_SEVERITY_ERROR_BIT_EXT)))
        return VK_FALSE;
    const char *kind = (sev & VK_DEBUG_UTILS_MESSAGE_SEVERITY_ERROR_BIT_EXT) ? "error" : "warning";
    const char *what = (type & VK_DEBUG_UTILS_MESSAGE_TYPE_PERFORMANCE_BIT_EXT) ? " (performance)" : "";
    const char *id = d && d->pMessageIdName ? d->pMessageIdName : "?";
    /* The one message about the messenger itself (enabling VK_EXT_debug_utils,
     * which only a validation run does) is not a finding about pagekv. */
    if (strcmp(id, "UNASSIGNED-BestPractices-vkCreateInstance-specialuse-extension-debugging") == 0) return VK_FALSE;
    const char *msg = d && d->pMessage ? d->pMessage : "";
    /* The loader reports through the same messenger, under the id "Loader
     * Message": e.g. a warning that VK_INSTANCE_LAYERS added the validation layer
     * (issue 43.7). Those are about the Vulkan installation, not findings of the
     * layer about pagekv's commands: logged (errors as warnings), not counted. */
    if (strcmp(id, "Loader Message") == 0) {
        pkv_log(sev & VK_DEBUG_UTILS_MESSAGE_SEVERITY_ERROR_BIT_EXT ? PKV_LOG_WARN : PKV_LOG_DEBUG,
                "vulkan loader %s: %s", kind, msg);
        return VK_FALSE;
    }
    pthread_mutex_lock(&g_vk.msg_lock);
    if (g_vk.messages++ == 0)
        snprintf(g_vk.first_message, sizeof g_vk.first_message, "%s%s [%s]: %s", kind, what, id, msg);
    pthread_mutex_unlock(&g_vk.msg_lock);
    pkv_log(PKV_LOG_WARN, "vulkan validation %s%s [%s]: %s", kind, what, id, msg);
    return VK_FALSE;
}

static bool instance_has_layer(const char *name) {
    uint32_t n = 0;
    if (vkEnumerateInstanceLayerProperties(&n, NULL) != VK_SUCCESS || n == 0) return false;
    VkLayerProperties *l = pkv_malloc(n * sizeof *l);
    if (!l) return false;
    bool found = false;
    if (vkEnumerateInstanceLayerProperties(&n, l) == VK_SUCCESS)
        for (uint32_t i = 0; i < n && !found; i++) found = strcmp(l[i].layerName, name) == 0;
    pkv_free(l);
    return found;
}

/* PKV_VK_VALIDATE=1 asks for the layer; without it installed the instance is
 * made without (validate_why says so): the layer is a check, not a requirement. */
static void validation_decide(void) {
    const char *v = getenv("PKV_VK_VALIDATE");
    if (!v || strcmp(v, "1") != 0) {
        snprintf(g_vk.validate_why, sizeof g_vk.validate_why, "not requested (PKV_VK_VALIDATE=1 turns it on)");
        return;
    }
    if (!instance_has_layer(PKV_VK_LAYER)) {
        snprintf(g_vk.validate_why, sizeof g_vk.validate_why,
                 "%s is not installed (Debian: vulkan-validationlayers)", PKV_VK_LAYER);
        return;
    }
    g_vk.validate = true;
}

static bool find_compute_queue(VkPhysicalDevice pd, uint32_t *fam) {
    uint32_t nq = 0;
    vkGetPhysicalDeviceQueueFamilyProperties(pd, &nq, NULL);
    if (nq == 0) return false;
    VkQueueFamilyProperties q[32];
    if (nq > 32) nq = 32;
    vkGetPhysicalDeviceQueueFamilyProperties(pd, &nq, q);
    /* Prefer a compute queue without graphics (dedicated compute), else any. */
    int best = -1;
    for (uint32_t i = 0; i < nq; i++) {
        if (!(q[i].queueFlags & VK_QUEUE_COMPUTE_BIT) || q[i].queueCount == 0) continue;
        if (best < 0 || !(q[i].queueFlags & VK_QUEUE_GRAPHICS_BIT)) best = (int)i;
    }
    if (best < 0) return false;
    *fam = (uint32_t)best;
    return true;
}

static void vk_discover(void) {
    const char *off = getenv("PKV_VK_DISABLE");
    if (off && strcmp(off, "1") == 0) {
        snprintf(g_vk.why, sizeof g_vk.why, "disabled by PKV_VK_DISABLE=1");
        snprintf(g_vk.validate_why, sizeof g_vk.validate_why, "Vulkan is disabled (PKV_VK_DISABLE=1)");
        return;
    }
    VkApplicationInfo app = {.sType = VK_STRUCTURE_TYPE_APPLICATION_INFO};
    app.pApplicationName = "pagekv";
    app.pEngineName = "pagekv";
    app.apiVersion = VK_API_VERSION_1_1;
    VkInstanceCreateInfo ici = {.sType = VK_STRUCTURE_TYPE_INSTANCE_CREATE_INFO};
    ici.pApplicationInfo = &app;
    validation_decide();
    const char *layers[1] = {PKV_VK_LAYER}, *iexts[1] = {VK_EXT_DEBUG_UTILS_EXTENSION_NAME};
    VkValidationFeatureEnableEXT enables[2] = {VK_VALIDATION_FEATURE_ENABLE_SYNCHRONIZATION_VALIDATION_EXT,
                                               VK_VALIDATION_FEATURE_ENABLE_BEST_PRACTICES_EXT};
    VkValidationFeaturesEXT vf = {.sType = VK_STRUCTURE_TYPE_VALIDATION_FEATURES_EXT};
    VkDebugUtilsMessengerCreateInfoEXT mci = {.sType = VK_STRUCTURE_TYPE_DEBUG_UTILS_MESSENGER_CREATE_INFO_EXT};
    mci.messageSeverity = VK_DEBUG_UTILS_MESSAGE_SEVERITY_WARNING_BIT_EXT | VK_DEBUG_UTILS_MESSAGE_SEVERITY_ERROR_BIT_EXT;
    mci.messageType = VK_DEBUG_UTILS_MESSAGE_TYPE_GENERAL_BIT_EXT | VK_DEBUG_UTILS_MESSAGE_TYPE_VALIDATION_BIT_EXT |
                      VK_DEBUG_UTILS_MESSAGE_TYPE_PERFORMANCE_BIT_EXT;
    mci.pfnUserCallback = vk_messenger;
    if (g_vk.validate) {
        /* The messenger in pNext also sees vkCreateInstance/vkDestroyInstance. */
        vf.enabledValidationFeatureCount = 2;
        vf.pEnabledValidationFeatures = enables;
        vf.pNext = &mci;
        ici.pNext = &vf;
        ici.enabledLayerCount = 1;
        ici.ppEnabledLayerNames = layers;
        ici.enabledExtensionCount = 1;
        ici.ppEnabledExtensionNames = iexts;
    }
    VkResult r = vkCreateInstance(&ici, NULL, &g_vk.instance);
    if (r != VK_SUCCESS && g_vk.validate) {
        snprintf(g_vk.validate_why, sizeof g_vk.validate_why, "vkCreateInstance with %s failed: %s", PKV_VK_LAYER,
                 pkv_vk_result_str(r));
        g_vk.validate = false;
        ici.pNext = NULL;
        ici.enabledLayerCount = ici.enabledExtensionCount = 0;
        r = vkCreateInstance(&ici, NULL, &g_vk.instance);
    }
    if (r == VK_SUCCESS && g_vk.validate) {
        PFN_vkCreateDebugUtilsMessengerEXT mk =
            (PFN_vkCreateDebugUtilsMessengerEXT)vkGetInstanceProcAddr(g_vk.instance, "vkCreateDebugUtilsMessengerEXT");
        if (!mk || mk(g_vk.instance, &mci, NULL, &g_vk.messenger) != VK_SUCCESS) {
            /* Without the messenger nothing would be counted: say so rather
             * than report zero messages. */
            snprintf(g_vk.validate_why, sizeof g_vk.validate_why, "vkCreateDebugUtilsMessengerEXT failed");
            g_vk.validate = false;
        }
    }
    if (r != VK_SUCCESS) {
        g_vk.instance = VK_NULL_HANDLE;
        snprintf(g_vk.why, sizeof g_vk.why, "no Vulkan driver found (vkCreateInstance: %s)", pkv_vk_result_str(r));
        return;
    }
    uint32_t np = 0;
    r = vkEnumeratePhysicalDevices(g_vk.instance, &np, NULL);
    if (r != VK_SUCCESS || np == 0) {
        snprintf(g_vk.why, sizeof g_vk.why, "no Vulkan device found (vkEnumeratePhysicalDevices: %s, %u devices)",
                 pkv_vk_result_str(r), np);
        return;
    }
    VkPhysicalDevice all[PKV_VK_MAX_DEVICES];
    if (np > PKV_VK_MAX_DEVICES) np = PKV_VK_MAX_DEVICES;
    r = vkEnumeratePhysicalDevices(g_vk.instance, &np, all);
    if (r != VK_SUCCESS && r != VK_INCOMPLETE) {
        snprintf(g_vk.why, sizeof g_vk.why, "vkEnumeratePhysicalDevices: %s", pkv_vk_result_str(r));
        return;
    }
    int skipped = 0;
    for (uint32_t i = 0; i < np; i++) {
        VkPhysicalDeviceProperties p;
        vkGetPhysicalDeviceProperties(all[i], &p);
        uint32_t fam;
        if (p.apiVersion < VK_API_VERSION_1_1 || !find_compute_queue(all[i], &fam)) {
            skipped++;
            continue;
        }
        g_vk.phys[g_vk.n++] = all[i];
    }
    if (g_vk.n == 0)
        snprintf(g_vk.why, sizeof g_vk.why, "%d Vulkan device(s) found, none with Vulkan 1.1 and a compute queue",
                 skipped);
}

static int g_vk_started; /* vk_discover has run (atomic): the instance exists or failed */

int64_t pkv_vulkan_validation(char *msg, size_t msg_size) {
    /* Asking must not start Vulkan in a process that never used it. */
    if (!__atomic_load_n(&g_vk_started, __ATOMIC_ACQUIRE)) {
        if (msg && msg_size) snprintf(msg, msg_size, "Vulkan was not used by this process");
        return -1;
    }
    if (!g_vk.validate) {
        if (msg && msg_size) snprintf(msg, msg_size, "%s", g_vk.validate_why);
        return -1;
    }
    pthread_mutex_lock(&g_vk.msg_lock);
    int64_t n = g_vk.messages;
    if (msg && msg_size) snprintf(msg, msg_size, "%s", g_vk.first_message);
    pthread_mutex_unlock(&g_vk.msg_lock);
    return n;
}

int pkv_vulkan_count(char *why, size_t why_size) {
    pthread_once(&g_vk.once, vk_discover);
    __atomic_store_n(&g_vk_started, 1, __ATOMIC_RELEASE);
    if (why && why_size) snprintf(why, why_size, "%s", g_vk.n ? "" : g_vk.why);
    return g_vk.n;
}

/* ------------------------------------------------------------------ memory */

static int find_type(const pkv_vk_ctx *c, uint32_t bits, VkMemoryPropertyFlags want) {
    for (uint32_t i = 0; i < c->memprops.memoryTypeCount; i++)
        if ((bits & (1u << i)) && (c->memprops.memoryTypes[i].propertyFlags & want) == want) return (int)i;
    return -1;
}

/* The staging buffer: an allocation of its own in host-visible memory. */
static pkv_status make_staging(pkv_vk_ctx *c, size_t size) {
    VkBufferCreateInfo bci = {.sType = VK_STRUCTURE_TYPE_BUFFER_CREATE_INFO};
    bci.size = size;
    bci.usage = VK_BUFFER_USAGE_TRANSFER_SRC_BIT | VK_BUFFER_USAGE_TRANSFER_DST_BIT;
    bci.sharingMode = VK_SHARING_MODE_EXCLUSIVE;
    VK_TRY(c, "vkCreateBuffer", vkCreateBuffer(c->dev, &bci, NULL, &c->stage_buf));
    VkMemoryRequirements req;
    vkGetBufferMemoryRequirements(c->dev, c->stage_buf, &req);
    pkv_status s = PKV_OK;
    if (!(req.memoryTypeBits & (1u << c->type_staging)))
        s = pkv_err(PKV_ERR_DEVICE, "%s: staging of %zu bytes cannot use memory type %u (allowed mask 0x%x)", c->name,
                    size, c->type_staging, req.memoryTypeBits);
    if (!s) s = pkv_vk_mem_raw(c, c->type_staging, req.size, &c->stage_mem);
    if (s) {
        vkDestroyBuffer(c->dev, c->stage_buf, NULL);
        c->stage_buf = VK_NULL_HANDLE;
        return s;
    }
    c->stage_mem_size = req.size;
    VkResult r = vkBindBufferMemory(c->dev, c->stage_buf, c->stage_mem, 0);
    if (r == VK_SUCCESS) r = vkMapMemory(c->dev, c->stage_mem, 0, VK_WHOLE_SIZE, 0, (void **)&c->stage_map);
    if (r != VK_SUCCESS) {
        pkv_vk_mem_raw_free(c, c->stage_mem, c->stage_mem_size);
        vkDestroyBuffer(c->dev, c->stage_buf, NULL);
        c->stage_buf = VK_NULL_HANDLE;
        c->stage_mem = VK_NULL_HANDLE;
        return pkv_vk_fail(c, "vkBindBufferMemory/vkMapMemory", r);
    }
    return PKV_OK;
}

static pkv_status vk_buffer_alloc(void *ctx, size_t size, void **handle) {
    pkv_vk_ctx *c = ctx;
    pkv_vk_buffer *b = pkv_calloc(1, sizeof *b);
    if (!b) return pkv_err(PKV_ERR_NOMEM, "%s: out of host memory for a buffer handle", c->name);
    VkBufferCreateInfo bci = {.sType = VK_STRUCTURE_TYPE_BUFFER_CREATE_INFO};
    bci.size = (size + 3) & ~(size_t)3;
    bci.usage = VK_BUFFER_USAGE_STORAGE_BUFFER_BIT | VK_BUFFER_USAGE_TRANSFER_SRC_BIT | VK_BUFFER_USAGE_TRANSFER_DST_BIT;
    bci.sharingMode = VK_SHARING_MODE_EXCLUSIVE;
    VkResult r = vkCreateBuffer(c->dev, &bci, NULL, &b->buf);
    if (r != VK_SUCCESS) {
        pkv_free(b);
        return pkv_vk_fail(c, "vkCreateBuffer", r);
    }
    pkv_status s = pkv_vk_mem_place(c, b->buf, c->type_local, c->direct, &b->place);
    if (s) {
        vkDestroyBuffer(c->dev, b->buf, NULL);
        pkv_free(b);
        return pkv_err_prefix(s, "%s: buffer of %zu bytes", c->name, size);
    }
    b->map = b->place.map;
    b->size = size;
    if (++c->n_buffers > c->peak_buffers) c->peak_buffers = c->n_buffers;
    *handle = b;
    return PKV_OK;
}

static void vk_buffer_free(void *ctx, void *handle) {
    pkv_vk_ctx *c = ctx;
    pkv_vk_buffer *b = handle;
    /* Queued work may still use the buffer: wait for it. A failure here leaves
     * nothing better to do than free anyway (the device is lost). */
    pkv_vk_sync(c);
    vkDestroyBuffer(c->dev, b->buf, NULL);
    pkv_vk_mem_release(c, &b->place);
    c->n_buffers--;
    pkv_free(b);
}

static void vk_memory_stats(void *ctx, pkv_device_memory_stats *out) {
    const pkv_vk_ctx *c = ctx;
    out->buffers = c->n_buffers;
    out->peak_buffers = c->peak_buffers;
    out->allocations = c->n_allocations;
    out->peak_allocations = c->peak_allocations;
    out->allocation_bytes = c->allocation_bytes;
    out->allocation_limit = c->limits.max_allocations;
}

/* ------------------------------------------------------------------- queue */

pkv_status pkv_vk_begin(pkv_vk_ctx *c) {
    if (!c->recording) {
        int i = c->cur;
        if (c->in_flight[i]) {
            VK_TRY(c, "vkWaitForFences", vkWaitForFences(c->dev, 1, &c->fence[i], VK_TRUE, UINT64_MAX));
            c->in_flight[i] = false;
        }
        VK_TRY(c, "vkResetFences", vkResetFences(c->dev, 1, &c->fence[i]));
        VK_TRY(c, "vkResetCommandPool", vkResetCommandPool(c->dev, c->cmd_pool[i], 0));
        if (c->desc_pool[i]) VK_TRY(c, "vkResetDescriptorPool", vkResetDescriptorPool(c->dev, c->desc_pool[i], 0));
        c->desc_sets = c->desc_count = 0;
        VkCommandBufferBeginInfo bi = {.sType = VK_STRUCTURE_TYPE_COMMAND_BUFFER_BEGIN_INFO};
        bi.flags = VK_COMMAND_BUFFER_USAGE_ONE_TIME_SUBMIT_BIT;
        VK_TRY(c, "vkBeginCommandBuffer", vkBeginCommandBuffer(c->cb[i], &bi));
        c->recording = true;
        c->n_cmds = 0;
    }
    /* Also before the first command of a command buffer: the barrier's first
     * scope then covers earlier submissions on this queue that may still run. */
    if (c->test_no_barrier) return PKV_OK;
    VkMemoryBarrier mb = {.sType = VK_STRUCTURE_TYPE_MEMORY_BARRIER};
    mb.srcAccessMask = VK_ACCESS_SHADER_WRITE_BIT | VK_ACCESS_TRANSFER_WRITE_BIT;
    mb.dstAccessMask = VK_ACCESS_SHADER_READ_BIT | VK_ACCESS_SHADER_WRITE_BIT | VK_ACCESS_TRANSFER_READ_BIT |
                       VK_ACCESS_TRANSFER_WRITE_BIT;
    VkPipelineStageFlags st = VK_PIPELINE_STAGE_COMPUTE_SHADER_BIT | VK_PIPELINE_STAGE_TRANSFER_BIT;
    vkCmdPipelineBarrier(c->cb[c->cur], st, st, 0, 1, &mb, 0, NULL, 0, NULL);
    return PKV_OK;
}

pkv_status pkv_vk_submit(pkv_vk_ctx *c) {
    if (!c->recording) return PKV_OK;
    int i = c->cur;
    /* Make device writes visible to host reads of mapped memory after the fence. */
    VkMemoryBarrier mb = {.sType = VK_STRUCTURE_TYPE_MEMORY_BARRIER};
    mb.srcAccessMask = VK_ACCESS_SHADER_WRITE_BIT | VK_ACCESS_TRANSFER_WRITE_BIT;
    mb.dstAccessMask = VK_ACCESS_HOST_READ_BIT;
    vkCmdPipelineBarrier(c->cb[i], VK_PIPELINE_STAGE_COMPUTE_SHADER_BIT | VK_PIPELINE_STAGE_TRANSFER_BIT,
                         VK_PIPELINE_STAGE_HOST_BIT, 0, 1, &mb, 0, NULL, 0, NULL);
    c->recording = false;
    VK_TRY(c, "vkEndCommandBuffer", vkEndCommandBuffer(c->cb[i]));
    VkSubmitInfo si = {.sType = VK_STRUCTURE_TYPE_SUBMIT_INFO};
    si.commandBufferCount = 1;
    si.pCommandBuffers = &c->cb[i];
    VK_TRY(c, "vkQueueSubmit", vkQueueSubmit(c->queue, 1, &si, c->fence[i]));
    c->in_flight[i] = true;
    c->cur = (i + 1) % PKV_VK_RING;
    return PKV_OK;
}

pkv_status pkv_vk_sync(pkv_vk_ctx *c) {
    pkv_status s = pkv_vk_submit(c);
    if (s) return s;
    for (int i = 0; i < PKV_VK_RING; i++) {
        if (!c->in_flight[i]) continue;
        VK_TRY(c, "vkWaitForFences", vkWaitForFences(c->dev, 1, &c->fence[i], VK_TRUE, UINT64_MAX));
        c->in_flight[i] = false;
    }
    c->stage_used = 0;
    return PKV_OK;
}

/* True when no work is recorded or running, so the host may touch mapped memory. */
static bool queue_idle(pkv_vk_ctx *c) {
    if (c->recording) return false;
    for (int i = 0; i < PKV_VK_RING; i++) {
        if (!c->in_flight[i]) continue;
        if (vkGetFenceStatus(c->dev, c->fence[i]) != VK_SUCCESS) return false;
        c->in_flight[i] = false;
    }
    c->stage_used = 0;
    return true;
}

static pkv_status vk_flush(void *ctx) { return pkv_vk_submit(ctx); }
static pkv_status vk_sync(void *ctx) { return pkv_vk_sync(ctx); }

/* ----------------------------------------------------------------- staging */

static void staging_release(pkv_vk_ctx *c) {
    if (!c->stage_buf) return;
    vkUnmapMemory(c->dev, c->stage_mem);
    vkDestroyBuffer(c->dev, c->stage_buf, NULL);
    pkv_vk_mem_raw_free(c, c->stage_mem, c->stage_mem_size);
    c->stage_buf = VK_NULL_HANDLE;
    c->stage_mem = VK_NULL_HANDLE;
    c->stage_map = NULL;
    c->stage_cap = c->stage_used = 0;
}

/* Reserve n (<= PKV_VK_STAGING_MAX) bytes of staging at *off; may wait for the
 * queue to drain (the space is reclaimed only when idle) and grow the buffer. */
static pkv_status staging_get(pkv_vk_ctx *c, size_t n, size_t *off) {
    size_t start = (c->stage_used + 15) & ~(size_t)15;
    if (c->stage_buf && start + n <= c->stage_cap) {
        *off = start;
        c->stage_used = start + n;
        return PKV_OK;
    }
    pkv_status s = pkv_vk_sync(c);
    if (s) return s;
    if (n > c->stage_cap) {
        size_t cap = PKV_MAX(PKV_MAX(n, 2 * c->stage_cap), PKV_VK_STAGING_MIN);
        if (cap > PKV_VK_STAGING_MAX) cap = PKV_MAX(n, PKV_VK_STAGING_MAX);
        staging_release(c);
        s = make_staging(c, cap);
        if (s) return pkv_err_prefix(s, "%s: staging buffer of %zu bytes", c->name, cap);
        c->stage_cap = cap;
    }
    *off = 0;
    c->stage_used = n;
    return PKV_OK;
}

static void record_copy(pkv_vk_ctx *c, VkBuffer src, size_t soff, VkBuffer dst, size_t doff, size_t n) {
    VkBufferCopy r = {soff, doff, n};
    vkCmdCopyBuffer(c->cb[c->cur], src, dst, 1, &r);
    c->n_cmds++;
}

/* --------------------------------------------------------------- transfers */

static pkv_status vk_write(void *ctx, void *dst, size_t off, const void *src, size_t n) {
    pkv_vk_ctx *c = ctx;
    pkv_vk_buffer *b = dst;
    if (b->map && queue_idle(c)) {
        memcpy(b->map + off, src, n);
        return PKV_OK;
    }
    for (size_t done = 0; done < n;) {
        size_t k = PKV_MIN(n - done, PKV_VK_STAGING_MAX), so = 0;
        pkv_status s = staging_get(c, k, &so);
        if (!s) s = pkv_vk_begin(c);
        if (s) return pkv_err_prefix(s, "%s: write of %zu bytes at offset %zu", c->name, n, off);
        memcpy(c->stage_map + so, (const uint8_t *)src + done, k);
        record_copy(c, c->stage_buf, so, b->buf, off + done, k);
        done += k;
    }
    return PKV_OK;
}

static pkv_status vk_read(void *ctx, void *src, size_t off, void *dst, size_t n) {
    pkv_vk_ctx *c = ctx;
    pkv_vk_buffer *b = src;
    pkv_status s;
    if (b->map) {
        if ((s = pkv_vk_sync(c))) return pkv_err_prefix(s, "%s: read of %zu bytes at offset %zu", c->name, n, off);
        memcpy(dst, b->map + off, n);
        return PKV_OK;
    }
    for (size_t done = 0; done < n;) {
        size_t k = PKV_MIN(n - done, PKV_VK_STAGING_MAX), so = 0;
        s = staging_get(c, k, &so);
        if (!s) s = pkv_vk_begin(c);
        if (!s) {
            record_copy(c, b->buf, off + done, c->stage_buf, so, k);
            s = pkv_vk_sync(c);
        }
        if (s) return pkv_err_prefix(s, "%s: read of %zu bytes at offset %zu", c->name, n, off);
        memcpy((uint8_t *)dst + done, c->stage_map + so, k);
        done += k;
    }
    return PKV_OK;
}

static pkv_status vk_fill(void *ctx, void *dst, size_t off, size_t n, uint8_t value) {
    pkv_vk_ctx *c = ctx;
    pkv_vk_buffer *b = dst;
    if (b->map && queue_idle(c)) {
        memset(b->map + off, value, n);
        return PKV_OK;
    }
    size_t mid0 = (off + 3) & ~(size_t)3, end = off + n, mid1 = end & ~(size_t)3;
    if (mid0 >= mid1) mid0 = mid1 = end; /* no aligned word inside: all bytes are "head" */
    size_t head = mid0 - off, tail = end - mid1;
    pkv_status s;
    if (head || tail) {
        size_t so = 0;
        if ((s = staging_get(c, head + tail, &so)) || (s = pkv_vk_begin(c)))
            return pkv_err_prefix(s, "%s: fill of %zu bytes at offset %zu", c->name, n, off);
        memset(c->stage_map + so, value, head + tail);
        if (head) record_copy(c, c->stage_buf, so, b->buf, off, head);
        if (tail) {
            if ((s = pkv_vk_begin(c))) return s;
            record_copy(c, c->stage_buf, so + head, b->buf, mid1, tail);
        }
    }
    if (mid1 > mid0) {
        if ((s = pkv_vk_begin(c))) return s;
        uint32_t word = value * 0x01010101u;
        vkCmdFillBuffer(c->cb[c->cur], b->buf, mid0, mid1 - mid0, word);
        c->n_cmds++;
    }
    return PKV_OK;
}

static pkv_status vk_copy(void *ctx, void *src, size_t src_off, void *dst, size_t dst_off, size_t n) {
    pkv_vk_ctx *c = ctx;
    pkv_status s = pkv_vk_begin(c);
    if (s) return s;
    record_copy(c, ((pkv_vk_buffer *)src)->buf, src_off, ((pkv_vk_buffer *)dst)->buf, dst_off, n);
    return PKV_OK;
}

static pkv_status vk_copy_regions(void *ctx, void *src, void *dst, const pkv_region *r, size_t n) {
    pkv_vk_ctx *c = ctx;
    VkBufferCopy *v = pkv_malloc(n * sizeof *v);
    if (!v) return pkv_err(PKV_ERR_NOMEM, "%s: copy_regions: no host memory for %zu regions", c->name, n);
    uint32_t k = 0;
    for (size_t i = 0; i < n; i++) {
        if (!r[i].size) continue;
        v[k].srcOffset = r[i].src_off;
        v[k].dstOffset = r[i].dst_off;
        v[k].size = r[i].size;
        k++;
    }
    pkv_status s = PKV_OK;
    if (k) {
        s = pkv_vk_begin(c);
        if (!s) {
            vkCmdCopyBuffer(c->cb[c->cur], ((pkv_vk_buffer *)src)->buf, ((pkv_vk_buffer *)dst)->buf, k, v);
            c->n_cmds++;
        }
    }
    pkv_free(v);
    return s;
}

/* ---------------------------------------------------------------- lifetime */

static const uint32_t k_grid_words[] = {PKV_IQ2XXS_GRID, PKV_IQ2XS_GRID, PKV_IQ2S_GRID,
                                        PKV_IQ3XXS_GRID, PKV_IQ3S_GRID, PKV_IQ1S_GRID};

pkv_status pkv_vk_grids(pkv_vk_ctx *c, pkv_buffer **out) {
    if (!c->grids) {
        void *h = NULL;
        pkv_status s = vk_buffer_alloc(c, sizeof k_grid_words, &h);
        if (!s) s = vk_write(c, h, 0, k_grid_words, sizeof k_grid_words);
        if (s) {
            if (h) vk_buffer_free(c, h);
            return pkv_err_prefix(s, "%s: the i-quant grid table", c->name);
        }
        c->grids = h;
        c->grids_ref.handle = h;
        c->grids_ref.size = sizeof k_grid_words;
    }
    *out = &c->grids_ref;
    return PKV_OK;
}

static void vk_destroy(void *ctx) {
    pkv_vk_ctx *c = ctx;
    if (!c) return;
    if (c->dev) {
        vkDeviceWaitIdle(c->dev);
        if (c->grids) vk_buffer_free(c, c->grids);
        pkv_vk_pipelines_destroy(c);
        staging_release(c);
        pkv_vk_mem_destroy(c);
        for (int i = 0; i < PKV_VK_RING; i++) {
            if (c->fence[i]) vkDestroyFence(c->dev, c->fence[i], NULL);
            if (c->desc_pool[i]) vkDestroyDescriptorPool(c->dev, c->desc_pool[i], NULL);
        }
        for (int i = 0; i < PKV_VK_RING; i++)
            if (c->cmd_pool[i]) vkDestroyCommandPool(c->dev, c->cmd_pool[i], NULL);
        vkDestroyDevice(c->dev, NULL);
    }
    pkv_free(c);
}

static const pkv_backend_ops vk_ops = {
    .version = PKV_BACKEND_VERSION,
    .destroy = vk_destroy,
    .buffer_alloc = vk_buffer_alloc,
    .buffer_free = vk_buffer_free,
    .write = vk_write,
    .read = vk_read,
    .fill = vk_fill,
    .copy = vk_copy,
    .copy_regions = vk_copy_regions,
    .flush = vk_flush,
    .sync = vk_sync,
    .kernels = &pkv_vk_kernel_ops,
    .memory_stats = vk_memory_stats,
};

static bool has_extension(VkPhysicalDevice pd, const char *name) {
    uint32_t n = 0;
    if (vkEnumerateDeviceExtensionProperties(pd, NULL, &n, NULL) != VK_SUCCESS || n == 0) return false;
    VkExtensionProperties *e = pkv_malloc(n * sizeof *e);
    if (!e) return false;
    bool found = false;
    if (vkEnumerateDeviceExtensionProperties(pd, NULL, &n, e) == VK_SUCCESS)
        for (uint32_t i = 0; i < n && !found; i++) found = strcmp(e[i].extensionName, name) == 0;
    pkv_free(e);
    return found;
}

static pkv_status vk_open(pkv_vk_ctx *c, int index, pkv_device_caps *caps) {
    c->phys = g_vk.phys[index];
    vkGetPhysicalDeviceProperties(c->phys, &c->props);
    vkGetPhysicalDeviceMemoryProperties(c->phys, &c->memprops);
    if (!find_compute_queue(c->phys, &c->qfam))
        return pkv_err(PKV_ERR_DEVICE, "%s: no compute queue", c->name);

    const char *nb = getenv("PKV_VK_TEST_NO_BARRIER");
    c->test_no_barrier = nb && strcmp(nb, "1") == 0;
    const char *np = getenv("PKV_VK_NO_PUSH_DESCRIPTOR");
    bool push = !(np && strcmp(np, "1") == 0) && has_extension(c->phys, VK_KHR_PUSH_DESCRIPTOR_EXTENSION_NAME);
    float prio = 1.0f;
    VkDeviceQueueCreateInfo qci = {.sType = VK_STRUCTURE_TYPE_DEVICE_QUEUE_CREATE_INFO};
    qci.queueFamilyIndex = c->qfam;
    qci.queueCount = 1;
    qci.pQueuePriorities = &prio;
    const char *exts[1] = {VK_KHR_PUSH_DESCRIPTOR_EXTENSION_NAME};
    VkDeviceCreateInfo dci = {.sType = VK_STRUCTURE_TYPE_DEVICE_CREATE_INFO};
    dci.queueCreateInfoCount = 1;
    dci.pQueueCreateInfos = &qci;
    dci.enabledExtensionCount = push ? 1 : 0;
    dci.ppEnabledExtensionNames = exts;
    VK_TRY(c, "vkCreateDevice", vkCreateDevice(c->phys, &dci, NULL, &c->dev));
    vkGetDeviceQueue(c->dev, c->qfam, 0, &c->queue);
    if (push)
        c->push_descriptor =
            (PFN_vkCmdPushDescriptorSetKHR)vkGetDeviceProcAddr(c->dev, "vkCmdPushDescriptorSetKHR");

    /* Memory types: probe with a small buffer for the allowed type bits. */
    VkBuffer probe;
    VkBufferCreateInfo bci = {.sType = VK_STRUCTURE_TYPE_BUFFER_CREATE_INFO};
    bci.size = 4096;
    bci.usage = VK_BUFFER_USAGE_STORAGE_BUFFER_BIT | VK_BUFFER_USAGE_TRANSFER_SRC_BIT |
                VK_BUFFER_USAGE_TRANSFER_DST_BIT;
    VK_TRY(c, "vkCreateBuffer", vkCreateBuffer(c->dev, &bci, NULL, &probe));
    VkMemoryRequirements req;
    vkGetBufferMemoryRequirements(c->dev, probe, &req);
    vkDestroyBuffer(c->dev, probe, NULL);
    const VkMemoryPropertyFlags LOCAL = VK_MEMORY_PROPERTY_DEVICE_LOCAL_BIT,
                                HOSTC = VK_MEMORY_PROPERTY_HOST_VISIBLE_BIT | VK_MEMORY_PROPERTY_HOST_COHERENT_BIT;
    bool unified_kind = c->props.deviceType == VK_PHYSICAL_DEVICE_TYPE_INTEGRATED_GPU ||
                        c->props.deviceType == VK_PHYSICAL_DEVICE_TYPE_CPU;
    const char *force = getenv("PKV_VK_FORCE_STAGING");
    bool force_staging = force && strcmp(force, "1") == 0;
    int tl = -1;
    if (unified_kind && !force_staging) {
        tl = find_type(c, req.memoryTypeBits, LOCAL | HOSTC);
        c->direct = tl >= 0;
    }
    if (tl < 0) tl = find_type(c, req.memoryTypeBits, LOCAL);
    if (tl < 0) tl = find_type(c, req.memoryTypeBits, 0);
    int ts = find_type(c, req.memoryTypeBits, HOSTC | VK_MEMORY_PROPERTY_HOST_CACHED_BIT);
    if (ts < 0) ts = find_type(c, req.memoryTypeBits, HOSTC);
    if (tl < 0 || ts < 0)
        return pkv_err(PKV_ERR_DEVICE, "%s: no usable memory type (device-local %d, host-visible coherent %d)",
                       c->name, tl, ts);
    c->type_local = (uint32_t)tl;
    c->type_staging = (uint32_t)ts;

    VkCommandPoolCreateInfo pci = {.sType = VK_STRUCTURE_TYPE_COMMAND_POOL_CREATE_INFO};
    pci.flags = VK_COMMAND_POOL_CREATE_TRANSIENT_BIT;
    pci.queueFamilyIndex = c->qfam;
    for (int i = 0; i < PKV_VK_RING; i++) {
        VK_TRY(c, "vkCreateCommandPool", vkCreateCommandPool(c->dev, &pci, NULL, &c->cmd_pool[i]));
        VkCommandBufferAllocateInfo cai = {.sType = VK_STRUCTURE_TYPE_COMMAND_BUFFER_ALLOCATE_INFO};
        cai.commandPool = c->cmd_pool[i];
        cai.level = VK_COMMAND_BUFFER_LEVEL_PRIMARY;
        cai.commandBufferCount = 1;
        VK_TRY(c, "vkAllocateCommandBuffers", vkAllocateCommandBuffers(c->dev, &cai, &c->cb[i]));
    }
    VkFenceCreateInfo fci = {.sType = VK_STRUCTURE_TYPE_FENCE_CREATE_INFO};
    for (int i = 0; i < PKV_VK_RING; i++) VK_TRY(c, "vkCreateFence", vkCreateFence(c->dev, &fci, NULL, &c->fence[i]));
    if (!c->push_descriptor) {
        /* Without push descriptors: one pool per command buffer, reset when the
         * command buffer is reused (see pkv_vk_begin). */
        VkDescriptorPoolSize ps = {VK_DESCRIPTOR_TYPE_STORAGE_BUFFER, PKV_VK_POOL_DESCRIPTORS};
        VkDescriptorPoolCreateInfo dpi = {.sType = VK_STRUCTURE_TYPE_DESCRIPTOR_POOL_CREATE_INFO};
        dpi.maxSets = PKV_VK_POOL_SETS;
        dpi.poolSizeCount = 1;
        dpi.pPoolSizes = &ps;
        for (int i = 0; i < PKV_VK_RING; i++)
            VK_TRY(c, "vkCreateDescriptorPool", vkCreateDescriptorPool(c->dev, &dpi, NULL, &c->desc_pool[i]));
    }

    memset(caps, 0, sizeof *caps);
    snprintf(caps->name, sizeof caps->name, "%s", c->name);
    snprintf(caps->description, sizeof caps->description, "%.127s", c->props.deviceName);
    caps->kind = PKV_DEVICE_VULKAN;
    uint32_t heap = c->memprops.memoryTypes[c->type_local].heapIndex;
    caps->memory_bytes = c->memprops.memoryHeaps[heap].size;
    /* One buffer is one allocation; kernels bind windows of at most
     * maxStorageBufferRange bytes of it. */
    VkPhysicalDeviceSubgroupProperties sg = {.sType = VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_SUBGROUP_PROPERTIES};
    VkPhysicalDeviceMaintenance3Properties m3 = {.sType = VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_MAINTENANCE_3_PROPERTIES};
    VkPhysicalDeviceProperties2 p2 = {.sType = VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_PROPERTIES_2};
    p2.pNext = &m3;
    m3.pNext = &sg;
    vkGetPhysicalDeviceProperties2(c->phys, &p2);
    uint64_t maxb = m3.maxMemoryAllocationSize ? m3.maxMemoryAllocationSize : c->props.limits.maxStorageBufferRange;
    caps->max_buffer_bytes = (size_t)maxb;
    const char *nsg = getenv("PKV_VK_NO_SUBGROUP");
    c->subgroup_arith = !(nsg && strcmp(nsg, "1") == 0) && (sg.supportedStages & VK_SHADER_STAGE_COMPUTE_BIT) &&
                        (sg.supportedOperations & VK_SUBGROUP_FEATURE_ARITHMETIC_BIT) && sg.subgroupSize >= 1;
    caps->transfer_align = 4;
    c->max_allocation_bytes = maxb;
    const VkPhysicalDeviceLimits *L = &c->props.limits;
    c->limits = (pkv_vk_limits){.name = "driver",
                                .storage_align = L->minStorageBufferOffsetAlignment,
                                .max_range = L->maxStorageBufferRange,
                                .max_allocations = L->maxMemoryAllocationCount,
                                .max_invocations = L->maxComputeWorkGroupInvocations,
                                .max_shared = L->maxComputeSharedMemorySize,
                                .subgroup_min = sg.subgroupSize,
                                .subgroup_max = sg.subgroupSize,
                                .int16 = true,
                                .int8 = true};
    pkv_status ls = pkv_vk_limits_apply(c);
    if (ls) return ls;
    pkv_vk_limits_describe(c, sg.subgroupSize, caps->limits, sizeof caps->limits);
    /* The subgroup shaders stride over the lanes of full subgroups of a
     * 64-invocation workgroup: sizes that do not divide 64 take the portable
     * shaders. */
    if (sg.subgroupSize == 0 || sg.subgroupSize > 64 || 64 % sg.subgroupSize != 0) c->subgroup_arith = false;
    c->max_range = c->limits.max_range;
    const char *mr = getenv("PKV_VK_MAX_RANGE");
    if (mr && strtoull(mr, NULL, 10) >= 1024 && strtoull(mr, NULL, 10) < c->max_range)
        c->max_range = strtoull(mr, NULL, 10);
    caps->host_memory = c->direct;
    caps->batch_invariant = true; /* rows are independent in every shader (tested on lavapipe) */
    return PKV_OK;
}

pkv_status pkv_vulkan_backend_create(const char *name, int index, pkv_device_params params,
                                     const pkv_backend_ops **ops, void **ctx, pkv_device_caps *caps) {
    (void)params;
    char why[256];
    int n = pkv_vulkan_count(why, sizeof why);
    if (index < 0 || index >= n)
        return pkv_err(PKV_ERR_NOT_FOUND, "no Vulkan device %d (%d found%s%s)", index, n, n ? "" : ": ", why);
    pkv_vk_ctx *c = pkv_calloc(1, sizeof *c);
    if (!c) return pkv_err(PKV_ERR_NOMEM, "opening %s: out of memory", name);
    snprintf(c->name, sizeof c->name, "%s", name);
    pkv_status s = vk_open(c, index, caps);
    if (s) {
        vk_destroy(c);
        return pkv_err_prefix(s, "opening %s", name);
    }
    *ops = &vk_ops;
    *ctx = c;
    return PKV_OK;
}
