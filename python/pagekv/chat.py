"""Chat templates: a model's tokenizer.chat_template (Jinja) rendered in Python.

pagekv's own template interpreter lives in the server (`pagekv serve`, built with
jansson) and is not part of libpagekv, so the bindings render templates with the
jinja2 package (Debian python3-jinja2) in a sandbox, with the variables llama.cpp
and Hugging Face pass: messages, add_generation_prompt, bos_token, eos_token,
tools (when given), raise_exception and strftime_now, plus any keyword
(enable_thinking=False, ...).

Message text is data (CONVENTIONS.md): special-token text inside a message must
not become a control token. render() therefore also returns the byte spans of the
message texts in the rendered prompt, which Model.tokenize_chat hands to
pkv_model_tokenize_spans so that only the template's own text makes special
tokens. The spans are found by rendering a second time with every data string
wrapped in private-use marker characters; where the template changed a text so
that the markers no longer line up (it stripped or sliced it), each message text
is looked for in order in the plain rendering instead.
"""
import datetime

from .errors import PagekvError, Status, UnsupportedError

__all__ = ["render", "ChatTemplateError"]

_OPEN, _CLOSE = "\U000F0000", "\U000F0001"  # plane-15 private use: never in a real prompt


class ChatTemplateError(PagekvError, ValueError):
    """The template failed (syntax, raise_exception, a missing variable)."""


def _env():
    try:
        import jinja2
        from jinja2.sandbox import ImmutableSandboxedEnvironment
    except ImportError as e:
        raise UnsupportedError(Status.UNSUPPORTED,
                               "chat templates need the jinja2 package (Debian: apt-get install python3-jinja2)") from e

    def raise_exception(msg):
        raise jinja2.exceptions.TemplateError(msg)

    def tojson(x, indent=None, ensure_ascii=False, sort_keys=False, separators=None):
        import json
        return json.dumps(x, indent=indent, ensure_ascii=ensure_ascii, sort_keys=sort_keys, separators=separators)

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                        extensions=["jinja2.ext.loopcontrols"])
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    return env, jinja2


def _wrap(x, mark):
    """Data strings of a conversation wrapped in markers (mark) or as given."""
    if not mark:
        return x
    if isinstance(x, str):
        return _OPEN + x + _CLOSE if x else x
    if isinstance(x, list):
        return [_wrap(v, mark) for v in x]
    if isinstance(x, dict):
        return {k: (_wrap(v, mark) if k in ("content", "text", "reasoning_content", "arguments", "thinking")
                    or isinstance(v, (list, dict)) else v) for k, v in x.items()}
    return x


def _texts(x, out):
    if isinstance(x, str):
        if x:
            out.append(x)
    elif isinstance(x, list):
        for v in x:
            _texts(v, out)
    elif isinstance(x, dict):
        for k, v in x.items():
            if k in ("content", "text", "reasoning_content", "arguments", "thinking") or isinstance(v, (list, dict)):
                _texts(v, out)


def render(source, messages, add_generation_prompt=True, bos_token="", eos_token="", tools=None, now=None,
           **kwargs):
    """Render a Jinja chat template. Returns (text, spans): spans is a sorted list
    of (start, end) byte offsets into text.encode() covering the message texts."""
    env, jinja2 = _env()
    try:
        tpl = env.from_string(source)
    except jinja2.exceptions.TemplateError as e:
        raise ChatTemplateError(Status.INVALID, "chat template: %s" % e) from e
    when = datetime.datetime.fromtimestamp(now) if now is not None else datetime.datetime.now()

    def run(mark):
        ctx = dict(kwargs)
        ctx.update(messages=_wrap(list(messages), mark), add_generation_prompt=add_generation_prompt,
                   bos_token=bos_token, eos_token=eos_token, strftime_now=lambda fmt: when.strftime(fmt))
        if tools is not None:
            ctx["tools"] = tools
        try:
            return tpl.render(**ctx)
        except jinja2.exceptions.TemplateError as e:
            raise ChatTemplateError(Status.INVALID, "chat template: %s" % e) from e

    plain = run(False)
    marked = run(True)
    spans = []
    if marked.replace(_OPEN, "").replace(_CLOSE, "") == plain and marked.count(_OPEN) == marked.count(_CLOSE):
        pos = 0  # byte offset in plain
        depth = 0
        start = 0
        for part in _split_marks(marked):
            if part == _OPEN:
                if depth == 0:
                    start = pos
                depth += 1
            elif part == _CLOSE:
                depth -= 1
                if depth == 0 and pos > start:
                    spans.append((start, pos))
            else:
                pos += len(part.encode("utf-8", "surrogatepass"))
    else:
        texts = []
        _texts(list(messages), texts)
        at = 0
        for t in texts:
            for cand in (t, t.strip()):
                i = plain.find(cand, at) if cand else -1
                if i >= 0:
                    a = len(plain[:i].encode("utf-8", "surrogatepass"))
                    spans.append((a, a + len(cand.encode("utf-8", "surrogatepass"))))
                    at = i + len(cand)
                    break
    return plain, _merge(spans)


def _split_marks(s):
    out, cur = [], []
    for ch in s:
        if ch in (_OPEN, _CLOSE):
            if cur:
                out.append("".join(cur))
                cur = []
            out.append(ch)
        else:
            cur.append(ch)
    if cur:
        out.append("".join(cur))
    return out


def _merge(spans):
    spans = sorted(spans)
    out = []
    for a, b in spans:
        if out and a <= out[-1][1]:
            out[-1] = (out[-1][0], max(out[-1][1], b))
        else:
            out.append((a, b))
    return out
