#!/usr/bin/env bash
# The Python bindings' tests (python/tests, pytest) against this build: the
# package copy in BUILD/python (its _libpath.py names BUILD's libpagekv.so) and
# the CLI in BUILD/bin (models are made with `pagekv mkmodel`).
#   python-check.sh BUILD_DIR SOURCE_DIR
# Python: /usr/bin/python3 when it has pytest (Debian's python3-pytest and
# python3-numpy install there), else the first python3 on the PATH that has it;
# none: SKIPPED (77). PKV_PYTHON names the interpreter(s) to try instead. pytest's "no tests collected" (5) is a failure: the tests
# exist, so collecting none means something is broken.
set -u
build=$1 src=$2
py=""
for cand in ${PKV_PYTHON:-/usr/bin/python3 $(command -v -a python3 2>/dev/null)}; do
  if [ -x "$cand" ] && "$cand" -c 'import pytest' 2>/dev/null; then py=$cand; break; fi
done
if [ -z "$py" ]; then
  echo "python-check: no python3 with pytest (Debian: apt-get install python3-pytest python3-numpy): skipped"
  exit 77
fi
if ! "$py" -c 'import numpy' 2>/dev/null; then
  echo "python-check: $py has no numpy (python3-numpy): the tests need it"; exit 1
fi
echo "python-check: $("$py" --version) ($py), pytest $("$py" -c 'import pytest; print(pytest.__version__)')"
export PYTHONPATH="$build/python" PKV_CLI="$build/bin/pagekv" PYTHONDONTWRITEBYTECODE=1
tmp=$(mktemp -d "${TMPDIR:-/tmp}/pkv-py.XXXXXX")
trap 'rm -rf "$tmp"' EXIT
cd "$src/python/tests" || exit 1
"$py" -m pytest -q -p no:cacheprovider --basetemp="$tmp/pytest" -o console_output_style=classic .
rc=$?
case $rc in
  0) exit 0 ;;
  5) echo "python-check: pytest collected no tests"; exit 1 ;;
  *) exit $rc ;;
esac
