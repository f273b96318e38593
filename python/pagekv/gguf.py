"""A GGUF file's metadata (its key-value header), read in Python.

The C API loads models but does not hand out the header's key-values, so
Model.metadata reads them here, from the file (or the bytes) the model was
loaded from: only the header, never the tensor data. Every count and length is
checked against the bytes that remain, so a malformed file raises FormatError
instead of allocating what it claims.
"""
import mmap
import struct

from .errors import FormatError, PagekvIOError, Status

__all__ = ["read_metadata"]

_SCALARS = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?", 10: "<Q", 11: "<q", 12: "<d"}
_STRING, _ARRAY = 8, 9


class _Reader:
    def __init__(self, data, label):
        self.d, self.p, self.label = data, 0, label

    def fail(self, what):
        raise FormatError(Status.FORMAT, "gguf %s: %s at byte %d" % (self.label, what, self.p))

    def take(self, n):
        if n < 0 or self.p + n > len(self.d):
            self.fail("truncated (%d bytes wanted, %d left)" % (n, len(self.d) - self.p))
        b = self.d[self.p:self.p + n]
        self.p += n
        return b

    def scalar(self, fmt):
        return struct.unpack(fmt, self.take(struct.calcsize(fmt)))[0]

    def string(self):
        n = self.scalar("<Q")
        return bytes(self.take(n)).decode("utf-8", "replace")

    def value(self, t, depth=0):
        if t in _SCALARS:
            return self.scalar(_SCALARS[t])
        if t == _STRING:
            return self.string()
        if t == _ARRAY:
            if depth > 2:
                self.fail("arrays nested too deep")
            et = self.scalar("<I")
            n = self.scalar("<Q")
            if et in _SCALARS:
                size = struct.calcsize(_SCALARS[et])
                if n * size > len(self.d) - self.p:
                    self.fail("array of %d elements does not fit" % n)
                return list(struct.unpack("<%d%s" % (n, _SCALARS[et][1]), self.take(n * size)))
            if et not in (_STRING, _ARRAY):
                self.fail("unknown array element type %d" % et)
            if n * 8 > len(self.d) - self.p:  # each element needs at least a length
                self.fail("array of %d elements does not fit" % n)
            return [self.value(et, depth + 1) for _ in range(n)]
        self.fail("unknown value type %d" % t)


def read_metadata(source, label=None):
    """The key-values of a GGUF file (path) or image (bytes): {key: value}, values
    as int, float, bool, str or lists of them. Raises PagekvIOError or FormatError."""
    if isinstance(source, (bytes, bytearray, memoryview)):
        with memoryview(source) as data:
            return _parse(data, label or "<memory>")
    label = label or str(source)
    try:
        with open(source, "rb") as f:
            # mapped: only the header's pages are read, however large the file
            m = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
    except (OSError, ValueError) as e:
        raise PagekvIOError(Status.IO, "gguf %s: %s" % (label, getattr(e, "strerror", None) or e)) from e
    try:
        with memoryview(m) as data:
            return _parse(data, label)
    finally:
        m.close()


def _parse(data, label):
    r = _Reader(data, label)
    if bytes(r.take(4)) != b"GGUF":
        r.p = 0
        r.fail("not a GGUF file (magic)")
    version = r.scalar("<I")
    if version not in (2, 3):
        r.fail("GGUF version %d (2 and 3 are read)" % version)
    r.scalar("<Q")  # tensor count
    n_kv = r.scalar("<Q")
    if n_kv * 12 > len(data) - r.p:
        r.fail("%d key-values do not fit" % n_kv)
    out = {}
    for _ in range(n_kv):
        key = r.string()
        out[key] = r.value(r.scalar("<I"))
    return out
