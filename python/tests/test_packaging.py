"""pip install ./python works offline (--no-build-isolation: Debian's setuptools,
nothing fetched), and the installed package finds libpagekv through the dynamic
linker (here LD_LIBRARY_PATH; after `make install`, ldconfig's cache)."""
import os
import shutil
import subprocess
import sys

import pytest

import pagekv
from conftest import SOURCE


def test_pip_install_offline(tmp_path):
    import importlib.util
    if not all(importlib.util.find_spec(m) for m in ("pip", "setuptools", "wheel")):
        pytest.skip("pip, setuptools or wheel missing (python3-pip, python3-setuptools, python3-wheel)")
    target = tmp_path / "site"
    env = dict(os.environ, PIP_NO_INDEX="1", PIP_CONFIG_FILE=os.devnull, PIP_DISABLE_PIP_VERSION_CHECK="1")
    # setuptools writes build/ and *.egg-info beside the sources: build from a copy
    src = tmp_path / "python"
    shutil.copytree(os.path.join(SOURCE, "python"), src, ignore=shutil.ignore_patterns("__pycache__", "build", "*.egg-info"))
    r = subprocess.run([sys.executable, "-m", "pip", "install", "--no-build-isolation", "--no-deps", "--target",
                        str(target), str(src)], capture_output=True, text=True, env=env,
                       cwd=tmp_path, timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
    assert (target / "pagekv" / "core.py").exists() and not (target / "pagekv" / "_libpath.py").exists()
    libdir = os.path.dirname(pagekv.library_path)
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PAGEKV_LIBRARY")}
    env.update(PYTHONPATH=str(target), LD_LIBRARY_PATH=libdir)
    r = subprocess.run([sys.executable, "-c", "import pagekv; print(pagekv.version(), pagekv.library_path)"],
                       capture_output=True, text=True, env=env, cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert r.stdout.split()[0] == pagekv.version() and r.stdout.split()[1] == "libpagekv.so.0"
