/* The log-mel front end of Whisper-style audio encoders (Voxtral), as Hugging Face
 * transformers' WhisperFeatureExtractor defines it and VoxtralProcessor applies it:
 * the audio is zero-padded to a whole number of 30-second windows, then
 *   STFT: n_fft 400, hop 160, periodic Hann window of 400, centered frames (the
 *         signal reflect-padded by 200 samples at both ends), |X|^2;
 *   mel:  n_mel triangular filters on the Slaney mel scale from 0 to 8000 Hz, each
 *         scaled by 2 / (its width in Hz) ("slaney" norm);
 *   log10(max(mel, 1e-10)), floored at (its maximum over the whole audio) - 8,
 *   then (x + 4) / 4;
 * the last frame of the STFT is dropped, so a window is exactly 3000 frames.
 * Computed on the host in double precision. */
#ifndef PKV_MEDIA_AUDIO_MEL_H
#define PKV_MEDIA_AUDIO_MEL_H

#include "base/base.h"

#define PKV_MEL_RATE 16000
#define PKV_MEL_N_FFT 400
#define PKV_MEL_HOP 160
#define PKV_MEL_WINDOW_SAMPLES 480000 /* 30 s */
#define PKV_MEL_WINDOW_FRAMES 3000

/* Windows of 30 s that n_samples (> 0) samples start: ceil(n / 480000). */
int64_t pkv_mel_n_windows(int64_t n_samples);

/* The filter bank: f32 [n_mel][n_fft / 2 + 1]. */
void pkv_mel_filters(int n_mel, float *filters);

/* out: f32 [n_mel][n_windows * 3000] (frame-minor: out[m * n_frames + t]),
 * n_windows = pkv_mel_n_windows(n_samples). PKV_ERR_NOMEM on allocation failure. */
pkv_status pkv_audio_log_mel(const float *samples, int64_t n_samples, int n_mel, float *out);
/* pkv_audio_log_mel in pieces (the encoder's slices): frames [t0, t1) of out get
 * their log10 values, *gmax the largest seen so far (start at -INFINITY); once
 * every frame has one, _finish floors and scales the whole of out. The result is
 * pkv_audio_log_mel's, bit for bit. */
pkv_status pkv_audio_log_mel_frames(const float *samples, int64_t n_samples, int n_mel, float *out, int64_t t0,
                                    int64_t t1, double *gmax);
void pkv_audio_log_mel_finish(int64_t n_samples, int n_mel, float *out, double gmax);

#endif
