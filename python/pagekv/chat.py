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
import functools

from .errors import PagekvError, Status, UnsupportedError

__all__ = ["render", "ChatTemplateError"]

_OPEN, _CLOSE = "\U000F0000", "\U000F0001"  # plane-15 private use: never in a real prompt


class ChatTemplateError(PagekvError, ValueError):
    """The template failed (syntax, raise_exception, a missing variable)."""


@functools.lru_cache(maxsize=16)
def _compile(source):
    """The compiled template (cached: a model's template is rendered again and again)."""
    env, jinja2 = _env()
    try:
        return env.from_string(source), jinja2
    except jinja2.exceptions.TemplateError as e:
        raise ChatTemplateError(Status.INVALID, "chat template: %s" % e) from e


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


def _normalize(messages, typed):
    """What llama.cpp's server does to messages before rendering: the 'developer'
    role is 'system'; content given as parts [{type: text, text}] stays so for
    templates that read parts (typed), else becomes their texts joined by newlines."""
    out = []
    for m in messages:
        m = dict(m)
        if m.get("role") == "developer":
            m["role"] = "system"
        c = m.get("content")
        if isinstance(c, list) and not typed:
            m["content"] = "\n".join(p.get("text", "") for p in c if isinstance(p, dict) and p.get("type") == "text")
        if isinstance(m.get("tool_calls"), list):
            m["tool_calls"] = [_args_object(tc) for tc in m["tool_calls"]]
        out.append(m)
    return out


def _args_object(tc):
    """A tool call's arguments given as JSON text become the object (llama.cpp
    passes objects: templates write them with tojson or iterate their items)."""
    f = tc.get("function") if isinstance(tc, dict) else None
    if isinstance(f, dict) and isinstance(f.get("arguments"), str):
        import json
        try:
            args = json.loads(f["arguments"])
        except ValueError:
            return tc
        if isinstance(args, dict):
            return dict(tc, function=dict(f, arguments=args))
    return tc


def _merge_system(messages):
    """For templates without a system role (they raise): each system message's text
    goes before the next user message's, on a line of its own (llama.cpp's
    workaround); a system message no user message follows becomes one."""
    out, pending = [], []
    for m in messages:
        if m.get("role") == "system":
            pending.append(m.get("content") or "")
            continue
        if pending and m.get("role") == "user":
            m = dict(m, content="\n".join(pending + [m.get("content") or ""]))
            pending = []
        out.append(m)
    if pending:
        out.append({"role": "user", "content": "\n".join(pending)})
    return out


def render(source, messages, add_generation_prompt=True, bos_token="", eos_token="", tools=None, now=None,
           **kwargs):
    """Render a Jinja chat template. Returns (text, spans): spans is a sorted list
    of (start, end) byte offsets into text.encode() covering the message texts.
    As llama.cpp's server: enable_thinking is True unless given, date_string is
    today's date (now: a Unix time for another clock)."""
    messages = _normalize(messages, _reads_parts(source))
    # a final assistant message is continued, as llama.cpp's server does: the
    # prompt ends with its text, without the end of its turn
    cont = bool(messages) and messages[-1].get("role") == "assistant" and isinstance(messages[-1].get("content"), str) \
        and messages[-1]["content"] != ""
    if cont:
        add_generation_prompt = False
    try:
        text, spans = _render(source, messages, add_generation_prompt, bos_token, eos_token, tools, now, kwargs)
    except ChatTemplateError:
        if not any(m.get("role") == "system" for m in messages):
            raise
        text, spans = _render(source, _merge_system(messages), add_generation_prompt, bos_token, eos_token, tools,
                              now, kwargs)
    if cont:
        last = messages[-1]["content"]
        i = text.rfind(last)
        if i < 0:
            raise ChatTemplateError(Status.INVALID, "chat template: the final assistant message to continue is not "
                                                    "in the rendered prompt as given")
        text = text[:i + len(last)]
        end = len(text.encode("utf-8", "surrogatepass"))
        spans = [(a, min(b, end)) for a, b in spans if a < end]
    return text, spans


@functools.lru_cache(maxsize=16)
def _reads_parts(source):
    """Does the template render content given as a list of text parts? (probed, as
    llama.cpp probes a template's capabilities)"""
    probe = [{"role": "user", "content": [{"type": "text", "text": "PKV_PART_PROBE"}]}]
    try:
        out = _render(source, probe, True, "", "", None, None, {})[0]
    except Exception:
        return False
    # the part's text, not the list printed as a Python or JSON value
    return "PKV_PART_PROBE" in out and "'text'" not in out and '"text"' not in out


def _render(source, messages, add_generation_prompt, bos_token, eos_token, tools, now, kwargs):
    tpl, jinja2 = _compile(source)
    when = datetime.datetime.fromtimestamp(now) if now is not None else datetime.datetime.now()

    def run(mark):
        ctx = {"enable_thinking": True, "date_string": when.strftime("%d %b %Y")}
        ctx.update(kwargs)
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
