"""Every ctypes struct has the C struct's field offsets and size (compiled against
include/pagekv.h), so the bindings never read or write beside a field."""
import ctypes
import os
import shutil
import subprocess

import pytest

from pagekv import _lib


def test_struct_layout(source_dir, tmp_path):
    cc = shutil.which(os.environ.get("CC", "cc")) or shutil.which("gcc")
    header = os.path.join(source_dir, "include", "pagekv.h")
    if not cc or not os.path.exists(header):
        pytest.skip("no C compiler or no include/pagekv.h")
    lines = ['#include <stdio.h>', '#include <stddef.h>', '#include "pagekv.h"', "int main(void) {"]
    for cname, cls in _lib.C_STRUCTS.items():
        lines.append('printf("%s sizeof %%zu\\n", sizeof(%s));' % (cname, cname))
        for f in cls._fields_:
            lines.append('printf("%s %s %%zu\\n", offsetof(%s, %s));' % (cname, f[0], cname, f[0]))
    lines.append("return 0; }")
    src = tmp_path / "layout.c"
    src.write_text("\n".join(lines))
    exe = tmp_path / "layout"
    subprocess.run([cc, "-std=c11", "-I", os.path.dirname(header), str(src), "-o", str(exe)], check=True)
    want = {}
    for line in subprocess.run([str(exe)], capture_output=True, text=True, check=True).stdout.splitlines():
        s, f, v = line.split()
        want[(s, f)] = int(v)
    checked = 0
    for cname, cls in _lib.C_STRUCTS.items():
        assert ctypes.sizeof(cls) == want[(cname, "sizeof")], cname
        for f in cls._fields_:
            assert getattr(cls, f[0]).offset == want[(cname, f[0])], "%s.%s" % (cname, f[0])
            checked += 1
    assert checked > 150
