"""Constrained sampling from Python: grammars the library refuses raise InvalidError
with its message (never a crash), and the grammar work limits (Sampler's
grammar_token_steps / grammar_request_steps keywords) stop a costly grammar with an
error naming the limit (issue 50)."""
import numpy as np
import pytest

import pagekv

# x{0,60} over y{0,60}: thousands of parse stacks after a few characters
COSTLY = "root ::= x{0,60}\nx ::= y{0,60}\ny ::= [a-z ]\n"
DEPTH = 100000


def _greedy(model, **kw):
    return pagekv.Sampler(model.n_vocab, temp=0, model=model, **kw)


def test_grammar_constrains(model):
    s = _greedy(model, grammar='root ::= "yes" | "no"')
    logits = np.zeros(model.n_vocab, dtype=np.float32)
    out = b""
    for _ in range(8):
        t = s.sample(logits)
        if model.is_eog(t):
            break
        s.accept(t)
        out += model.detokenize_bytes([t])
    assert out in (b"yes", b"no")
    s.close()


def test_deep_grammar_raises(model):
    text = "root ::= " + "(" * DEPTH + '"a"' + ")" * DEPTH
    with pytest.raises(pagekv.InvalidError) as e:
        _greedy(model, grammar=text)
    assert "nested deeper than the limit of 256" in str(e.value)
    assert e.value.status == pagekv.Status.INVALID
    # a schema nested as deep (as text: json.dumps of such a dict would recurse)
    schema = '{"items":' * DEPTH + "{}" + "}" * DEPTH
    with pytest.raises(pagekv.InvalidError) as e:
        _greedy(model, json_schema=schema)
    assert "nested deeper than 64" in str(e.value)
    # the process is fine afterwards
    s = _greedy(model, grammar='root ::= "a"+')
    s.close()


def test_token_work_limit(model):
    logits = np.zeros(model.n_vocab, dtype=np.float32)
    # the library's default allows it on this vocabulary
    s = _greedy(model, grammar=COSTLY)
    t = s.sample(logits)
    assert 0 <= t < model.n_vocab
    s.close()
    s = _greedy(model, grammar=COSTLY, grammar_token_steps=1000)
    with pytest.raises(pagekv.InvalidError) as e:
        s.sample(logits)
    msg = str(e.value)
    assert "work limit of 1000 steps per token" in msg, msg
    assert msg.startswith("sampler: grammar: "), msg
    with pytest.raises(pagekv.InvalidError) as e:  # stays failed
        s.sample(logits)
    assert "steps per token" in str(e.value)
    s.close()


def test_request_work_limit(model):
    logits = np.random.default_rng(1).standard_normal(model.n_vocab).astype(np.float32)
    # each token takes 1-3M steps on this vocabulary: a few fit in 10M, not 500
    s = _greedy(model, grammar=COSTLY, grammar_request_steps=10000000)
    n = 0
    with pytest.raises(pagekv.InvalidError) as e:
        for _ in range(500):
            t = s.sample(logits)
            if model.is_eog(t):
                break
            s.accept(t)
            n += 1
    assert "work limit of 10000000 steps per request" in str(e.value)
    assert n >= 2
    s.reset()  # starts over: the first token is within the limit again
    assert 0 <= s.sample(logits) < model.n_vocab
    s.close()


@pytest.mark.parametrize("bad", [-1, 1.5, "10", True, 1 << 64])
def test_work_limit_values(model, bad):
    with pytest.raises(pagekv.InvalidError) as e:
        _greedy(model, grammar=COSTLY, grammar_token_steps=bad)
    assert "grammar_token_steps" in str(e.value)
    with pytest.raises(pagekv.InvalidError) as e:
        _greedy(model, grammar=COSTLY, grammar_request_steps=bad)
    assert "grammar_request_steps" in str(e.value)
