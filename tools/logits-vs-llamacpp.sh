#!/usr/bin/env bash
# One model's logits against llama.cpp's (docs/model.md, "Checked against
# llama.cpp"): the token list decoded as one prompt, the logits of every position,
# from a small program on llama.cpp's public llama.h (written and compiled here,
# one batch, f32 KV, flash attention off, no weight repacking) and from `pagekv
# logits` run once per prefix. Prints NMSE = sum((a - b)^2) / sum(b^2) over every
# position (b = llama.cpp), the largest difference and the argmax agreement.
#
#   tools/logits-vs-llamacpp.sh PAGEKV LLAMA_SRC LLAMA_BUILD_BIN MODEL.gguf N_CTX [N_TOKENS [LAST]]
#   PKV_ARGS="-d vulkan:0 --page-size 5": more options for pagekv's side (device, pages)
#   e.g. tools/logits-vs-llamacpp.sh build/bin/pagekv /work/scratch/llama.cpp \
#            /work/scratch/llama.cpp/build/bin m.gguf 512 300
# N_CTX is both runtimes' context (llama.cpp pads it to a multiple of 256): it
# chooses LongRoPE's factors. Tokens: (i * 37 + 11) % 512. LAST (default N_TOKENS):
# compare only the last LAST positions (long prompts: llama4's 8192-token chunks).
set -euo pipefail
PKV=${1:?pagekv binary}
LSRC=${2:?llama.cpp source}
LBIN=${3:?llama.cpp build/bin}
MODEL=${4:?model}
NCTX=${5:?context}
NTOK=${6:-40}
LAST=${7:-$NTOK}
DIR=$(mktemp -d)
trap 'rm -rf "$DIR"' EXIT
cat >"$DIR/ll.c" <<'CEOF'
#include <stdio.h>
#include <stdlib.h>
#include "llama.h"
static void quiet(enum ggml_log_level l, const char *t, void *u) { (void)l; (void)t; (void)u; }
int main(int argc, char **argv) {
    if (argc != 5) return 2;
    int n_ctx = atoi(argv[2]), n = atoi(argv[3]);
    llama_log_set(quiet, NULL);
    llama_backend_init();
    struct llama_model_params mp = llama_model_default_params();
    mp.use_extra_bufts = false;
    struct llama_model *m = llama_model_load_from_file(argv[1], mp);
    if (!m) return 1;
    struct llama_context_params cp = llama_context_default_params();
    cp.n_ctx = (uint32_t)n_ctx;
    cp.n_batch = cp.n_ubatch = (uint32_t)n;
    cp.n_seq_max = 1;
    cp.type_k = cp.type_v = GGML_TYPE_F32;
    cp.flash_attn_type = LLAMA_FLASH_ATTN_TYPE_DISABLED;
    cp.n_threads = cp.n_threads_batch = 2;
    struct llama_context *c = llama_init_from_model(m, cp);
    if (!c) return 1;
    struct llama_batch b = llama_batch_init(n, 0, 1);
    for (int i = 0; i < n; i++) {
        b.token[i] = (i * 37 + 11) % 512;
        b.pos[i] = i;
        b.n_seq_id[i] = 1;
        b.seq_id[i][0] = 0;
        b.logits[i] = 1;
    }
    b.n_tokens = n;
    if (llama_decode(c, b)) return 1;
    int nv = llama_vocab_n_tokens(llama_model_get_vocab(m));
    FILE *f = fopen(argv[4], "wb");
    for (int i = 0; i < n; i++) fwrite(llama_get_logits_ith(c, i), sizeof(float), (size_t)nv, f);
    fclose(f);
    return 0;
}
CEOF
cc -O1 -o "$DIR/ll" "$DIR/ll.c" -I"$LSRC/include" -I"$LSRC/ggml/include" -L"$LBIN" -lllama -lggml -lggml-base \
    -Wl,-rpath,"$LBIN"
"$DIR/ll" "$MODEL" "$NCTX" "$NTOK" "$DIR/llama.bin"
TOKENS=$(python3 -c "print(','.join(str((i * 37 + 11) % 512) for i in range($NTOK)))")
FIRST=$((NTOK - LAST + 1))
for k in $(seq "$FIRST" "$NTOK"); do
    # shellcheck disable=SC2086 # PKV_ARGS: more `pagekv logits` options, split on spaces
    "$PKV" logits -m "$MODEL" -c "$NCTX" -t 2 --kv-type f32 ${PKV_ARGS:-} --tokens "$(echo "$TOKENS" | cut -d, -f1-"$k")" \
        -o "$DIR/p$k.bin" 2>"$DIR/pkv.err" || { cat "$DIR/pkv.err"; exit 1; }
done
python3 - "$DIR" "$NTOK" "$MODEL" "$NCTX" "$FIRST" <<'PEOF'
import struct, sys, os
d, n, first = sys.argv[1], int(sys.argv[2]), int(sys.argv[5])
ref = open(os.path.join(d, "llama.bin"), "rb").read()
nv = len(ref) // 4 // n
ref = struct.unpack(f"<{nv * n}f", ref)
num = den = mx = 0.0
agree = 0
for k in range(first, n + 1):
    ours = struct.unpack(f"<{nv}f", open(os.path.join(d, f"p{k}.bin"), "rb").read())
    b = ref[(k - 1) * nv:k * nv]
    num += sum((x - y) ** 2 for x, y in zip(ours, b))
    den += sum(y * y for y in b)
    mx = max(mx, max(abs(x - y) for x, y in zip(ours, b)))
    agree += max(range(nv), key=lambda i: ours[i]) == max(range(nv), key=lambda i: b[i])
print(f"{os.path.basename(sys.argv[3])} n_ctx {sys.argv[4]}, {n} tokens{f' (positions {first - 1}..{n - 1})' if first > 1 else ''}: "
      f"NMSE {num / den:.3g}, max |diff| {mx:.3g}, argmax {agree}/{n - first + 1}")
PEOF
