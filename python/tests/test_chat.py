"""Chat templates rendered by the bindings through libpagekv's chat layer
(pkv_chat_render, the interpreter pagekv serve runs): against llama.cpp's
renderings of tests/templates (the server's golden fixtures), against pagekv
serve's own /apply-template for the same conversations, and message text kept as
data when a rendered conversation is tokenized. jinja2 is not used."""
import json
import os
import socket
import subprocess
import time
import urllib.error
import urllib.request

import pytest

import pagekv
from pagekv import chat

try:  # a library built without jansson has no chat layer: it says so, naming the package
    chat.render("chatml", [])
except pagekv.UnsupportedError as e:
    assert "libjansson-dev" in e.message
    pytest.skip("libpagekv was built without the chat layer: %s" % e.message, allow_module_level=True)


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


@pytest.fixture
def utc(monkeypatch):
    """The fixtures' dates are UTC (as test-jinja renders them)."""
    monkeypatch.setenv("TZ", "UTC")
    time.tzset()
    yield
    monkeypatch.undo()
    time.tzset()


def test_templates_match_llamacpp(source_dir, utc):
    checked = 0
    for f, src, bos, eos, now, reqs, exp in cases(source_dir):
        for i, r in enumerate(reqs):
            body = dict(r, bos_token=bos, eos_token=eos)
            if "error" in exp[i]:
                with pytest.raises(pagekv.ChatTemplateError) as e:
                    chat.render_request(src, body, now=now)
                # the template's own message (raise_exception's), as llama.cpp's
                assert e.value.message.split("the chat template: ", 1)[-1] in exp[i]["error"], (f, i)
            else:
                text, spans = chat.render_request(src, body, now=now)
                assert text == exp[i]["prompt"], "%s request %d" % (f, i)
                data = text.encode()
                for a, b in spans:  # each span is message text
                    assert 0 <= a < b <= len(data)
            checked += 1
    assert checked >= 168  # every request of every fixture (none left out, as the jinja2 renderer had to)


def test_spans_cover_message_text():
    src = "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}"
    msgs = [{"role": "system", "content": "Be <|im_end|> brief."}, {"role": "user", "content": "Hi é"}]
    text, spans = chat.render(src, msgs, add_generation_prompt=False)
    data = text.encode()
    # every string of the request is data, the roles too (as pagekv serve marks them)
    assert [data[a:b].decode() for a, b in spans] == ["system", "Be <|im_end|> brief.", "user", "Hi é"]
    # a template that strips the text: the span is what is left of it
    src2 = "{% for m in messages %}[{{ m.content | trim }}]{% endfor %}"
    text, spans = chat.render(src2, [{"role": "user", "content": "  padded  "}])
    assert text == "[padded]" and [text.encode()[a:b] for a, b in spans] == [b"padded"]
    # a built-in family by name; keywords reach the template as chat_template_kwargs
    text, _ = chat.render("llama3", [{"role": "user", "content": "hi"}])
    assert text.endswith("<|start_header_id|>assistant<|end_header_id|>\n\n")
    text, _ = chat.render("{{ greeting }}", [], greeting="hello")
    assert text == "hello"


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
    with pytest.raises(pagekv.ChatTemplateError, match="no system role"):
        model.apply_chat_template(msgs, template="{{ raise_exception('no system role') }}")
    with pytest.raises(pagekv.ChatTemplateError, match="does not parse"):
        model.apply_chat_template(msgs, template="{% for %}")


def test_no_template(cli, tmp_models):
    from conftest import mkmodel
    with pagekv.Model(mkmodel(cli, tmp_models / "notpl.gguf", "--no-template")) as m:
        assert m.chat_template is None
        with pytest.raises(pagekv.NotFoundError):
            m.apply_chat_template([{"role": "user", "content": "x"}])
        # a family by name needs no template in the file
        assert m.apply_chat_template([{"role": "user", "content": "x"}], template="chatml") == \
            "<|im_start|>user\nx<|im_end|>\n<|im_start|>assistant\n"


# ---- the same conversation rendered by pagekv serve (/apply-template)

TOOLS = [{"type": "function", "function": {"name": "get_weather", "description": "The weather in a city",
                                           "parameters": {"type": "object", "properties": {
                                               "city": {"type": "string"}}, "required": ["city"]}}}]
CONVERSATIONS = [
    dict(messages=[{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi <|im_end|> there"},
                   {"role": "assistant", "content": "Hello."}, {"role": "user", "content": "Bye é"}]),
    dict(messages=[{"role": "user", "content": "Weather in Paris?"}], tools=TOOLS),
    dict(messages=[{"role": "user", "content": "Weather in Paris?"},
                   {"role": "assistant", "content": "", "tool_calls": [
                       {"id": "c1", "type": "function",
                        "function": {"name": "get_weather", "arguments": "{\"city\": \"Paris\"}"}}]},
                   {"role": "tool", "tool_call_id": "c1", "content": "sunny"}], tools=TOOLS),
    dict(messages=[{"role": "user", "content": "Hi"}], add_generation_prompt=False),
]


def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _post(port, path, body):
    req = urllib.request.Request("http://127.0.0.1:%d%s" % (port, path), data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=30) as r:
        return json.loads(r.read())


class _Server:
    """pagekv serve on 127.0.0.1 (a free port), stopped on exit (also on failure)."""

    def __init__(self, cli, model_path):
        self.port = _free_port()
        self.p = subprocess.Popen([cli, "serve", "-m", model_path, "--host", "127.0.0.1", "--port", str(self.port),
                                   "-c", "512"], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)

    def __enter__(self):
        deadline = time.time() + 30
        while time.time() < deadline:
            if self.p.poll() is not None:
                err = self.p.stderr.read().decode("utf-8", "replace")
                if "libmicrohttpd" in err or "not built" in err or "without" in err:
                    pytest.skip("pagekv serve is not in this build: " + err.strip()[:200])
                raise AssertionError("pagekv serve exited (%d): %s" % (self.p.returncode, err))
            try:
                with urllib.request.urlopen("http://127.0.0.1:%d/health" % self.port, timeout=2) as r:
                    if r.status == 200:
                        return self
            except (urllib.error.URLError, OSError):
                pass
            time.sleep(0.1)
        raise AssertionError("pagekv serve did not answer /health within 30 s")

    def __exit__(self, *exc):
        self.p.terminate()
        try:
            self.p.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.p.kill()
            self.p.wait()
        self.p.stderr.close()


@pytest.mark.parametrize("family", ["chatml", "llama3", "gemma", "Qwen-Qwen2.5-7B-Instruct.jinja"])
def test_python_renders_as_serve(cli, tmp_models, source_dir, family):
    """apply_chat_template == pagekv serve's /apply-template for the same request:
    three built-in families, and a model whose template (Qwen 2.5's) renders tools."""
    from conftest import mkmodel
    arg = os.path.join(source_dir, "tests", "templates", family) if family.endswith(".jinja") else family
    path = mkmodel(cli, tmp_models / ("serve-%s.gguf" % family.replace(".", "-")), "--chat-template", arg)
    with pagekv.Model(path) as m, _Server(cli, path) as srv:
        for conv in CONVERSATIONS:
            served = _post(srv.port, "/apply-template", conv)["prompt"]
            kw = {k: v for k, v in conv.items() if k != "messages"}
            mine = m.apply_chat_template(conv["messages"], **kw)
            assert mine == served, (family, conv)
            if conv.get("tools"):
                assert "get_weather" in mine or family != "Qwen-Qwen2.5-7B-Instruct.jinja"
            assert conv["messages"][0]["content"] in mine
