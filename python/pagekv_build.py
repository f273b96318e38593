"""The package's own PEP 517 build backend (pyproject.toml: backend-path = ["."]).

The package is pure Python, so a wheel is a zip of pagekv/*.py and its metadata.
Building it with the standard library alone means `pip install ./python` needs
nothing from an index: pip's isolated build environment has nothing to install
(requires = []), so the install works offline, where a setuptools backend would
make pip fetch setuptools first. Metadata comes from pyproject.toml's [project]
table (read with tomllib, or a small reader of its simple keys before Python 3.11).
Implements build_wheel, build_sdist and build_editable (PEP 517/660).
"""
import base64
import hashlib
import io
import os
import re
import tarfile
import time
import zipfile

HERE = os.path.dirname(os.path.abspath(__file__))
PACKAGE = "pagekv"
# written by the pagekv build (the build tree's library path): never part of a wheel
SKIP = {"_libpath.py"}


def _project():
    path = os.path.join(HERE, "pyproject.toml")
    try:
        import tomllib
        with open(path, "rb") as f:
            return tomllib.load(f)["project"]
    except ImportError:
        pass
    # Python < 3.11: the [project] table's strings, and its optional-dependencies' lists
    proj, extras, table = {}, {}, None
    with open(path, encoding="utf-8") as f:
        for line in f:
            line = line.strip()
            m = re.match(r"^\[(.+)\]$", line)
            if m:
                table = m.group(1)
                continue
            m = re.match(r'^([A-Za-z0-9_-]+)\s*=\s*(.*)$', line)
            if not m:
                continue
            key, val = m.group(1), m.group(2)
            if table == "project" and val.startswith('"'):
                proj[key] = val.strip('"')
            elif table == "project.optional-dependencies":
                extras[key] = re.findall(r'"([^"]+)"', val)
    proj["optional-dependencies"] = extras
    return proj


def _metadata():
    p = _project()
    lines = ["Metadata-Version: 2.1", "Name: " + p["name"], "Version: " + p["version"]]
    if p.get("description"):
        lines.append("Summary: " + p["description"])
    if p.get("requires-python"):
        lines.append("Requires-Python: " + p["requires-python"])
    for dep in p.get("dependencies", []):
        lines.append("Requires-Dist: " + dep)
    for extra, deps in sorted(p.get("optional-dependencies", {}).items()):
        lines.append("Provides-Extra: " + extra)
        for dep in deps:
            lines.append('Requires-Dist: %s; extra == "%s"' % (dep, extra))
    body = ""
    readme = os.path.join(HERE, "README.md")
    if os.path.exists(readme):
        lines.append("Description-Content-Type: text/markdown")
        with open(readme, encoding="utf-8") as f:
            body = "\n" + f.read()
    return p["name"], p["version"], "\n".join(lines) + "\n" + body


def _sources():
    """(path in the archive, path on disk) of the package's modules, sorted."""
    out = []
    pkg = os.path.join(HERE, PACKAGE)
    for name in sorted(os.listdir(pkg)):
        if name.endswith(".py") and name not in SKIP:
            out.append((PACKAGE + "/" + name, os.path.join(pkg, name)))
    return out


def _digest(data):
    return "sha256=" + base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()


def _wheel(wheel_directory, files):
    """Write a py3-none-any wheel of files [(archive path, bytes)] plus dist-info."""
    name, version, metadata = _metadata()
    dist = "%s-%s" % (name, version)
    info = dist + ".dist-info"
    files = list(files) + [
        (info + "/METADATA", metadata.encode()),
        (info + "/WHEEL", b"Wheel-Version: 1.0\nGenerator: pagekv_build\nRoot-Is-Purelib: true\nTag: py3-none-any\n"),
    ]
    record = "".join("%s,%s,%d\n" % (p, _digest(d), len(d)) for p, d in files) + info + "/RECORD,,\n"
    files.append((info + "/RECORD", record.encode()))
    wheel = dist + "-py3-none-any.whl"
    stamp = time.gmtime(int(os.environ.get("SOURCE_DATE_EPOCH", "315532800")))[:6]
    with zipfile.ZipFile(os.path.join(wheel_directory, wheel), "w", zipfile.ZIP_DEFLATED) as z:
        for path, data in files:
            zi = zipfile.ZipInfo(path, stamp)
            zi.external_attr = 0o644 << 16
            zi.compress_type = zipfile.ZIP_DEFLATED
            z.writestr(zi, data)
    return wheel


def _read(path):
    with open(path, "rb") as f:
        return f.read()


def get_requires_for_build_wheel(config_settings=None):
    return []


def get_requires_for_build_sdist(config_settings=None):
    return []


def get_requires_for_build_editable(config_settings=None):
    return []


def build_wheel(wheel_directory, config_settings=None, metadata_directory=None):
    return _wheel(wheel_directory, [(arc, _read(disk)) for arc, disk in _sources()])


def build_editable(wheel_directory, config_settings=None, metadata_directory=None):
    # a .pth file that puts this folder on sys.path: edits take effect without reinstalling
    return _wheel(wheel_directory, [(PACKAGE + "_editable.pth", (HERE + "\n").encode())])


def build_sdist(sdist_directory, config_settings=None):
    name, version, metadata = _metadata()
    base = "%s-%s" % (name, version)
    members = [(base + "/PKG-INFO", metadata.encode())]
    for rel in ("pyproject.toml", "README.md", "pagekv_build.py"):
        if os.path.exists(os.path.join(HERE, rel)):
            members.append((base + "/" + rel, _read(os.path.join(HERE, rel))))
    members += [(base + "/" + arc, _read(disk)) for arc, disk in _sources()]
    out = base + ".tar.gz"
    with tarfile.open(os.path.join(sdist_directory, out), "w:gz", format=tarfile.PAX_FORMAT) as t:
        for path, data in members:
            ti = tarfile.TarInfo(path)
            ti.size, ti.mode, ti.mtime = len(data), 0o644, int(os.environ.get("SOURCE_DATE_EPOCH", "315532800"))
            t.addfile(ti, io.BytesIO(data))
    return out
