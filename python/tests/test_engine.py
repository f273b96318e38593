"""The engine through the bindings: tokens streamed from several Python threads,
bitwise the tokens of plain greedy decoding; cancel; errors; the GIL released
during foreign calls."""
import threading

import pytest

import pagekv

PROMPTS = [[1, 17, 29, 300, 41, 5], [9, 250, 11, 60, 61], [400, 3, 8, 77, 123, 64, 65]]


def greedy(model_path, prompt, n):
    """Reference: the contexts API on a model of its own (greedy, ignoring EOS as the requests do)."""
    with pagekv.Model(model_path) as m, m.cache(n_ctx=128) as c, c.context() as ctx:
        ctx.decode(prompt)
        return list(ctx.generate(n, temp=0, stop_at_eog=False))


@pytest.fixture
def engine_model(model_path):
    m = pagekv.Model(model_path)
    yield m
    m.close()


def test_stream_from_threads(engine_model, model_path):
    n = 12
    want = [greedy(model_path, p, n) for p in PROMPTS]
    got = [None] * len(PROMPTS)
    errors = []
    with pagekv.Engine(engine_model, n_ctx=128, n_seq_max=4) as eng:
        def worker(i):
            try:
                toks = []
                for t in eng.generate(PROMPTS[i], n, ignore_eos=True):  # a generator: tokens as they come
                    toks.append(t)
                got[i] = toks
            except Exception as e:  # pragma: no cover
                errors.append(e)
        threads = [threading.Thread(target=worker, args=(i,)) for i in range(len(PROMPTS))]
        for t in threads:
            t.start()
        for t in threads:
            t.join(120)
        for _ in range(1000):  # the counters are a snapshot of the last step boundary
            stats = eng.stats()
            if stats["requests_finished"] == len(PROMPTS):
                break
            threading.Event().wait(0.01)
    assert not errors and got == want
    assert stats["requests_finished"] == len(PROMPTS) and stats["generated_tokens"] == n * len(PROMPTS)


def test_events_n_samples_and_logprobs(engine_model, model_path):
    with pagekv.Engine(engine_model, n_ctx=128) as eng:
        r = eng.submit(PROMPTS[0], 5, n=3, ignore_eos=True, top_logprobs=2)
        events = list(r)
    assert r.finish == ["length"] * 3
    want = greedy(model_path, PROMPTS[0], 5)
    for s in range(3):  # greedy: every sample the same, bitwise
        evs = [e for e in events if e.sample == s]
        assert [e.token for e in evs] == want
        assert evs[-1].finish == "length" and all(e.finish == "none" for e in evs[:-1])
        assert all(len(e.top) == 2 and e.top[0][0] == e.token and e.logprob <= 0 for e in evs)
        assert [e.n_generated for e in evs] == [1, 2, 3, 4, 5]


def test_cancel(engine_model):
    with pagekv.Engine(engine_model, n_ctx=512) as eng:
        r = eng.submit(PROMPTS[1], 0, ignore_eos=True)  # up to the context limit
        it = iter(r)
        first = next(it)
        assert first.token >= 0
        r.cancel()
        rest = list(it)
        assert rest[-1].finish == "cancelled" and r.finish == ["cancelled"]
        assert len(rest) < 400
        with pytest.raises(pagekv.NotFoundError):
            eng.cancel(10 ** 9)  # an unknown id
        # closing a token generator early cancels its request
        gen = eng.generate(PROMPTS[2], 0, ignore_eos=True)
        next(gen)
        gen.close()
        assert eng.stats()["requests_cancelled"] >= 1


def test_submit_errors(engine_model):
    with pagekv.Engine(engine_model, n_ctx=64) as eng:
        with pytest.raises(pagekv.InvalidError) as e:
            eng.submit([1, engine_model.n_vocab + 3], 4)
        assert "outside" in e.value.message or str(engine_model.n_vocab + 3) in e.value.message
        with pytest.raises(pagekv.InvalidError):
            eng.submit([], 4)
        with pytest.raises(pagekv.InvalidError):
            eng.submit([1, 2], 1000)  # beyond the context limit
        assert eng.stats()["requests_submitted"] == 0
        # the model belongs to the engine meanwhile; tokenizing is fine
        with pytest.raises(pagekv.InvalidError):
            engine_model.cache(n_ctx=16)
        with pytest.raises(pagekv.InvalidError):
            engine_model.close()
        assert engine_model.tokenize("hi")
    engine_model.cache(n_ctx=16).close()  # usable again


def test_engine_close_cancels(engine_model):
    eng = pagekv.Engine(engine_model, n_ctx=512)
    r = eng.submit(PROMPTS[0], 0, ignore_eos=True)
    next(iter(r))
    eng.close()  # final events of the unfinished request come during close
    evs = list(r)
    assert evs[-1].finish == "cancelled"


def test_gil_released_during_foreign_calls(engine_model):
    """pkv_engine_stop blocks in C until the engine thread's step ends; that step
    is inside a Python callback waiting for `release`, which only another Python
    thread sets. Were the GIL held during the foreign call, nothing could set it
    (and the callback could not take the GIL back): a deadlock."""
    from pagekv._lib import lib
    entered, release = threading.Event(), threading.Event()
    eng = pagekv.Engine(engine_model, n_ctx=128)
    orig = eng._on_event

    def blocking(evp, user):
        if not entered.is_set():
            entered.set()
            release.wait(60)
        return orig(evp, user)

    eng._on_event_impl = blocking
    from pagekv._lib import EVENT_FN
    cb = EVENT_FN(blocking)
    eng._cb = cb  # the submit below uses it
    r = eng.submit(PROMPTS[0], 3, ignore_eos=True)
    assert entered.wait(60)
    setter = threading.Thread(target=lambda: (threading.Event().wait(0.2), release.set()), daemon=True)
    setter.start()
    stopped = []
    stopper = threading.Thread(target=lambda: stopped.append(lib.pkv_engine_stop(eng._h)), daemon=True)
    stopper.start()
    stopper.join(60)
    setter.join(60)
    assert stopped == [0] and release.is_set()
    assert lib.pkv_engine_start(eng._h) == 0
    assert [e.finish for e in r][-1] == "length"
    eng.close()


def test_logit_bias_and_ngram_drafts(engine_model, model_path):
    """logit_bias bans and forces (dict and pair forms, False = a ban); an engine
    with n-gram drafts gives the tokens of plain greedy decoding and counts its
    proposals; bad entries raise naming them."""
    rep = [5, 6, 7, 8, 9, 5, 6, 7, 8, 9, 5, 6, 7, 8, 9, 5, 6]
    want = greedy(model_path, rep, 24)
    with pagekv.Engine(engine_model, n_ctx=128, draft_ngram=True, draft_max=5) as eng:
        assert list(eng.generate(rep, 24, ignore_eos=True)) == want
        got = list(eng.generate(PROMPTS[0], 8, ignore_eos=True, logit_bias={want[0]: False}))
        assert want[0] not in got
        assert list(eng.generate(PROMPTS[0], 6, ignore_eos=True, logit_bias=[(123, 100.0)])) == [123] * 6
        with pytest.raises(pagekv.InvalidError) as e:
            eng.submit(PROMPTS[0], 4, logit_bias={engine_model.n_vocab: 1.0})
        assert "logit_bias entry 0 has token" in e.value.message
        stats = eng.stats()
    assert stats["draft_proposed"] > 0
    s = pagekv.Sampler(engine_model.n_vocab, temp=0, logit_bias={3: 100})
    assert s.sample([0.0] * engine_model.n_vocab) == 3
