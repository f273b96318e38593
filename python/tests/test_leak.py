"""No leak over 1,000 fork/free cycles: the package's live native handles, the C
library's live allocations, the cache's sequences and pages all come back to
where they were."""
import gc
import os
import subprocess
import sys

import pytest

import pagekv


def test_fork_free_cycles(model):
    cache = model.cache(n_ctx=128, n_seq_max=4, page_size=4)
    root = cache.context()
    root.decode([1, 2, 3, 4, 5, 6, 7, 8, 9, 10])  # a partial last page: each child's append copies it
    for i in range(4):  # warm-up: the first decodes grow the cache's bookkeeping once (2 allocations)
        with root.fork() as c:
            c.decode([i])
    gc.collect()
    handles = pagekv.live_handles()
    allocs = pagekv.alloc_live()
    stats = cache.stats()
    for i in range(1000):
        child = root.fork()
        if i % 2:
            child.decode([i % 500])  # copy-on-write of the shared partial page
            child.close()             # explicit
        else:
            del child                 # the garbage collector (refcount) frees it
        if i == 500:
            mid = pagekv.live_handles()
            assert mid.get("Context") == handles.get("Context")
    gc.collect()
    assert pagekv.live_handles() == handles
    assert pagekv.alloc_live() == allocs, "C allocations grew over the cycles"
    after = cache.stats()
    assert after["n_seqs"] == stats["n_seqs"] == 1
    assert after["pages_used"] == stats["pages_used"]
    assert after["cow_pages"] >= stats["cow_pages"] + 500
    with cache.context() as ctx:  # the root is intact
        ctx.decode([1, 2, 3, 4, 5, 6, 7, 8, 9, 10])
        assert ctx.logits().tobytes() == root.logits().tobytes()
    root.close()
    cache.close()
    assert pagekv.live_handles().get("Context", 0) == handles.get("Context", 0) - 1


def test_gc_frees_a_whole_tree(model_path):
    """Handles not closed are freed by the garbage collector, children first (a
    context keeps its cache and model alive, not the other way round)."""
    gc.collect()
    before = pagekv.live_handles()
    m = pagekv.Model(model_path)
    c = m.cache(n_ctx=32)
    ctxs = [c.context() for _ in range(3)]
    ctxs[0].decode([1, 2, 3])
    ctxs.append(ctxs[0].fork())
    del m, c  # still alive through the contexts
    assert pagekv.live_handles().get("Model", 0) == before.get("Model", 0) + 1
    assert ctxs[3].model.tokenize("a")
    del ctxs
    gc.collect()
    assert pagekv.live_handles() == before


def test_threads_share_a_cache(model):
    """Contexts of one model used from several Python threads: the model's lock
    serializes their C calls, and each thread's results equal a replay."""
    import threading
    cache = model.cache(n_ctx=128, n_seq_max=6, page_size=4)
    root = cache.context()
    root.decode([1, 2, 3, 4, 5])
    out, errs = {}, []

    def work(k):
        try:
            ctx = root.fork()
            toks = []
            for i in range(30):
                t = (k * 37 + i * 11) % model.n_vocab
                ctx.decode([t])
                toks.append(t)
            out[k] = (toks, ctx.logits(copy=True))
            ctx.close()
        except Exception as e:  # pragma: no cover
            errs.append(e)

    ts = [threading.Thread(target=work, args=(k,)) for k in range(4)]
    for t in ts:
        t.start()
    for t in ts:
        t.join(120)
    assert not errs and len(out) == 4
    for k, (toks, logits) in out.items():
        with cache.context() as r:
            r.decode([1, 2, 3, 4, 5] + toks)
            assert r.logits().tobytes() == logits.tobytes()
    cache.close()


_CYCLE = r"""
import gc, sys
import pagekv
gc.collect()
before = pagekv.alloc_live()
m = pagekv.Model(sys.argv[1])
c = m.cache(n_ctx=32)
x = c.context()
x.decode([1, 2, 3])
y = x.fork()
e = pagekv.Engine(m, n_ctx=32) if sys.argv[2] == "engine" else None
box = [m, c, x, y, e]
box.append(box)                     # one reference cycle through all of them
m.cycle = c.cycle = x.cycle = box
del m, c, x, y, e, box
if sys.argv[3] == "gc":
    gc.collect()                    # weak references cleared, finalizers in any order
    print("handles", sorted(pagekv.live_handles().items()), "allocs", pagekv.alloc_live() - before)
else:
    keep = [pagekv.Model(sys.argv[1])]  # at exit: a global tree, and the cycle above
    keep.append(keep[0].cache(n_ctx=32).context())
    keep.append(keep)
print("done", flush=True)
"""


@pytest.mark.parametrize("when", ["gc", "exit"])
@pytest.mark.parametrize("engine", ["engine", "no-engine"])
def test_collected_together(model_path, when, engine, tmp_path):
    """A model, its cache and contexts (and an engine) collected in one pass, by
    gc.collect() or at interpreter exit: each native object is freed once, children
    before their parents (issue 50 item 9: the model went first, "buffers still
    allocated", SIGSEGV in pkv_buffer_free)."""
    script = tmp_path / "cycle.py"
    script.write_text(_CYCLE)
    r = subprocess.run([sys.executable, str(script), model_path, engine, when], capture_output=True, text=True,
                       timeout=120, env=dict(os.environ))
    assert r.returncode == 0, "exit %d\n%s\n%s" % (r.returncode, r.stdout, r.stderr)
    assert "still allocated" not in r.stderr, r.stderr
    assert "done" in r.stdout
    if when == "gc":
        assert "handles [] allocs 0" in r.stdout, r.stdout  # every handle freed, no C allocation left
