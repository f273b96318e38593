#!/usr/bin/env bash
# Run every fuzz harness (or those named in FUZZ_ONLY, e.g. "gguf kvfile") for
# FUZZ_SECONDS seconds each, FUZZ_JOBS at a time (default: one per CPU), at the
# lowest CPU priority.
#   bash fuzz/run.sh [BUILD_DIR]      (make fuzz FUZZ_SECONDS=N does this)
# Corpora grow in BUILD_DIR/corpus/<harness>/ and are kept between runs; the seeds
# (make fuzz-corpus) are read from BUILD_DIR/seeds/<harness>/. A crash, leak,
# sanitizer report, timeout (FUZZ_TIMEOUT seconds for one input, default 30; the
# template interpreter's harness: FUZZ_TIMEOUT_JINJA, default 10: its renders are
# bounded in time, so a slow input is a bug; the grammar harness: FUZZ_TIMEOUT_GRAMMAR,
# default 10: its parsing is linear and its matching bounded by work limits) or
# out-of-memory input is saved under BUILD_DIR/crashes/ and printed with the
# one-line command that reproduces it; the script then exits 1 (after running the
# remaining harnesses). Logs: BUILD_DIR/logs/<harness>.log.
set -u
cd "$(dirname "$0")/.."
B=${1:-build-fuzz}
secs=${FUZZ_SECONDS:-60}
only=${FUZZ_ONLY:-}
timeout=${FUZZ_TIMEOUT:-30}
timeout_jinja=${FUZZ_TIMEOUT_JINJA:-10}
timeout_grammar=${FUZZ_TIMEOUT_GRAMMAR:-10}
harnesses=()
for src in fuzz/fuzz-*.c; do
  h=$(basename "$src" .c)
  if [ -n "$only" ] && [[ " $only " != *" ${h#fuzz-} "* ]]; then continue; fi
  harnesses+=("$h")
done
if [ ${#harnesses[@]} -eq 0 ]; then echo "fuzz: no harness matches FUZZ_ONLY='$only'" >&2; exit 2; fi
mkdir -p "$B/crashes" "$B/logs" "$B/results"
jobs=${FUZZ_JOBS:-$(nproc 2>/dev/null || echo 1)}
[ "$jobs" -ge 1 ] 2>/dev/null || jobs=1

# One harness: runs it and writes its report to $B/results/<name>.txt, then its
# exit status to $B/results/<name>.rc (read in harness order below, so the output
# is the same whatever finished first).
run_one() {
  local h=$1 name=${1#fuzz-}
  local bin="$B/bin/$h" corpus="$B/corpus/$name" seeds="$B/seeds/$name" log="$B/logs/$name.log"
  local out="$B/results/$name.txt" dict=()
  mkdir -p "$corpus" "$seeds"
  local t=$timeout
  [ "$name" = jinja ] && t=$timeout_jinja
  [ "$name" = grammar ] && t=$timeout_grammar
  [ -f "fuzz/$name.dict" ] && dict=("-dict=fuzz/$name.dict")
  echo "== $h: ${secs}s (corpus $corpus, seeds $seeds)" >"$out"
  # Lowest priority: the machine is shared. Leaks count as failures.
  ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=1} UBSAN_OPTIONS=${UBSAN_OPTIONS:-print_stacktrace=1} \
    nice -n 19 "$bin" -max_total_time="$secs" -timeout="$t" -rss_limit_mb=2048 \
    -print_final_stats=1 -artifact_prefix="$B/crashes/$name-" "${dict[@]}" "$corpus" "$seeds" >"$log" 2>&1
  local rc=$?
  {
    grep -E "^(Done|stat::number_of_executed_units|stat::peak_rss_mb)" "$log" | sed 's/^/   /'
    grep -E "^#[0-9]+ +DONE" "$log" | tail -1 | sed 's/^/   /'
    if [ $rc -ne 0 ]; then
      echo "FAIL: $h exited with $rc; the report:"
      grep -E "ERROR: |FUZZ_CHECK failed|runtime error|SUMMARY" "$log" | head -8 | sed 's/^/   /'
      # the first stack of the report (where it crashed, or where the leaked block
      # was allocated), so a CI log alone names the culprit
      awk '/^ *#[0-9]+ 0x/ {print; n++; if (n >= 16) exit; next} n > 0 {exit}' "$log" | sed 's/^/   /'
      for unit in $(sed -n 's/.*Test unit written to \(.*\)$/\1/p' "$log"); do
        echo "   saved: $unit"
        echo "   reproduce: $bin $unit"
      done
    fi
  } >>"$out"
  echo $rc >"$B/results/$name.rc"
}

for h in "${harnesses[@]}"; do
  if [ ! -x "$B/bin/$h" ]; then echo "fuzz: $B/bin/$h is missing (make fuzz builds it)" >&2; exit 2; fi
  rm -f "$B/results/${h#fuzz-}.rc"
done
# FUZZ_JOBS harnesses at a time (default: one per CPU), each a single libFuzzer
# job, so 10 harnesses of 60 s take 5 minutes on 2 cores instead of 10.
echo "fuzz: ${#harnesses[@]} harnesses, ${secs}s each, $jobs at a time"
running=0
for h in "${harnesses[@]}"; do
  if [ $running -ge "$jobs" ]; then wait -n; running=$((running-1)); fi
  run_one "$h" &
  running=$((running+1))
done
wait
failed=0
for h in "${harnesses[@]}"; do
  name=${h#fuzz-}
  cat "$B/results/$name.txt"
  rc=$(cat "$B/results/$name.rc" 2>/dev/null || echo 1)
  [ "$rc" = 0 ] || failed=1
done
exit $failed
