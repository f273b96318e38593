/* Whisper's log-mel spectrogram (audio-mel.h). */
#include "media/audio-mel.h"

#include <math.h>
#include <string.h>

#define N_BINS (PKV_MEL_N_FFT / 2 + 1)

int64_t pkv_mel_n_windows(int64_t n_samples) {
    if (n_samples <= 0) return 1;
    return (n_samples + PKV_MEL_WINDOW_SAMPLES - 1) / PKV_MEL_WINDOW_SAMPLES;
}

/* The Slaney mel scale: linear below 1 kHz (3 mel per 200 Hz), logarithmic above. */
static double hz_to_mel(double f) {
    return f < 1000.0 ? 3.0 * f / 200.0 : 15.0 + log(f / 1000.0) * 27.0 / log(6.4);
}
static double mel_to_hz(double m) {
    return m < 15.0 ? 200.0 * m / 3.0 : 1000.0 * exp((m - 15.0) * log(6.4) / 27.0);
}

static void filters_d(int n_mel, double *fb) {
    const double mmax = hz_to_mel(PKV_MEL_RATE / 2.0);
    double edge[1024 + 2];
    for (int i = 0; i < n_mel + 2; i++) edge[i] = mel_to_hz(mmax * (double)i / (double)(n_mel + 1));
    for (int m = 0; m < n_mel; m++) {
        const double enorm = 2.0 / (edge[m + 2] - edge[m]);
        for (int k = 0; k < N_BINS; k++) {
            const double f = (double)k * (PKV_MEL_RATE / 2.0) / (double)(N_BINS - 1);
            const double down = (f - edge[m]) / (edge[m + 1] - edge[m]);
            const double up = (edge[m + 2] - f) / (edge[m + 2] - edge[m + 1]);
            double w = down < up ? down : up;
            fb[m * N_BINS + k] = (w > 0 ? w : 0) * enorm;
        }
    }
}

void pkv_mel_filters(int n_mel, float *filters) {
    double *fb = pkv_malloc(sizeof(double) * (size_t)n_mel * N_BINS);
    if (!fb) return;
    filters_d(n_mel, fb);
    for (int i = 0; i < n_mel * N_BINS; i++) filters[i] = (float)fb[i];
    pkv_free(fb);
}

typedef struct {
    double re, im;
} cplx;

/* Mixed-radix decimation-in-time DFT of n points (n divides 400 = 2^4 5^2):
 * out[k] = sum_j in[j * stride] e^{-2 pi i j k / n}. tw[j] = e^{-2 pi i j / 400}. */
static void fft(const cplx *in, size_t stride, cplx *out, int n, const cplx *tw) {
    if (n == 1) {
        out[0] = in[0];
        return;
    }
    const int p = n % 2 == 0 ? 2 : 5, m = n / p, step = PKV_MEL_N_FFT / n;
    for (int r = 0; r < p; r++) fft(in + (size_t)r * stride, stride * (size_t)p, out + r * m, m, tw);
    /* out[r m + k] is bin k of the r-th decimated sequence; X[k + q m] =
     * sum_r out[r m + k] W_n^{r (k + q m)}, which overwrites the same p slots */
    for (int k = 0; k < m; k++) {
        cplx a[5], x[5];
        for (int r = 0; r < p; r++) a[r] = out[r * m + k];
        for (int q = 0; q < p; q++) {
            double re = 0, im = 0;
            for (int r = 0; r < p; r++) {
                const cplx w = tw[((size_t)r * (size_t)(k + q * m) * (size_t)step) % PKV_MEL_N_FFT];
                re += a[r].re * w.re - a[r].im * w.im;
                im += a[r].re * w.im + a[r].im * w.re;
            }
            x[q].re = re;
            x[q].im = im;
        }
        for (int q = 0; q < p; q++) out[k + q * m] = x[q];
    }
}

pkv_status pkv_audio_log_mel(const float *samples, int64_t n_samples, int n_mel, float *out) {
    double gmax = -INFINITY;
    const int64_t n_frames = pkv_mel_n_windows(n_samples) * PKV_MEL_WINDOW_FRAMES;
    pkv_status st = pkv_audio_log_mel_frames(samples, n_samples, n_mel, out, 0, n_frames, &gmax);
    if (!st) pkv_audio_log_mel_finish(n_samples, n_mel, out, gmax);
    return st;
}

void pkv_audio_log_mel_finish(int64_t n_samples, int n_mel, float *out, double gmax) {
    const size_t total = (size_t)n_mel * (size_t)(pkv_mel_n_windows(n_samples) * PKV_MEL_WINDOW_FRAMES);
    for (size_t i = 0; i < total; i++) {
        /* out[i] holds the log10 value (rounded to f32 to halve the memory of long audio) */
        const double v = (double)out[i] > gmax - 8.0 ? (double)out[i] : gmax - 8.0;
        out[i] = (float)((v + 4.0) / 4.0);
    }
}

pkv_status pkv_audio_log_mel_frames(const float *samples, int64_t n_samples, int n_mel, float *out, int64_t t0,
                                    int64_t t1, double *gmax_io) {
    if (n_mel <= 0 || n_mel > 1024) return pkv_err(PKV_ERR_INVALID, "log-mel: %d mel bins (1..1024)", n_mel);
    const int64_t n_win = pkv_mel_n_windows(n_samples), len = n_win * PKV_MEL_WINDOW_SAMPLES;
    const int64_t n_frames = n_win * PKV_MEL_WINDOW_FRAMES; /* the STFT's last frame dropped */
    double *fb = pkv_malloc(sizeof(double) * (size_t)n_mel * N_BINS);
    if (!fb) {
        return pkv_err(PKV_ERR_NOMEM, "log-mel: out of memory for %lld frames", (long long)n_frames);
    }
    filters_d(n_mel, fb);
    cplx tw[PKV_MEL_N_FFT];
    double hann[PKV_MEL_N_FFT];
    for (int j = 0; j < PKV_MEL_N_FFT; j++) {
        const double a = 2.0 * M_PI * (double)j / PKV_MEL_N_FFT;
        tw[j].re = cos(a);
        tw[j].im = -sin(a);
        hann[j] = 0.5 - 0.5 * cos(a); /* periodic */
    }
    double gmax = *gmax_io;
    for (int64_t t = t0; t < t1 && t < n_frames; t++) {
        cplx fr[PKV_MEL_N_FFT], X[PKV_MEL_N_FFT];
        double pw[N_BINS];
        for (int j = 0; j < PKV_MEL_N_FFT; j++) {
            /* centered: sample t * hop + j - n_fft / 2 of the padded signal, reflected at both ends */
            int64_t s = t * PKV_MEL_HOP + j - PKV_MEL_N_FFT / 2;
            if (s < 0) s = -s;
            if (s >= len) s = 2 * (len - 1) - s;
            fr[j].re = (s < n_samples ? (double)samples[s] : 0.0) * hann[j];
            fr[j].im = 0;
        }
        fft(fr, 1, X, PKV_MEL_N_FFT, tw);
        for (int k = 0; k < N_BINS; k++) pw[k] = X[k].re * X[k].re + X[k].im * X[k].im;
        for (int m = 0; m < n_mel; m++) {
            const double *f = fb + (size_t)m * N_BINS;
            double s = 0;
            for (int k = 0; k < N_BINS; k++) s += f[k] * pw[k];
            const double v = log10(s > 1e-10 ? s : 1e-10);
            out[(size_t)m * (size_t)n_frames + (size_t)t] = (float)v;
            if (v > gmax) gmax = v;
        }
    }
    *gmax_io = gmax;
    pkv_free(fb);
    return PKV_OK;
}
