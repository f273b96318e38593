#!/usr/bin/env bash
# Every command block of README.md runs as written (issue 28): the ```sh blocks
# other than the set-up one (`make run` / `make test`, which CI itself runs), and
# the ```js client snippet against the served quick-start model, and the ```python
# blocks with this build's package (BUILD/python) on a `pagekv mkmodel` model.gguf. The only
# changes made to the text: `pagekv` and `build/bin/pagekv` are this build's
# binary, the `export PATH` line is dropped (PATH is set here), port 8080
# becomes a free port (the machine may have 8080 taken; `pagekv serve` gets
# `--port`), and the benchmark block runs its model's shape with 2 layers instead
# of 28 and 16/4 tokens instead of 512/64, `mpirun` gets `--oversubscribe` (and may
# run as root, as CI does) (the full shape takes minutes on a
# 2-core CI machine; the commands and options are the same). Each block runs with
# `set -e` in a scratch folder; a failing command fails the test, naming the block,
# and a "# -> TEXT" comment line in a block is output that must appear.
#   readme-check.sh SOURCE_DIR BUILD_BIN_DIR NODE_DIR
set -u
src=$1 bin=$2 node_dir=$3
work=$(mktemp -d "${TMPDIR:-/tmp}/pkv-readme.XXXXXX")
trap 'kill $(jobs -p) 2>/dev/null; rm -rf "$work"' EXIT
port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
export PATH="$bin:$PATH"
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
# blocks: block-N.sh / block-N.js / block-N.python, in README order
# (blocks inside a list item are indented: the indentation is dropped)
awk -v out="$work" '
  /^ *```(sh|js|python)$/ { n++; ext = $0; sub(/^ *```/, "", ext); f = out "/block-" n "." ext; next }
  /^ *```/ { f = ""; next }
  f != "" { sub(/^  /, ""); print > f }' "$src/README.md"
fails=0 ran=0
for f in $(ls "$work"/block-* | sort -t- -k2 -n); do
  name=$(basename "$f")
  if grep -qE '^make (run|test)' "$f"; then echo "readme: $name is the set-up block (CI runs it): skipped here"; continue; fi
  if grep -q '^mpirun ' "$f" && ! command -v mpirun > /dev/null; then
    echo "readme: $name needs mpirun (openmpi-bin), which this machine does not have: skipped"; continue
  fi
  if grep -q 'vulkan:0' "$f" && ! pagekv devices 2>/dev/null | grep -q 'vulkan:0'; then
    echo "readme: $name needs vulkan:0, which this machine does not have: skipped"; continue
  fi
  sed -i -e '/^export PATH=/d' -e 's#build/bin/pagekv#pagekv#g' -e "s/8080/$port/g" \
      -e "s/^pagekv serve /pagekv serve --port $port /" \
      -e 's/--layers 28 /--layers 2 /' -e 's/--prefill 512 --decode 64/--prefill 16 --decode 4/' \
      -e 's/^mpirun /mpirun --oversubscribe /' "$f"
  case "$f" in
    *.sh)
      echo "readme: running $name:"; sed 's/^/    /' "$f"
      (cd "$work" && timeout 600 bash -e "$f") >"$work/$name.log" 2>&1
      rc=$?
      if [ $rc -ne 0 ]; then echo "FAIL: README $name exited $rc:"; tail -20 "$work/$name.log"; fails=$((fails+1)); fi
      ran=$((ran+1))
      # a '# -> TEXT' line in a block is output the README promises: it must appear
      while IFS= read -r want; do
        if ! grep -qF -- "$want" "$work/$name.log"; then
          echo "FAIL: README $name promises '$want', which its output lacks:"; tail -5 "$work/$name.log"; fails=$((fails+1))
        fi
      done < <(sed -n 's/^# -> //p' "$f")
      # the quick start: the chat answer came back as a chat completion
      if grep -q 'v1/chat/completions' "$f" && ! grep -q '"chat.completion"' "$work/$name.log"; then
        echo "FAIL: README $name: no chat completion in its output:"; tail -5 "$work/$name.log"; fails=$((fails+1))
      fi;;
    *.python)
      py=""
      for cand in /usr/bin/python3 python3; do
        if command -v "$cand" >/dev/null && PYTHONPATH="$bin/../python" "$cand" -c 'import pagekv' 2>/dev/null; then
          py=$cand; break
        fi
      done
      if [ -z "$py" ]; then echo "readme: $name: no python3 imports this build's pagekv ($bin/../python): skipped"; continue; fi
      [ -f "$work/model.gguf" ] || pagekv mkmodel -o "$work/model.gguf" 2>/dev/null
      echo "readme: running $name ($py):"; sed 's/^/    /' "$f"
      (cd "$work" && PYTHONPATH="$bin/../python" timeout 300 "$py" "$f") >"$work/$name.log" 2>&1
      rc=$?
      if [ $rc -ne 0 ] || [ ! -s "$work/$name.log" ]; then
        echo "FAIL: README $name (python) exited $rc or printed nothing:"; tail -20 "$work/$name.log"; fails=$((fails+1))
      fi
      ran=$((ran+1));;
    *.js)
      if [ ! -d "$node_dir/node_modules/openai" ] || ! command -v node >/dev/null; then
        echo "readme: $name needs node and the openai client (test-server-openai installs it): skipped"; continue
      fi
      [ -f "$work/model.gguf" ] || pagekv mkmodel -o "$work/model.gguf" 2>/dev/null
      pagekv serve -m "$work/model.gguf" --port "$port" >"$work/serve.log" 2>&1 &
      spid=$!
      for i in $(seq 100); do curl -sf "http://127.0.0.1:$port/health" >/dev/null && break; sleep 0.2; done
      cp "$f" "$node_dir/readme-snippet.mjs"
      echo "readme: running $name (node) against pagekv serve on port $port"
      (cd "$node_dir" && timeout 120 node readme-snippet.mjs) >"$work/$name.log" 2>&1
      rc=$?
      kill $spid; wait $spid 2>/dev/null
      if [ $rc -ne 0 ] || [ ! -s "$work/$name.log" ]; then
        echo "FAIL: README $name (node) exited $rc or printed nothing:"; tail -20 "$work/$name.log"; fails=$((fails+1))
      fi
      ran=$((ran+1));;
  esac
done
echo "readme: $ran blocks run, $fails failed"
[ $ran -gt 0 ] || exit 77
[ $fails -eq 0 ]
