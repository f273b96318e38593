#!/usr/bin/env bash
# pagekv's /v1/embeddings and /v1/rerank against llama.cpp's llama-server on the same
# random-weight GGUF files (issue 45, item 4). For each layout — qwen3 with last-token
# pooling (Qwen3-Embedding), llama with mean pooling, qwen2 with CLS pooling, and a
# qwen3 reranker as llama.cpp's converter writes Qwen3-Reranker (rank pooling,
# cls.output yes/no, tokenizer.chat_template.rerank; and without the template: the
# default query/document layout) — it makes the model with
# `pagekv mkmodel --pooling`, starts both servers, sends the same requests (text and
# token-id inputs; a query with documents) and prints the NMSE of pagekv's vectors
# (scores) against llama.cpp's: sum((a - b)^2) / sum(b^2) over each input, the largest
# one per layout. Exit status 1 when one is above --max-nmse (default 1e-4).
# Nothing in pagekv's build, tests or CI runs this script (CI has no llama.cpp).
#
# usage: tools/compare-embeddings-llamacpp.sh --llama-build DIR [--pagekv BIN] [--dir DIR]
#   --llama-build DIR   a llama.cpp build directory with bin/llama-server (build it as
#                       tools/bench-llamacpp.sh does, or `cmake --build DIR --target llama-server`)
#   --pagekv BIN        pagekv binary (default build/bin/pagekv)
#   --dir DIR           scratch directory for models and logs (default /tmp/pkv-embd-compare)
#   --max-nmse X        the bound checked (default 1e-4)
# Needs python3 and curl.
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
root=$(dirname "$here")
llama=""
pagekv="$root/build/bin/pagekv"
dir=/tmp/pkv-embd-compare
max_nmse=1e-4
while [ $# -gt 0 ]; do
    case "$1" in
    --llama-build) llama=$2; shift 2 ;;
    --pagekv) pagekv=$2; shift 2 ;;
    --dir) dir=$2; shift 2 ;;
    --max-nmse) max_nmse=$2; shift 2 ;;
    -h | --help) sed -n 2,20p "$0"; exit 0 ;;
    *) echo "compare-embeddings-llamacpp: unknown option $1" >&2; exit 2 ;;
    esac
done
[ -x "$llama/bin/llama-server" ] || { echo "compare-embeddings-llamacpp: give --llama-build DIR with bin/llama-server" >&2; exit 2; }
[ -x "$pagekv" ] || { echo "compare-embeddings-llamacpp: no pagekv binary at $pagekv (--pagekv)" >&2; exit 2; }
mkdir -p "$dir"
pids=()
cleanup() { for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done; }
trap cleanup EXIT

free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
wait_up() { # port
    for _ in $(seq 1 200); do
        curl -sf "http://127.0.0.1:$1/health" >/dev/null 2>&1 && return 0
        sleep 0.1
    done
    echo "compare-embeddings-llamacpp: a server on port $1 did not come up" >&2
    return 1
}

# layout name, mkmodel args, llama-server args, endpoint kind
layouts=(
    "qwen3-last|--arch qwen3 --pooling last|--embedding --pooling last|embd"
    "llama-mean|--arch llama --pooling mean|--embedding --pooling mean|embd"
    "qwen2-cls|--arch qwen2 --pooling cls|--embedding --pooling cls|embd"
    "qwen3-rank|--arch qwen3 --pooling rank|--reranking|rank"
    "qwen3-rank-notemplate|--arch qwen3 --pooling rank --no-template|--reranking|rank"
)
fail=0
printf '| layout | inputs | max NMSE vs llama.cpp |\n|---|---|---|\n'
for l in "${layouts[@]}"; do
    IFS='|' read -r name mk largs kind <<<"$l"
    model="$dir/$name.gguf"
    # shellcheck disable=SC2086
    "$pagekv" mkmodel $mk --seed 7 -o "$model" >"$dir/$name.mk.log" 2>&1
    pp=$(free_port)
    lp=$(free_port)
    "$pagekv" serve -m "$model" --port "$pp" >"$dir/$name.pagekv.log" 2>&1 &
    pids+=($!)
    # shellcheck disable=SC2086
    "$llama/bin/llama-server" -m "$model" --port "$lp" -c 2048 -b 2048 -ub 2048 -np 1 $largs >"$dir/$name.llama.log" 2>&1 &
    pids+=($!)
    wait_up "$pp"
    wait_up "$lp"
    out=$(python3 - "$pp" "$lp" "$kind" <<'EOF'
import json, sys, urllib.request
pp, lp, kind = sys.argv[1], sys.argv[2], sys.argv[3]
def post(port, path, body):
    req = urllib.request.Request(f"http://127.0.0.1:{port}{path}", json.dumps(body).encode(),
                                 {"Content-Type": "application/json"})
    return json.load(urllib.request.urlopen(req, timeout=120))
def nmse(a, b):
    num = sum((x - y) ** 2 for x, y in zip(a, b)); den = sum(y * y for y in b)
    return num / den if den else (0.0 if num == 0 else float("inf"))
texts = ["hello world", "the quick brown fox jumps over the lazy dog",
         "a b c d e f g h i j k l m n o p q r s t u v w x y z " * 4, "x"]
worst, n = 0.0, 0
if kind == "embd":
    for inp in [texts, [[1, 2, 3, 4, 5], [7] * 40, list(range(10, 210))]]:
        a = post(pp, "/v1/embeddings", {"input": inp})["data"]
        b = post(lp, "/v1/embeddings", {"input": inp})["data"]
        for x, y in zip(sorted(a, key=lambda d: d["index"]), sorted(b, key=lambda d: d["index"])):
            worst = max(worst, nmse(x["embedding"], y["embedding"])); n += 1
else:
    body = {"query": "what is a fox", "documents": texts + ["the fox is an animal", "dogs bark"]}
    a = {r["index"]: r["relevance_score"] for r in post(pp, "/v1/rerank", body)["results"]}
    b = {r["index"]: r["relevance_score"] for r in post(lp, "/v1/rerank", body)["results"]}
    va = [a[i] for i in sorted(b)]; vb = [b[i] for i in sorted(b)]
    worst = nmse(va, vb); n = len(vb)
    for i in sorted(b):
        worst = max(worst, nmse([a[i]], [b[i]]))
print(f"{n} {worst:.3e}")
EOF
)
    read -r n worst <<<"$out"
    printf '| %s | %s | %s |\n' "$name" "$n" "$worst"
    python3 -c "import sys; sys.exit(0 if float('$worst') <= float('$max_nmse') else 1)" || fail=1
    cleanup
    pids=()
    sleep 0.5
done
exit $fail
