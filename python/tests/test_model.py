"""Model: load, info, GGUF metadata, tokenizer against the CLI, errors as exceptions."""
import json
import subprocess

import pytest

import pagekv


def test_info_and_metadata(model, model_path):
    assert model.info.arch == "llama" and model.info["n_layer"] == 2
    assert model.n_vocab == model.info.n_vocab == 512
    meta = model.metadata
    assert meta["general.architecture"] == "llama"
    assert meta["llama.block_count"] == 2
    assert len(meta["tokenizer.ggml.tokens"]) == model.n_vocab
    assert "<|im_start|>" in model.chat_template
    assert pagekv.read_metadata(open(model_path, "rb").read()) == meta


def test_tokenize_matches_cli(model, model_path, cli):
    text = "Hello world, the quick brown fox <|im_end|> jumps 123!"
    for special in (False, True):
        args = [cli, "tokenize", "-m", model_path, "-p", text, "--json"] + (["--special"] if special else [])
        want = json.loads(subprocess.run(args, capture_output=True, text=True, check=True).stdout)["ids"]
        assert model.tokenize(text, parse_special=special) == want
    ids = model.tokenize(text, add_special=False)
    assert model.detokenize(ids) == text
    assert b"".join(model.token_piece(t) for t in ids) == text.encode()
    # a long text: the output buffer grows as the C API asks
    long = "word " * 5000
    assert model.detokenize(model.tokenize(long, add_special=False)) == long


def test_special_tokens(model):
    assert model.bos >= 0 and model.is_eog(model.eos)
    im_end = model.tokenize("<|im_end|>", add_special=False, parse_special=True)
    assert len(im_end) == 1 and model.is_eog(im_end[0])
    assert model.token_piece(im_end[0], render_special=True) == b"<|im_end|>"


def test_bad_path():
    with pytest.raises(pagekv.PagekvIOError) as e:
        pagekv.Model("/nonexistent/dir/model.gguf")
    assert e.value.status == pagekv.Status.IO
    assert "/nonexistent/dir/model.gguf" in e.value.message
    assert isinstance(e.value, OSError)


def test_malformed_file(tmp_path):
    bad = tmp_path / "bad.gguf"
    bad.write_bytes(b"GGUF" + b"\x03\x00\x00\x00" + b"\xff" * 64)
    with pytest.raises(pagekv.PagekvError) as e:
        pagekv.Model(bad)
    assert e.value.status in (pagekv.Status.FORMAT, pagekv.Status.IO) and e.value.message
    with pytest.raises(pagekv.FormatError):
        pagekv.read_metadata(bad)
    with pytest.raises(pagekv.FormatError):
        pagekv.read_metadata(b"NOPE")


def test_bad_token_ids(model):
    with model.cache(n_ctx=64).context() as ctx:
        ctx.decode([1, 2, 3])
        before = ctx.logits(copy=True)
        for bad in ([model.n_vocab], [-1], [5, 70000]):
            with pytest.raises(pagekv.InvalidError) as e:
                ctx.decode(bad)
            assert e.value.status == pagekv.Status.INVALID
            assert "outside the vocabulary" in e.value.message
            assert len(ctx) == 3  # nothing changed
        assert (ctx.logits() == before).all()
        with pytest.raises(pagekv.InvalidError):
            model.detokenize([model.n_vocab + 5])


def test_token_ids_beyond_int32(model):
    """Token ids that do not fit a C int32 token id (>= 2**31, 2**32 + 5 which
    ctypes wrapped to 5, negatives) raise ValueError naming the value at every
    entry point that passes ids to C, and change nothing (issue 50 item 10)."""
    cache = model.cache(n_ctx=64)
    with cache.context() as ctx, pagekv.Sampler(model.n_vocab) as smp:
        ctx.decode([1, 2, 3])
        before = ctx.logits(copy=True)
        calls = [ctx.decode, ctx.decode_all, model.detokenize, lambda t: ctx.fork().reuse_prefix(t),
                 lambda t: model.is_eog(t[-1]), lambda t: model.token_piece(t[-1]), lambda t: smp.accept(t[-1])]
        for bad in (2**32 + 5, 2**31, 2**64 + 1, -1, -2**32 + 5):
            for call in calls:
                with pytest.raises(ValueError) as e:
                    call([4, bad])
                assert str(bad) in str(e.value), (bad, str(e.value))
            assert len(ctx) == 3 and ctx.tokens == [1, 2, 3]  # nothing changed
        assert (ctx.logits() == before).all()
        with pytest.raises(TypeError):
            ctx.decode([1.5])
    cache.close()
    with pagekv.Engine(model, n_ctx=64) as eng:
        for kw in ({"prompt": [1, 2**32 + 5]}, {"prompt": [1, -7]}, {"prompt": [1], "stop_tokens": [2**32 + 3]}):
            with pytest.raises(ValueError) as e:
                eng.submit(max_tokens=2, **kw)
            bad = (kw.get("stop_tokens") or kw["prompt"])[-1]
            assert str(bad) in str(e.value)
        assert eng.stats()["requests_submitted"] == 0


def test_closed_handles(model_path):
    m = pagekv.Model(model_path)
    c = m.cache(n_ctx=32)
    ctx = c.context()
    m.close()  # closes the cache and the context first
    assert ctx.closed and c.closed and m.closed
    with pytest.raises(pagekv.InvalidError):
        ctx.decode([1])
    with pytest.raises(pagekv.InvalidError):
        m.tokenize("x")
    m.close()  # twice is fine


def test_bad_cache_params(model):
    with pytest.raises(pagekv.NotFoundError):
        model.cache(kv_type="f17")
    with pytest.raises(pagekv.PagekvError) as e:
        model.cache(page_size=1000)
    assert e.value.message


def test_builtin_and_bytes(model_path):
    with pagekv.Model.builtin() as b:
        assert b.info.arch == "llama" and b.metadata == {}
    data = open(model_path, "rb").read()
    with pagekv.Model.from_bytes(data, "mem") as m:
        assert m.metadata["general.architecture"] == "llama"


def test_devices_and_check(monkeypatch):
    devs = pagekv.devices()
    assert devs[0]["name"] == "cpu" and devs[0]["kind"] == "cpu" and devs[0]["has_kernels"]
    passed, rows = pagekv.check_device("cpu", iterations=50, kernels=False, cross="cpu")
    assert passed and {"write", "read", "fill", "copy", "copy_regions"} <= {r["test"] for r in rows}
    assert all(r["passed"] or r["skipped"] for r in rows)
    # the faulty test device corrupts offset reads: the suite must catch it
    monkeypatch.setenv("PKV_FAULTY_DEVICE", "1")
    assert "faulty" in [d["name"] for d in pagekv.devices()]
    passed, rows = pagekv.check_device("faulty", iterations=200, kernels=False)
    assert not passed and any(not r["passed"] and not r["skipped"] for r in rows)
    with pytest.raises(pagekv.NotFoundError):
        pagekv.check_device("nosuchdevice")
