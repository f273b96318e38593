"""pagekv's statuses as Python exceptions.

Every failing call raises a subclass of PagekvError carrying the library's
status (``e.status``, a Status) and message (``e.message``: pkv_errmsg(), with
the file, tensor, layer or devices involved). OutOfPagesError is the
recoverable "KV page pool exhausted" of the C API: nothing was changed.
"""
import enum

from ._lib import lib

__all__ = ["Status", "PagekvError", "InvalidError", "NoMemoryError", "OutOfPagesError", "PagekvIOError",
           "FormatError", "UnsupportedError", "DeviceError", "MismatchError", "NotFoundError", "InternalError"]


class Status(enum.IntEnum):
    OK = 0
    INVALID = -1
    NOMEM = -2
    OUT_OF_PAGES = -3
    IO = -4
    FORMAT = -5
    UNSUPPORTED = -6
    DEVICE = -7
    MISMATCH = -8
    NOT_FOUND = -9
    INTERNAL = -10

    def __str__(self):
        return lib.pkv_status_str(int(self)).decode()


class PagekvError(Exception):
    """A pagekv call failed: ``status`` is its Status, ``message`` what went wrong."""
    status = Status.INTERNAL

    def __init__(self, status, message):
        try:
            status = Status(status)
        except ValueError:
            pass
        self.status = status
        self.message = message
        super().__init__("%s (%s)" % (message, str(status)) if message else str(status))


class InvalidError(PagekvError, ValueError):
    pass


class NoMemoryError(PagekvError, MemoryError):
    pass


class OutOfPagesError(PagekvError):
    """The KV page pool is exhausted; nothing was changed (free contexts and retry)."""


class PagekvIOError(PagekvError, OSError):
    pass


class FormatError(PagekvError, ValueError):
    pass


class UnsupportedError(PagekvError):
    pass


class DeviceError(PagekvError):
    pass


class MismatchError(PagekvError, ValueError):
    pass


class NotFoundError(PagekvError, LookupError):
    pass


class InternalError(PagekvError):
    pass


_BY_STATUS = {Status.INVALID: InvalidError, Status.NOMEM: NoMemoryError, Status.OUT_OF_PAGES: OutOfPagesError,
              Status.IO: PagekvIOError, Status.FORMAT: FormatError, Status.UNSUPPORTED: UnsupportedError,
              Status.DEVICE: DeviceError, Status.MISMATCH: MismatchError, Status.NOT_FOUND: NotFoundError,
              Status.INTERNAL: InternalError}


def error(status, message=None):
    """The exception for a status; message None = this thread's pkv_errmsg()."""
    if message is None:
        message = lib.pkv_errmsg().decode("utf-8", "replace")
    return _BY_STATUS.get(status, PagekvError)(status, message)


def check(status):
    """Raise the exception of a failed status (the message is read on this thread,
    where ctypes made the call, so it is that call's)."""
    if status != 0:
        raise error(status)
    return status


def check_handle(h):
    """A handle-returning call: NULL raises with pkv_errcode()'s status."""
    if not h:
        code = lib.pkv_errcode()
        raise error(code if code != 0 else Status.INTERNAL)
    return h
