#!/usr/bin/env python3
"""An independent reference for pagekv's Voxtral projector (src/media/mmproj-audio.c).

Written here from the documented semantics of Hugging Face transformers'
WhisperFeatureExtractor + VoxtralProcessor (the mel front end and its 30-second
windows) and modeling_voxtral.py (VoxtralEncoder = Whisper's encoder, then the
projector over 4 stacked frames), in float64 numpy, reading the same mmproj GGUF
file (a minimal GGUF reader below: f32 and f16 tensors). No code is shared with
the C implementation: the STFT is numpy's rfft, the convolutions are sums over
taps, the attention is a dense softmax.

usage: voxtral_ref.py PROJ.gguf AUDIO.f32 ROWS.f32
  AUDIO.f32: 16 kHz mono float32 samples; ROWS.f32: pagekv's rows (float32).
Exits 0 when pagekv's rows match within the tolerance, 1 otherwise."""

import math
import struct
import sys

import numpy as np

# ---------------------------------------------------------------- GGUF reader

_SCALAR = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?", 10: "<Q", 11: "<q", 12: "<d"}


def read_gguf(path):
    data = open(path, "rb").read()
    pos = 0

    def take(fmt):
        nonlocal pos
        v = struct.unpack_from(fmt, data, pos)
        pos += struct.calcsize(fmt)
        return v[0]

    def string():
        nonlocal pos
        n = take("<Q")
        s = data[pos:pos + n].decode("utf-8")
        pos += n
        return s

    def value(t):
        if t == 8:
            return string()
        if t == 9:
            et, n = take("<I"), take("<Q")
            return [value(et) for _ in range(n)]
        return take(_SCALAR[t])

    assert data[:4] == b"GGUF", "not a GGUF file"
    pos = 4
    version = take("<I")
    assert version in (2, 3), version
    n_tensors, n_kv = take("<Q"), take("<Q")
    kv = {}
    for _ in range(n_kv):
        k = string()
        kv[k] = value(take("<I"))
    infos = []
    for _ in range(n_tensors):
        name = string()
        nd = take("<I")
        ne = [take("<Q") for _ in range(nd)]
        t, off = take("<I"), take("<Q")
        infos.append((name, ne, t, off))
    align = kv.get("general.alignment", 32)
    base = (pos + align - 1) // align * align
    tensors = {}
    for name, ne, t, off in infos:
        count = int(np.prod(ne))
        if t == 0:
            a = np.frombuffer(data, dtype="<f4", count=count, offset=base + off)
        elif t == 1:
            a = np.frombuffer(data, dtype="<f2", count=count, offset=base + off)
        else:
            raise SystemExit(f"{name}: tensor type {t} not handled by this reference (f32, f16 only)")
        # GGUF ne is innermost first: numpy shape is reversed
        tensors[name] = a.astype(np.float64).reshape(list(reversed(ne)))
    return kv, tensors


# ---------------------------------------------------------------- front end

RATE, N_FFT, HOP, WIN_SAMPLES, WIN_FRAMES = 16000, 400, 160, 480000, 3000


def slaney_mel(f):
    f = np.asarray(f, dtype=np.float64)
    lin = 3.0 * f / 200.0
    log = 15.0 + np.log(np.maximum(f, 1e-12) / 1000.0) / (math.log(6.4) / 27.0)
    return np.where(f >= 1000.0, log, lin)


def slaney_hz(m):
    m = np.asarray(m, dtype=np.float64)
    lin = 200.0 * m / 3.0
    log = 1000.0 * np.exp(math.log(6.4) / 27.0 * (m - 15.0))
    return np.where(m >= 15.0, log, lin)


def mel_bank(n_mel):
    """Triangles between consecutive edges on the Slaney scale, 0..8000 Hz, with
    Slaney's area normalization (2 / width in Hz). [n_mel][201]"""
    fft_hz = np.linspace(0.0, RATE / 2, N_FFT // 2 + 1)
    edges = slaney_hz(np.linspace(slaney_mel(0.0), slaney_mel(RATE / 2), n_mel + 2))
    lower = (fft_hz[None, :] - edges[:-2, None]) / (edges[1:-1] - edges[:-2])[:, None]
    upper = (edges[2:, None] - fft_hz[None, :]) / (edges[2:] - edges[1:-1])[:, None]
    tri = np.clip(np.minimum(lower, upper), 0.0, None)
    return tri * (2.0 / (edges[2:] - edges[:-2]))[:, None]


def log_mel(audio, n_mel):
    """[n_mel][n_windows * 3000]: the whole audio zero-padded to 30 s windows,
    centered STFT with reflect padding, last frame dropped, log10, max - 8, (x+4)/4."""
    n_win = max(1, -(-len(audio) // WIN_SAMPLES))
    x = np.zeros(n_win * WIN_SAMPLES)
    x[:len(audio)] = audio
    xp = np.pad(x, N_FFT // 2, mode="reflect")
    n_frames = 1 + (len(xp) - N_FFT) // HOP
    idx = np.arange(N_FFT)[None, :] + HOP * np.arange(n_frames)[:, None]
    window = 0.5 - 0.5 * np.cos(2 * np.pi * np.arange(N_FFT) / N_FFT)  # periodic Hann
    spec = np.abs(np.fft.rfft(xp[idx] * window, axis=1)) ** 2  # [frames][201]
    mel = mel_bank(n_mel) @ spec.T  # [n_mel][frames]
    lm = np.log10(np.maximum(mel, 1e-10))[:, :-1]
    lm = np.maximum(lm, lm.max() - 8.0)
    return (lm + 4.0) / 4.0, n_win


# ---------------------------------------------------------------- encoder

_erf = np.frompyfunc(math.erf, 1, 1)


def gelu(x):
    return 0.5 * x * (1.0 + _erf(x / math.sqrt(2.0)).astype(np.float64))


def layer_norm(x, w, b, eps):
    mu = x.mean(axis=-1, keepdims=True)
    var = ((x - mu) ** 2).mean(axis=-1, keepdims=True)
    return (x - mu) / np.sqrt(var + eps) * w + b


def conv1d(x, w, b, stride):
    """x [C_in][T], w [C_out][C_in][3] (PyTorch's layout), padding 1 -> [C_out][T_out]"""
    c_in, t = x.shape
    xp = np.concatenate([np.zeros((c_in, 1)), x, np.zeros((c_in, 1))], axis=1)
    t_out = (t + 2 - 3) // stride + 1
    y = np.zeros((w.shape[0], t_out))
    for k in range(3):
        cols = xp[:, k:k + stride * (t_out - 1) + 1:stride]  # [C_in][t_out]
        y += w[:, :, k] @ cols
    return y + b.reshape(-1, 1)


def encode_window(mel, T, kv):
    g = lambda n: T[n]  # noqa: E731
    d = kv["clip.audio.embedding_length"]
    n_head = kv["clip.audio.attention.head_count"]
    eps = kv.get("clip.audio.attention.layer_norm_epsilon", 1e-5)
    stack = kv["clip.audio.projector.stack_factor"]
    h = gelu(conv1d(mel, g("a.conv1d.1.weight"), g("a.conv1d.1.bias"), 1))
    h = gelu(conv1d(h, g("a.conv1d.2.weight"), g("a.conv1d.2.bias"), 2))  # [d][1500]
    h = h.T + g("a.position_embd.weight")[: h.shape[1]]  # [1500][d]
    n, dh = h.shape[0], d // n_head
    for i in range(kv["clip.audio.block_count"]):
        p = f"a.blk.{i}."
        x = layer_norm(h, g(p + "ln1.weight"), g(p + "ln1.bias"), eps)
        q = x @ g(p + "attn_q.weight").T + g(p + "attn_q.bias")
        k = x @ g(p + "attn_k.weight").T
        if p + "attn_k.bias" in T:
            k = k + g(p + "attn_k.bias")
        v = x @ g(p + "attn_v.weight").T + g(p + "attn_v.bias")
        o = np.zeros_like(q)
        for hh in range(n_head):
            sl = slice(hh * dh, (hh + 1) * dh)
            s = (q[:, sl] * dh ** -0.5) @ k[:, sl].T  # every frame sees every frame
            s = np.exp(s - s.max(axis=1, keepdims=True))
            o[:, sl] = (s / s.sum(axis=1, keepdims=True)) @ v[:, sl]
        h = h + o @ g(p + "attn_out.weight").T + g(p + "attn_out.bias")
        x = layer_norm(h, g(p + "ln2.weight"), g(p + "ln2.bias"), eps)
        f = gelu(x @ g(p + "ffn_up.weight").T + g(p + "ffn_up.bias"))
        h = h + f @ g(p + "ffn_down.weight").T + g(p + "ffn_down.bias")
    h = layer_norm(h, g("a.post_ln.weight"), g("a.post_ln.bias"), eps)
    # VoxtralForConditionalGeneration.get_audio_features: reshape to
    # (-1, intermediate_size): consecutive frames concatenated
    s = h.reshape(n // stack, stack * d)
    y = s @ g("mm.a.mlp.1.weight").T
    if "mm.a.mlp.1.bias" in T:
        y = y + g("mm.a.mlp.1.bias")
    y = gelu(y) @ g("mm.a.mlp.2.weight").T
    if "mm.a.mlp.2.bias" in T:
        y = y + g("mm.a.mlp.2.bias")
    return y


def main():
    if len(sys.argv) != 4:
        raise SystemExit(__doc__)
    kv, T = read_gguf(sys.argv[1])
    assert kv.get("clip.projector_type", kv.get("clip.audio.projector_type")) == "voxtral"
    audio = np.fromfile(sys.argv[2], dtype="<f4").astype(np.float64)
    got = np.fromfile(sys.argv[3], dtype="<f4").astype(np.float64)
    n_embd = kv["clip.audio.projection_dim"]
    mel, n_win = log_mel(audio, kv["clip.audio.num_mel_bins"])
    rows_per_window = (WIN_FRAMES // 2) // kv["clip.audio.projector.stack_factor"]
    ok = True
    if rows_per_window != 375:
        print(f"FAIL: {rows_per_window} rows per 30 s window, expected 375")
        ok = False
    want_rows = n_win * rows_per_window
    print(f"{len(audio) / RATE:.2f} s of audio: {n_win} windows, {want_rows} rows of {n_embd}")
    if got.size != want_rows * n_embd:
        print(f"FAIL: pagekv wrote {got.size / n_embd:g} rows, the reference makes {want_rows}")
        return 1
    ref = np.concatenate([encode_window(mel[:, w * WIN_FRAMES:(w + 1) * WIN_FRAMES], T, kv) for w in range(n_win)])
    got = got.reshape(want_rows, n_embd)
    err = got - ref
    nmse = float((err ** 2).sum() / (ref ** 2).sum())
    max_rel = float(np.abs(err).max() / np.abs(ref).max())
    # pagekv runs the encoder in f32 (the reference in f64, from the same f16/f32
    # weights; the mel front end is f64 in both, pagekv keeps log10 in f32):
    # measured nmse 4e-14 and max |err| / max |ref| 2.2e-7 on the test pair (cpu)
    TOL_NMSE, TOL_MAX = 1e-10, 1e-5
    print(f"pagekv vs reference: nmse {nmse:.3g} (tolerance {TOL_NMSE:g}), max |err| / max |ref| {max_rel:.3g} "
          f"(tolerance {TOL_MAX:g})")
    if not (nmse <= TOL_NMSE and max_rel <= TOL_MAX):
        ok = False
        print("FAIL: pagekv's rows differ from the reference")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
