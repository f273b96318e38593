"""Chat templates rendered by libpagekv's chat layer (pkv_chat_render, src/chat/):
the same Jinja interpreter, built-in families and request handling as
`pagekv serve` (/apply-template, /v1/chat/completions) and `pagekv run -cnv`, so
Python and the server give one prompt for one conversation. The conversation
goes to the library as the JSON body of a chat request: messages, tools,
add_generation_prompt, continue_final_message, chat_template_kwargs (the
keywords, e.g. enable_thinking=False) and reasoning_effort.

Message text is data (CONVENTIONS.md): special-token text inside a message must
not become a control token. render() therefore also returns the byte spans of the
message texts in the rendered prompt (the interpreter tracks them), which
Model.tokenize_chat hands to pkv_model_tokenize_spans so that only the template's
own text makes special tokens.

A library built without jansson has no chat layer: render() raises
UnsupportedError naming libjansson-dev.
"""
import ctypes
import json
from ctypes import byref, c_size_t, c_void_p

from ._lib import lib
from .errors import PagekvError, Status, error

__all__ = ["render", "render_request", "request_json", "ChatTemplateError"]


class ChatTemplateError(PagekvError, ValueError):
    """The template failed (syntax, raise_exception, a missing variable)."""


def request_json(messages, add_generation_prompt=True, tools=None, continue_final_message=None, bos_token=None,
                 eos_token=None, **kwargs):
    """The chat request body render() sends (also what to POST to pagekv serve's
    /apply-template for the same prompt); keywords become chat_template_kwargs
    (reasoning_effort stays a request field, as OpenAI's)."""
    body = {"messages": list(messages), "add_generation_prompt": bool(add_generation_prompt)}
    if tools is not None:
        body["tools"] = tools
    if continue_final_message is not None:
        body["continue_final_message"] = bool(continue_final_message)
    if "reasoning_effort" in kwargs:
        body["reasoning_effort"] = kwargs.pop("reasoning_effort")
    if kwargs:
        body["chat_template_kwargs"] = kwargs
    if bos_token is not None:
        body["bos_token"] = bos_token
    if eos_token is not None:
        body["eos_token"] = eos_token
    return body


def render(source, messages, add_generation_prompt=True, tools=None, now=None, model=None, bos_token=None,
           eos_token=None, continue_final_message=None, **kwargs):
    """Render a chat template. Returns (text, spans): spans is a sorted list of
    (start, end) byte offsets into text.encode() covering the message texts.
    source: Jinja text, a built-in family's name ("chatml", "llama3", ...), or None
    for model's tokenizer.chat_template. model (a native handle) gives bos_token
    and eos_token and whether its tokenizer adds BOS (a leading BOS text is then
    left out, as the server does); without one, bos_token/eos_token are given
    here. now: a Unix time for the template's dates (None = now)."""
    body = request_json(messages, add_generation_prompt, tools, continue_final_message,
                        bos_token if model is None else None, eos_token if model is None else None, **kwargs)
    return render_request(source, body, now, model)


def render_request(source, body, now=None, model=None):
    """render() of a whole chat request body (a dict, as POSTed to pagekv serve's
    /v1/chat/completions or /apply-template): (text, spans)."""
    try:
        req = json.dumps(body, ensure_ascii=False).encode("utf-8", "surrogatepass")
    except (TypeError, ValueError) as e:
        raise ChatTemplateError(Status.INVALID, "chat template: the conversation is not JSON: %s" % e) from e
    out = c_void_p()
    n = c_size_t()
    sp = ctypes.POINTER(c_size_t)()
    nsp = c_size_t()
    src = source.encode("utf-8", "surrogatepass") if source is not None else None
    s = lib.pkv_chat_render(model, src, req, int(now or 0), byref(out), byref(n), byref(sp), byref(nsp))
    if s != 0:
        if s == Status.INVALID:  # the template or the request: ChatTemplateError (an InvalidError's peer)
            raise ChatTemplateError(s, lib.pkv_errmsg().decode("utf-8", "replace"))
        raise error(s)
    try:
        text = ctypes.string_at(out.value, n.value).decode("utf-8", "replace")
        spans = [(sp[2 * i], sp[2 * i + 1]) for i in range(nsp.value)]
    finally:
        lib.pkv_chat_render_free(out, sp)
    return text, spans
