"""Models, KV caches, contexts (sequences) and samplers over libpagekv.

Ownership: a Context keeps its Cache and Model alive, a Cache its Model. close()
frees a handle at once (and, for a Model or Cache, every Cache and Context made
from it first); the garbage collector frees what was not closed. `with` blocks
close on exit.

Threads: the C objects of one model (the model, its caches and contexts) are
used by one thread at a time. Every call on them takes the model's lock, so
Python threads may share them safely (their calls are serialized; ctypes drops
the GIL inside each call, so other Python threads run meanwhile). For parallel
generation use an Engine.
"""
import ctypes
import operator
import os
import threading
import weakref
from ctypes import byref, c_float, c_int, c_int32, c_int64, c_size_t, c_uint8

from . import chat as _chat
from . import gguf as _gguf
from ._lib import CHECK_REPORT_FN, KVStats, LogitBias, ModelInfo, _count, lib
from .errors import InvalidError, Status, check, check_handle, error

try:  # NumPy is optional: logits come as numpy arrays with it, memoryviews without
    import numpy as _np
except ImportError:  # pragma: no cover
    _np = None

__all__ = ["Model", "Cache", "Context", "Sequence", "Sampler", "devices", "check_device", "version",
           "type_id", "ModelInfoView"]


def version():
    """The library's version, e.g. '0.3.0'."""
    return lib.pkv_version().decode()


def type_id(name):
    """pkv_type of a type name ('f16', 'q8_0', ...)."""
    if isinstance(name, int):
        return name
    out = c_int()
    check(lib.pkv_type_from_name(name.encode(), byref(out)))
    return out.value


def _b(s):
    return s.encode() if isinstance(s, str) else s


def _path(p):
    return os.fsencode(p)


def _token(t, what="token id"):
    """t as a token id for C (an int32 >= 0). ctypes would wrap an int beyond 32
    bits silently: InvalidError (a ValueError) naming the value instead, before
    anything reaches C (TypeError for a non-int)."""
    try:
        v = operator.index(t)
    except TypeError:
        raise TypeError("%s must be an int, not %s" % (what, type(t).__name__)) from None
    if not 0 <= v <= 0x7FFFFFFF:
        raise InvalidError(Status.INVALID, "%s %d is outside the vocabulary (not in 0 .. 2**31 - 1)" % (what, v))
    return v


def _tokens(seq, what="token id"):
    """A C int32 array of token ids (each checked by _token) and its length."""
    seq = [_token(t, what) for t in seq]
    return (c_int32 * max(len(seq), 1))(*seq), len(seq)


class _Handle:
    """A native handle: freed once, by close() or by the garbage collector.

    A handle made from another (a cache from its model, a context from its cache,
    an engine from its model) names it as its parent: it holds a strong reference
    to it, and the parent's native object is freed only after all of its
    children's. close() closes the children it can still reach first; children it
    cannot reach any more (a model, its cache and a context collected together in
    one garbage-collector pass or at interpreter exit, where weak references are
    cleared before any finalizer runs and the finalizers run in any order) each
    free their own when their turn comes, and the last one frees the parent's."""
    _kind = "Handle"
    _h = None
    _parent = None   # the handle this one was made from (freed after this one)
    _n_open = 0      # children not freed yet
    _pending = None  # this handle, closed while children were still open: freed by the last of them

    def _own(self, h, parent=None):
        self._h = h
        _count(self._kind, 1)
        if parent is not None:
            self._parent = parent
            parent._n_open += 1

    def _free(self, h):  # pragma: no cover - overridden
        raise NotImplementedError

    def close(self):
        h, self._h = self._h, None
        if h:
            for c in list(getattr(self, "_children", ())):
                c.close()
            self._release(h)

    def _release(self, h):
        if self._n_open:
            self._pending = h
            return
        self._free(h)
        _count(self._kind, -1)
        p, self._parent = self._parent, None
        if p is not None:
            with p._lock:  # the count also moves under it when a child is made (an RLock)
                p._n_open -= 1
                if not p._n_open and p._pending:
                    hp, p._pending = p._pending, None
                    p._release(hp)

    @property
    def closed(self):
        return not self._h

    def _live(self):
        if not self._h:
            raise InvalidError(Status.INVALID, "%s is closed" % self._kind)
        return self._h

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def _finalize(self):
        self.close()

    def __del__(self):
        try:
            self._finalize()
        except Exception:  # interpreter shutdown: the module's globals may be gone
            pass


class ModelInfoView(dict):
    """pkv_model_info as a dict whose keys are also attributes (info.n_vocab)."""
    __getattr__ = dict.__getitem__


# ------------------------------------------------------------------ devices


def devices(extra_cpu=0):
    """The devices that can be opened here: a list of dicts (name, description,
    kind, memory_bytes, host_memory, has_kernels, batch_invariant, ...); and why
    others are missing, as devices.why after the call."""
    names = (ctypes.c_char * 64 * 64)()
    n = c_int()
    why = ctypes.create_string_buffer(512)
    check(lib.pkv_device_enumerate(extra_cpu, names, 64, byref(n), why, len(why)))
    out = []
    for i in range(min(n.value, 64)):
        name = names[i].value
        dev = lib.pkv_device_open(name, lib.pkv_device_default_params())
        if not dev:
            out.append({"name": name.decode(), "error": lib.pkv_errmsg().decode("utf-8", "replace")})
            continue
        try:
            caps = lib.pkv_device_get_caps(dev).contents
            out.append({"name": caps.name.decode(), "description": caps.description.decode("utf-8", "replace"),
                        "kind": ("cpu", "vulkan", "cuda", "test")[caps.kind] if 0 <= caps.kind < 4 else caps.kind,
                        "memory_bytes": caps.memory_bytes, "transfer_align": caps.transfer_align,
                        "max_buffer_bytes": caps.max_buffer_bytes, "host_memory": caps.host_memory,
                        "has_kernels": caps.has_kernels, "batch_invariant": caps.batch_invariant})
        finally:
            lib.pkv_device_close(dev)
    devices.why = why.value.decode("utf-8", "replace")
    return out


devices.why = ""


def check_device(device="cpu", seed=0, iterations=0, kernels=True, cross=None):
    """pagekv check on one device: the transfer conformance suite, the kernels
    against the CPU reference (kernels=True) and copies to and from another
    device (cross='cpu:1'). Returns (passed, rows), rows a list of dicts (device,
    test, passed, skipped, count, seconds, detail). A device that fails a check
    gives passed False; a suite that cannot run raises."""
    rows = []

    def report(r, _user):
        r = r.contents
        rows.append({"device": (r.device or b"").decode(), "test": (r.test or b"").decode(), "passed": r.passed,
                     "skipped": r.skipped, "count": r.count, "seconds": r.seconds,
                     "detail": r.detail.decode("utf-8", "replace")})

    cb = CHECK_REPORT_FN(report)
    p = lib.pkv_check_default_params()
    p.seed, p.iterations = seed, iterations
    devs = []
    try:
        for name in [device] + ([cross] if cross else []):
            devs.append(check_handle(lib.pkv_device_open(_b(name), lib.pkv_device_default_params())))
        passed = True
        suites = [lambda: lib.pkv_check_transfers(devs[0], p, cb, None)]
        if kernels:
            suites.append(lambda: lib.pkv_check_kernels(devs[0], p, cb, None))
        if cross:
            suites.append(lambda: lib.pkv_check_cross(devs[0], devs[1], p, cb, None))
        for run in suites:
            s = run()
            if s == Status.DEVICE:
                passed = False
            elif s != 0:
                raise error(s)
        return passed, rows
    finally:
        for d in devs:
            lib.pkv_device_close(d)


# -------------------------------------------------------------------- model


class Model(_Handle):
    """A GGUF model loaded onto a device (or split over several).

    Model(path, device=None, devices=None, split=None, kv_on_host=False,
    n_threads=0, no_mmap=False, mtp=False); Model.builtin() for the built-in
    tiny model; Model.from_bytes(image) for a GGUF image in memory."""
    _kind = "Model"

    def __init__(self, path=None, *, device=None, devices=None, split=None, kv_on_host=False, n_threads=0,
                 no_mmap=False, mtp=False, _image=None, _label=None, _builtin=False):
        self._lock = threading.RLock()
        self._children = weakref.WeakSet()
        self._engines = 0
        self._meta = None
        self._source = None
        keep = [_b(device), _b(devices), _b(split)]  # alive until the call returns
        p = lib.pkv_model_default_params()
        p.device, p.devices, p.split = keep
        p.kv_on_host, p.n_threads, p.no_mmap, p.mtp = kv_on_host, n_threads, no_mmap, mtp
        if _builtin:
            h = lib.pkv_model_builtin(p)
        elif _image is not None:
            buf = (c_uint8 * len(_image)).from_buffer_copy(_image)
            h = lib.pkv_model_load_memory(buf, len(_image), _b(_label or "<memory>"), p)
            self._source = bytes(_image)
        else:
            if path is None:
                raise InvalidError(Status.INVALID, "Model: a path, or Model.builtin() / Model.from_bytes()")
            h = lib.pkv_model_load(_path(path), p)
            self._source = os.fspath(path)
        self._own(check_handle(h))
        info = ModelInfo()
        check(lib.pkv_model_get_info(self._h, byref(info)))
        self.info = ModelInfoView((k, getattr(info, k).decode() if isinstance(getattr(info, k), bytes)
                                   else getattr(info, k)) for k, _ in ModelInfo._fields_)
        self.n_vocab = info.n_vocab
        self.path = self._source if isinstance(self._source, str) else None

    @classmethod
    def builtin(cls, **kw):
        """The built-in tiny llama model (what `pagekv run` uses without -m)."""
        return cls(_builtin=True, **kw)

    @classmethod
    def from_bytes(cls, image, label="<memory>", **kw):
        """A model from a GGUF image in memory (copied; the bytes may be dropped after)."""
        return cls(_image=image, _label=label, **kw)

    def _free(self, h):
        lib.pkv_model_free(h)

    def close(self):
        if self._engines:
            raise InvalidError(Status.INVALID, "Model.close: an Engine still uses this model; close it first")
        with self._lock:
            super().close()

    def _finalize(self):
        # collected: an engine that still counts here is being collected too, and
        # frees the model after itself (_Handle._release)
        with self._lock:
            _Handle.close(self)

    def _use(self):
        """The handle, for a call that drives the model's device (not while an engine owns it)."""
        if self._engines:
            raise InvalidError(Status.INVALID, "this model is used by an Engine: the C API lets nothing else "
                                               "drive it while the engine lives (tokenize is fine)")
        return self._live()

    # -- vocabulary

    @property
    def bos(self):
        return lib.pkv_model_bos(self._live())

    @property
    def eos(self):
        return lib.pkv_model_eos(self._live())

    def is_eog(self, token):
        """True when token ends generation (EOS/EOT/... as llama.cpp decides)."""
        return lib.pkv_model_is_eog(self._live(), _token(token))

    def tokenize(self, text, add_special=True, parse_special=False):
        """Token ids of text (str or bytes). add_special: BOS/EOS as the model asks;
        parse_special: special-token text becomes the special token."""
        data = text.encode() if isinstance(text, str) else bytes(text)
        n = c_size_t()
        cap = len(data) + 16
        while True:
            out = (c_int32 * cap)()
            s = lib.pkv_model_tokenize(self._live(), data, len(data), add_special, parse_special, out, cap, byref(n))
            if s == Status.INVALID and n.value > cap:
                cap = n.value
                continue
            check(s)
            return list(out[:n.value])

    def tokenize_spans(self, text, spans, add_special=True):
        """tokenize with special tokens parsed only outside the byte spans
        [(start, end), ...] (message text in a rendered chat prompt)."""
        data = text.encode() if isinstance(text, str) else bytes(text)
        flat = [x for ab in spans for x in ab]
        sp = (c_size_t * max(len(flat), 1))(*flat)
        n = c_size_t()
        cap = len(data) + 16
        while True:
            out = (c_int32 * cap)()
            s = lib.pkv_model_tokenize_spans(self._live(), data, len(data), add_special, sp, len(spans), out, cap,
                                             byref(n))
            if s == Status.INVALID and n.value > cap:
                cap = n.value
                continue
            check(s)
            return list(out[:n.value])

    def detokenize_bytes(self, tokens, render_special=False):
        """The bytes of token ids (a token may hold part of a UTF-8 character)."""
        ids, n_ids = _tokens(tokens)
        n = c_size_t()
        cap = 16 * n_ids + 16
        while True:
            buf = ctypes.create_string_buffer(cap)
            s = lib.pkv_model_detokenize(self._live(), ids, n_ids, render_special, buf, cap, byref(n))
            if s == Status.INVALID and n.value > cap:
                cap = n.value + 1
                continue
            check(s)
            return buf.raw[:n.value]

    def detokenize(self, tokens, render_special=False):
        """The text of token ids (invalid UTF-8 replaced by U+FFFD)."""
        return self.detokenize_bytes(tokens, render_special).decode("utf-8", "replace")

    def token_piece(self, token, render_special=False):
        """The bytes of one token."""
        n = c_size_t()
        buf = ctypes.create_string_buffer(256)
        token = _token(token)
        s = lib.pkv_model_token_piece(self._live(), token, render_special, buf, 256, byref(n))
        if s == Status.INVALID and n.value > 256:
            buf = ctypes.create_string_buffer(n.value)
            s = lib.pkv_model_token_piece(self._live(), token, render_special, buf, n.value, byref(n))
        check(s)
        return buf.raw[:n.value]

    # -- metadata and chat

    @property
    def metadata(self):
        """The GGUF header's key-values ({} for the built-in model)."""
        if self._meta is None:
            self._meta = _gguf.read_metadata(self._source) if self._source is not None else {}
        return self._meta

    @property
    def chat_template(self):
        """tokenizer.chat_template, or None."""
        t = self.metadata.get("tokenizer.chat_template")
        return t if isinstance(t, str) else None

    def apply_chat_template(self, messages, add_generation_prompt=True, tools=None, template=None, **kwargs):
        """The prompt text of a conversation ([{'role': 'user', 'content': 'Hi'}, ...])
        rendered with the model's chat template (or `template`: Jinja text or a
        built-in family's name) by libpagekv's chat layer, as pagekv serve renders
        it (its /apply-template answers the same text). Keywords go to the template
        as chat_template_kwargs (enable_thinking=False, ...)."""
        return self._render(messages, add_generation_prompt, tools, template, kwargs)[0]

    def tokenize_chat(self, messages, add_generation_prompt=True, tools=None, template=None, **kwargs):
        """Token ids of a rendered conversation: the template's own text may make
        special tokens, message text never does (it is tokenized as plain text).
        BOS text the template writes is left out of the prompt when the tokenizer
        adds BOS itself (as the server does)."""
        text, spans = self._render(messages, add_generation_prompt, tools, template, kwargs)
        return self.tokenize_spans(text.encode("utf-8", "surrogatepass"), spans, add_special=True)

    def _render(self, messages, add_generation_prompt, tools, template, kwargs):
        if template is None and self.chat_template is None:
            raise error(Status.NOT_FOUND, "the model has no chat template (tokenizer.chat_template); pass template=")
        src = template if template is not None else self.chat_template
        return _chat.render(src, messages, add_generation_prompt=add_generation_prompt, tools=tools,
                            model=self._live(), **kwargs)

    # -- caches

    def cache(self, n_ctx=0, n_seq_max=0, page_size=0, kv_type="f16", kv_type_v=None, n_pages=0, host_pages=0,
              n_window_pages=0, disk_dir=None, disk_bytes=0, remote_url=None):
        """A paged KV cache for this model (see pkv_cache_params: 0 = the default). disk_dir: a
        directory for the disk tier below the pools (docs/kv-cache.md), disk_bytes its cap;
        remote_url: a Redis tier shared with other processes, redis://HOST:PORT (docs/distributed.md)."""
        return Cache(self, n_ctx=n_ctx, n_seq_max=n_seq_max, page_size=page_size, kv_type=kv_type,
                     kv_type_v=kv_type_v, n_pages=n_pages, host_pages=host_pages, n_window_pages=n_window_pages,
                     disk_dir=disk_dir, disk_bytes=disk_bytes, remote_url=remote_url)

    def __repr__(self):
        return "<pagekv.Model %s %s%s>" % (self.info.get("arch"), self.path or "(memory)",
                                            " closed" if self.closed else "")


def _cache_params(n_ctx=0, n_seq_max=0, page_size=0, kv_type="f16", kv_type_v=None, n_pages=0, host_pages=0,
                  n_window_pages=0, disk_dir=None, disk_bytes=0, remote_url=None):
    p = lib.pkv_cache_default_params()
    p.n_ctx, p.n_seq_max, p.page_size = n_ctx, n_seq_max, page_size
    p.kv_type = type_id(kv_type)
    if kv_type_v is not None:
        p.kv_type_v = type_id(kv_type_v)
    p.n_pages, p.host_pages, p.n_window_pages = n_pages, host_pages, n_window_pages
    # the string only has to live through pkv_model_cache_create, which the caller makes at once
    p.disk_dir = os.fsencode(disk_dir) if disk_dir is not None else None
    p.disk_bytes = disk_bytes
    p.remote_url = remote_url.encode() if remote_url is not None else None
    return p


class Cache(_Handle):
    """A paged KV cache of a model: the pool of pages its contexts share."""
    _kind = "Cache"

    def __init__(self, model, **params):
        self.model = model
        self._lock = model._lock
        self._children = weakref.WeakSet()
        p = _cache_params(**params)
        with self._lock:
            self._own(check_handle(lib.pkv_model_cache_create(model._use(), p)), model)
        model._children.add(self)

    def _free(self, h):
        lib.pkv_kv_cache_free(h)

    def close(self):
        with self._lock:
            super().close()

    def stats(self):
        """pkv_kv_stats as a dict: pages free/used/cached, host pages, sequences,
        copy-on-write and prefix-hit counters, ..."""
        st = KVStats()
        with self._lock:
            lib.pkv_kv_stats_get(self._live(), byref(st))
        return {k: getattr(st, k) for k, _ in KVStats._fields_}

    def context(self, n_ctx=0):
        """A new empty context (sequence) holding at most n_ctx tokens (0 = the default)."""
        return Context(self, n_ctx=n_ctx)

    def load(self, path, n_ctx=0):
        """A context from a file written by Context.save (same geometry; any device).
        Its last token is decoded again, so it has logits."""
        return Context(self, n_ctx=n_ctx, _load=path)


class Context(_Handle):
    """One sequence of a model in a KV cache, with the logits of its last token.

    Made by Cache.context(), Cache.load(), Context.fork(). len(ctx) is its token
    count; ctx.tokens its token ids."""
    _kind = "Context"

    def __init__(self, cache, n_ctx=0, _load=None, _handle=None):
        self.cache = cache
        self.model = cache.model
        self._lock = cache._lock
        with self._lock:
            m = self.model._use()
            if _handle is not None:
                h = _handle
            elif _load is not None:
                h = check_handle(lib.pkv_context_load(m, cache._live(), _path(_load), n_ctx))
            else:
                h = check_handle(lib.pkv_context_create(m, cache._live(), n_ctx))
            self._own(h, cache)
        cache._children.add(self)

    def _free(self, h):
        lib.pkv_context_free(h)

    def close(self):
        with self._lock:
            super().close()

    def _use(self):
        self.model._use()
        return self._live()

    def __len__(self):
        with self._lock:
            return lib.pkv_context_n_tokens(self._live())

    @property
    def n_ctx(self):
        """The most tokens this context may hold."""
        return lib.pkv_context_n_ctx(self._live())

    @property
    def seq(self):
        """The KV sequence id in the cache."""
        return lib.pkv_context_seq(self._live())

    @property
    def tokens(self):
        """Token ids in the cache, as a list."""
        with self._lock:
            h = self._live()
            n = lib.pkv_context_n_tokens(h)
            out = (c_int32 * max(n, 1))()
            check(lib.pkv_context_tokens(h, 0, n, out))
            return list(out[:n])

    @property
    def swapped(self):
        """True while swapped out to the host pool."""
        with self._lock:
            return lib.pkv_kv_seq_swapped(self.cache._live(), lib.pkv_context_seq(self._live()))

    def decode(self, tokens):
        """Append tokens (a list of ids) and compute; afterwards logits are those of
        the last token. On error nothing changes (OutOfPagesError is recoverable)."""
        arr, n = _tokens(tokens)
        with self._lock:
            check(lib.pkv_context_decode(self._use(), arr, n))

    def decode_all(self, tokens):
        """decode() that returns the logits of every token: float32 [n][n_vocab]
        (a numpy array, or a list of memoryviews without NumPy)."""
        arr, n = _tokens(tokens)
        V = self.model.n_vocab
        out = (c_float * (max(n, 1) * V))()
        with self._lock:
            check(lib.pkv_context_decode_all(self._use(), arr, n, out))
        if _np is not None:
            return _np.ctypeslib.as_array(out).reshape(max(n, 1), V)[:n]
        mv = memoryview(out).cast("B").cast("f")
        return [mv[i * V:(i + 1) * V] for i in range(n)]

    def logits(self, copy=False):
        """Logits float32 [n_vocab] of the last decoded token, or None when there
        are none (nothing decoded yet; after truncate, shift or swap without a
        decode). Without copy the array (numpy, read-only) or memoryview shares the
        context's buffer: it changes with the next decode and must not be used
        after close(). copy=True gives a copy of its own."""
        with self._lock:
            p = lib.pkv_context_logits(self._live())
            if not p:
                return None
            V = self.model.n_vocab
            raw = (c_float * V).from_address(ctypes.addressof(p.contents))
            raw._owner = self  # the view keeps the context (and its buffer) from the collector
            if _np is not None:
                a = _np.ctypeslib.as_array(raw)
                if copy:
                    return a.copy()
                a.flags.writeable = False
                return a
            mv = memoryview(raw).cast("B").cast("f")
            return memoryview(bytearray(mv)).cast("f") if copy else mv.toreadonly()

    def fork(self):
        """A child sharing every page (copy-on-write) and the logits: O(1) in the length."""
        with self._lock:
            h = check_handle(lib.pkv_context_fork(self._use()))
            return Context(self.cache, _handle=h)

    def truncate(self, n_keep):
        """Keep the first n_keep tokens (rollback, backtracking). Leaves no logits."""
        with self._lock:
            check(lib.pkv_context_truncate(self._use(), n_keep))

    def shift(self, start, n_remove):
        """Context shift: remove tokens [start, start + n_remove); later tokens move
        down and their cached K is re-rotated. Leaves no logits."""
        with self._lock:
            check(lib.pkv_context_shift(self._use(), start, n_remove))

    def swap_out(self):
        """Move the sequence's pages to the host pool (bit-identical on swap_in)."""
        with self._lock:
            check(lib.pkv_context_swap_out(self._use()))

    def swap_in(self):
        with self._lock:
            check(lib.pkv_context_swap_in(self._use()))

    def save(self, path):
        """Write the sequence (tokens, positions, K/V, checksum) to a file."""
        with self._lock:
            check(lib.pkv_context_save(self._use(), _path(path)))

    def reuse_prefix(self, tokens):
        """For an empty context: share the cached full pages whose tokens equal the
        start of `tokens` (prefix reuse; tokens are compared, never only hashed).
        Returns how many tokens are now in the context (a multiple of the page size);
        decode tokens[n:] next. Pages are cached when a context holding them is freed
        or fills them (they stay in the cache's LRU until evicted)."""
        arr, n = _tokens(tokens)
        got = c_int64()
        with self._lock:
            h = self._use()
            check(lib.pkv_kv_prefix_match(self.cache._live(), lib.pkv_context_seq(h), arr, None, n, byref(got)))
        return got.value

    def generate(self, max_tokens, sampler=None, stop_at_eog=True, **sampling):
        """Yield up to max_tokens sampled tokens, decoding each one (pkv_generate's
        loop, as a generator): a token is yielded while the logits it was drawn
        from are still the context's, and decoded when the next one is asked for,
        so once the loop has run out every token is in the context; an
        end-of-generation token is yielded and ends it without being decoded. sampler: a Sampler, or keywords for one
        (temp=0 is greedy; seed, top_k, top_p, min_p, repeat_penalty, ...)."""
        own = sampler is None
        if own:
            sampler = Sampler(self.model.n_vocab, **sampling)
        try:
            for _ in range(max_tokens):
                with self._lock:
                    p = lib.pkv_context_logits(self._use())
                    if not p:
                        raise InvalidError(Status.INVALID, "generate: the context has no logits (decode a prompt first)")
                    tok = sampler._sample_ptr(p)
                sampler.accept(tok)
                yield tok
                if stop_at_eog and self.model.is_eog(tok):
                    return
                self.decode([tok])
        finally:
            if own:
                sampler.close()

    def __repr__(self):
        return "<pagekv.Context %s>" % ("closed" if self.closed else "%d tokens" % len(self))


Sequence = Context


class Sampler(_Handle):
    """pkv_sampler: repetition and presence/frequency penalties, temperature (<= 0:
    greedy), top-k, top-p, min-p, a seeded draw; the same seed gives the same tokens
    on every machine. Optional grammar (GBNF text) or json_schema constraint (with
    model=, whose vocabulary it masks).

    grammar_token_steps and grammar_request_steps bound the grammar's matching work
    (pkv_grammar_set_work_limits): steps for one token's mask or acceptance, and
    steps since the grammar started (or since reset()). None or 0 = the library's
    defaults (20M per token, 1G per request). Passing one makes sample() raise
    InvalidError naming the limit, and the sampler stays failed until reset()."""
    _kind = "Sampler"

    def __init__(self, n_vocab, temp=0.8, top_k=40, top_p=0.95, min_p=0.05, repeat_penalty=1.0, repeat_last_n=64,
                 seed=0, presence_penalty=0.0, frequency_penalty=0.0, grammar=None, json_schema=None, model=None,
                 grammar_token_steps=None, grammar_request_steps=None, logit_bias=None):
        steps = (_steps("grammar_token_steps", grammar_token_steps),
                 _steps("grammar_request_steps", grammar_request_steps))
        p = sampler_params(temp=temp, top_k=top_k, top_p=top_p, min_p=min_p, repeat_penalty=repeat_penalty,
                           repeat_last_n=repeat_last_n, seed=seed, presence_penalty=presence_penalty,
                           frequency_penalty=frequency_penalty, logit_bias=logit_bias)
        self.n_vocab = n_vocab
        self._vocab = None
        self._own(check_handle(lib.pkv_sampler_create(p, n_vocab)))
        if grammar is not None or json_schema is not None:
            if model is None:
                raise InvalidError(Status.INVALID, "Sampler: a grammar needs model= (its vocabulary)")
            g = make_grammar(grammar, json_schema)
            try:
                check(lib.pkv_grammar_set_work_limits(g, *steps))
                self._vocab = check_handle(lib.pkv_grammar_vocab_create(model._live()))
                check(lib.pkv_sampler_set_grammar(self._h, g, self._vocab))
            finally:
                lib.pkv_grammar_free(g)

    def _free(self, h):
        lib.pkv_sampler_free(h)
        if self._vocab:
            lib.pkv_grammar_vocab_free(self._vocab)
            self._vocab = None

    def _sample_ptr(self, p):
        out = c_int32()
        check(lib.pkv_sampler_sample(self._live(), p, byref(out)))
        return out.value

    def sample(self, logits):
        """One token from a row of n_vocab logits (numpy array, memoryview or list).
        Does not add it to the history: accept() does."""
        if _np is not None and isinstance(logits, _np.ndarray):
            a = _np.ascontiguousarray(logits, dtype=_np.float32)
            if a.size != self.n_vocab:
                raise InvalidError(Status.INVALID, "sample: %d logits for a vocabulary of %d" % (a.size, self.n_vocab))
            return self._sample_ptr(a.ctypes.data_as(ctypes.POINTER(c_float)))
        row = list(logits)
        if len(row) != self.n_vocab:
            raise InvalidError(Status.INVALID, "sample: %d logits for a vocabulary of %d" % (len(row), self.n_vocab))
        return self._sample_ptr((c_float * self.n_vocab)(*row))

    def accept(self, token):
        lib.pkv_sampler_accept(self._live(), _token(token))

    def reset(self):
        lib.pkv_sampler_reset(self._live())


def _steps(name, v):
    """A work limit in steps for the C API: None -> 0 (the library's default)."""
    if v is None:
        return 0
    if isinstance(v, bool) or not isinstance(v, int) or not 0 <= v < 1 << 64:
        raise InvalidError(Status.INVALID, "Sampler: %s must be an integer in [0, 2**64) (0 or None = the "
                                           "library's default), got %r" % (name, v))
    return v


def sampler_params(temp=0.8, top_k=40, top_p=0.95, min_p=0.05, repeat_penalty=1.0, repeat_last_n=64, seed=0,
                   presence_penalty=0.0, frequency_penalty=0.0, logit_bias=None):
    """pkv_sampler_params; logit_bias: {token id: bias} or [(token id, bias), ...], a bias
    a float (added to the logit) or False / -inf (a ban). The list lives as long as p
    (ctypes keeps the array with the struct); create and submit copy it."""
    p = lib.pkv_sampler_default_params()
    p.temp, p.top_k, p.top_p, p.min_p = temp, top_k, top_p, min_p
    p.repeat_penalty, p.repeat_last_n, p.seed = repeat_penalty, repeat_last_n, seed
    p.presence_penalty, p.frequency_penalty = presence_penalty, frequency_penalty
    if logit_bias:
        pairs = list(logit_bias.items()) if isinstance(logit_bias, dict) else list(logit_bias)
        arr = (LogitBias * len(pairs))()
        for i, (t, b) in enumerate(pairs):
            arr[i].token = operator.index(t)
            arr[i].bias = float("-inf") if b is False else float(b)
        p.logit_bias, p.n_logit_bias = arr, len(pairs)
    return p


def make_grammar(gbnf=None, json_schema=None):
    """A pkv_grammar handle from GBNF text or a JSON schema (str or dict); the caller frees it."""
    import json
    if gbnf is not None:
        b = _b(gbnf)
        return check_handle(lib.pkv_grammar_from_gbnf(b, len(b)))
    s = json_schema if isinstance(json_schema, (str, bytes)) else json.dumps(json_schema)
    b = _b(s)
    return check_handle(lib.pkv_grammar_from_json_schema(b, len(b)))
