/* Vulkan kernels: one compute pipeline per kernel from the embedded SPIR-V
 * (shaders/<kernel>.comp), created on first use, dispatched into the current command
 * buffer (see vulkan.c for the queue model) with push descriptors, or with
 * descriptor sets from a per-command-buffer pool where the driver lacks them
 * (PKV_VK_NO_PUSH_DESCRIPTOR=1 forces that path for tests).
 *
 * Shaders see every argument as an array of 32-bit words and address it in bytes:
 * the host binds a window of the buffer starting at the argument's offset rounded
 * down to minStorageBufferOffsetAlignment and passes the remainder in push
 * constants. Hence the alignment rule for kernel arguments (transfers take any
 * offset): f32 and i32 tensors (and their strides) at multiples of 4 bytes, f16,
 * bf16 and quantized (q8_0, q4_0, k-quants, q4_1 .. tq2_0) data at multiples of 2, mxfp4
 * weights (17-byte blocks, no 16-bit fields) at any offset; anything else returns
 * PKV_ERR_UNSUPPORTED naming the argument. A window is at most
 * maxStorageBufferRange bytes (128 MiB on lavapipe): matmul and get_rows split
 * bigger weights and batches into chunks of rows (one dispatch each); attention
 * and set_rows bind a KV pool bigger than that as up to four windows of whole
 * pages / rows (attention_win, set_rows_win: the same shaders compiled with
 * KV_WINDOWED); for other kernels a bigger argument is PKV_ERR_UNSUPPORTED
 * (PKV_VK_MAX_RANGE=BYTES, read at open, lowers the range for tests). Attention needs dk <= 576 and
 * dv <= 512 (DeepSeek's latent row); the re-rotation of quantized (q8_0, q4_0) K needs head_dim <= 512.
 * KV pages of every KV type (f32, f16, q8_0, q4_0: kvq.glsl) are read and written
 * in place by set_rows, rope and attention. The recurrent kernels (ssm_conv,
 * delta_net, ssm_scan) bind the whole slot pool of a call as one argument (slots are picked
 * on the device), so the pool must fit one window; delta_net needs d_k <= 256,
 * ssm_scan d_state <= 256. */
#include "device/vulkan/vulkan-impl.h"

#include "base/quant.h"

#include <stdio.h>
#include <string.h>


static const struct {
    const char *name;
} kinfo[PKV_VK_K_COUNT] = {
#define KINFO(id, name) [PKV_VK_K_##id] = {#name},
    PKV_VK_PIPELINES(KINFO)
#undef KINFO
};

#define WG 64u      /* local_size_x of every shader */
#define MM_TILE 4u  /* x rows per matmul workgroup (NT in matmul.comp) */
#define SG_TILE 8u  /* x rows per matmul_sg workgroup (NT in matmul_sg.comp) */
#define SG_ROWS 8u  /* weight rows per matmul_sg workgroup (RPW) */
#define PC_BYTES 128 /* push-constant range: the guaranteed minimum */
#define MAX_BINDINGS 13 /* attention: q, k, v, out, meta, sinks, q_win, three more windows of k and of v */
#define KV_WINDOWS 4u   /* windows of one K or V pool (kvq.glsl) */

void pkv_vk_pipelines_destroy(pkv_vk_ctx *c) {
    for (int i = 0; i < PKV_VK_K_COUNT; i++) {
        pkv_vk_pipeline *p = &c->pipes[i];
        if (p->pipe) vkDestroyPipeline(c->dev, p->pipe, NULL);
        if (p->layout) vkDestroyPipelineLayout(c->dev, p->layout, NULL);
        if (p->dsl) vkDestroyDescriptorSetLayout(c->dev, p->dsl, NULL);
        if (p->module) vkDestroyShaderModule(c->dev, p->module, NULL);
        memset(p, 0, sizeof *p);
    }
}

/* The pipeline of shader k, made on its first dispatch with n_bindings storage
 * buffers (bindings 0 .. n_bindings - 1); every later dispatch must pass as many. */
static pkv_status pipeline_get(pkv_vk_ctx *c, pkv_vk_kernel k, int n_bindings, pkv_vk_pipeline **out) {
    pkv_vk_pipeline *p = &c->pipes[k];
    *out = p;
    if (p->pipe && p->n_bindings != n_bindings)
        return pkv_err(PKV_ERR_INTERNAL, "%s: kernel %s dispatched with %d buffers, its pipeline has %d", c->name,
                       kinfo[k].name, n_bindings, p->n_bindings);
    if (p->pipe) return PKV_OK;
    const pkv_spirv *sp = NULL;
    for (int i = 0; i < pkv_vk_shader_count; i++)
        if (pkv_vk_shaders[i].name && strcmp(pkv_vk_shaders[i].name, kinfo[k].name) == 0) sp = &pkv_vk_shaders[i];
    if (!sp) return pkv_err(PKV_ERR_INTERNAL, "%s: shader %s is not embedded in this build", c->name, kinfo[k].name);
    pkv_status ps = pkv_vk_shader_admit(c, kinfo[k].name, sp->code, sp->bytes);
    if (ps) return ps;
    VkResult r;
    const char *call = "vkCreateShaderModule";
    VkShaderModuleCreateInfo smi = {.sType = VK_STRUCTURE_TYPE_SHADER_MODULE_CREATE_INFO};
    smi.codeSize = sp->bytes;
    smi.pCode = sp->code;
    if ((r = vkCreateShaderModule(c->dev, &smi, NULL, &p->module))) goto fail;
    VkDescriptorSetLayoutBinding b[MAX_BINDINGS];
    for (int i = 0; i < n_bindings; i++) {
        b[i] = (VkDescriptorSetLayoutBinding){.binding = (uint32_t)i,
                                              .descriptorType = VK_DESCRIPTOR_TYPE_STORAGE_BUFFER,
                                              .descriptorCount = 1,
                                              .stageFlags = VK_SHADER_STAGE_COMPUTE_BIT};
    }
    VkDescriptorSetLayoutCreateInfo dli = {.sType = VK_STRUCTURE_TYPE_DESCRIPTOR_SET_LAYOUT_CREATE_INFO};
    dli.flags = c->push_descriptor ? VK_DESCRIPTOR_SET_LAYOUT_CREATE_PUSH_DESCRIPTOR_BIT_KHR : 0;
    dli.bindingCount = (uint32_t)n_bindings;
    dli.pBindings = b;
    call = "vkCreateDescriptorSetLayout";
    if ((r = vkCreateDescriptorSetLayout(c->dev, &dli, NULL, &p->dsl))) goto fail;
    VkPushConstantRange pcr = {VK_SHADER_STAGE_COMPUTE_BIT, 0, PC_BYTES};
    VkPipelineLayoutCreateInfo pli = {.sType = VK_STRUCTURE_TYPE_PIPELINE_LAYOUT_CREATE_INFO};
    pli.setLayoutCount = 1;
    pli.pSetLayouts = &p->dsl;
    pli.pushConstantRangeCount = 1;
    pli.pPushConstantRanges = &pcr;
    call = "vkCreatePipelineLayout";
    if ((r = vkCreatePipelineLayout(c->dev, &pli, NULL, &p->layout))) goto fail;
    VkComputePipelineCreateInfo cpi = {.sType = VK_STRUCTURE_TYPE_COMPUTE_PIPELINE_CREATE_INFO};
    cpi.stage.sType = VK_STRUCTURE_TYPE_PIPELINE_SHADER_STAGE_CREATE_INFO;
    cpi.stage.stage = VK_SHADER_STAGE_COMPUTE_BIT;
    cpi.stage.module = p->module;
    cpi.stage.pName = "main";
    cpi.layout = p->layout;
    call = "vkCreateComputePipelines";
    if ((r = vkCreateComputePipelines(c->dev, VK_NULL_HANDLE, 1, &cpi, NULL, &p->pipe))) goto fail;
    p->n_bindings = n_bindings;
    return PKV_OK;
fail:
    if (p->layout) vkDestroyPipelineLayout(c->dev, p->layout, NULL);
    if (p->dsl) vkDestroyDescriptorSetLayout(c->dev, p->dsl, NULL);
    if (p->module) vkDestroyShaderModule(c->dev, p->module, NULL);
    memset(p, 0, sizeof *p);
    pkv_vk_fail(c, call, r);
    return pkv_err_prefix(PKV_ERR_DEVICE, "kernel %s", kinfo[k].name);
}

/* One kernel argument: a tensor of `bytes` bytes at t, whose offset must be a
 * multiple of `align`. */
typedef struct {
    const char *name;
    pkv_tref t;
    uint64_t bytes;
    unsigned align;
} varg;

/* Record one dispatch of `groups` workgroups. pc[0..nargs) receive the byte
 * offsets of the arguments inside their bound windows; the rest of pc is the
 * kernel's parameters. Nothing is recorded when an argument is rejected. */
static pkv_status dispatch(pkv_vk_ctx *c, pkv_vk_kernel k, const varg *a, int nargs, uint32_t *pc, int pc_words,
                           uint64_t groups) {
    const char *kn = kinfo[k].name;
    if (nargs < 1 || nargs > MAX_BINDINGS)
        return pkv_err(PKV_ERR_INTERNAL, "%s: kernel %s dispatched with %d buffers (1 to %d)", c->name, kn, nargs,
                       MAX_BINDINGS);
    VkDescriptorBufferInfo bi[MAX_BINDINGS];
    VkWriteDescriptorSet w[MAX_BINDINGS];
    uint64_t malign = c->limits.storage_align;
    if (malign < 4) malign = 4;
    for (int i = 0; i < nargs; i++) {
        const pkv_vk_buffer *b = a[i].t.buf->handle;
        size_t off = a[i].t.off;
        if (off % a[i].align)
            return pkv_err(PKV_ERR_UNSUPPORTED,
                           "kernel %s on %s: argument %s at byte offset %zu is not a multiple of %u (Vulkan kernels "
                           "need %u-byte aligned tensors; transfers accept any offset)",
                           kn, c->name, a[i].name, off, a[i].align, a[i].align);
        uint64_t base = off / malign * malign;
        uint64_t padded = (b->size + 3) & ~(uint64_t)3;
        uint64_t range = (off + a[i].bytes - base + 3) & ~(uint64_t)3;
        if (range > padded - base) range = padded - base;
        if (range > c->max_range)
            return pkv_err(PKV_ERR_UNSUPPORTED,
                           "kernel %s on %s: argument %s spans %llu bytes, more than the device's storage buffer "
                           "range of %llu bytes",
                           kn, c->name, a[i].name, (unsigned long long)range, (unsigned long long)c->max_range);
        pc[i] = (uint32_t)(off - base);
        bi[i] = (VkDescriptorBufferInfo){b->buf, base, range};
        w[i] = (VkWriteDescriptorSet){.sType = VK_STRUCTURE_TYPE_WRITE_DESCRIPTOR_SET,
                                      .dstBinding = (uint32_t)i,
                                      .descriptorCount = 1,
                                      .descriptorType = VK_DESCRIPTOR_TYPE_STORAGE_BUFFER,
                                      .pBufferInfo = &bi[i]};
    }
    uint64_t gx_max = c->props.limits.maxComputeWorkGroupCount[0];
    uint64_t gx = groups < gx_max ? groups : gx_max, gy = (groups + gx - 1) / gx;
    if (gy > c->props.limits.maxComputeWorkGroupCount[1])
        return pkv_err(PKV_ERR_UNSUPPORTED, "kernel %s on %s: %llu workgroups exceed the device's grid", kn, c->name,
                       (unsigned long long)groups);
    pkv_vk_pipeline *p;
    pkv_status s = pipeline_get(c, k, nargs, &p);
    if (!s) s = pkv_vk_begin(c);
    if (s) return s;
    VkDescriptorSet set = VK_NULL_HANDLE;
    if (!c->push_descriptor) {
        /* A set from this command buffer's pool; when the pool is used up,
         * submit and continue in the next command buffer (order is kept: one
         * queue). */
        if (c->desc_sets + 1 > PKV_VK_POOL_SETS || c->desc_count + p->n_bindings > PKV_VK_POOL_DESCRIPTORS) {
            if ((s = pkv_vk_submit(c)) || (s = pkv_vk_begin(c))) return s;
        }
        VkDescriptorSetAllocateInfo dai = {.sType = VK_STRUCTURE_TYPE_DESCRIPTOR_SET_ALLOCATE_INFO};
        dai.descriptorSetCount = 1;
        dai.pSetLayouts = &p->dsl;
        dai.descriptorPool = c->desc_pool[c->cur];
        VkResult r = vkAllocateDescriptorSets(c->dev, &dai, &set);
        if (r != VK_SUCCESS) return pkv_vk_fail(c, "vkAllocateDescriptorSets", r);
        c->desc_sets++;
        c->desc_count += p->n_bindings;
        for (int i = 0; i < nargs; i++) w[i].dstSet = set;
        vkUpdateDescriptorSets(c->dev, (uint32_t)nargs, w, 0, NULL);
    }
    VkCommandBuffer cb = c->cb[c->cur];
    vkCmdBindPipeline(cb, VK_PIPELINE_BIND_POINT_COMPUTE, p->pipe);
    if (c->push_descriptor)
        c->push_descriptor(cb, VK_PIPELINE_BIND_POINT_COMPUTE, p->layout, 0, (uint32_t)nargs, w);
    else
        vkCmdBindDescriptorSets(cb, VK_PIPELINE_BIND_POINT_COMPUTE, p->layout, 0, 1, &set, 0, NULL);
    vkCmdPushConstants(cb, p->layout, VK_SHADER_STAGE_COMPUTE_BIT, 0, (uint32_t)pc_words * 4, pc);
    vkCmdDispatch(cb, (uint32_t)gx, (uint32_t)gy, 1);
    c->n_cmds++;
    return PKV_OK;
}

static uint32_t fbits(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    return u;
}

/* Shape values travel as 32-bit words; larger ones are rejected. */
static pkv_status fits(pkv_vk_ctx *c, const char *kn, const char *what, uint64_t v) {
    if (v > UINT32_MAX)
        return pkv_err(PKV_ERR_UNSUPPORTED, "kernel %s on %s: %s = %llu exceeds 32 bits", kn, c->name, what,
                       (unsigned long long)v);
    return PKV_OK;
}

#define TRY(x)                                                                             \
    do {                                                                                   \
        pkv_status _s = (x);                                                               \
        if (_s) return _s;                                                                 \
    } while (0)
#define CDIV(a, b) (((a) + (b) - 1) / (b))

/* The types with an integer form (q4_1 .. tq2_0) run on matmul_int/get_rows_int,
 * the generic dequantize-then-multiply shaders (weights_int.glsl). */
static bool int_type(pkv_type t) { return pkv_qblock_decoder(t) != NULL; }

static bool vk_supports_type(void *ctx, pkv_type t) {
    (void)ctx;
    return t == PKV_TYPE_F32 || t == PKV_TYPE_F16 || t == PKV_TYPE_BF16 || t == PKV_TYPE_Q8_0 || t == PKV_TYPE_Q4_0 ||
           t == PKV_TYPE_Q4_K || t == PKV_TYPE_Q5_K || t == PKV_TYPE_Q6_K || t == PKV_TYPE_MXFP4 || int_type(t);
}

static pkv_weight_speed vk_weight_speed(void *ctx, pkv_type t) {
    if (!vk_supports_type(ctx, t)) return PKV_WEIGHT_NONE;
    return int_type(t) ? PKV_WEIGHT_SLOW : PKV_WEIGHT_FAST;
}

static unsigned type_align(pkv_type t) { return t == PKV_TYPE_F32 ? 4 : t == PKV_TYPE_MXFP4 ? 1 : 2; }

/* The KV type codes of kvq.glsl. */
static uint32_t kv_code(pkv_type t) {
    return t == PKV_TYPE_F32 ? 0u : t == PKV_TYPE_F16 ? 1u : t == PKV_TYPE_Q8_0 ? 2u : 3u;
}

/* Bytes an argument may span so that its window (which starts up to
 * minStorageBufferOffsetAlignment - 1 bytes before it and is rounded up to 4)
 * fits in max_range. */
static uint64_t window_bytes(const pkv_vk_ctx *c) {
    uint64_t malign = PKV_MAX(c->limits.storage_align, 4);
    return c->max_range > malign + 4 ? c->max_range - malign - 4 : 0;
}

/* Weights bigger than one window (an output projection on a device with a 128 MiB
 * maxStorageBufferRange) are processed in chunks of rows, and long batches in
 * chunks of x rows, one dispatch per chunk. */
static pkv_status chunks(pkv_vk_ctx *c, const char *kn, uint64_t row_bytes, uint64_t n_row_bytes, uint64_t *rows_per,
                         uint64_t *n_per) {
    uint64_t wb = window_bytes(c);
    *rows_per = wb / row_bytes;
    *n_per = wb / n_row_bytes;
    if (*rows_per == 0 || *n_per == 0)
        return pkv_err(PKV_ERR_UNSUPPORTED,
                       "kernel %s on %s: a row of %llu bytes does not fit the device's storage buffer range of %llu "
                       "bytes",
                       kn, c->name, (unsigned long long)PKV_MAX(row_bytes, n_row_bytes), (unsigned long long)c->max_range);
    return PKV_OK;
}

static pkv_status vk_matmul(void *ctx, const pkv_k_matmul_args *a) {
    pkv_vk_ctx *c = ctx;
    pkv_buffer *grids = NULL;
    if (int_type(a->wtype)) TRY(pkv_vk_grids(c, &grids));
    uint64_t rb = pkv_type_row_bytes(a->wtype, (size_t)a->cols), rows = (uint64_t)a->rows, cols = (uint64_t)a->cols,
             n = (uint64_t)a->n, rows_per, n_per;
    TRY(chunks(c, "matmul", rb, PKV_MAX(cols, rows) * 4, &rows_per, &n_per));
    for (uint64_t i0 = 0; i0 < n; i0 += n_per) {
        uint64_t ni = PKV_MIN(n_per, n - i0);
        for (uint64_t r0 = 0; r0 < rows; r0 += rows_per) {
            uint64_t cnt = PKV_MIN(rows_per, rows - r0);
            varg v[4] = {{"w", pkv_tref_make(a->w.buf, a->w.off + r0 * rb), cnt * rb, type_align(a->wtype)},
                         {"x", pkv_tref_make(a->x.buf, a->x.off + i0 * cols * 4), ni * cols * 4, 4},
                         {"y", pkv_tref_make(a->y.buf, a->y.off + i0 * rows * 4), ni * rows * 4, 4},
                         {"grids", pkv_tref_make(grids, 0), grids ? grids->size : 0, 4}};
            uint32_t pc[10] = {0, 0, 0, (uint32_t)rows, (uint32_t)cols, (uint32_t)ni, (uint32_t)rb,
                               (uint32_t)a->wtype, (uint32_t)r0, (uint32_t)cnt};
            if (grids) { /* matmul_int: the grid table's offset is a fourth leading word */
                uint32_t pci[11] = {0, 0, 0, 0, pc[3], pc[4], pc[5], pc[6], pc[7], pc[8], pc[9]};
                if (c->subgroup_arith)
                    TRY(dispatch(c, PKV_VK_K_MATMUL_INT_SG, v, 4, pci, 11, CDIV(cnt, SG_ROWS) * CDIV(ni, SG_TILE)));
                else
                    TRY(dispatch(c, PKV_VK_K_MATMUL_INT, v, 4, pci, 11, cnt * CDIV(ni, MM_TILE)));
            }
            else if (c->subgroup_arith)
                TRY(dispatch(c, PKV_VK_K_MATMUL_SG, v, 3, pc, 10, CDIV(cnt, SG_ROWS) * CDIV(ni, SG_TILE)));
            else
                TRY(dispatch(c, PKV_VK_K_MATMUL, v, 3, pc, 10, cnt * CDIV(ni, MM_TILE)));
        }
    }
    return PKV_OK;
}

static pkv_status vk_get_rows(void *ctx, const pkv_k_get_rows_args *a) {
    pkv_vk_ctx *c = ctx;
    pkv_buffer *grids = NULL;
    if (int_type(a->wtype)) TRY(pkv_vk_grids(c, &grids));
    uint64_t rb = pkv_type_row_bytes(a->wtype, (size_t)a->cols), vocab = (uint64_t)a->n_vocab,
             cols = (uint64_t)a->cols, n = (uint64_t)a->n, rows_per, n_per;
    TRY(chunks(c, "get_rows", rb, cols * 4, &rows_per, &n_per));
    for (uint64_t i0 = 0; i0 < n; i0 += n_per) {
        uint64_t ni = PKV_MIN(n_per, n - i0);
        for (uint64_t r0 = 0; r0 < vocab; r0 += rows_per) {
            uint64_t cnt = PKV_MIN(rows_per, vocab - r0);
            varg v[4] = {{"w", pkv_tref_make(a->w.buf, a->w.off + r0 * rb), cnt * rb, type_align(a->wtype)},
                         {"ids", pkv_tref_make(a->ids.buf, a->ids.off + i0 * 4), ni * 4, 4},
                         {"out", pkv_tref_make(a->out.buf, a->out.off + i0 * cols * 4), ni * cols * 4, 4},
                         {"grids", pkv_tref_make(grids, 0), grids ? grids->size : 0, 4}};
            uint32_t pc[12] = {0, 0, 0, (uint32_t)ni, (uint32_t)cols, (uint32_t)vocab, (uint32_t)rb,
                               (uint32_t)a->wtype, (uint32_t)r0, (uint32_t)cnt, r0 == 0 ? 1u : 0u, fbits(a->scale)};
            if (grids) {
                uint32_t pci[13] = {0, 0, 0, 0, pc[3], pc[4], pc[5], pc[6], pc[7], pc[8], pc[9], pc[10], pc[11]};
                TRY(dispatch(c, PKV_VK_K_GET_ROWS_INT, v, 4, pci, 13, CDIV(ni * cols, WG)));
            } else
                TRY(dispatch(c, PKV_VK_K_GET_ROWS, v, 3, pc, 12, CDIV(ni * cols, WG)));
        }
    }
    return PKV_OK;
}

static pkv_status vk_rms_norm(void *ctx, const pkv_k_rms_norm_args *a) {
    pkv_vk_ctx *c = ctx;
    uint64_t bytes = (uint64_t)a->n_rows * (uint64_t)a->row_len * 4;
    TRY(fits(c, "rms_norm", "n_rows*row_len", bytes / 4));
    varg v[3] = {{"x", a->x, bytes, 4}, {"w", a->w, (uint64_t)a->row_len * 4, 4}, {"y", a->y, bytes, 4}};
    uint32_t pc[6] = {0, 0, 0, (uint32_t)a->n_rows, (uint32_t)a->row_len, fbits(a->eps)};
    return dispatch(c, PKV_VK_K_RMS_NORM, v, 3, pc, 6, (uint64_t)a->n_rows);
}

static pkv_status vk_layer_norm(void *ctx, const pkv_k_layer_norm_args *a) {
    pkv_vk_ctx *c = ctx;
    uint64_t bytes = (uint64_t)a->n_rows * (uint64_t)a->row_len * 4;
    TRY(fits(c, "layer_norm", "n_rows*row_len", bytes / 4));
    const bool hw = a->w.buf != NULL, hb = a->b.buf != NULL;
    /* an absent w or b binds a 4-byte window of x that the shader never reads */
    varg v[4] = {{"x", a->x, bytes, 4},
                 {"y", a->y, bytes, 4},
                 {"w", hw ? a->w : a->x, hw ? (uint64_t)a->row_len * 4 : 4, 4},
                 {"b", hb ? a->b : a->x, hb ? (uint64_t)a->row_len * 4 : 4, 4}};
    uint32_t pc[9] = {0, 0, 0, 0, (uint32_t)a->n_rows, (uint32_t)a->row_len, hw ? 1u : 0u, hb ? 1u : 0u,
                      fbits(a->eps)};
    return dispatch(c, PKV_VK_K_LAYER_NORM, v, 4, pc, 9, (uint64_t)a->n_rows);
}

static pkv_status vk_add(void *ctx, const pkv_k_add_args *a) {
    pkv_vk_ctx *c = ctx;
    TRY(fits(c, "add", "n", (uint64_t)a->n));
    varg v[3] = {{"a", a->a, (uint64_t)a->n * 4, 4}, {"b", a->b, (uint64_t)a->b_len * 4, 4},
                 {"y", a->y, (uint64_t)a->n * 4, 4}};
    uint32_t pc[5] = {0, 0, 0, (uint32_t)a->n, (uint32_t)a->b_len};
    return dispatch(c, PKV_VK_K_ADD, v, 3, pc, 5, CDIV((uint64_t)a->n, WG));
}

static pkv_status vk_swiglu(void *ctx, const pkv_k_swiglu_args *a) {
    pkv_vk_ctx *c = ctx;
    TRY(fits(c, "swiglu", "n", (uint64_t)a->n));
    varg v[3] = {{"g", a->g, (uint64_t)a->n * 4, 4}, {"u", a->u, (uint64_t)a->n * 4, 4},
                 {"y", a->y, (uint64_t)a->n * 4, 4}};
    uint32_t pc[8] = {0, 0, 0, (uint32_t)a->n, a->gelu ? 1u : 0u, a->oai ? 1u : 0u, fbits(a->alpha), fbits(a->limit)};
    return dispatch(c, PKV_VK_K_SWIGLU, v, 3, pc, 8, CDIV((uint64_t)a->n, WG));
}

static pkv_status vk_rope(void *ctx, const pkv_k_rope_args *a) {
    pkv_vk_ctx *c = ctx;
    const bool quant = pkv_kv_type_quant(a->dtype);
    size_t es = a->dtype == PKV_TYPE_F32 ? 4 : 2;
    if (a->row_stride % es)
        return pkv_err(PKV_ERR_UNSUPPORTED, "kernel rope on %s: row stride %zu is not a multiple of %zu", c->name,
                       a->row_stride, es);
    if (quant && a->head_dim > 512)
        return pkv_err(PKV_ERR_UNSUPPORTED, "kernel rope on %s: %s head size %d (the Vulkan kernel re-quantizes heads "
                       "of up to 512)", c->name, pkv_type_name(a->dtype), a->head_dim);
    int64_t max_rows = a->rows.buf ? a->max_rows : a->n_rows;
    if (a->n_rows <= 0 || max_rows <= 0) return PKV_OK; /* nothing to rotate */
    const uint64_t head_bytes = (uint64_t)a->n_heads * pkv_type_row_bytes(a->dtype, (size_t)a->head_dim),
                   rows = (uint64_t)max_rows;
    uint64_t xbytes = (rows - 1) * a->row_stride + head_bytes;
    uint64_t work = (uint64_t)a->n_rows * (uint64_t)a->n_heads * (quant ? 1u : (uint64_t)(a->n_rot / 2));
    TRY(fits(c, "rope", "rows*heads*pairs", work));
    /* x larger than one window (cached K of a pool past maxStorageBufferRange,
     * re-rotated after a shift) is bound as up to KV_WINDOWS windows of rpw rows. */
    const uint64_t wb = window_bytes(c);
    uint64_t rpw = rows, nw = 1;
    if (xbytes > wb) {
        rpw = wb >= head_bytes ? (wb - head_bytes) / PKV_MAX(a->row_stride, 1) + 1 : 0;
        if (rpw == 0)
            return pkv_err(PKV_ERR_UNSUPPORTED, "kernel rope on %s: a row of %llu bytes is larger than the device's "
                           "storage buffer range of %llu bytes", c->name, (unsigned long long)head_bytes,
                           (unsigned long long)c->max_range);
        nw = CDIV(rows, rpw);
        if (nw > KV_WINDOWS)
            return pkv_err(PKV_ERR_UNSUPPORTED, "kernel rope on %s: x (%llu bytes) needs %llu windows of the device's "
                           "storage buffer range of %llu bytes; the Vulkan kernel binds at most %u", c->name,
                           (unsigned long long)xbytes, (unsigned long long)nw, (unsigned long long)c->max_range, KV_WINDOWS);
    }
    varg v[7] = {{"x", a->x, (PKV_MIN(rpw, rows) - 1) * a->row_stride + head_bytes, (unsigned)es},
                 {"pos", a->pos, (uint64_t)a->n_rows * 4, 4},
                 {"rows", a->rows.buf ? a->rows : a->pos, (uint64_t)a->n_rows * 4, 4}};
    /* binding 6: the frequency factors, or pos as a stand-in the kernel does not read */
    v[6] = a->ff.buf ? (varg){"ff", a->ff, (uint64_t)(a->n_rot / 2) * 4, 4} : (varg){"ff", a->pos, 4, 4};
    static const char *const xn[3] = {"x window 1", "x window 2", "x window 3"};
    for (uint64_t w = 1; w < KV_WINDOWS; w++) {
        v[2 + w] = v[0];
        v[2 + w].name = xn[w - 1];
        if (w < nw) {
            const uint64_t r0 = w * rpw;
            v[2 + w].t = pkv_tref_make(a->x.buf, a->x.off + r0 * a->row_stride);
            v[2 + w].bytes = (PKV_MIN(rpw, rows - r0) - 1) * a->row_stride + head_bytes;
        }
    }
    uint32_t pc[24] = {0,
                       0,
                       0,
                       0,
                       0,
                       0,
                       0,
                       (uint32_t)a->n_rows,
                       (uint32_t)a->row_stride,
                       (uint32_t)a->n_heads,
                       (uint32_t)a->head_dim,
                       (uint32_t)a->n_rot,
                       a->neox ? 1u : 0u,
                       kv_code(a->dtype),
                       a->rows.buf ? 1u : 0u,
                       (uint32_t)rpw,
                       (uint32_t)rows,
                       fbits(a->freq_base),
                       fbits(a->freq_scale),
                       fbits(a->ext_factor),
                       fbits(a->corr_lo),
                       fbits(a->corr_hi),
                       fbits(a->mscale > 0 ? a->mscale : 1.0f),
                       a->ff.buf ? 1u : 0u};
    return dispatch(c, nw > 1 ? PKV_VK_K_ROPE_WIN : PKV_VK_K_ROPE, v, 7, pc, 24, CDIV(work, WG));
}

static pkv_status vk_set_rows(void *ctx, const pkv_k_set_rows_args *a) {
    pkv_vk_ctx *c = ctx;
    const bool quant = pkv_kv_type_quant(a->dst_type);
    size_t es = a->dst_type == PKV_TYPE_F32 ? 4 : 2;
    if (a->src_stride % 4 || a->dst_stride % es)
        return pkv_err(PKV_ERR_UNSUPPORTED,
                       "kernel set_rows on %s: strides (src %zu, dst %zu) must be multiples of 4 and %zu bytes",
                       c->name, a->src_stride, a->dst_stride, es);
    if (a->n <= 0 || a->dst_rows <= 0) return PKV_OK; /* nothing to write */
    const uint64_t row_bytes = pkv_type_row_bytes(a->dst_type, (size_t)a->row_elems), rows = (uint64_t)a->dst_rows;
    uint64_t sbytes = (uint64_t)(a->n - 1) * a->src_stride + (uint64_t)a->row_elems * 4;
    uint64_t dbytes = (rows - 1) * a->dst_stride + row_bytes;
    uint64_t work = (uint64_t)a->n * (uint64_t)a->row_elems / (quant ? 32u : 1u);
    TRY(fits(c, "set_rows", "src bytes", sbytes));
    TRY(fits(c, "set_rows", "n*row_elems", (uint64_t)a->n * (uint64_t)a->row_elems));
    /* A dst larger than one window (a layer's KV pool past maxStorageBufferRange)
     * is bound as up to KV_WINDOWS windows of rpw rows each. */
    const uint64_t wb = window_bytes(c);
    uint64_t rpw = PKV_MAX(rows, 1), nw = 1;
    if (dbytes > wb) {
        rpw = wb >= row_bytes ? (wb - row_bytes) / PKV_MAX(a->dst_stride, 1) + 1 : 0;
        if (rpw == 0) /* dst_stride >= row_bytes, so rpw >= 1 whenever a row fits */
            return pkv_err(PKV_ERR_UNSUPPORTED, "kernel set_rows on %s: a row of %llu bytes is larger than the device's "
                           "storage buffer range of %llu bytes", c->name, (unsigned long long)row_bytes,
                           (unsigned long long)c->max_range);
        nw = CDIV(rows, rpw);
        if (nw > KV_WINDOWS)
            return pkv_err(PKV_ERR_UNSUPPORTED, "kernel set_rows on %s: dst (%llu bytes) needs %llu windows of the "
                           "device's storage buffer range of %llu bytes; the Vulkan kernel binds at most %u", c->name,
                           (unsigned long long)dbytes, (unsigned long long)nw, (unsigned long long)c->max_range, KV_WINDOWS);
    }
    const uint64_t w0 = (PKV_MIN(rpw, rows) - 1) * a->dst_stride + row_bytes;
    varg v[6] = {{"src", a->src, sbytes, 4}, {"dst", a->dst, w0, (unsigned)es}, {"idx", a->idx, (uint64_t)a->n * 4, 4}};
    static const char *const dn[3] = {"dst window 1", "dst window 2", "dst window 3"};
    for (uint64_t w = 1; w < KV_WINDOWS; w++) {
        v[2 + w] = v[1];
        v[2 + w].name = dn[w - 1];
        if (w < nw) {
            const uint64_t r0 = w * rpw;
            v[2 + w].t = pkv_tref_make(a->dst.buf, a->dst.off + r0 * a->dst_stride);
            v[2 + w].bytes = (PKV_MIN(rpw, rows - r0) - 1) * a->dst_stride + row_bytes;
        }
    }
    uint32_t pc[13] = {0, 0, 0, 0, 0, 0, (uint32_t)a->n, (uint32_t)a->row_elems, (uint32_t)a->src_stride,
                       (uint32_t)a->dst_stride, (uint32_t)a->dst_rows, kv_code(a->dst_type), (uint32_t)rpw};
    return dispatch(c, nw > 1 ? PKV_VK_K_SET_ROWS_WIN : PKV_VK_K_SET_ROWS, v, 6, pc, 13, CDIV(work, WG));
}

static pkv_status vk_attention(void *ctx, const pkv_k_attention_args *a) {
    pkv_vk_ctx *c = ctx;
    if (a->dk > 576 || a->dv > 512)
        return pkv_err(PKV_ERR_UNSUPPORTED, "kernel attention on %s: head sizes dk %d, dv %d (the Vulkan kernel "
                       "supports dk <= 576, dv <= 512)", c->name, a->dk, a->dv);
    /* v_in_k (MLA): v is k (the dispatcher's), each V row the head of a K row */
    const uint64_t krow = pkv_type_row_bytes(a->k_type, (size_t)a->dk),
                   vrow = a->v_in_k ? krow : pkv_type_row_bytes(a->v_type, (size_t)a->dv);
    const uint64_t n_pages = (uint64_t)PKV_MAX(a->n_pages, 0), page_slots = (uint64_t)a->page_size * (uint64_t)a->n_kv;
    const uint64_t kpage = page_slots * krow, vpage = page_slots * vrow, slots = n_pages * page_slots;
    /* The shader keeps a slot index in an int. */
    if (slots > INT32_MAX)
        return pkv_err(PKV_ERR_UNSUPPORTED, "kernel attention on %s: %llu KV slots exceed 2^31", c->name,
                       (unsigned long long)slots);
    /* A pool larger than one window is bound as up to KV_WINDOWS windows of ppw
     * whole pages each (the same pages for K and V); each window starts at the
     * storage offset alignment below its first page, the rest in push constants. */
    const uint64_t wb = window_bytes(c);
    uint64_t ppw = PKV_MAX(n_pages, 1), nw = 1;
    if (n_pages * kpage > wb || n_pages * vpage > wb) {
        ppw = PKV_MIN(wb / PKV_MAX(kpage, 1), wb / PKV_MAX(vpage, 1));
        if (ppw == 0)
            return pkv_err(PKV_ERR_UNSUPPORTED, "kernel attention on %s: a KV page (K %llu, V %llu bytes) is larger "
                           "than the device's storage buffer range of %llu bytes", c->name, (unsigned long long)kpage,
                           (unsigned long long)vpage, (unsigned long long)c->max_range);
        nw = CDIV(n_pages, ppw);
        if (nw > KV_WINDOWS)
            return pkv_err(PKV_ERR_UNSUPPORTED, "kernel attention on %s: the K/V pools (%llu and %llu bytes) need %llu "
                           "windows of the device's storage buffer range of %llu bytes; the Vulkan kernel binds at most %u",
                           c->name, (unsigned long long)(n_pages * kpage), (unsigned long long)(n_pages * vpage),
                           (unsigned long long)nw, (unsigned long long)c->max_range, KV_WINDOWS);
    }
    const bool has_sinks = a->sinks.buf != NULL, has_qwin = a->q_win.buf != NULL;
    /* Without sinks (q_win), binding 5 (6) is a 4-byte window of meta that the shader
     * never reads; windows the pools do not need repeat window 0 (never read). */
    varg v[MAX_BINDINGS] = {{"q", a->q, (uint64_t)a->n_q * a->n_head * a->dk * 4, 4},
                            {"k", a->k, PKV_MIN(ppw, n_pages) * kpage, type_align(a->k_type)},
                            {"v", a->v, PKV_MIN(ppw, n_pages) * vpage, type_align(a->v_type)},
                            {"out", a->out, (uint64_t)a->n_q * a->n_head * a->dv * 4, 4},
                            {"meta", a->meta, ((uint64_t)a->n_q * 2 + (uint64_t)a->n_seq + 1 + (uint64_t)a->meta_pages) * 4, 4},
                            {"sinks", has_sinks ? a->sinks : a->meta, has_sinks ? (uint64_t)a->n_head * 4 : 4, 4},
                            {"q_win", has_qwin ? a->q_win : a->meta, has_qwin ? (uint64_t)a->n_q * 4 : 4, 4}};
    static const char *const kn[3] = {"k window 1", "k window 2", "k window 3"},
                             *const vn[3] = {"v window 1", "v window 2", "v window 3"};
    for (uint64_t w = 1; w < KV_WINDOWS; w++) {
        varg *kw = &v[6 + w], *vw = &v[9 + w];
        *kw = v[1];
        *vw = v[2];
        kw->name = kn[w - 1];
        vw->name = vn[w - 1];
        if (w < nw) {
            const uint64_t p0 = w * ppw, np = PKV_MIN(ppw, n_pages - p0);
            kw->t = pkv_tref_make(a->k.buf, a->k.off + p0 * kpage);
            kw->bytes = np * kpage;
            vw->t = pkv_tref_make(a->v.buf, a->v.off + p0 * vpage);
            vw->bytes = np * vpage;
        }
    }
    uint32_t pc[32] = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, (uint32_t)a->n_q, (uint32_t)a->n_seq,
                       (uint32_t)a->n_pages, (uint32_t)a->page_size, (uint32_t)a->n_head, (uint32_t)a->n_kv,
                       (uint32_t)a->dk, (uint32_t)a->dv, kv_code(a->k_type), kv_code(a->v_type), (uint32_t)krow,
                       (uint32_t)vrow, fbits(a->scale), (uint32_t)a->window, fbits(a->softcap), has_sinks ? 1u : 0u,
                       has_qwin ? 1u : 0u, (uint32_t)ppw, (uint32_t)a->chunk};
    return dispatch(c, nw > 1 ? PKV_VK_K_ATTENTION_WIN : PKV_VK_K_ATTENTION, v, MAX_BINDINGS, pc, 32,
                    (uint64_t)a->n_q * (uint64_t)a->n_head);
}

static pkv_status vk_softmax(void *ctx, const pkv_k_softmax_args *a) {
    pkv_vk_ctx *c = ctx;
    uint64_t bytes = (uint64_t)a->n_rows * (uint64_t)a->row_len * 4;
    TRY(fits(c, "softmax", "n_rows*row_len", bytes / 4));
    varg v[2] = {{"x", a->x, bytes, 4}, {"y", a->y, bytes, 4}};
    uint32_t pc[4] = {0, 0, (uint32_t)a->n_rows, (uint32_t)a->row_len};
    return dispatch(c, PKV_VK_K_SOFTMAX, v, 2, pc, 4, (uint64_t)a->n_rows);
}

static pkv_status vk_argmax(void *ctx, const pkv_k_argmax_args *a) {
    pkv_vk_ctx *c = ctx;
    uint64_t bytes = (uint64_t)a->n_rows * (uint64_t)a->row_len * 4;
    TRY(fits(c, "argmax", "n_rows*row_len", bytes / 4));
    varg v[2] = {{"x", a->x, bytes, 4}, {"out", a->out, (uint64_t)a->n_rows * 4, 4}};
    uint32_t pc[4] = {0, 0, (uint32_t)a->n_rows, (uint32_t)a->row_len};
    return dispatch(c, PKV_VK_K_ARGMAX, v, 2, pc, 4, (uint64_t)a->n_rows);
}

/* ---- recurrent layers */

static pkv_status vk_ssm_conv(void *ctx, const pkv_k_ssm_conv_args *a) {
    pkv_vk_ctx *c = ctx;
    const uint64_t bytes = (uint64_t)a->n_tok * (uint64_t)a->channels * 4;
    const uint64_t sbytes = (uint64_t)(a->n_slots - 1) * a->state_stride + (uint64_t)(a->d_conv - 1) * (uint64_t)a->channels * 4;
    TRY(fits(c, "ssm_conv", "x bytes", bytes));
    TRY(fits(c, "ssm_conv", "state bytes", sbytes));
    TRY(fits(c, "ssm_conv", "n_seq*channels", (uint64_t)a->n_seq * (uint64_t)a->channels));
    varg v[5] = {{"x", a->x, bytes, 4},
                 {"w", a->w, (uint64_t)a->channels * (uint64_t)a->d_conv * 4, 4},
                 {"y", a->y, bytes, 4},
                 {"state", a->state, sbytes, 4},
                 {"meta", a->meta, (2 * (uint64_t)a->n_seq + 1) * 4, 4}};
    uint32_t pc[12] = {0, 0, 0, 0, 0, (uint32_t)a->n_tok, (uint32_t)a->channels, (uint32_t)a->n_seq, (uint32_t)a->d_conv,
                       (uint32_t)a->n_slots, (uint32_t)a->state_stride, a->silu ? 1u : 0u};
    return dispatch(c, PKV_VK_K_SSM_CONV, v, 5, pc, 12, CDIV((uint64_t)a->n_seq * (uint64_t)a->channels, WG));
}

static pkv_status vk_delta_net(void *ctx, const pkv_k_delta_net_args *a) {
    pkv_vk_ctx *c = ctx;
    if (a->d_k > 256)
        return pkv_err(PKV_ERR_UNSUPPORTED, "kernel delta_net on %s: key head size %d (the Vulkan kernel keeps a state "
                       "column of up to 256 in registers)", c->name, a->d_k);
    const uint64_t last = (uint64_t)(a->n_tok - 1), qk_row = (uint64_t)a->n_k_heads * (uint64_t)a->d_k * 4,
                   v_row = (uint64_t)a->n_v_heads * (uint64_t)a->d_v * 4, gb = (uint64_t)a->n_tok * (uint64_t)a->n_v_heads * 4;
    const uint64_t sbytes = (uint64_t)(a->n_slots - 1) * a->state_stride + (uint64_t)a->n_v_heads * (uint64_t)a->d_k * (uint64_t)a->d_v * 4;
    varg v[8] = {{"q", a->q, last * a->q_stride + qk_row, 4},
                 {"k", a->k, last * a->k_stride + qk_row, 4},
                 {"v", a->v, last * a->v_stride + v_row, 4},
                 {"g", a->g, gb, 4},
                 {"beta", a->beta, gb, 4},
                 {"out", a->out, (uint64_t)a->n_tok * v_row, 4},
                 {"state", a->state, sbytes, 4},
                 {"meta", a->meta, (2 * (uint64_t)a->n_seq + 1) * 4, 4}};
    for (int i = 0; i < 7; i++) TRY(fits(c, "delta_net", v[i].name, v[i].bytes));
    const uint64_t groups = (uint64_t)a->n_seq * (uint64_t)a->n_v_heads * CDIV((uint64_t)a->d_v, WG);
    uint32_t pc[21] = {0, 0, 0, 0, 0, 0, 0, 0, (uint32_t)a->q_stride, (uint32_t)a->k_stride, (uint32_t)a->v_stride,
                       (uint32_t)a->n_tok, (uint32_t)a->n_seq, (uint32_t)a->n_slots, (uint32_t)a->state_stride,
                       (uint32_t)a->n_k_heads, (uint32_t)a->n_v_heads, (uint32_t)a->d_k, (uint32_t)a->d_v,
                       a->grouped ? 1u : 0u, fbits(a->scale)};
    return dispatch(c, PKV_VK_K_DELTA_NET, v, 8, pc, 21, groups);
}

static pkv_status vk_ssm_scan(void *ctx, const pkv_k_ssm_scan_args *a) {
    pkv_vk_ctx *c = ctx;
    if (a->d_state > 256)
        return pkv_err(PKV_ERR_UNSUPPORTED, "kernel ssm_scan on %s: state size %d (the Vulkan kernel keeps a state "
                       "row of up to 256 in registers)", c->name, a->d_state);
    const uint64_t last = (uint64_t)(a->n_tok - 1), x_row = (uint64_t)a->n_head * (uint64_t)a->head_dim * 4,
                   bc_row = (uint64_t)a->n_group * (uint64_t)a->d_state * 4, heads = (uint64_t)a->n_head * 4;
    const uint64_t sbytes = (uint64_t)(a->n_slots - 1) * a->state_stride + x_row * (uint64_t)a->d_state;
    /* without D, A's window stands in for it (never read) */
    varg v[10] = {{"x", a->x, last * a->x_stride + x_row, 4},
                  {"B", a->B, last * a->B_stride + bc_row, 4},
                  {"C", a->C, last * a->C_stride + bc_row, 4},
                  {"dt", a->dt, (uint64_t)a->n_tok * heads, 4},
                  {"dt_bias", a->dt_bias, heads, 4},
                  {"A", a->A, heads, 4},
                  {"D", a->D.buf ? a->D : a->A, heads, 4},
                  {"y", a->y, (uint64_t)a->n_tok * x_row, 4},
                  {"state", a->state, sbytes, 4},
                  {"meta", a->meta, (2 * (uint64_t)a->n_seq + 1) * 4, 4}};
    for (int i = 0; i < 9; i++) TRY(fits(c, "ssm_scan", v[i].name, v[i].bytes));
    const uint64_t groups = (uint64_t)a->n_seq * (uint64_t)a->n_head * CDIV((uint64_t)a->head_dim, WG);
    uint32_t pc[22] = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, (uint32_t)a->x_stride, (uint32_t)a->B_stride, (uint32_t)a->C_stride,
                       (uint32_t)a->n_tok, (uint32_t)a->n_seq, (uint32_t)a->n_slots, (uint32_t)a->state_stride,
                       (uint32_t)a->n_head, (uint32_t)a->head_dim, (uint32_t)a->n_group, (uint32_t)a->d_state,
                       a->D.buf ? 1u : 0u};
    return dispatch(c, PKV_VK_K_SSM_SCAN, v, 10, pc, 22, groups);
}

static pkv_status vk_l2_norm(void *ctx, const pkv_k_l2_norm_args *a) {
    pkv_vk_ctx *c = ctx;
    const uint64_t row = (uint64_t)a->n_heads * (uint64_t)a->head_dim * 4, last = (uint64_t)(a->n - 1);
    varg v[2] = {{"x", a->x, last * a->x_stride + row, 4}, {"y", a->y, last * a->y_stride + row, 4}};
    TRY(fits(c, "l2_norm", "x bytes", v[0].bytes));
    TRY(fits(c, "l2_norm", "y bytes", v[1].bytes));
    uint32_t pc[8] = {0, 0, (uint32_t)a->n, (uint32_t)a->n_heads, (uint32_t)a->head_dim, (uint32_t)a->x_stride,
                      (uint32_t)a->y_stride, fbits(a->eps)};
    return dispatch(c, PKV_VK_K_L2_NORM, v, 2, pc, 8, (uint64_t)a->n * (uint64_t)a->n_heads);
}

static pkv_status vk_unary(void *ctx, const pkv_k_unary_args *a) {
    pkv_vk_ctx *c = ctx;
    TRY(fits(c, "unary", "n", (uint64_t)a->n * 4));
    const bool hb = a->bias.buf != NULL, hm = a->mul.buf != NULL;
    /* an absent bias or mul binds a 4-byte window of x that the shader never reads */
    varg v[4] = {{"x", a->x, (uint64_t)a->n * 4, 4},
                 {"y", a->y, (uint64_t)a->n * 4, 4},
                 {"bias", hb ? a->bias : a->x, hb ? (uint64_t)a->bias_len * 4 : 4, 4},
                 {"mul", hm ? a->mul : a->x, hm ? (uint64_t)a->mul_len * 4 : 4, 4}};
    uint32_t pc[10] = {0, 0, 0, 0, (uint32_t)a->n, (uint32_t)a->op, hb ? (uint32_t)a->bias_len : 1u,
                       hm ? (uint32_t)a->mul_len : 1u, hb ? 1u : 0u, hm ? 1u : 0u};
    return dispatch(c, PKV_VK_K_UNARY, v, 4, pc, 10, CDIV((uint64_t)a->n, WG));
}

static pkv_status vk_moe_route(void *ctx, const pkv_k_moe_route_args *a) {
    pkv_vk_ctx *c = ctx;
    const uint64_t lb = (uint64_t)a->n * (uint64_t)a->n_expert * 4, sb = (uint64_t)a->n * (uint64_t)a->k * 4;
    TRY(fits(c, "moe_route", "logits bytes", lb));
    const bool hb = a->bias.buf != NULL;
    /* an absent bias binds a 4-byte window of the logits that the shader never reads */
    varg v[4] = {{"logits", a->logits, lb, 4},
                 {"bias", hb ? a->bias : a->logits, hb ? (uint64_t)a->n_expert * 4 : 4, 4},
                 {"sel", a->sel, sb, 4},
                 {"w", a->w, sb, 4}};
    uint32_t pc[14] = {0, 0, 0, 0, (uint32_t)a->n, (uint32_t)a->n_expert, (uint32_t)a->k, (uint32_t)a->n_group,
                       (uint32_t)a->n_group_used, (uint32_t)a->gating, a->norm_w ? 1u : 0u, a->sel_logits ? 1u : 0u,
                       hb ? 1u : 0u, fbits(a->w_scale)};
    return dispatch(c, PKV_VK_K_MOE_ROUTE, v, 4, pc, 14, CDIV((uint64_t)a->n, WG));
}

static pkv_status vk_moe_combine(void *ctx, const pkv_k_moe_combine_args *a) {
    pkv_vk_ctx *c = ctx;
    const uint64_t total = (uint64_t)a->n * (uint64_t)a->cols;
    TRY(fits(c, "moe_combine", "y bytes", total * 4));
    TRY(fits(c, "moe_combine", "out bytes", (uint64_t)a->out_rows * (uint64_t)a->cols * 4));
    varg v[4] = {{"out", a->out, (uint64_t)a->out_rows * (uint64_t)a->cols * 4, 4},
                 {"y", a->y, total * 4, 4},
                 {"rows", a->rows, (uint64_t)a->n * 4, 4},
                 {"w", a->w, (uint64_t)a->n * 4, 4}};
    uint32_t pc[8] = {0, 0, 0, 0, (uint32_t)a->n, (uint32_t)a->cols, (uint32_t)a->out_rows, a->add ? 1u : 0u};
    return dispatch(c, PKV_VK_K_MOE_COMBINE, v, 4, pc, 8, CDIV(total, WG));
}

/* .<name> for each kernel of PKV_KERNELS (kernel-list.h) */
#define SLOT(name) .name = vk_##name,
const pkv_kernel_ops pkv_vk_kernel_ops = {
    .supports_type = vk_supports_type,
    .weight_speed = vk_weight_speed,
    PKV_KERNELS(SLOT)
};
#undef SLOT
