#!/usr/bin/env bash
# LoRA adapters against llama.cpp (docs/lora.md): one base file and one adapter
# (pagekv mkmodel, --lora-of), the next-token distribution after a prompt of token
# ids from `pagekv logits --lora` and from llama-server --lora (/completion with
# n_probs = the vocabulary and a per-request "lora" scale), compared as log-probs:
# NMSE, the largest difference, and the top-1 token, for scales 0, 0.5, 1 and 2.
#
# MERGED=1: llama.cpp runs the base with the adapter merged by llama-export-lora
# (--lora-scaled FILE:SCALE, one merged file per scale) instead of --lora: for a
# tied model (gemma*), whose token_embd adapter llama-server cannot apply (it
# aborts in ggml_mul_mat: it applies the flipped embedding pair to the output).
#
#   tools/lora-vs-llamacpp.sh PAGEKV LLAMA_BUILD_BIN [ARCH] [TYPE]
#   e.g. tools/lora-vs-llamacpp.sh build/bin/pagekv /work/scratch/llama.cpp/build/bin llama f16
#        MERGED=1 MK_ARGS=--tied tools/lora-vs-llamacpp.sh build/bin/pagekv /work/scratch/llama.cpp/build/bin llama f16
#
# On a VM whose CPU lists AMX but whose kernel does not grant the AMX state,
# llama-server dies with SIGILL (tilezero) on quantized bases: run with
# LLAMA_ARG_REPACK=0 (no AMX repacking) in the environment.
set -euo pipefail
PKV=${1:?pagekv binary}
LBIN=${2:?llama.cpp build/bin}
ARCH=${3:-llama}
TYPE=${4:-f16}
DIR=$(mktemp -d)
trap 'kill $SRV 2>/dev/null || true; rm -rf "$DIR"' EXIT
SRV=
# MK_ARGS: more mkmodel options for the base (e.g. --tied)
"$PKV" mkmodel --arch "$ARCH" --type "$TYPE" --layers 4 --dim 256 --heads 8 --kv-heads 4 --ffn 512 --seed 21 \
    ${MK_ARGS:-} -o "$DIR/base.gguf" 2>/dev/null
"$PKV" mkmodel --lora-of "$DIR/base.gguf" --lora-rank 16 --lora-alpha 32 --type f16 --seed 22 -o "$DIR/lora.gguf" 2>/dev/null
TOKENS=${TOKENS:-5,17,42,99,123,7,300,256,64,11,480,2,77,150}
MERGED=${MERGED:-0}
start_server() { # MODEL [ARGS...]
    PORT=$((20000 + RANDOM % 20000))
    LD_LIBRARY_PATH="$LBIN" "$LBIN/llama-server" -m "$@" --host 127.0.0.1 --port "$PORT" -c 256 -t 2 --no-warmup \
        >"$DIR/server.log" 2>&1 &
    SRV=$!
    for _ in $(seq 1 100); do
        curl -sf "127.0.0.1:$PORT/health" >/dev/null 2>&1 && break
        sleep 0.2
    done
}
[ "$MERGED" = 1 ] || start_server "$DIR/base.gguf" --lora "$DIR/lora.gguf"
N_VOCAB=$(python3 -c "import json,sys; print(json.load(open(sys.argv[1]))['n_vocab'])" <("$PKV" logits -m "$DIR/base.gguf" --tokens 1))
for SCALE in 0 0.5 1 2; do
    "$PKV" logits -m "$DIR/base.gguf" --lora "$DIR/lora.gguf:$SCALE" --tokens "$TOKENS" >"$DIR/pkv.json" 2>/dev/null
    LORA_FIELD=",\"lora\":[{\"id\":0,\"scale\":$SCALE}]"
    if [ "$MERGED" = 1 ]; then
        LD_LIBRARY_PATH="$LBIN" "$LBIN/llama-export-lora" -m "$DIR/base.gguf" --lora-scaled "$DIR/lora.gguf:$SCALE" \
            -o "$DIR/merged.gguf" -t 2 >"$DIR/export.log" 2>&1
        start_server "$DIR/merged.gguf"
        LORA_FIELD=
    fi
    curl -s "127.0.0.1:$PORT/completion" -d "{\"prompt\":[$TOKENS],\"n_predict\":1,\"n_probs\":$N_VOCAB,\"temperature\":0,
        \"cache_prompt\":false$LORA_FIELD}" >"$DIR/llama.json"
    if [ "$MERGED" = 1 ]; then
        kill "$SRV" 2>/dev/null || true
        wait "$SRV" 2>/dev/null || true
    fi
    python3 - "$DIR/pkv.json" "$DIR/llama.json" "$SCALE" "$ARCH" "$TYPE$([ "$MERGED" = 1 ] && echo ' (merged)')" <<'EOF'
import json, math, sys
p = json.load(open(sys.argv[1]))
lg = p["logits"][-p["n_vocab"]:]
m = max(lg)
lse = m + math.log(sum(math.exp(x - m) for x in lg))
ours = [x - lse for x in lg]
d = json.load(open(sys.argv[2]))
if "completion_probabilities" not in d: sys.exit("llama-server: " + json.dumps(d)[:400])
top = d["completion_probabilities"][0]["top_logprobs"]
ref = {t["id"]: t["logprob"] for t in top}
ids = sorted(ref)
num = sum((ours[i] - ref[i]) ** 2 for i in ids)
den = sum(ref[i] ** 2 for i in ids)
pkv_top = max(range(len(ours)), key=lambda i: ours[i])
llama_top = max(ids, key=lambda i: ref[i])
print(f"{sys.argv[4]} {sys.argv[5]} scale {sys.argv[3]}: {len(ids)} log-probs, NMSE {num / den:.3g}, "
      f"max |diff| {max(abs(ours[i] - ref[i]) for i in ids):.3g}, top-1 pagekv {pkv_top} llama.cpp {llama_top}"
      + ("" if pkv_top == llama_top or pkv_top not in ref else
         f" (a near tie? their log-probs: pagekv {ours[pkv_top]:.4f} / {ours[llama_top]:.4f}, "
         f"llama.cpp {ref[pkv_top]:.4f} / {ref[llama_top]:.4f})"))
EOF
done
