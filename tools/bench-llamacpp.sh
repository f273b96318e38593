#!/usr/bin/env bash
# pagekv against llama.cpp on the same GGUF files, side by side (issue 29, item 2).
#
# Gets llama.cpp's source from npm's node-llama-cpp (llama/gitRelease.bundle: the
# llama.cpp release that package builds), builds llama-bench and llama-batched-bench
# in a scratch directory (natively; on a CPU with AVX-512 also an AVX2-only build to
# hold against PKV_CPU_PATH=avx2), makes the models with `pagekv mkmodel`, runs both
# engines alternately and prints one markdown table. Nothing in pagekv's build, tests
# or CI runs or needs this script; everything it fetches or builds stays in --dir.
# `--help` lists the options; docs/BENCHMARKS.md ("Against llama.cpp") says how to use it.
#
# What is matched between the tools, and what is not (printed with the table, too):
# - Same GGUF file, same thread count, f16 K and V caches for both.
# - Prefill: `pagekv bench model --prefill P` times P prompt tokens (in steps of 512)
#   into an empty cache; `llama-bench -p P -n 0` the same (one ubatch of 512). llama-bench
#   runs an untimed warm-up of each test first; pagekv times its first prefill, which also
#   takes the first touches of the mapped weights: not matched.
# - Decode: pagekv decodes D tokens after its prefill, so its cache holds P..P+D tokens;
#   llama-bench's `-n D` alone would decode into an empty cache, so it runs as
#   `-p 0 -n D -d P` (the P tokens of depth are filled untimed): matched.
# - 16 sequences: `pagekv bench model --n-seq 16` prefills a 64-token prompt (fixed in
#   pagekv), forks it 16 ways (pages shared copy-on-write) and times D steps of 16 tokens.
#   `llama-batched-bench -npp 64 -ntg D -npl 16 -pps` decodes the shared prompt once,
#   copies it into each sequence's own KV stream (its default, non-unified cache) and
#   times D steps of 16 tokens (S_TG). Both read 64+i keys per sequence at step i and
#   compute logits for every sequence; the copy vs sharing of the prompt is untimed.
# - llama.cpp's own defaults are kept otherwise: flash attention "auto" (reported in its
#   JSON as -1), weights repacked at load for its CPU kernels, threads spin-polling
#   between ops (--poll 50). llama.cpp's figures come from three processes (pp, tg,
#   batched), pagekv's from one.
# - q4_k_m is pagekv mkmodel's own mixture (q4_k, with q6_k for the output matrix and
#   every other layer's attn_v and ffn_down), not llama-quantize's (q6_k on a few more
#   layers), so both engines read the same file.
# - node-llama-cpp's llama/patches (a model-loader fix) are not applied: they do not
#   touch the CPU kernels.
set -euo pipefail

NLC_VERSION=3.22.1
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
root=$(dirname "$here")
me=bench-llamacpp

usage() {
    cat <<EOF
usage: tools/bench-llamacpp.sh [options]

pagekv against llama.cpp on the same GGUF files: prefill, single-sequence decode and
16-sequence decode for each weight type and each x86 kernel path of pagekv, alternating
runs of the two engines, medians in one markdown table (stdout); progress on stderr.

llama.cpp: npm pack node-llama-cpp@$NLC_VERSION, its llama/gitRelease.bundle cloned into
DIR/llama.cpp, built (llama-bench, llama-batched-bench) into DIR/build-native (-march=native)
and, on a CPU with avx512f, DIR/build-avx2 (AVX2/FMA/F16C only). Needs npm, git, cmake and
a C++ compiler; about 25 minutes per build on 2 cores. Builds and models already present
are reused.

options:
  --dir DIR             scratch directory (default /tmp/pkv-llamacpp): source, builds, logs/,
                        models/, results/
  --llama-build DIR     an existing llama.cpp build directory (DIR/bin/llama-bench and
                        llama-batched-bench; a missing one of them is built there if DIR is a
                        CMake build); nothing is fetched then
  --llama-build-avx2 DIR  an existing AVX2-only build (with --llama-build; otherwise the
                        AVX2-only comparison is left out)
  --no-avx2-build       leave out the AVX2-only build even on a CPU with AVX-512
  --build-only          fetch and build llama.cpp, then stop
  --pagekv PATH         pagekv binary (default: build/bin/pagekv of this checkout)
  --types "T1 T2 ..."   weight types, as pagekv mkmodel names them (default:
                        "q8_0 q4_k_m q6_k f16 bf16"; commas work too)
  --paths "P1 P2 ..."   pagekv kernel paths to run, of avx2 avx512 amx (default: each one this
                        CPU has, as pagekv itself detects it)
  --reps N              alternating runs of each engine; the table shows medians (default 3)
  -t, --threads N       threads for both engines (default: nproc = $(nproc))
  --prefill N           prompt tokens (default 512)
  --decode N            decoded tokens, also the 16-sequence decode steps (default 128)
  --n-seq N             sequences decoding together (default 16)
  --shape ref|small     ref: Qwen3-0.6B's shape (28 layers, width 1024, vocabulary 151,936;
                        default); small: 4 layers, width 512, vocabulary 32,000
  --jobs N              parallel compile jobs for llama.cpp (default nproc)
  --out FILE            raw JSON lines (default DIR/results/<time>.jsonl; the table goes
                        beside it as .md)
  --quick               a check of the script in about a minute: --shape small --prefill 64
                        --decode 16 --reps 1 (options given explicitly still win)
  -h, --help            this text

Exit status: 0 when every run gave a figure, 1 when one failed (its cell shows "failed"
and stderr names its log), 2 for a usage error.
EOF
}

log() { printf '[%s] %s\n' "$me" "$*" >&2; }
die() {
    printf '[%s] error: %s\n' "$me" "$*" >&2
    exit 1
}
need() {
    local c
    for c in "$@"; do
        command -v "$c" >/dev/null 2>&1 || die "'$c' is not on the PATH; $me needs it (${need_why[$c]:-})"
    done
}
declare -A need_why=([npm]="to fetch node-llama-cpp@$NLC_VERSION with npm pack" [git]="to clone llama.cpp's gitRelease.bundle"
    [tar]="to unpack the npm package" [cmake]="to build llama.cpp (Debian: apt-get install cmake g++)")

# ------------------------------------------------------------------ options
dir=/tmp/pkv-llamacpp
llama_build="" llama_build_avx2="" avx2_build=1 build_only=0 quick=0
pagekv="$root/build/bin/pagekv"
types="q8_0 q4_k_m q6_k f16 bf16" paths=""
o_reps="" o_prefill="" o_decode="" o_shape="" threads=$(nproc) nseq=16 jobs=$(nproc) out=""

argval() { # option name, remaining argument count
    [[ $2 -ge 2 ]] || {
        printf '%s: %s needs a value (see --help)\n' "$me" "$1" >&2
        exit 2
    }
}
while [[ $# -gt 0 ]]; do
    case $1 in
    -h | --help) usage; exit 0 ;;
    --dir) argval "$1" $#; dir=$2; shift ;;
    --llama-build) argval "$1" $#; llama_build=$2; shift ;;
    --llama-build-avx2) argval "$1" $#; llama_build_avx2=$2; shift ;;
    --no-avx2-build) avx2_build=0 ;;
    --build-only) build_only=1 ;;
    --pagekv) argval "$1" $#; pagekv=$2; shift ;;
    --types) argval "$1" $#; types=${2//,/ }; shift ;;
    --paths) argval "$1" $#; paths=${2//,/ }; shift ;;
    --reps) argval "$1" $#; o_reps=$2; shift ;;
    -t | --threads) argval "$1" $#; threads=$2; shift ;;
    --prefill) argval "$1" $#; o_prefill=$2; shift ;;
    --decode) argval "$1" $#; o_decode=$2; shift ;;
    --n-seq) argval "$1" $#; nseq=$2; shift ;;
    --shape) argval "$1" $#; o_shape=$2; shift ;;
    --jobs) argval "$1" $#; jobs=$2; shift ;;
    --out) argval "$1" $#; out=$2; shift ;;
    --quick) quick=1 ;;
    *) printf '%s: unknown option %s (see --help)\n' "$me" "$1" >&2; exit 2 ;;
    esac
    shift
done
if ((quick)); then
    reps=${o_reps:-1} prefill=${o_prefill:-64} decode=${o_decode:-16} shape=${o_shape:-small}
else
    reps=${o_reps:-3} prefill=${o_prefill:-512} decode=${o_decode:-128} shape=${o_shape:-ref}
fi
for v in reps threads prefill decode nseq jobs; do
    [[ ${!v} =~ ^[1-9][0-9]*$ ]] || { printf '%s: --%s expects a positive integer, got "%s"\n' "$me" "$v" "${!v}" >&2; exit 2; }
done
case $shape in
ref) shape_args="--layers 28 --dim 1024 --heads 16 --kv-heads 8 --head-dim 128 --ffn 3072 --vocab 151936 --ctx 8192" ;;
small) shape_args="--layers 4 --dim 512 --heads 8 --kv-heads 4 --head-dim 64 --ffn 1536 --vocab 32000 --ctx 8192" ;;
*) printf '%s: --shape is ref or small, got "%s"\n' "$me" "$shape" >&2; exit 2 ;;
esac
# pagekv's --n-seq benchmark forks a prompt of this many tokens (src/cli/cmd-bench.c)
npp=64

mkdir -p "$dir" || die "cannot create $dir"
dir=$(cd "$dir" && pwd)
logs=$dir/logs
mkdir -p "$logs" "$dir/models" "$dir/results"
stamp=$(date +%Y%m%d-%H%M%S)

# ------------------------------------------------------------------ pagekv
# The kernel path pagekv's CPU device takes under PKV_CPU_PATH=$1, as it names it itself
# (src/device/cpu/cpu-kernels.c: avx2 needs avx2+fma; avx512 also avx512f/bw/vl; amx also
# AMX tiles that the kernel lends); a path the CPU lacks falls back to a lower one.
pkv_path_of() {
    PKV_CPU_PATH=$1 "$pagekv" devices 2>/dev/null |
        sed -n 's/.*host CPU, [0-9]* threads, \([a-z0-9]*\) kernels.*/\1/p' | head -n 1
}

# The binary and the paths to run, checked before llama.cpp's long build so that a
# wrong --pagekv or --paths stops at once.
check_pagekv() {
    local p
    [[ -x $pagekv ]] || die "no pagekv binary at $pagekv (build it: make; or name one with --pagekv)"
    pagekv=$(cd "$(dirname "$pagekv")" && pwd)/$(basename "$pagekv")
    if [[ -z $paths ]]; then
        for p in avx2 avx512 amx; do [[ $(pkv_path_of $p) == "$p" ]] && paths+="$p "; done
        [[ -n $paths ]] || die "pagekv runs none of avx2, avx512, amx on this CPU ($(pkv_path_of avx2) kernels): nothing to compare"
    else
        for p in $paths; do
            case $p in avx2 | avx512 | amx) ;; *) die "--paths: '$p' is not one of avx2 avx512 amx" ;; esac
            [[ $(pkv_path_of "$p") == "$p" ]] || die "--paths: this CPU does not run pagekv's $p path (it takes $(pkv_path_of "$p"))"
        done
    fi
    read -r -a pa <<<"$paths"
    paths="${pa[*]}"
}
((build_only)) || check_pagekv

# ------------------------------------------------------------------ llama.cpp
src=$dir/llama.cpp

fetch_llama() {
    if [[ -f $src/CMakeLists.txt ]]; then
        log "llama.cpp source: $src (already there)"
        return
    fi
    need npm git tar
    local tgz=$dir/node-llama-cpp-$NLC_VERSION.tgz bundle=$dir/package/llama/gitRelease.bundle
    if [[ ! -s $tgz ]]; then
        log "npm pack node-llama-cpp@$NLC_VERSION in $dir (log: $logs/npm-pack.log)"
        (cd "$dir" && npm pack "node-llama-cpp@$NLC_VERSION") >"$logs/npm-pack.log" 2>&1 ||
            die "npm pack node-llama-cpp@$NLC_VERSION failed (no registry access?); see $logs/npm-pack.log"
        [[ -s $tgz ]] || die "npm pack did not write $tgz; see $logs/npm-pack.log"
    fi
    if [[ ! -s $bundle ]]; then
        log "unpacking package/llama from $tgz"
        tar -xzf "$tgz" -C "$dir" package/llama || die "cannot unpack package/llama from $tgz"
        [[ -s $bundle ]] || die "$tgz has no package/llama/gitRelease.bundle"
    fi
    log "git clone $bundle -> $src (log: $logs/git-clone.log)"
    rm -rf "$src.partial"
    git clone "$bundle" "$src.partial" >"$logs/git-clone.log" 2>&1 || die "git clone of $bundle failed; see $logs/git-clone.log"
    mv "$src.partial" "$src"
}

# build_llama NAME BUILD_DIR [cmake -D options...]: configure once (a stamp file marks a
# configure that finished), then build the two targets; reuses whatever is built.
build_llama() {
    local name=$1 b=$2 missing=() t
    shift 2
    for t in llama-bench llama-batched-bench; do [[ -x $b/bin/$t ]] || missing+=("$t"); done
    if [[ ${#missing[@]} -eq 0 ]]; then
        log "llama.cpp $name build: $b (already built)"
        return
    fi
    need cmake
    if [[ ! -f $b/.pkv-configured ]]; then
        log "configuring llama.cpp ($name) in $b (log: $logs/cmake-$name.log)"
        cmake -S "$src" -B "$b" -DCMAKE_BUILD_TYPE=Release -DGGML_OPENMP=OFF -DLLAMA_OPENSSL=OFF \
            -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_SERVER=OFF -DGGML_CCACHE=OFF \
            "$@" >"$logs/cmake-$name.log" 2>&1 ||
            die "configuring llama.cpp ($name) failed; see $logs/cmake-$name.log (remove $b to start over)"
        touch "$b/.pkv-configured"
    fi
    log "building ${missing[*]} ($name, -j$jobs; about 25 minutes on 2 cores; log: $logs/build-$name.log)"
    cmake --build "$b" --target "${missing[@]}" -j "$jobs" >"$logs/build-$name.log" 2>&1 ||
        die "building llama.cpp ($name) failed; see $logs/build-$name.log"
}

# an existing build named with --llama-build[-avx2]: build a missing tool there if it is a
# CMake build directory, else stop
use_build() {
    local name=$1 b=$2 missing=() t
    [[ -d $b ]] || die "--llama-build${name/native/}: $b is not a directory"
    for t in llama-bench llama-batched-bench; do [[ -x $b/bin/$t ]] || missing+=("$t"); done
    [[ ${#missing[@]} -eq 0 ]] && return
    [[ -f $b/CMakeCache.txt ]] || die "$b/bin lacks ${missing[*]} and $b is not a CMake build directory"
    need cmake
    log "building ${missing[*]} in $b ($name, -j$jobs; log: $logs/build-$name.log)"
    cmake --build "$b" --target "${missing[@]}" -j "$jobs" >"$logs/build-$name.log" 2>&1 ||
        die "building ${missing[*]} in $b failed; see $logs/build-$name.log"
}

has_flag() { grep -qw "$1" /proc/cpuinfo 2>/dev/null; }

builds=()             # llama.cpp builds to run: names
declare -A build_dir  # name -> build directory
if [[ -n $llama_build ]]; then
    use_build native "$llama_build"
    build_dir[native]=$(cd "$llama_build" && pwd)
    builds+=(native)
    if [[ -n $llama_build_avx2 ]]; then
        use_build avx2 "$llama_build_avx2"
        build_dir[avx2]=$(cd "$llama_build_avx2" && pwd)
        builds+=(avx2)
    fi
else
    [[ -z $llama_build_avx2 ]] || die "--llama-build-avx2 goes with --llama-build"
    fetch_llama
    build_llama native "$dir/build-native" -DGGML_NATIVE=ON
    build_dir[native]=$dir/build-native
    builds+=(native)
    if ((avx2_build)) && has_flag avx512f; then
        # GGML_NATIVE=OFF turns the baseline x86 options on; name them anyway, and every
        # AVX-512 / AVX-VNNI / AMX option off, so the build is what an AVX2 CPU runs.
        build_llama avx2 "$dir/build-avx2" -DGGML_NATIVE=OFF -DGGML_SSE42=ON -DGGML_AVX=ON -DGGML_AVX2=ON \
            -DGGML_FMA=ON -DGGML_F16C=ON -DGGML_BMI2=ON -DGGML_AVX_VNNI=OFF -DGGML_AVX512=OFF \
            -DGGML_AVX512_VBMI=OFF -DGGML_AVX512_VNNI=OFF -DGGML_AVX512_BF16=OFF -DGGML_AMX_TILE=OFF \
            -DGGML_AMX_INT8=OFF -DGGML_AMX_BF16=OFF
        build_dir[avx2]=$dir/build-avx2
        builds+=(avx2)
    fi
fi
if ((build_only)); then
    for b in "${builds[@]}"; do log "llama.cpp $b: ${build_dir[$b]}/bin"; done
    exit 0
fi
declare -A build_label=([native]="native" [avx2]="AVX2-only")

# The comparisons: every pagekv path against the native llama.cpp build; avx2 also
# against the AVX2-only build where there is one.
rows=()
for p in $paths; do rows+=("$p|native"); done
if [[ -n ${build_dir[avx2]:-} ]]; then
    if [[ " $paths " == *" avx2 "* ]]; then rows+=("avx2|avx2"); else builds=(native); fi
fi

# ------------------------------------------------------------------ models
model_of() { echo "$dir/models/qwen3-$shape-$1.gguf"; }
for t in $types; do
    f=$(model_of "$t")
    [[ -s $f ]] && continue
    log "pagekv mkmodel --arch qwen3 --type $t $shape_args -o $f"
    # shellcheck disable=SC2086
    "$pagekv" mkmodel --arch qwen3 --type "$t" $shape_args -o "$f.partial" >"$logs/mkmodel-$shape-$t.log" 2>&1 ||
        die "pagekv mkmodel --type $t failed; see $logs/mkmodel-$shape-$t.log (pagekv mkmodel --help lists the types)"
    mv "$f.partial" "$f"
done

# ------------------------------------------------------------------ runs
out=${out:-$dir/results/$stamp.jsonl}
mkdir -p "$(dirname "$out")"
: >"$out" || die "cannot write $out"
table=${out%.jsonl}.md
[[ $table != "$out" ]] || table=$out.md
tmp=$(mktemp -d)
ld_path=${LD_LIBRARY_PATH:-}
trap 'rm -rf "$tmp"' EXIT

jstr() { # a JSON string literal of $1; null for an empty one
    [[ -n $1 ]] || { printf 'null'; return; }
    local s=${1//\\/\\\\}
    s=${s//\"/\\\"}
    printf '"%s"' "$s"
}
# jnum KEY LINE: the number after "KEY": in a one-line JSON object (its last occurrence)
jnum() { sed -n "s/.*\"$1\": *\(-\{0,1\}[0-9][0-9.eE+-]*\).*/\1/p" <<<"$2" | head -n 1; }

declare -A vals # "type|who|metric" -> space-separated figures; who: pkv:PATH or llama:BUILD
declare -A desc # "pkv:PATH" -> kernel path as bench model's device_description names it
failed=0 llama_commit="" llama_fa=""

record() { # engine tool path build type rep cmd json-line
    printf '{"engine": %s, "tool": %s, "path": %s, "llama_build": %s, "weights": %s, "shape": %s, "rep": %d, "cmd": %s, "result": %s}\n' \
        "$(jstr "$1")" "$(jstr "$2")" "$(jstr "$3")" "$(jstr "$4")" "$(jstr "$5")" "$(jstr "$shape")" "$6" "$(jstr "$7")" "$8" >>"$out"
}
add() { vals[$1]+="$2 "; }
fail() { # what, log
    log "FAILED: $1; see $2"
    failed=1
}

run_pagekv() { # path type model rep
    local p=$1 t=$2 m=$3 r=$4 lf=$logs/$stamp-pagekv-$1-$2-$4.log line
    local cmd=("$pagekv" bench model -m "$m" -d cpu -t "$threads" --prefill "$prefill" --decode "$decode" --depth 0
        --n-seq "$nseq" --kv-type f16 --json)
    log "  pagekv $p: PKV_CPU_PATH=$p ${cmd[*]}"
    if ! PKV_CPU_PATH=$p "${cmd[@]}" >"$tmp/pkv" 2>"$lf"; then
        fail "pagekv bench model ($p, $t)" "$lf"
        return
    fi
    line=$(grep '^{' "$tmp/pkv" | tail -n 1 || true)
    [[ -n $line ]] || { fail "pagekv bench model ($p, $t) printed no JSON" "$lf"; return; }
    record pagekv "bench model" "$p" "" "$t" "$r" "PKV_CPU_PATH=$p ${cmd[*]}" "$line"
    local d
    d=$(sed -n 's/.*"device_description": "[^"]*, \([a-z0-9]*\) kernels".*/\1/p' <<<"$line")
    desc[pkv:$p]=$d
    [[ $d == "$p" ]] || log "  warning: PKV_CPU_PATH=$p ran pagekv's $d kernels"
    add "$t|pkv:$p|pp" "$(jnum prefill_tok_s "$line")"
    add "$t|pkv:$p|tg" "$(jnum decode_tok_s "$line")"
    add "$t|pkv:$p|roof" "$(jnum roofline_fraction "$line")"
    add "$t|pkv:$p|bat" "$(jnum tok_s "$line")"
}

# llama_one BUILD TYPE REP KEY(pp|tg) LOGFILE COMMAND...: one llama-bench run
llama_one() {
    local b=$1 t=$2 r=$3 k=$4 lf=$5 line
    shift 5
    log "  llama.cpp ${build_label[$b]}: $*"
    if ! LD_LIBRARY_PATH=${build_dir[$b]}/bin${ld_path:+:$ld_path} "$@" >"$tmp/ll" 2>>"$lf"; then
        fail "llama-bench ($k, ${build_label[$b]}, $t)" "$lf"
        return
    fi
    line=$(grep '^{' "$tmp/ll" | tail -n 1 || true)
    [[ -n $line ]] || { fail "llama-bench ($k, ${build_label[$b]}, $t) printed no JSON" "$lf"; return; }
    record llama.cpp llama-bench "" "$b" "$t" "$r" "$*" "$line"
    add "$t|llama:$b|$k" "$(jnum avg_ts "$line")"
    llama_commit=$(sed -n 's/.*"build_commit": "\([^"]*\)".*/\1/p' <<<"$line")
    llama_fa=$(jnum flash_attn "$line")
}

run_llama() { # build type model rep
    local b=$1 t=$2 m=$3 r=$4 bin=${build_dir[$1]}/bin line
    local lf=$logs/$stamp-llama-$1-$2-$4.log
    : >"$lf"
    # prefill, then decode at the depth pagekv's decode starts from (see the header)
    llama_one "$b" "$t" "$r" pp "$lf" "$bin/llama-bench" -m "$m" -t "$threads" -p "$prefill" -n 0 -r 1 \
        -ctk f16 -ctv f16 -o jsonl
    llama_one "$b" "$t" "$r" tg "$lf" "$bin/llama-bench" -m "$m" -t "$threads" -p 0 -n "$decode" -d "$prefill" -r 1 \
        -ctk f16 -ctv f16 -o jsonl
    # a context of n_seq streams of a multiple of 256 cells, each holding 64 + D tokens:
    # llama-batched-bench skips (prints nothing for) a case that does not fit
    local per=$(((npp + decode + 255) / 256 * 256))
    local bb=("$bin/llama-batched-bench" -m "$m" -t "$threads" -c $((nseq * per)) -npp "$npp" -ntg "$decode" -npl "$nseq" -pps
        -ctk f16 -ctv f16 --output-format jsonl)
    log "  llama.cpp ${build_label[$b]}: ${bb[*]}"
    # Its logger writes from a thread that the process does not wait for at exit
    # (common/log.cpp leaks it on purpose), so the result line, printed last, is
    # sometimes lost: run again, up to three times in all.
    for _ in 1 2 3; do
        if ! LD_LIBRARY_PATH=$bin${ld_path:+:$ld_path} "${bb[@]}" >"$tmp/ll" 2>>"$lf"; then
            fail "llama-batched-bench (${build_label[$b]}, $t)" "$lf"
            return
        fi
        line=$(grep '"speed_tg"' "$tmp/ll" | tail -n 1 || true)
        [[ -n $line ]] && break
        log "  llama-batched-bench printed no result (its logger can drop the last line at exit); again"
    done
    if [[ -z $line ]]; then
        fail "llama-batched-bench (${build_label[$b]}, $t) printed no result in 3 runs" "$lf"
        return
    fi
    record llama.cpp llama-batched-bench "" "$b" "$t" "$r" "${bb[*]}" "$line"
    add "$t|llama:$b|bat" "$(jnum speed_tg "$line")"
}

cpu_model=$(lscpu 2>/dev/null | sed -n 's/^Model name: *//p' | head -n 1)
[[ -n $cpu_model ]] || cpu_model=$(sed -n 's/^model name[[:space:]]*: //p' /proc/cpuinfo | head -n 1)
cpu_flags=""
for f in avx2 fma f16c avx512f avx512bw avx512vl avx512_vnni avx512_bf16 avx512_fp16 amx_tile amx_int8 amx_bf16; do
    has_flag $f && cpu_flags+="${cpu_flags:+ }$f"
done
load_before=$(cut -d' ' -f1-3 /proc/loadavg)
if awk -v l="${load_before%% *}" -v n="$(nproc)" 'BEGIN { exit !(l > n / 2) }'; then
    log "warning: load average $load_before on $(nproc) CPUs: other work is running. llama.cpp's threads"
    log "  spin-wait between ops and slow down far more than pagekv's on a shared CPU; take the ratios as a"
    log "  check of the script, not a measurement"
fi

# One repetition runs each pagekv path and each llama.cpp build once, interleaved
# (pagekv, llama.cpp, pagekv, llama.cpp, ...), so slow drifts of the machine hit both.
seq_=()
for ((i = 0; i < ${#pa[@]} || i < ${#builds[@]}; i++)); do
    if ((i < ${#pa[@]})); then seq_+=("pkv:${pa[$i]}"); fi
    if ((i < ${#builds[@]})); then seq_+=("llama:${builds[$i]}"); fi
done
log "CPU: $cpu_model; flags: $cpu_flags; $threads threads; load average $load_before"
log "runs per weight type and repetition: ${seq_[*]}; $reps repetition(s); raw JSON lines: $out"
for t in $types; do
    m=$(model_of "$t")
    for ((r = 1; r <= reps; r++)); do
        log "$t, repetition $r of $reps"
        for s in "${seq_[@]}"; do
            case $s in
            pkv:*) run_pagekv "${s#pkv:}" "$t" "$m" "$r" ;;
            llama:*) run_llama "${s#llama:}" "$t" "$m" "$r" ;;
            esac
        done
    done
done
load_after=$(cut -d' ' -f1-3 /proc/loadavg)

# ------------------------------------------------------------------ table
median() { # figures on stdin (one line, spaces) -> median, or nothing
    tr ' ' '\n' | { grep -E '^[0-9.eE+-]+$' || true; } | sort -g |
        awk '{ a[NR] = $1 } END { if (NR) printf "%.3f\n", NR % 2 ? a[(NR + 1) / 2] : (a[NR / 2] + a[NR / 2 + 1]) / 2 }'
}
fmt() { [[ -n $1 ]] && printf '%.1f' "$1" || printf 'failed'; }
ratio() { [[ -n $1 && -n $2 ]] && awk -v a="$1" -v b="$2" 'BEGIN { if (b > 0) printf "**%.2f**", a / b; else printf "-" }' || printf -- '-'; }
{
    echo "pagekv against llama.cpp, $(date -u '+%Y-%m-%d %H:%M UTC')"
    echo
    echo "- CPU: $cpu_model ($(nproc) CPUs; flags: $cpu_flags); $threads threads; load average before $load_before, after $load_after"
    kp="" lb=""
    for p in $paths; do kp+="${kp:+, }PKV_CPU_PATH=$p: ${desc[pkv:$p]:-?} kernels"; done
    for b in "${builds[@]}"; do lb+="${lb:+, }${build_label[$b]} (${build_dir[$b]})"; done
    echo "- pagekv: $("$pagekv" --version 2>/dev/null | head -n 1) ($pagekv); kernel path as \`bench model\` names it (device_description): $kp"
    echo "- llama.cpp: node-llama-cpp $NLC_VERSION's gitRelease.bundle (commit ${llama_commit:-?}); builds: $lb; flash_attn ${llama_fa:-?} (-1: auto)"
    echo "- models: pagekv mkmodel --arch qwen3 $shape_args (shape \"$shape\"; q4_k_m is mkmodel's mixture, not llama-quantize's)"
    echo "- medians of $reps alternating run(s); tok/s. prefill $prefill tokens; decode $decode tokens after the prefill (llama-bench -d $prefill);"
    echo "  $nseq sequences: a $npp-token prompt shared, $decode steps of $nseq tokens (llama-batched-bench -pps S_TG); f16 KV for both"
    echo
    echo "| pagekv path | llama.cpp build | weights | prefill pagekv | llama.cpp | ratio | decode pagekv | llama.cpp | ratio | $nseq-seq decode pagekv | llama.cpp | ratio | pagekv decode / roofline |"
    echo "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"
    for row in "${rows[@]}"; do
        p=${row%|*} b=${row#*|}
        for t in $types; do
            line="| $p | ${build_label[$b]} | $t"
            for k in pp tg bat; do
                a=$(median <<<"${vals[$t|pkv:$p|$k]:-}")
                c=$(median <<<"${vals[$t|llama:$b|$k]:-}")
                line+=" | $(fmt "$a") | $(fmt "$c") | $(ratio "$a" "$c")"
            done
            roof=$(median <<<"${vals[$t|pkv:$p|roof]:-}")
            line+=" | ${roof:-failed} |"
            echo "$line"
        done
    done
    echo
    echo "(ratio: pagekv / llama.cpp. Raw JSON lines: $out)"
} | tee "$table"
log "table: $table; raw JSON lines: $out"
exit $failed
