#!/usr/bin/env bash
# Voxtral's projector against an independent numpy implementation of the
# transformers definition (tests/ref/voxtral_ref.py; docs/multimodal.md):
# test-mmproj-audio --dump writes a random-weight pair, 31 s of test audio and the
# CPU's 750 rows; the reference recomputes them from the same GGUF file and audio.
#   voxtral-ref-check.sh TEST_BINARY SOURCE_DIR
# Python: /usr/bin/python3 when it has numpy (Debian's python3-numpy), else the
# first python3 on the PATH that has it; none: SKIPPED (77).
set -u
bin=$1 src=$2
py=""
for cand in ${PKV_PYTHON:-/usr/bin/python3 $(command -v -a python3 2>/dev/null)}; do
  if [ -x "$cand" ] && "$cand" -c 'import numpy' 2>/dev/null; then py=$cand; break; fi
done
if [ -z "$py" ]; then
  echo "voxtral-ref-check: no python3 with numpy (Debian: apt-get install python3-numpy): skipped"
  exit 77
fi
tmp=$(mktemp -d "${TMPDIR:-/tmp}/pkv-voxref.XXXXXX")
trap 'rm -rf "$tmp"' EXIT
"$bin" --dump "$tmp" || exit 1
PYTHONDONTWRITEBYTECODE=1 "$py" "$src/tests/ref/voxtral_ref.py" "$tmp/proj.gguf" "$tmp/audio.f32" "$tmp/rows.f32"
