"""pagekv from Python: ctypes bindings for libpagekv (include/pagekv.h).

    import pagekv
    with pagekv.Model("model.gguf") as m:
        cache = m.cache(n_ctx=512)
        ctx = cache.context()
        ctx.decode(m.tokenize("Hello"))
        branch = ctx.fork()                      # O(1): pages shared copy-on-write
        print(m.detokenize(branch.generate(16, temp=0)))

See docs/python.md for the whole API and its thread-safety rules.
"""
from ._lib import library_path, live_handles
from .chat import ChatTemplateError
from .core import Cache, Context, Model, Sampler, Sequence, check_device, devices, type_id, version
from .engine import Engine, Event, Request
from .errors import (DeviceError, FormatError, InternalError, InvalidError, MismatchError, NoMemoryError,
                     NotFoundError, OutOfPagesError, PagekvError, PagekvIOError, Status, UnsupportedError)
from .gguf import read_metadata

__version__ = "0.3.0"


def alloc_live():
    """Live allocations the C library has made through its allocator hooks (for leak checks)."""
    from ._lib import lib
    return lib.pkv_alloc_live()


__all__ = ["Model", "Cache", "Context", "Sequence", "Sampler", "Engine", "Request", "Event", "devices",
           "check_device", "version", "type_id", "read_metadata", "live_handles", "alloc_live", "library_path",
           "Status", "PagekvError", "InvalidError", "NoMemoryError", "OutOfPagesError", "PagekvIOError",
           "FormatError", "UnsupportedError", "DeviceError", "MismatchError", "NotFoundError", "InternalError",
           "ChatTemplateError"]
