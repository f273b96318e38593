// labels: server timeout=120
/* pagekv serve's media endpoints through HTTP, as far as they go without a
 * projector (the encoders are issue 34's branches audio and vision; once a
 * projector loads, this test grows the transcription through the openai npm
 * client):
 *   - POST /v1/audio/transcriptions: a 400 saying the server takes no audio;
 *     GET on it a 405; a body over --max-body a 413 before it is read;
 *   - chat content parts: an http(s) image_url a 400 saying pagekv never fetches
 *     URLs; input_audio and a data-URL image a 400 saying no projector is loaded;
 *     bad base64 is never reached without one (the kind is checked first);
 *   - GET /props: modalities audio and vision false;
 *   - serve --mmproj on a file that is no projector (the model itself) refuses to
 *     start, saying so; on a missing file too.
 * Each server is stopped on every exit path (server-testlib.h). */
#include "testhelp.h"

#ifndef PKV_HAVE_SERVER
int main(void) { return th_skip("pagekv was built without the server (libmicrohttpd-dev, libjansson-dev)"); }
#else
#include "server-json.h"
#include "server-testlib.h"

static int g_port;

static int post_json(const char *path, const char *json) {
    const char *f = ts_file("media-body.json", json, strlen(json));
    return ts_http(g_port, "-H 'Content-Type: application/json' --data-binary @%s %s", f, path);
}

static bool body_has(const char *s) { return strstr(ts_body, s) != NULL; }

static bool log_has(const char *log, const char *needle) {
    static char buf[1 << 16];
    return strstr(th_read_text(log, buf, sizeof buf), needle) != NULL;
}

int main(void) {
    char model[512], log[512];
    snprintf(model, sizeof model, "%s", th_tmp("media-model.gguf"));
    snprintf(log, sizeof log, "%s", th_tmp("media-serve.log"));
    REQUIRE(th_cli("", true, "mkmodel -o '%s'", model) == 0);

    /* --mmproj on something that is no projector, and on nothing */
    char args[2048];
    int port = 0;
    snprintf(args, sizeof args, "-m '%s' --mmproj '%s'", model, model);
    CHECK(ts_start(args, log, &port) < 0);
    CHECK(port != 0);
    CHECK(log_has(log, "not a projector file"));
    snprintf(args, sizeof args, "-m '%s' --mmproj '%s'", model, th_tmp("no-such-projector.gguf"));
    CHECK(ts_start(args, log, &port) < 0);
    CHECK(log_has(log, "--mmproj"));

    snprintf(args, sizeof args, "-m '%s' --max-body 4096", model);
    pid_t pid = ts_start(args, log, &g_port);
    REQUIRE(pid > 0);

    /* transcriptions without an audio projector */
    const char *wav = ts_file("a.wav", "RIFF\x24\0\0\0WAVEfmt ", 16);
    CHECK_INT(ts_http(g_port, "-F 'file=@%s' -F model=any /v1/audio/transcriptions", wav), 400);
    CHECK(body_has("takes no audio"));
    CHECK(body_has("--mmproj"));
    CHECK_INT(ts_http(g_port, "/v1/audio/transcriptions"), 405);
    /* a body over --max-body: 413 before it is read (no projector: the limit is --max-body) */
    static char big[8192];
    memset(big, 'a', sizeof big - 1);
    const char *bf = ts_file("big.bin", big, sizeof big - 1);
    CHECK_INT(ts_http(g_port, "-F 'file=@%s' /v1/audio/transcriptions", bf), 413);
    CHECK(body_has("larger than the limit of 4096 bytes (--max-body)"));

    /* chat content parts */
    CHECK_INT(post_json("/v1/chat/completions",
                        "{\"messages\":[{\"role\":\"user\",\"content\":[{\"type\":\"text\",\"text\":\"what is this?\"},"
                        "{\"type\":\"image_url\",\"image_url\":{\"url\":\"https://example.com/cat.png\"}}]}]}"),
              400);
    CHECK(body_has("pagekv never fetches URLs"));
    CHECK(body_has("messages[0].content[1]"));
    CHECK_INT(post_json("/v1/chat/completions",
                        "{\"messages\":[{\"role\":\"user\",\"content\":[{\"type\":\"image_url\",\"image_url\":"
                        "{\"url\":\"data:image/png;base64,iVBORw0KGgo=\"}}]}]}"),
              400);
    CHECK(body_has("takes no images"));
    CHECK_INT(post_json("/v1/chat/completions",
                        "{\"messages\":[{\"role\":\"user\",\"content\":[{\"type\":\"input_audio\",\"input_audio\":"
                        "{\"data\":\"UklGRg==\",\"format\":\"wav\"}}]}]}"),
              400);
    CHECK(body_has("takes no audio"));
    /* text parts still work */
    CHECK_INT(post_json("/v1/chat/completions",
                        "{\"messages\":[{\"role\":\"user\",\"content\":[{\"type\":\"text\",\"text\":\"hi\"}]}],"
                        "\"max_tokens\":2,\"temperature\":0}"),
              200);
    CHECK_INT(ts_http(g_port, "/props"), 200);
    json_t *j = json_loads(ts_body, 0, NULL);
    CHECK(j && json_is_false(jget(j, "modalities.audio")) && json_is_false(jget(j, "modalities.vision")));
    json_decref(j);
    CHECK_INT(ts_stop(pid, SIGTERM), 0);
    return th_done();
}
#endif
