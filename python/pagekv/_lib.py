"""The C library through ctypes: loading libpagekv.so, the structs of
include/pagekv.h and the prototypes of the functions the package calls.

Every struct here mirrors one of pagekv.h field for field; the test
python/tests/test_layout.py compiles a C program against the header and
checks each field's offset and each struct's size, so a change to the header
that is not made here fails the tests instead of corrupting memory.

ctypes.CDLL releases the GIL for the duration of every foreign call and takes
it back for Python callbacks (CFUNCTYPE), so a long decode or an engine step
lets other Python threads run.
"""
import ctypes
import os
import threading
from ctypes import (CFUNCTYPE, POINTER, Structure, c_bool, c_char, c_char_p, c_double, c_float, c_int,
                    c_int32, c_int64, c_long, c_size_t, c_uint8, c_uint64, c_void_p)

__all__ = ["lib", "library_path"]


def _candidates():
    env = os.environ.get("PAGEKV_LIBRARY")
    if env:
        yield env
        return
    here = os.path.dirname(os.path.abspath(__file__))
    try:  # written by the build (build/python/pagekv/_libpath.py): this build's library
        from ._libpath import LIBRARY  # type: ignore
        yield LIBRARY
    except ImportError:
        pass
    # installed by `make install` / cmake --install: <libdir>/python3/dist-packages/pagekv/,
    # next to <libdir>/libpagekv.so
    libdir = os.path.normpath(os.path.join(here, "..", "..", ".."))
    for name in ("libpagekv.so", "libpagekv.so.0", "libpagekv.dylib"):
        yield os.path.join(libdir, name)
    # anywhere the dynamic linker looks (ldconfig's cache, LD_LIBRARY_PATH)
    yield "libpagekv.so.0"
    yield "libpagekv.so"


class _DlInfo(Structure):
    _fields_ = [("dli_fname", c_char_p), ("dli_fbase", c_void_p), ("dli_sname", c_char_p), ("dli_saddr", c_void_p)]


def _loaded_path(dll, name):
    """The file the dynamic linker loaded for dll (opened by `name`, which may be a
    bare file name found through LD_LIBRARY_PATH or ldconfig's cache): dladdr() of
    one of its functions names the object that holds it; /proc/self/maps, the
    file mapped at that address, where dladdr is not reachable. `name` itself
    when neither answers."""
    addr = ctypes.cast(dll.pkv_version, c_void_p).value
    for libc in (None, "libc.so.6", "libdl.so.2"):  # dladdr: libc since glibc 2.34, libdl before
        try:
            dladdr = ctypes.CDLL(libc).dladdr
        except (OSError, AttributeError):
            continue
        dladdr.argtypes, dladdr.restype = [c_void_p, POINTER(_DlInfo)], c_int
        info = _DlInfo()
        if dladdr(addr, ctypes.byref(info)) and info.dli_fname:
            found = os.fsdecode(info.dli_fname)
            if os.sep in found and os.path.exists(found):
                return os.path.abspath(found)
        break
    try:
        with open("/proc/self/maps") as f:
            for line in f:
                parts = line.split(None, 5)
                lo, hi = (int(x, 16) for x in parts[0].split("-"))
                if lo <= addr < hi and len(parts) == 6 and parts[5].startswith("/"):
                    return parts[5].rstrip("\n")
    except (OSError, ValueError):
        pass
    return name


def _load():
    tried = []
    for path in _candidates():
        if os.sep in path and not os.path.exists(path):
            tried.append(path + " (missing)")
            continue
        try:
            dll = ctypes.CDLL(path)
        except OSError as e:
            tried.append("%s (%s)" % (path, e))
            continue
        return dll, _loaded_path(dll, path) if os.sep not in path else os.path.abspath(path)
    raise ImportError("pagekv: cannot load libpagekv.so; set PAGEKV_LIBRARY to its path. Tried: " + "; ".join(tried))


# library_path: the loaded file's absolute path, also when the dynamic linker
# found it by name (LD_LIBRARY_PATH, ldconfig's cache)
lib, library_path = _load()

# ------------------------------------------------------------------ structs


class DeviceCaps(Structure):
    _fields_ = [("name", c_char * 64), ("description", c_char * 128), ("kind", c_int),
                ("memory_bytes", c_uint64), ("transfer_align", c_size_t), ("max_buffer_bytes", c_size_t),
                ("host_memory", c_bool), ("has_kernels", c_bool), ("batch_invariant", c_bool),
                ("limits", c_char * 160)]


class DeviceParams(Structure):
    _fields_ = [("n_threads", c_int), ("memory_limit", c_uint64)]


class CheckResult(Structure):
    _fields_ = [("device", c_char_p), ("test", c_char_p), ("passed", c_bool), ("skipped", c_bool),
                ("count", c_long), ("seconds", c_double), ("detail", c_char * 256)]


class CheckParams(Structure):
    _fields_ = [("seed", c_uint64), ("iterations", c_int)]


PROGRESS_FN = CFUNCTYPE(None, c_double, c_void_p)


class ModelParams(Structure):
    _fields_ = [("device", c_char_p), ("device_handle", c_void_p), ("devices", c_char_p), ("split", c_char_p),
                ("kv_on_host", c_bool), ("n_threads", c_int), ("progress", PROGRESS_FN),
                ("progress_user", c_void_p), ("no_mmap", c_bool), ("mtp", c_bool),
                ("rank_split", c_char_p)]


class ModelInfo(Structure):
    _fields_ = [("arch", c_char_p), ("n_layer", c_int), ("n_embd", c_int), ("n_head", c_int),
                ("n_head_kv", c_int), ("head_dim", c_int), ("n_ff", c_int), ("n_vocab", c_int),
                ("n_ctx_train", c_int), ("weight_type", c_char_p), ("weight_types", c_uint64),
                ("weight_bytes", c_uint64), ("decode_bytes_per_token", c_uint64), ("has_vocab", c_bool),
                ("n_devices", c_int), ("kv_on_host", c_bool), ("shared_kv", c_bool), ("load_seconds", c_double),
                ("weight_bytes_mapped", c_uint64), ("n_expert", c_int), ("n_expert_used", c_int),
                ("n_recurrent", c_int), ("mtp", c_bool), ("n_nextn", c_int), ("n_kv_layers", c_int),
                ("assistant", c_bool), ("n_embd_out", c_int), ("pooling", c_int), ("n_cls_out", c_int),
                ("rank", c_int), ("n_ranks", c_int), ("layer_first", c_int), ("layer_end", c_int)]


class CacheParams(Structure):
    _fields_ = [("n_ctx", c_int), ("n_seq_max", c_int), ("page_size", c_int), ("kv_type", c_int),
                ("kv_type_v", c_int), ("n_pages", c_int64), ("host_pages", c_int64), ("n_window_pages", c_int64),
                ("disk_dir", c_char_p), ("disk_bytes", c_uint64),
                ("remote_url", c_char_p), ("remote_queue_pages", c_int)]


class KVStats(Structure):
    _fields_ = [("n_pages", c_int64), ("pages_free", c_int64), ("pages_cached", c_int64), ("pages_used", c_int64),
                ("host_pages", c_int64), ("host_free", c_int64), ("n_seqs", c_int), ("cow_pages", c_uint64),
                ("cow_bytes", c_uint64), ("prefix_hit_pages", c_uint64), ("evicted_pages", c_uint64),
                ("window_pages", c_int64), ("window_free", c_int64), ("window_cached", c_int64),
                ("window_used", c_int64), ("window_released", c_uint64), ("window_replays", c_uint64),
                ("page_bytes", c_size_t), ("window_page_bytes", c_size_t), ("state_slots", c_int64),
                ("state_free", c_int64), ("state_checkpoints", c_int64), ("state_slot_bytes", c_size_t),
                ("state_copies", c_uint64), ("state_restores", c_uint64), ("state_prefix_hits", c_uint64),
                ("state_ckpt_skipped", c_uint64),
                ("disk_enabled", c_bool), ("disk_hit_pages", c_uint64), ("disk_miss_pages", c_uint64),
                ("disk_rejected_files", c_uint64), ("disk_written_pages", c_uint64), ("disk_write_errors", c_uint64),
                ("disk_evicted_files", c_uint64), ("disk_bytes_read", c_uint64), ("disk_bytes_written", c_uint64),
                ("disk_read_seconds", c_double), ("disk_write_seconds", c_double), ("disk_files", c_int64),
                ("disk_bytes_used", c_uint64), ("disk_bytes_max", c_uint64),
                ("disk_queue_seconds", c_double),
                ("remote_configured", c_bool), ("remote_enabled", c_bool), ("remote_hit_pages", c_uint64),
                ("remote_miss_pages", c_uint64), ("remote_rejected_values", c_uint64),
                ("remote_written_pages", c_uint64), ("remote_dropped_pages", c_uint64), ("remote_errors", c_uint64),
                ("remote_lookups", c_uint64), ("remote_bytes_read", c_uint64), ("remote_bytes_written", c_uint64),
                ("remote_read_seconds", c_double), ("remote_write_seconds", c_double)]


class LogitBias(Structure):
    _fields_ = [("token", c_int32), ("bias", c_float)]


class SamplerParams(Structure):
    _fields_ = [("temp", c_float), ("top_k", c_int), ("top_p", c_float), ("min_p", c_float),
                ("repeat_penalty", c_float), ("repeat_last_n", c_int), ("seed", c_uint64),
                ("presence_penalty", c_float), ("frequency_penalty", c_float),
                ("logit_bias", POINTER(LogitBias)), ("n_logit_bias", c_int32)]


class TokenLogprob(Structure):
    _fields_ = [("token", c_int32), ("logprob", c_float)]


class EngineEvent(Structure):
    _fields_ = [("request", c_uint64), ("sample", c_int), ("token", c_int32), ("logprob", c_float),
                ("n_top", c_int), ("top", POINTER(TokenLogprob)), ("finish", c_int), ("stop_token", c_bool),
                ("n_prompt", c_int32), ("n_cached", c_int32), ("n_generated", c_int32), ("n_shifted", c_int64),
                ("status", c_int), ("message", c_char_p), ("embd", POINTER(c_float)), ("n_embd", c_int32)]


EVENT_FN = CFUNCTYPE(c_bool, POINTER(EngineEvent), c_void_p)


class RequestParams(Structure):
    _fields_ = [("prompt", POINTER(c_int32)), ("n_prompt", c_int32), ("sampling", SamplerParams),
                ("max_tokens", c_int32), ("stop_tokens", POINTER(c_int32)), ("n_stop", c_int),
                ("ignore_eos", c_bool), ("n", c_int), ("priority", c_int), ("top_logprobs", c_int),
                ("on_event", EVENT_FN), ("user", c_void_p), ("grammar", c_void_p), ("context", c_void_p),
                ("prefill_only", c_bool),
                ("media", c_void_p), ("n_media", c_int), ("context_shift", c_bool), ("n_keep", c_int32),
                ("sampler", c_void_p), ("last_pending", c_bool), ("embed", c_bool), ("pooling", c_int),
                ("lora", c_void_p), ("n_lora", c_int)]


class EngineParams(Structure):
    _fields_ = [("cache", CacheParams), ("max_batch_tokens", c_int), ("max_seqs", c_int),
                ("prefix_cache", c_bool), ("swap", c_bool), ("draft", c_void_p), ("draft_max", c_int),
                ("spill", c_int), ("draft_accept", c_int), ("on_draft_round", c_void_p),
                ("draft_round_user", c_void_p), ("use_cache", c_void_p), ("draft_ngram", c_bool),
                ("ngram_min", c_int), ("ngram_max", c_int)]


class EngineStats(Structure):
    _fields_ = [("n_waiting", c_int), ("n_running", c_int), ("n_swapped", c_int), ("n_recompute", c_int),
                ("n_requests", c_int), ("pages_total", c_int64), ("pages_used", c_int64), ("pages_free", c_int64),
                ("pages_cached", c_int64), ("pages_peak", c_int64), ("host_pages", c_int64), ("host_free", c_int64),
                ("requests_submitted", c_uint64), ("requests_finished", c_uint64),
                ("requests_cancelled", c_uint64), ("requests_failed", c_uint64), ("prompt_tokens", c_uint64),
                ("prefix_hit_tokens", c_uint64), ("computed_tokens", c_uint64), ("generated_tokens", c_uint64),
                ("preemptions_swap", c_uint64), ("preemptions_recompute", c_uint64), ("steps", c_uint64),
                ("busy_seconds", c_double), ("tokens_per_second", c_double), ("batch_invariant", c_bool),
                ("draft_proposed", c_uint64), ("draft_accepted", c_uint64), ("draft_steps", c_uint64),
                ("draft_disabled", c_uint64), ("grammar_masks", c_uint64), ("grammar_mask_seconds", c_double),
                ("preemptions_spill", c_uint64), ("spill_failed", c_uint64), ("spill_pages_written", c_uint64),
                ("spill_bytes_written", c_uint64), ("spill_pages_read", c_uint64),
                ("spill_pages_resumed", c_uint64), ("spill_write_seconds", c_double),
                ("spill_read_seconds", c_double), ("prefill_seconds_per_token", c_double),
                ("waiting_for_pages", c_bool), ("draft_skipped", c_uint64),
                ("context_swap_outs", c_uint64), ("context_swap_ins", c_uint64),
                ("n_contexts_held", c_int), ("n_contexts_swapped", c_int)]


# The structs above by their C names (for the layout test).
C_STRUCTS = {
    "pkv_device_caps": DeviceCaps, "pkv_device_params": DeviceParams, "pkv_check_result": CheckResult,
    "pkv_check_params": CheckParams, "pkv_model_params": ModelParams, "pkv_model_info": ModelInfo,
    "pkv_cache_params": CacheParams, "pkv_kv_stats": KVStats, "pkv_sampler_params": SamplerParams,
    "pkv_logit_bias": LogitBias,
    "pkv_token_logprob": TokenLogprob, "pkv_engine_event": EngineEvent, "pkv_request_params": RequestParams,
    "pkv_engine_params": EngineParams, "pkv_engine_stats": EngineStats,
}

CHECK_REPORT_FN = CFUNCTYPE(None, POINTER(CheckResult), c_void_p)

# ---------------------------------------------------------------- prototypes

_P = c_void_p  # every opaque handle
_i32p = POINTER(c_int32)
_status = c_int

_PROTOS = {
    # base
    "pkv_version": (c_char_p, []),
    "pkv_status_str": (c_char_p, [c_int]),
    "pkv_errmsg": (c_char_p, []),
    "pkv_errcode": (c_int, []),
    "pkv_alloc_live": (c_int64, []),
    "pkv_type_name": (c_char_p, [c_int]),
    "pkv_type_from_name": (_status, [c_char_p, POINTER(c_int)]),
    # devices
    "pkv_device_default_params": (DeviceParams, []),
    "pkv_device_enumerate": (_status, [c_int, c_void_p, c_int, POINTER(c_int), c_char_p, c_size_t]),
    "pkv_device_open": (_P, [c_char_p, DeviceParams]),
    "pkv_device_close": (None, [_P]),
    "pkv_device_get_caps": (POINTER(DeviceCaps), [_P]),
    "pkv_check_default_params": (CheckParams, []),
    "pkv_check_transfers": (_status, [_P, CheckParams, CHECK_REPORT_FN, c_void_p]),
    "pkv_check_cross": (_status, [_P, _P, CheckParams, CHECK_REPORT_FN, c_void_p]),
    "pkv_check_kernels": (_status, [_P, CheckParams, CHECK_REPORT_FN, c_void_p]),
    # model
    "pkv_model_default_params": (ModelParams, []),
    "pkv_model_load": (_P, [c_char_p, ModelParams]),
    "pkv_model_load_memory": (_P, [c_void_p, c_size_t, c_char_p, ModelParams]),
    "pkv_model_builtin": (_P, [ModelParams]),
    "pkv_model_free": (None, [_P]),
    "pkv_model_get_info": (_status, [_P, POINTER(ModelInfo)]),
    "pkv_model_tokenize": (_status, [_P, c_char_p, c_size_t, c_bool, c_bool, _i32p, c_size_t, POINTER(c_size_t)]),
    "pkv_model_tokenize_spans": (_status, [_P, c_char_p, c_size_t, c_bool, POINTER(c_size_t), c_size_t, _i32p,
                                           c_size_t, POINTER(c_size_t)]),
    "pkv_model_detokenize": (_status, [_P, _i32p, c_size_t, c_bool, c_void_p, c_size_t, POINTER(c_size_t)]),
    "pkv_model_token_piece": (_status, [_P, c_int32, c_bool, c_void_p, c_size_t, POINTER(c_size_t)]),
    "pkv_model_bos": (c_int32, [_P]),
    "pkv_model_eos": (c_int32, [_P]),
    "pkv_model_is_eog": (c_bool, [_P, c_int32]),
    "pkv_chat_render": (_status, [_P, c_char_p, c_char_p, c_int64, POINTER(c_void_p), POINTER(c_size_t),
                                  POINTER(POINTER(c_size_t)), POINTER(c_size_t)]),
    "pkv_chat_render_free": (None, [c_void_p, POINTER(c_size_t)]),
    # cache and contexts
    "pkv_cache_default_params": (CacheParams, []),
    "pkv_model_cache_create": (_P, [_P, CacheParams]),
    "pkv_kv_cache_free": (None, [_P]),
    "pkv_kv_stats_get": (None, [_P, POINTER(KVStats)]),
    "pkv_kv_seq_swapped": (c_bool, [_P, c_int32]),
    "pkv_kv_prefix_match": (_status, [_P, c_int32, _i32p, _i32p, c_int64, POINTER(c_int64)]),
    "pkv_context_create": (_P, [_P, _P, c_int64]),
    "pkv_context_free": (None, [_P]),
    "pkv_context_fork": (_P, [_P]),
    "pkv_context_seq": (c_int32, [_P]),
    "pkv_context_n_tokens": (c_int64, [_P]),
    "pkv_context_n_ctx": (c_int64, [_P]),
    "pkv_context_logits": (POINTER(c_float), [_P]),
    "pkv_decode": (_status, [POINTER(c_void_p), c_int, POINTER(_i32p), _i32p]),
    "pkv_context_decode": (_status, [_P, _i32p, c_int32]),
    "pkv_context_decode_all": (_status, [_P, _i32p, c_int32, POINTER(c_float)]),
    "pkv_context_truncate": (_status, [_P, c_int64]),
    "pkv_context_shift": (_status, [_P, c_int64, c_int64]),
    "pkv_context_swap_out": (_status, [_P]),
    "pkv_context_swap_in": (_status, [_P]),
    "pkv_context_save": (_status, [_P, c_char_p]),
    "pkv_context_load": (_P, [_P, _P, c_char_p, c_int64]),
    "pkv_context_tokens": (_status, [_P, c_int64, c_int64, _i32p]),
    # sampling
    "pkv_sampler_default_params": (SamplerParams, []),
    "pkv_sampler_create": (_P, [SamplerParams, c_int32]),
    "pkv_sampler_free": (None, [_P]),
    "pkv_sampler_sample": (_status, [_P, POINTER(c_float), _i32p]),
    "pkv_sampler_accept": (None, [_P, c_int32]),
    "pkv_sampler_reset": (None, [_P]),
    "pkv_sampler_set_grammar": (_status, [_P, _P, _P]),
    "pkv_grammar_from_gbnf": (_P, [c_char_p, c_size_t]),
    "pkv_grammar_from_json_schema": (_P, [c_char_p, c_size_t]),
    "pkv_grammar_free": (None, [_P]),
    "pkv_grammar_set_work_limits": (_status, [_P, c_uint64, c_uint64]),
    "pkv_grammar_vocab_create": (_P, [_P]),
    "pkv_grammar_vocab_free": (None, [_P]),
    # engine
    "pkv_finish_reason_str": (c_char_p, [c_int]),
    "pkv_request_default_params": (RequestParams, []),
    "pkv_engine_default_params": (EngineParams, []),
    "pkv_engine_create": (_P, [_P, EngineParams]),
    "pkv_engine_free": (None, [_P]),
    "pkv_engine_submit": (_status, [_P, POINTER(RequestParams), POINTER(c_uint64)]),
    "pkv_engine_cancel": (_status, [_P, c_uint64]),
    "pkv_engine_step": (_status, [_P, POINTER(c_int)]),
    "pkv_engine_start": (_status, [_P]),
    "pkv_engine_stop": (_status, [_P]),
    "pkv_engine_stats_get": (None, [_P, POINTER(EngineStats)]),
}

for _name, (_res, _args) in _PROTOS.items():
    try:
        _f = getattr(lib, _name)
    except AttributeError as e:  # an older library than this package
        raise ImportError("pagekv: %s lacks %s (library and package versions differ)" % (library_path, _name)) from e
    _f.restype = _res
    _f.argtypes = _args

# ------------------------------------------------------------- live handles
# Every native handle the package makes is counted here by kind until it is
# freed (close() or the garbage collector), so tests and users can see leaks.

_live = {}
_live_lock = threading.Lock()


def _count(kind, delta):
    with _live_lock:
        _live[kind] = _live.get(kind, 0) + delta


def live_handles():
    """Native handles alive now, by kind: {'Model': 1, 'Context': 3, ...} (kinds at 0 left out)."""
    with _live_lock:
        return {k: v for k, v in _live.items() if v}


# For buffers of bytes read back from the library.
def _bytes_buf(n):
    return (c_uint8 * max(n, 1))()
