/* The Jinja chat templates of the built-in families: what `pagekv mkmodel
 * --chat-template NAME` writes into tokenizer.chat_template and what `pagekv serve
 * --chat-template NAME` runs (one text for both). Families with no system turn join
 * system texts (a blank line between) and open the next user turn with them; one no
 * user turn follows becomes a turn of its own. The [INST] families: llama2 wraps the
 * system text in <<SYS>>, mistral does not; turns after the first start with <s>. */
#ifndef PKV_CHAT_FAMILIES_H
#define PKV_CHAT_FAMILIES_H

#define PKV_FW "\xef\xbd\x9c" /* DeepSeek's fullwidth bar */
#define PKV_SP "\xe2\x96\x81" /* SentencePiece's space */

#define PKV_JINJA_SYS_JOIN                                                                                          \
    "{%- if message['role'] == 'system' -%}\n"                                                                  \
    "{%- set ns.sys = ns.sys + '\\n\\n' + message['content'] if ns.sys else message['content'] -%}\n"
#define PKV_JINJA_INST(SYS_OPEN, SYS_CLOSE)                                                                         \
    "{%- set ns = namespace(sys=none, first=true) -%}\n"                                                        \
    "{%- for message in messages -%}\n" PKV_JINJA_SYS_JOIN                                                          \
    "{%- elif message['role'] == 'user' -%}\n"                                                                  \
    "{%- if not ns.first -%}{{- '<s>' -}}{%- endif -%}\n"                                                       \
    "{{- '[INST] ' -}}\n"                                                                                       \
    "{%- if ns.sys is not none -%}\n"                                                                           \
    "{{- " SYS_OPEN " + ns.sys + " SYS_CLOSE " -}}{%- set ns.sys = none -%}\n"                                 \
    "{%- endif -%}\n"                                                                                           \
    "{{- message['content'] + ' [/INST]' -}}\n"                                                                 \
    "{%- set ns.first = false -%}\n"                                                                            \
    "{%- else -%}\n"                                                                                            \
    "{{- ' ' + message['content'] + ' </s>' -}}\n"                                                              \
    "{%- set ns.first = false -%}\n"                                                                            \
    "{%- endif -%}\n"                                                                                           \
    "{%- endfor -%}\n"                                                                                          \
    "{%- if ns.sys is not none -%}\n"                                                                           \
    "{%- if not ns.first -%}{{- '<s>' -}}{%- endif -%}\n"                                                       \
    "{{- '[INST] ' + " SYS_OPEN " + ns.sys + " SYS_CLOSE " + ' [/INST]' -}}\n"                                  \
    "{%- endif -%}\n"

#define PKV_JINJA_CHATML \
    "{%- for message in messages -%}\n" \
    "{{- '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>\\n' -}}\n" \
    "{%- endfor -%}\n" \
    "{%- if add_generation_prompt -%}{{- '<|im_start|>assistant\\n' -}}{%- endif -%}"

#define PKV_JINJA_LLAMA3 \
    "{%- for message in messages -%}\n" \
    "{{- '<|start_header_id|>' + message['role'] + '<|end_header_id|>\\n\\n' + message['content'] + '<|eot_id|>' -}}\n" \
    "{%- endfor -%}\n" \
    "{%- if add_generation_prompt -%}{{- '<|start_header_id|>assistant<|end_header_id|>\\n\\n' -}}{%- endif -%}"

#define PKV_JINJA_LLAMA2 \
    PKV_JINJA_INST("'<<SYS>>\\n'", "'\\n<</SYS>>\\n\\n'")

#define PKV_JINJA_MISTRAL \
    PKV_JINJA_INST("''", "'\\n\\n'")

#define PKV_JINJA_GEMMA \
    "{%- set ns = namespace(sys=none) -%}\n" \
    "{%- for message in messages -%}\n" PKV_JINJA_SYS_JOIN \
    "{%- else -%}\n" \
    "{{- '<start_of_turn>' + ('model' if message['role'] == 'assistant' else 'user') + '\\n' -}}\n" \
    "{%- if message['role'] == 'user' and ns.sys is not none -%}\n" \
    "{{- ns.sys + '\\n\\n' -}}{%- set ns.sys = none -%}\n" \
    "{%- endif -%}\n" \
    "{{- message['content'] + '<end_of_turn>\\n' -}}\n" \
    "{%- endif -%}\n" \
    "{%- endfor -%}\n" \
    "{%- if ns.sys is not none -%}{{- '<start_of_turn>user\\n' + ns.sys + '<end_of_turn>\\n' -}}{%- endif -%}\n" \
    "{%- if add_generation_prompt -%}{{- '<start_of_turn>model\\n' -}}{%- endif -%}"

#define PKV_JINJA_PHI3 \
    "{%- for message in messages -%}\n" \
    "{%- if message['role'] == 'system' -%}{{- '<|system|>\\n' -}}\n" \
    "{%- elif message['role'] == 'user' -%}{{- '<|user|>\\n' -}}\n" \
    "{%- else -%}{{- '<|assistant|>\\n' -}}{%- endif -%}\n" \
    "{{- message['content'] + '<|end|>\\n' -}}\n" \
    "{%- endfor -%}\n" \
    "{%- if add_generation_prompt -%}{{- '<|assistant|>\\n' -}}{%- endif -%}"

#define PKV_JINJA_DEEPSEEK \
    "{%- for message in messages -%}\n" \
    "{%- if message['role'] == 'system' -%}{{- message['content'] -}}\n" \
    "{%- elif message['role'] == 'user' -%}{{- '<" PKV_FW "User" PKV_FW ">' + message['content'] -}}\n" \
    "{%- else -%}{{- '<" PKV_FW "Assistant" PKV_FW ">' + message['content'] + '<" PKV_FW "end" PKV_SP "of" PKV_SP "sentence" PKV_FW ">' -}}\n" \
    "{%- endif -%}\n" \
    "{%- endfor -%}\n" \
    "{%- if add_generation_prompt -%}{{- '<" PKV_FW "Assistant" PKV_FW ">' -}}{%- endif -%}"

#endif /* PKV_CHAT_FAMILIES_H */
