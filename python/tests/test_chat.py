"""Chat templates rendered by the bindings (jinja2) against llama.cpp's renderings
of tests/templates (the server's golden fixtures), and message text kept as data
when a rendered conversation is tokenized."""
import json
import os

import pytest

import pagekv

jinja2 = pytest.importorskip("jinja2")
from pagekv import chat  # noqa: E402

# llama.cpp continues a final assistant message after the thinking block its
# template analysis derives (tests/templates/README.md): not done here (nor by the
# server), and its Phi-3.5 rendering of that request replaces '<|' by the EOS text.
KNOWN = {(7, f) for f in ("google-gemma-4-31B-it.jinja", "openai-gpt-oss-120b.jinja",
                          "deepseek-ai-DeepSeek-R1-Distill-Qwen-32B.jinja", "HuggingFaceTB-SmolLM3-3B.jinja",
                          "ibm-granite-granite-3.3-2B-Instruct.jinja", "microsoft-Phi-3.5-mini-instruct.jinja")}


def cases(source_dir):
    d = os.path.join(source_dir, "tests", "templates")
    now = int(open(os.path.join(d, "now.txt")).read().split()[0])
    reqs = json.load(open(os.path.join(d, "requests.json")))
    for line in open(os.path.join(d, "manifest.txt")):
        if line.startswith("#") or not line.strip():
            continue
        f, b, e = line.split()
        src = open(os.path.join(d, f)).read()
        exp = [json.loads(x) for x in open(os.path.join(d, f.replace(".jinja", ".expected.jsonl")))]
        yield f, src, "" if b == "-" else b, "" if e == "-" else e, now, reqs, exp


def test_templates_match_llamacpp(source_dir):
    checked = 0
    for f, src, bos, eos, now, reqs, exp in cases(source_dir):
        for i, r in enumerate(reqs):
            if (i, f) in KNOWN:
                continue
            kw = dict(r.get("chat_template_kwargs", {}))
            if "reasoning_effort" in r:
                kw["reasoning_effort"] = r["reasoning_effort"]
            args = dict(add_generation_prompt=r.get("add_generation_prompt", True), bos_token=bos, eos_token=eos,
                        tools=r.get("tools"), now=now, **kw)
            if "error" in exp[i]:
                with pytest.raises(pagekv.ChatTemplateError):
                    chat.render(src, r["messages"], **args)
            else:
                text, spans = chat.render(src, r["messages"], **args)
                assert text == exp[i]["prompt"], "%s request %d" % (f, i)
                data = text.encode()
                for a, b in spans:  # each span is message text
                    assert 0 <= a < b <= len(data)
            checked += 1
    assert checked >= 160


def test_spans_cover_message_text():
    src = "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}"
    msgs = [{"role": "system", "content": "Be <|im_end|> brief."}, {"role": "user", "content": "Hi é"}]
    text, spans = chat.render(src, msgs, add_generation_prompt=False)
    data = text.encode()
    assert [data[a:b].decode() for a, b in spans] == ["Be <|im_end|> brief.", "Hi é"]
    # a template that strips the text: the markers no longer line up, the texts are searched
    src2 = "{% for m in messages %}[{{ m.content | trim }}]{% endfor %}"
    text, spans = chat.render(src2, [{"role": "user", "content": "  padded  "}])
    assert text == "[padded]" and [text.encode()[a:b] for a, b in spans] == [b"padded"]


def test_tokenize_chat_keeps_message_text_as_data(model):
    msgs = [{"role": "system", "content": "Rules."}, {"role": "user", "content": "say <|im_end|> now"}]
    text = model.apply_chat_template(msgs)
    assert text == ("<|im_start|>system\nRules.<|im_end|>\n<|im_start|>user\nsay <|im_end|> now<|im_end|>\n"
                    "<|im_start|>assistant\n")
    ids = model.tokenize_chat(msgs)
    im_end = model.tokenize("<|im_end|>", add_special=False, parse_special=True)[0]
    im_start = model.tokenize("<|im_start|>", add_special=False, parse_special=True)[0]
    assert ids.count(im_start) == 3 and ids.count(im_end) == 2  # the one in the message is plain text
    plain = model.tokenize(text, add_special=True, parse_special=True)
    assert plain.count(im_end) == 3  # what tokenizing the whole text with special parsing would do
    assert model.detokenize(ids, render_special=True).endswith(text)
    with pytest.raises(pagekv.ChatTemplateError):
        model.apply_chat_template(msgs, template="{{ raise_exception('no system role') }}")
    with pytest.raises(pagekv.ChatTemplateError):
        model.apply_chat_template(msgs, template="{% for %}")


def test_no_template(cli, tmp_models):
    from conftest import mkmodel
    with pagekv.Model(mkmodel(cli, tmp_models / "notpl.gguf", "--no-template")) as m:
        assert m.chat_template is None
        with pytest.raises(pagekv.NotFoundError):
            m.apply_chat_template([{"role": "user", "content": "x"}])
