"""pip install ./python works offline (pip's own build isolation, no index: the
package's backend, pagekv_build.py, needs nothing installed), the wheel's RECORD
matches its files, and the installed package finds libpagekv through the dynamic
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
    if not importlib.util.find_spec("pip"):
        pytest.skip("pip missing (python3-pip)")
    target = tmp_path / "site"
    env = dict(os.environ, PIP_NO_INDEX="1", PIP_CONFIG_FILE=os.devnull, PIP_DISABLE_PIP_VERSION_CHECK="1")
    # build from a copy, as a user's checkout would be: nothing written beside the sources
    src = tmp_path / "python"
    shutil.copytree(os.path.join(SOURCE, "python"), src, ignore=shutil.ignore_patterns("__pycache__", "build", "*.egg-info"))
    r = subprocess.run([sys.executable, "-m", "pip", "install", "--no-deps", "--target",
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


def test_wheel_record(tmp_path):
    """The backend's wheel: every module but the build tree's _libpath.py, each
    RECORD line's sha256 and size those of the file, the metadata from pyproject."""
    import base64
    import hashlib
    import importlib
    import zipfile
    sys.path.insert(0, os.path.join(SOURCE, "python"))
    try:
        backend = importlib.import_module("pagekv_build")
    finally:
        sys.path.pop(0)
    whl = tmp_path / backend.build_wheel(str(tmp_path))
    with zipfile.ZipFile(whl) as z:
        names = set(z.namelist())
        mods = {"pagekv/" + f for f in os.listdir(os.path.join(SOURCE, "python", "pagekv"))
                if f.endswith(".py") and f != "_libpath.py"}
        assert mods <= names and "pagekv/_libpath.py" not in names
        info = [n for n in names if n.endswith(".dist-info/RECORD")][0].rsplit("/", 1)[0]
        rows = z.read(info + "/RECORD").decode().splitlines()
        assert len(rows) == len(names)
        for row in rows:
            path, digest, size = row.rsplit(",", 2)
            if path == info + "/RECORD":
                continue
            data = z.read(path)
            assert int(size) == len(data), path
            assert digest == "sha256=" + base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
        meta = z.read(info + "/METADATA").decode()
        assert "Name: pagekv\n" in meta and "Version: %s\n" % pagekv.version().split()[0] in meta
