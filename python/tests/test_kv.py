"""Every KV operation through the bindings against a replay: a fresh context fed
the same tokens gives bitwise the same logits (one device, the CPU's kernels are
batch-invariant), except context shift, which re-rotates cached K (rounding)."""
import numpy as np
import pytest

import pagekv

PROMPT = [1, 17, 29, 300, 41, 5, 77, 123, 9, 250, 11, 60, 61, 62, 63, 64, 65, 3, 8, 400]


def replay(cache, tokens):
    with cache.context() as r:
        r.decode(tokens)
        assert r.tokens == list(tokens)
        return r.logits(copy=True)


def same(a, b):
    return a is not None and b is not None and a.dtype == b.dtype == np.float32 and a.tobytes() == b.tobytes()


@pytest.fixture
def cache(model):
    c = model.cache(n_ctx=256, n_seq_max=8, page_size=4)
    yield c
    c.close()


def test_logits_view_and_copy(cache):
    ctx = cache.context()
    assert ctx.logits() is None  # nothing decoded
    ctx.decode(PROMPT[:5])
    view, copy = ctx.logits(), ctx.logits(copy=True)
    assert not view.flags.writeable and view.flags.c_contiguous and view.shape == (cache.model.n_vocab,)
    assert same(view, copy)
    assert same(view, replay(cache, PROMPT[:5]))
    ctx.decode(PROMPT[5:6])  # the view is the context's buffer: it changed in place, the copy did not
    assert same(view, replay(cache, PROMPT[:6])) and not same(view, copy)
    rows = ctx.decode_all(PROMPT[6:9])
    assert rows.shape == (3, cache.model.n_vocab)
    for i in range(3):
        assert same(rows[i], replay(cache, PROMPT[:7 + i]))
    assert same(ctx.logits(), rows[2])


def test_fork(cache):
    parent = cache.context()
    parent.decode(PROMPT[:10])  # 10 tokens, page size 4: a shared partial page
    child = parent.fork()
    assert len(child) == 10 and child.tokens == PROMPT[:10]
    assert same(child.logits(), parent.logits())
    cow_before = cache.stats()["cow_pages"]
    child.decode([100, 101])
    parent.decode([200])
    assert cache.stats()["cow_pages"] > cow_before  # the partial page was copied, not written over
    assert same(child.logits(), replay(cache, PROMPT[:10] + [100, 101]))
    assert same(parent.logits(), replay(cache, PROMPT[:10] + [200]))
    grandchild = child.fork()
    parent.close()  # any order
    grandchild.decode([7])
    assert same(grandchild.logits(), replay(cache, PROMPT[:10] + [100, 101, 7]))


def test_truncate(cache):
    ctx = cache.context()
    ctx.decode(PROMPT)
    ctx.truncate(7)
    assert len(ctx) == 7 and ctx.tokens == PROMPT[:7] and ctx.logits() is None
    ctx.decode([99, 98])
    assert same(ctx.logits(), replay(cache, PROMPT[:7] + [99, 98]))
    with pytest.raises(pagekv.InvalidError):
        ctx.truncate(100)
    assert len(ctx) == 9


def test_swap(cache):
    ctx = cache.context()
    ctx.decode(PROMPT)
    before = cache.stats()
    ctx.swap_out()
    assert ctx.swapped and cache.stats()["host_free"] < before["host_free"]
    with pytest.raises(pagekv.InvalidError):
        ctx.decode([5])  # a swapped sequence is not resident
    ctx.swap_in()
    assert not ctx.swapped and ctx.tokens == PROMPT
    ctx.decode([42])
    assert same(ctx.logits(), replay(cache, PROMPT + [42]))


def test_save_load(cache, tmp_path):
    ctx = cache.context()
    ctx.decode(PROMPT)
    path = tmp_path / "seq.pkv"
    ctx.save(path)
    loaded = cache.load(path)
    assert loaded.tokens == PROMPT
    assert same(loaded.logits(), ctx.logits())  # the last token is decoded again on load
    loaded.decode([33])
    assert same(loaded.logits(), replay(cache, PROMPT + [33]))
    with pytest.raises(pagekv.PagekvIOError):
        cache.load(tmp_path / "missing.pkv")
    bad = tmp_path / "bad.pkv"
    bad.write_bytes(path.read_bytes()[:100])
    with pytest.raises(pagekv.FormatError) as e:
        cache.load(bad)
    assert e.value.message
    with pytest.raises(pagekv.PagekvIOError):
        ctx.save(tmp_path / "no" / "such" / "dir" / "x.pkv")


def test_save_load_other_cache(model, tmp_path):
    a = model.cache(n_ctx=128, page_size=4)
    b = model.cache(n_ctx=128, page_size=4)
    ctx = a.context()
    ctx.decode(PROMPT)
    ctx.save(tmp_path / "x.pkv")
    other = b.load(tmp_path / "x.pkv")
    other.decode([1])
    assert same(other.logits(), replay(a, PROMPT + [1]))
    c = model.cache(n_ctx=128, page_size=8)  # another geometry: refused, naming it
    with pytest.raises(pagekv.FormatError) as e:
        c.load(tmp_path / "x.pkv")
    assert "page" in e.value.message
    for x in (a, b, c):
        x.close()


def test_prefix_reuse(cache):
    first = cache.context()
    first.decode(PROMPT)
    first.close()  # its full pages stay cached
    hits = cache.stats()["prefix_hit_pages"]
    ctx = cache.context()
    n = ctx.reuse_prefix(PROMPT + [7, 8])
    assert n == 20 and len(ctx) == 20 and ctx.tokens == PROMPT  # 5 full pages of 4
    assert cache.stats()["prefix_hit_pages"] == hits + 5
    ctx.decode([7, 8])
    assert same(ctx.logits(), replay(cache, PROMPT + [7, 8]))
    other = cache.context()
    assert other.reuse_prefix([1, 2, 3, 4, 5]) == 0  # nothing matches: nothing shared
    with pytest.raises(pagekv.PagekvError):
        ctx.reuse_prefix(PROMPT)  # only for an empty context


def test_shift(shift_model_path):
    with pagekv.Model(shift_model_path) as m:
        cache = m.cache(n_ctx=128, page_size=4, kv_type="f32")
        ctx = cache.context()
        ctx.decode(PROMPT)
        ctx.shift(2, 5)
        kept = PROMPT[:2] + PROMPT[7:]
        assert ctx.tokens == kept and ctx.logits() is None
        ctx.decode([44])
        ref = replay(cache, kept + [44])
        got = ctx.logits()
        nmse = float(((got.astype(np.float64) - ref) ** 2).sum() / (ref.astype(np.float64) ** 2).sum())
        assert nmse < 1e-10 and got.argmax() == ref.argmax()
        with pytest.raises(pagekv.InvalidError):
            ctx.shift(10, 100)


def test_out_of_pages_is_recoverable(model):
    cache = model.cache(n_ctx=64, page_size=4, n_pages=4, host_pages=4)
    ctx = cache.context()
    ctx.decode(PROMPT[:16])
    with pytest.raises(pagekv.OutOfPagesError) as e:
        ctx.decode([1, 2, 3])
    assert e.value.status == pagekv.Status.OUT_OF_PAGES
    assert len(ctx) == 16
    ctx.truncate(12)
    ctx.decode([1, 2, 3])
    got = ctx.logits(copy=True)  # a copy: a view must not outlive its context
    ctx.close()  # the pool holds one sequence
    assert same(got, replay(cache, PROMPT[:12] + [1, 2, 3]))


def test_generate_greedy(cache):
    ctx = cache.context()
    ctx.decode(PROMPT[:6])
    branch = ctx.fork()
    toks = list(branch.generate(12, temp=0))
    # by hand: argmax, decode, repeat
    want = []
    for _ in range(12):
        t = int(ctx.logits().argmax())
        want.append(t)
        if cache.model.is_eog(t):
            break
        ctx.decode([t])
    assert toks == want and len(toks) >= 1
    s1 = list(cache.context().fork().generate(0))
    assert s1 == []


def test_sampler_seeded(cache):
    ctx = cache.context()
    ctx.decode(PROMPT[:6])
    a, b = ctx.fork(), ctx.fork()
    ta = list(a.generate(10, temp=1.0, seed=7, top_k=0, top_p=1.0, min_p=0.0))
    tb = list(b.generate(10, temp=1.0, seed=7, top_k=0, top_p=1.0, min_p=0.0))
    assert ta == tb
    s = pagekv.Sampler(cache.model.n_vocab, temp=0)
    assert s.sample(ctx.logits()) == int(ctx.logits().argmax())
    with pytest.raises(pagekv.InvalidError):
        s.sample([0.0] * 3)
    with pytest.raises(pagekv.InvalidError):
        pagekv.Sampler(cache.model.n_vocab, top_p=2.0)
