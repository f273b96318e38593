// labels: unit server
/* The server's chat templates (src/chat/chat-template.c, compiled in here: it
 * is plain C with no HTTP): each family's rendering of a conversation, and the
 * regressions fuzz-chat found — a system-only conversation in the [INST]
 * families failed with "out of memory", and the families without a system turn
 * (llama2, mistral, gemma) dropped every system message but the last, and a
 * system message no user turn followed. No text may be dropped. The families are
 * Jinja templates now (pkv_tpl_source), run by the server's interpreter. */
#include "testhelp.h"

#ifndef PKV_HAVE_SERVER
int main(void) { return th_skip("built without the server (jansson)"); }
#else
#include "chat/chat-template.c"
#include "chat/jinja.c"
#include "chat/jinja-lex.c"
#include "chat/jinja-parse.c"
#include "chat/jinja-eval.c"
#include "chat/jinja-builtins.c"
#include "chat-testlib.h"

static char *render(pkv_tpl t, const pkv_chat_msg *m, int n) {
    char err[256] = "";
    char *out = pkv_tpl_render(t, m, n, err, sizeof err);
    if (!out) TH_FAIL("%s: %s", pkv_tpl_name(t), err);
    return out;
}

static void expect(pkv_tpl t, const pkv_chat_msg *m, int n, const char *want) {
    char *out = render(t, m, n);
    if (out && strcmp(out, want)) TH_FAIL("%s: got\n%s\nwant\n%s", pkv_tpl_name(t), out, want);
    th_checks++;
    free(out);
}

int main(void) {
    const pkv_chat_msg conv[] = {{"system", "Be brief."}, {"user", "Hi"}, {"assistant", "Hello."}, {"user", "Bye"}};
    expect(PKV_TPL_CHATML, conv, 4,
           "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\nHello."
           "<|im_end|>\n<|im_start|>user\nBye<|im_end|>\n<|im_start|>assistant\n");
    expect(PKV_TPL_LLAMA2, conv, 4, "[INST] <<SYS>>\nBe brief.\n<</SYS>>\n\nHi [/INST] Hello. </s><s>[INST] Bye [/INST]");
    expect(PKV_TPL_MISTRAL, conv, 4, "[INST] Be brief.\n\nHi [/INST] Hello. </s><s>[INST] Bye [/INST]");
    expect(PKV_TPL_GEMMA, conv, 4,
           "<start_of_turn>user\nBe brief.\n\nHi<end_of_turn>\n<start_of_turn>model\nHello.<end_of_turn>\n"
           "<start_of_turn>user\nBye<end_of_turn>\n<start_of_turn>model\n");

    /* system only: a turn of its own (was "out of memory" for llama2/mistral, nothing for gemma) */
    const pkv_chat_msg sys_only[] = {{"system", "Rules."}};
    expect(PKV_TPL_LLAMA2, sys_only, 1, "[INST] <<SYS>>\nRules.\n<</SYS>>\n\n [/INST]");
    expect(PKV_TPL_MISTRAL, sys_only, 1, "[INST] Rules.\n\n [/INST]");
    expect(PKV_TPL_GEMMA, sys_only, 1, "<start_of_turn>user\nRules.<end_of_turn>\n<start_of_turn>model\n");

    /* two system messages: both kept, joined (the first used to be dropped) */
    const pkv_chat_msg two_sys[] = {{"system", "One."}, {"system", "Two."}, {"user", "Q"}};
    expect(PKV_TPL_LLAMA2, two_sys, 3, "[INST] <<SYS>>\nOne.\n\nTwo.\n<</SYS>>\n\nQ [/INST]");
    expect(PKV_TPL_GEMMA, two_sys, 3, "<start_of_turn>user\nOne.\n\nTwo.\n\nQ<end_of_turn>\n<start_of_turn>model\n");

    /* no family drops any message's text */
    const pkv_chat_msg mixed[] = {{"user", "u1"}, {"system", "s1"}, {"assistant", "a1"}, {"system", "s2"}};
    for (int t = 1; t < PKV_TPL_COUNT; t++) {
        char *out = render((pkv_tpl)t, mixed, 4);
        for (int i = 0; out && i < 4; i++)
            if (!strstr(out, mixed[i].content)) TH_FAIL("%s dropped '%s': %s", pkv_tpl_name((pkv_tpl)t), mixed[i].content, out);
        th_checks++;
        free(out);
    }

    /* a final assistant message is continued, not closed (llama.cpp's prefill) */
    const pkv_chat_msg prefill[] = {{"user", "Hi"}, {"assistant", "Hel"}};
    expect(PKV_TPL_CHATML, prefill, 2, "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\nHel");
    return th_done();
}
#endif
