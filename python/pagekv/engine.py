"""The serving engine: many requests over one model, continuously batched.

An Engine runs pagekv's engine thread (pkv_engine_start). submit() may be called
from any Python thread (pkv_engine_submit is thread-safe); events come from the
engine thread through a ctypes callback, which takes the GIL only to put the
event on the request's queue, and are read by whoever iterates the Request.
While an engine lives, its model may not be used for anything else but
tokenizing (the C API's rule): Model methods that would drive it raise.
"""
import atexit
import collections
import itertools
import queue
import threading
import weakref
from ctypes import byref, c_uint64

from ._lib import EVENT_FN, EngineStats, lib
from .core import _Handle, _cache_params, _tokens, make_grammar, sampler_params
from .errors import Status, check, check_handle, error

__all__ = ["Engine", "Request", "Event", "FINISH"]

FINISH = ("none", "stop", "length", "cancelled", "error")

Event = collections.namedtuple("Event", "request sample token logprob top finish stop_token n_prompt n_cached "
                                        "n_generated status message")
Event.__doc__ = ("One event of one sample: token (-1 when it carries none), logprob, top [(token, logprob)], "
                 "finish ('none' while the sample goes on, then 'stop', 'length', 'cancelled' or 'error'), "
                 "status and message with 'error'.")


class Request:
    """A submitted request: iterate it for its Events (every sample's, in order;
    the iteration ends after every sample's final event), or use tokens() /
    result(). cancel() from any thread."""

    def __init__(self, engine, n):
        self.engine = engine
        self.id = 0
        self.n = n
        self._q = queue.Queue()
        self._open = n  # samples without their final event yet (as the iterator has seen)
        self._finals = 0  # final events delivered by the engine thread
        self.finish = [None] * n

    def __iter__(self):
        while self._open > 0 or not self._q.empty():
            ev = self._q.get()
            if ev.finish != "none":
                self._open -= 1
                self.finish[ev.sample] = ev.finish
            yield ev

    def tokens(self, sample=0):
        """A generator of one sample's token ids as they are generated (the events of
        other samples are kept for result()). Closing it early cancels the request.
        Raises the sample's error when it finished with one."""
        done = False
        try:
            for ev in self:
                if ev.sample != sample:
                    continue
                if ev.token >= 0:
                    yield ev.token
                if ev.finish == "error":
                    raise error(ev.status, ev.message)
                if ev.finish != "none":
                    done = True
                    return
        finally:
            if not done:
                self.cancel()

    def result(self):
        """Wait for the end: a list per sample of its tokens, and self.finish."""
        out = [[] for _ in range(self.n)]
        for ev in self:
            if ev.token >= 0:
                out[ev.sample].append(ev.token)
        return out

    def cancel(self):
        """Cancel (a no-op once it finished): the final events say 'cancelled'."""
        if self.id and self._open > 0:
            try:
                self.engine.cancel(self.id)
            except Exception:
                pass


_engines = weakref.WeakSet()


@atexit.register
def _close_engines():
    """Stop engine threads before the interpreter goes: their callbacks must not
    run into a finalizing interpreter."""
    for e in list(_engines):
        try:
            e.close()
        except Exception:
            pass


class Engine(_Handle):
    """Engine(model, n_ctx=0, n_seq_max=0, page_size=0, kv_type='f16', n_pages=0,
    host_pages=0, max_batch_tokens=0, max_seqs=0, prefix_cache=True, swap=True,
    draft_ngram=False, ngram_min=0, ngram_max=0, draft_max=0).
    draft_ngram: n-gram drafts (prompt lookup; docs/engine.md), the same tokens.
    Starts its thread at once; close() (or `with`) stops it, cancelling what is
    unfinished."""
    _kind = "Engine"

    def __init__(self, model, *, n_ctx=0, n_seq_max=0, page_size=0, kv_type="f16", kv_type_v=None, n_pages=0,
                 host_pages=0, max_batch_tokens=0, max_seqs=0, prefix_cache=True, swap=True, draft_ngram=False,
                 ngram_min=0, ngram_max=0, draft_max=0):
        self.model = model
        self._reqs = {}
        self._reqs_lock = threading.Lock()
        self._keys = itertools.count(1)
        self._cb = EVENT_FN(self._on_event)  # alive as long as the engine
        p = lib.pkv_engine_default_params()
        p.cache = _cache_params(n_ctx=n_ctx, n_seq_max=n_seq_max, page_size=page_size, kv_type=kv_type,
                                kv_type_v=kv_type_v, n_pages=n_pages, host_pages=host_pages)
        p.max_batch_tokens, p.max_seqs, p.prefix_cache, p.swap = max_batch_tokens, max_seqs, prefix_cache, swap
        p.draft_ngram, p.ngram_min, p.ngram_max, p.draft_max = draft_ngram, ngram_min, ngram_max, draft_max
        with model._lock:
            h = check_handle(lib.pkv_engine_create(model._use(), p))
            model._engines += 1
            self._own(h, model)
        _engines.add(self)
        s = lib.pkv_engine_start(h)
        if s:
            err = error(s)
            self.close()
            raise err

    def _free(self, h):
        lib.pkv_engine_free(h)  # the final events of unfinished requests come on this thread
        self.model._engines -= 1

    def _on_event(self, evp, user):
        # on the engine thread; nothing may raise into C, and every final event must
        # reach its request (its iterator waits for it)
        try:
            e = evp.contents
            with self._reqs_lock:
                r = self._reqs.get(user)
            if r is None:
                return True
            finish = FINISH[e.finish] if 0 <= e.finish < len(FINISH) else "error"
            try:
                status = Status(e.status)
            except ValueError:
                status = e.status
            try:
                top = [(e.top[i].token, e.top[i].logprob) for i in range(e.n_top)] if e.n_top > 0 else []
                message = (e.message or b"").decode("utf-8", "replace")
            except Exception:  # pragma: no cover
                top, message = [], ""
            r._q.put(Event(e.request, e.sample, e.token, e.logprob, top, finish, e.stop_token, e.n_prompt,
                           e.n_cached, e.n_generated, status, message))
            if finish != "none":
                with self._reqs_lock:
                    r._finals += 1
                    if r._finals >= r.n:
                        self._reqs.pop(user, None)
        except BaseException:  # pragma: no cover
            pass
        return True

    def submit(self, prompt, max_tokens=0, *, n=1, temp=0.0, top_k=40, top_p=0.95, min_p=0.05, repeat_penalty=1.0,
               repeat_last_n=64, seed=0, presence_penalty=0.0, frequency_penalty=0.0, stop_tokens=(),
               ignore_eos=False, priority=0, top_logprobs=0, grammar=None, json_schema=None, logit_bias=None):
        """Queue a request (prompt: token ids) and return its Request. Thread-safe.
        Sampling defaults to greedy (temp 0). Bad arguments (an id outside the
        vocabulary, a prompt beyond the context, ...) raise here and queue nothing."""
        arr, n_prompt = _tokens(prompt, "prompt token id")
        sarr, n_stop = _tokens(stop_tokens, "stop token id")
        r = Request(self, n)
        key = next(self._keys)
        rp = lib.pkv_request_default_params()
        rp.prompt, rp.n_prompt = arr, n_prompt
        rp.sampling = sampler_params(temp=temp, top_k=top_k, top_p=top_p, min_p=min_p, repeat_penalty=repeat_penalty,
                                     repeat_last_n=repeat_last_n, seed=seed, presence_penalty=presence_penalty,
                                     frequency_penalty=frequency_penalty, logit_bias=logit_bias)
        rp.max_tokens, rp.n, rp.priority, rp.top_logprobs = max_tokens, n, priority, top_logprobs
        rp.stop_tokens, rp.n_stop, rp.ignore_eos = sarr, n_stop, ignore_eos
        rp.on_event, rp.user = self._cb, key
        g = make_grammar(grammar, json_schema) if grammar is not None or json_schema is not None else None
        rp.grammar = g
        with self._reqs_lock:
            self._reqs[key] = r  # before submit: the engine thread may call back at once
        rid = c_uint64()
        try:
            s = lib.pkv_engine_submit(self._live(), byref(rp), byref(rid))
        finally:
            if g:
                lib.pkv_grammar_free(g)  # submit retained its own reference
        if s:
            with self._reqs_lock:
                self._reqs.pop(key, None)
            raise error(s)
        r.id = rid.value
        return r

    def generate(self, prompt, max_tokens=0, **kw):
        """Submit and stream the tokens of sample 0 as a generator (closing it early
        cancels the request)."""
        return self.submit(prompt, max_tokens, **kw).tokens()

    def cancel(self, request_id):
        """Cancel a request by id (Request.cancel() is the same). NotFoundError when
        it is unknown or finished."""
        check(lib.pkv_engine_cancel(self._live(), request_id))

    def stats(self):
        """pkv_engine_stats as a dict (requests, pages, prefix hits, tokens/s, ...)."""
        st = EngineStats()
        lib.pkv_engine_stats_get(self._live(), byref(st))
        return {k: getattr(st, k) for k, _ in EngineStats._fields_}
