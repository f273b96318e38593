/* Host-side planning for the CUDA backend (see cuda-plan.h). */
#include "device/cuda/cuda-plan.h"

#include <stdio.h>

int pkv_cu_wtype(pkv_type t) {
    switch (t) {
    case PKV_TYPE_F32: return PKV_CU_W_F32;
    case PKV_TYPE_F16: return PKV_CU_W_F16;
    case PKV_TYPE_BF16: return PKV_CU_W_BF16;
    case PKV_TYPE_Q8_0: return PKV_CU_W_Q8_0;
    case PKV_TYPE_Q4_0: return PKV_CU_W_Q4_0;
    case PKV_TYPE_Q4_K: return PKV_CU_W_Q4_K;
    case PKV_TYPE_Q5_K: return PKV_CU_W_Q5_K;
    case PKV_TYPE_Q6_K: return PKV_CU_W_Q6_K;
    case PKV_TYPE_MXFP4: return PKV_CU_W_MXFP4;
    default: return -1;
    }
}

size_t pkv_cu_plan_regions(const pkv_region *r, size_t n, size_t max_chunk, pkv_cu_chunk *out, size_t cap) {
    if (max_chunk == 0) max_chunk = PKV_CU_CHUNK_BYTES;
    size_t count = 0, i = 0;
    while (i < n) {
        if (!r[i].size) {
            i++;
            continue;
        }
        /* the run of regions that continue region i in both buffers */
        uint64_t src = r[i].src_off, dst = r[i].dst_off, size = r[i].size;
        size_t j = i + 1;
        for (; j < n; j++) {
            if (!r[j].size) continue;
            if (r[j].src_off != src + size || r[j].dst_off != dst + size) break;
            size += r[j].size;
        }
        for (uint64_t done = 0; done < size; done += max_chunk) {
            if (count < cap) {
                out[count].src_off = src + done;
                out[count].dst_off = dst + done;
                out[count].size = PKV_MIN(max_chunk, size - done);
            }
            count++;
        }
        i = j;
    }
    return count;
}

int pkv_cu_attention_splits(int n_q, int n_head, int meta_pages, int page_size, int n_seq, int n_sm) {
    const int64_t blocks = (int64_t)n_q * n_head, want_blocks = 2 * (int64_t)PKV_MAX(n_sm, 1);
    if (blocks <= 0 || blocks >= want_blocks || n_seq <= 0) return 1;
    const int64_t avg_tokens = (int64_t)meta_pages * page_size / n_seq;
    int64_t n = (want_blocks + blocks - 1) / blocks;
    n = PKV_MIN(n, avg_tokens / 256);
    n = PKV_MIN(n, PKV_CU_ATT_MAX_SPLIT);
    return n < 1 ? 1 : (int)n;
}

pkv_status pkv_cu_check_align(const char *dev, const char *kernel, const char *arg, size_t off, size_t align) {
    if (align > 1 && off % align)
        return pkv_err(PKV_ERR_UNSUPPORTED,
                       "kernel %s on %s: argument %s at byte offset %zu; the CUDA kernel needs a multiple of %zu",
                       kernel, dev, arg, off, align);
    return PKV_OK;
}

void pkv_cu_why(int code, const char *name, const char *text, char *why, size_t why_size) {
    if (!why || !why_size) return;
    switch (code) {
    case 35: /* cudaErrorInsufficientDriver */
        snprintf(why, why_size, "no NVIDIA driver, or one older than this build's CUDA runtime (%s)", name);
        break;
    case 100: /* cudaErrorNoDevice */
        snprintf(why, why_size, "the NVIDIA driver reports no CUDA GPU (%s)", name);
        break;
    case 2: /* cudaErrorMemoryAllocation: what the runtime reports under AddressSanitizer */
        snprintf(why, why_size, "cudaGetDeviceCount failed: %s: %s (under AddressSanitizer, set "
                 "ASAN_OPTIONS=protect_shadow_gap=0)", name, text);
        break;
    case 0: snprintf(why, why_size, "no CUDA GPU found"); break;
    default: snprintf(why, why_size, "cudaGetDeviceCount failed: %s: %s", name, text); break;
    }
}
