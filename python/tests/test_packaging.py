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
    # this process's library, however it was found (library_path is absolute then too)
    libdir = os.path.dirname(pagekv.library_path)
    assert os.path.isabs(libdir), pagekv.library_path
    r = _import_by_linker(target, libdir, tmp_path)
    version, path = r.stdout.rsplit(None, 1)
    assert version == pagekv.version()
    assert os.path.isabs(path) and os.path.samefile(path, os.path.join(libdir, "libpagekv.so.0")), path


def _import_by_linker(pythonpath, libdir, cwd):
    """pagekv imported from pythonpath with no _libpath.py and no PAGEKV_LIBRARY:
    it loads libpagekv.so.0 by name from LD_LIBRARY_PATH=libdir. Its version and
    library_path on stdout."""
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PAGEKV_LIBRARY")}
    env.update(PYTHONPATH=str(pythonpath), LD_LIBRARY_PATH=libdir)
    r = subprocess.run([sys.executable, "-c", "import pagekv; print(pagekv.version(), pagekv.library_path)"],
                       capture_output=True, text=True, env=env, cwd=cwd)
    assert r.returncode == 0, r.stderr
    return r


def test_library_path_resolved(tmp_path):
    """library_path is the loaded file's absolute path also when the dynamic linker
    found it by name (issue 43 item 8: it was the bare name, and a test that took
    its directory for LD_LIBRARY_PATH got an empty one): the source package (no
    _libpath.py) under LD_LIBRARY_PATH, then a package that itself was found that
    way loads the library again through its library_path's directory."""
    src = tmp_path / "python"
    shutil.copytree(os.path.join(SOURCE, "python", "pagekv"), src / "pagekv",
                    ignore=shutil.ignore_patterns("__pycache__", "_libpath.py"))
    libdir = os.path.dirname(os.path.abspath(pagekv.library_path))
    path = _import_by_linker(src, libdir, tmp_path).stdout.rsplit(None, 1)[1]
    assert os.path.isabs(path) and os.path.samefile(path, os.path.join(libdir, "libpagekv.so.0")), path
    again = _import_by_linker(src, os.path.dirname(path), tmp_path).stdout.rsplit(None, 1)[1]
    assert os.path.samefile(again, path)


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
