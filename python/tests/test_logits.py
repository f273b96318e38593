"""Logits through the bindings equal `pagekv logits` bit for bit (the same model
file, tokens and device), for several models and KV types."""
import subprocess

import numpy as np
import pytest

import pagekv
from conftest import mkmodel

TOKENS = [1, 17, 29, 300, 41, 5, 77, 123, 9, 250, 11, 60]


@pytest.mark.parametrize("args,kv", [((), "f16"), (("--arch", "qwen3", "--type", "q8_0"), "f16"),
                                     (("--arch", "qwen2", "--type", "f32"), "f32"),
                                     (("--type", "q4_0"), "q8_0")])
def test_logits_equal_cli(cli, tmp_models, tmp_path, args, kv):
    path = mkmodel(cli, tmp_models / ("logits-%s.gguf" % "-".join(args or ("default",))), *args)
    out = tmp_path / "cli.f32"
    subprocess.run([cli, "logits", "-m", path, "--tokens", ",".join(map(str, TOKENS)), "--kv-type", kv,
                    "-o", str(out)], check=True, capture_output=True)
    want = np.fromfile(out, dtype="<f4")
    with pagekv.Model(path) as m, m.cache(n_ctx=64, kv_type=kv) as c, c.context() as ctx:
        ctx.decode(TOKENS)
        got = ctx.logits()
        assert got.shape == want.shape == (m.n_vocab,)
        assert got.tobytes() == want.tobytes()
        mv = ctx.logits(copy=True)
        assert mv.tobytes() == want.tobytes()


def test_memoryview_without_numpy(model, monkeypatch):
    """Without NumPy the same buffer comes as a read-only float memoryview."""
    from pagekv import core
    with model.cache(n_ctx=32) as c, c.context() as ctx:
        ctx.decode(TOKENS[:4])
        arr = ctx.logits()
        monkeypatch.setattr(core, "_np", None)
        mv = ctx.logits()
        assert isinstance(mv, memoryview) and mv.format == "f" and mv.readonly and len(mv) == model.n_vocab
        assert mv.tobytes() == arr.tobytes()
        cp = ctx.logits(copy=True)
        assert not cp.readonly and cp.tobytes() == arr.tobytes()
        rows = ctx.decode_all(TOKENS[4:6])
        assert len(rows) == 2 and rows[1].tobytes() == ctx.logits().tobytes()
