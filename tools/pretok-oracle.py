#!/usr/bin/env python3
"""Expected pre-tokenizer splits for tests/test-tokenizer.c (test_pretok_oracle), and
the \\p{P}\\p{S} / \\p{M} range table of src/model/tokenizer-bpe.c.

The facts: for each tokenizer.ggml.pre name, the list of regular expressions
llama.cpp applies (src/llama-vocab.cpp, llm_tokenizer_bpe, read at commit 00ad355 of
ggml-org/llama.cpp), and how it applies them (src/unicode.cpp,
unicode_regex_split, read at commit 0c4093c):

  - each regex of the list is applied to every piece the previous one made: its
    matches and the unmatched text between them become pieces (an empty match
    only marks a boundary);
  - a regex that names a Unicode category (\\p{L} ...) runs through std::regex on a
    "collapsed" text: ASCII stays, any other code point becomes one byte for its
    category (whitespace becomes \\v), and \\p{X} becomes that byte plus an ASCII
    set. The ASCII sets of \\p{P} and \\p{S} there are together all ASCII
    punctuation, '~' in \\p{S} (checked against llama.cpp's own unicode_regex_split
    as node-llama-cpp 3.22.1 carries it, commit de3ff81: the reading at 0c4093c had
    left '~' out, and pagekv split ' ~x' as ' ' '~x' where llama.cpp has ' ~' 'x');
  - a regex without one runs through std::wregex on the code points (non-ASCII
    whitespace replaced by \\v), where \\d is ASCII only;
  - "kimi-k2" is not a regex there but a hand-written function
    (unicode_regex_split_custom_kimi_k2); KIMI_K2 below is that function written
    as a regex (it ignores letter case and marks, unlike the tokenizer's own
    pattern in its comment).

The matching itself is done by the Python `regex` module (its \\p{...} tables are
the ones tools/gen-tokenizer-unicode.py used), not by code shared with pagekv.

    python3 tools/pretok-oracle.py          # the C table of expected piece ends
    python3 tools/pretok-oracle.py --show   # the pieces, readable
    python3 tools/pretok-oracle.py --classes  # the range table for tokenizer-bpe.c
"""
import sys

import regex

CONTRACTIONS = "(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])"

# llama.cpp's unicode_cpt_is_han
HAN = ("\u4E00-\u9FFF\u3400-\u4DBF\U00020000-\U0002A6DF\U0002A700-\U0002B73F"
       "\U0002B740-\U0002B81F\U0002B820-\U0002CEAF\U0002CEB0-\U0002EBEF"
       "\uF900-\uFAFF\U0002F800-\U0002FA1F")

KIMI_K2 = ("[" + HAN + "]+|[^\\r\\n\\p{L}\\p{N}]?(?:(?![" + HAN + "])\\p{L})+" + CONTRACTIONS +
           "?|\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+")

# name -> the regex list of llama.cpp, verbatim (C++ escapes undone)
PRETOK = {
    "gpt-4o": [
        "[^\\r\\n\\p{L}\\p{N}]?((?=[\\p{L}])([^a-z]))*((?=[\\p{L}])([^A-Z]))+" + CONTRACTIONS +
        "?|[^\\r\\n\\p{L}\\p{N}]?((?=[\\p{L}])([^a-z]))+((?=[\\p{L}])([^A-Z]))*" + CONTRACTIONS +
        "?|\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n/]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+",
    ],
    "tekken": [
        "[^\\r\\n\\p{L}\\p{N}]?((?=[\\p{L}])([^a-z]))*((?=[\\p{L}])([^A-Z]))+|"
        "[^\\r\\n\\p{L}\\p{N}]?((?=[\\p{L}])([^a-z]))+((?=[\\p{L}])([^A-Z]))*|"
        "\\p{N}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n/]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+",
    ],
    "deepseek-v3": [
        "\\p{N}{1,3}",
        "[\u4E00-\u9FA5\u3040-\u309F\u30A0-\u30FF]+",
        "[!\"#$%&'()*+,\\-./:;<=>?@\\[\\\\\\]^_`{|}~][A-Za-z]+|[^\r\n\\p{L}\\p{P}\\p{S}]?[\\p{L}\\p{M}]+|"
        " ?[\\p{P}\\p{S}]+[\r\n]*|\\s*[\r\n]+|\\s+(?!\\S)|\\s+",
    ],
    "kimi-k2": [KIMI_K2],
    "seed-coder": [
        CONTRACTIONS + "|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1}| ?[^\\s\\p{L}\\p{N}\\r\\n]+|"
        "\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+",
    ],
    "superbpe": [
        "\\p{N}+",
        "(?=(\\d{3})+(?!\\d))",
    ],
}

# unicode_regex_split's k_ucat_cpt / k_ucat_map
UCAT = {
    "N": ("\xD1", "0-9"),
    "L": ("\xD2", "A-Za-z"),
    "P": ("\xD3", "!-#%-*,-/:-;?-@\\[-\\]_\\{\\}"),
    "M": ("\xD4", ""),
    "S": ("\xD5", "\\$\\+<->^`\\|\\~"),
}
UCAT_NAMES = {"\\p{N}": "N", "\\p{L}": "L", "\\p{P}": "P", "\\p{M}": "M", "\\p{S}": "S",
              "\\p{Lu}": "L", "\\p{Ll}": "L", "\\p{Lt}": "L", "\\p{Lm}": "L", "\\p{Lo}": "L"}


def is_space(ch):
    return bool(regex.match(r"\s", ch))


def collapse_char(ch):
    if ord(ch) < 128:
        return ch
    if is_space(ch):
        return "\x0b"
    for k in "NLPMS":
        if regex.match("\\p{%s}" % k, ch):
            return UCAT[k][0]
    return "\xD0"


def collapse_regex(rx):
    out, inside, i = [], False, 0
    while i < len(rx):
        c = rx[i]
        if c == "[" and (i == 0 or rx[i - 1] != "\\"):
            out.append("[")
            inside = True
            i += 1
            continue
        if inside and c == "]" and rx[i - 1] != "\\":
            out.append("]")
            inside = False
            i += 1
            continue
        if rx.startswith("\\p{", i):
            close = rx.find("}", i + 3)
            pat = rx[i:close + 1]
            if close >= 0 and pat in UCAT_NAMES:
                byte, ascii_set = UCAT[UCAT_NAMES[pat]]
                out.append(byte + ascii_set if inside else "[" + byte + ascii_set + "]")
                i = close + 1
                continue
        out.append(c)
        i += 1
    return "".join(out)


def apply(rx, subject, pieces):
    """Boundaries (code point indices) of rx applied to each piece [a, b) of subject."""
    out = []
    for a, b in pieces:
        cuts = {a, b}
        for m in rx.finditer(subject[a:b]):
            cuts.add(a + m.start())
            cuts.add(a + m.end())
        cuts = sorted(cuts)
        out += [(p, q) for p, q in zip(cuts, cuts[1:]) if p < q]
    return out


def split(name, text):
    """Pieces of text (a str) as (start, end) code point indices."""
    pieces = [(0, len(text))] if text else []
    for rx in PRETOK[name]:
        if name == "kimi-k2":
            subject, compiled = text, regex.compile(rx)
        elif any(k in rx for k in UCAT_NAMES):
            subject = "".join(collapse_char(c) for c in text)
            compiled = regex.compile(collapse_regex(rx))
        else:
            subject = "".join("\x0b" if ord(c) > 0x7F and is_space(c) else c for c in text)
            compiled = regex.compile(rx, regex.ASCII)
        pieces = apply(compiled, subject, pieces)
    return pieces


def byte_ends(text, pieces):
    return [len(text[:q].encode("utf-8")) for _, q in pieces]


# The corpus, in the order of k_oracle_texts in tests/test-tokenizer.c.
CORPUS = [
    "Hello world! It's a test, isn't it? We're here; THEY'LL see, I'VE got, I'm, you'd.",
    "DON'T Won'T 'S 's x'Re it'\u017f a'S 'll '' '",
    "1 12 123 1234 12345 123456 1234567 12345678 123456789 1234567890",
    "3.14159, 1,000,000 and 2024-11-24T10:00 v1.2.3 x86_64 abc123def4567ghi 98765x",
    "\u4F60\u597D\u4E16\u754C\uFF0C\u8FD9\u662F\u4E00\u4E2A\u6D4B\u8BD5\u3002\u65E5\u672C\u8A9E\u306E"
    "\u30C6\u30AD\u30B9\u30C8\u3068\u30AB\u30BF\u30AB\u30CA\u30FB\u3072\u3089\u304C\u306A",
    "\uD55C\uAD6D\uC5B4 \uD14D\uC2A4\uD2B8 \uC785\uB2C8\uB2E4 2024\uB144",
    "\u0645\u0631\u062D\u0628\u0627 \u0628\u0627\u0644\u0639\u0627\u0644\u0645 "
    "\u0661\u0662\u0663\u0664 \u0665\u0666 \u0634\u064F\u0643\u0652\u0631\u064B\u0627",
    "\u041F\u0440\u0438\u0432\u0435\u0442, \u041C\u0438\u0440! \u041F\u0420\u0418\u0412\u0415\u0422"
    "\u043C\u0438\u0440 \u043F\u0440\u0438\u0412\u0415\u0422 \u041C\u041E\u0421\u041A\u0412\u0410 "
    "Hello\u041C\u0438\u0440",
    "caf\u00E9 na\u00EFve \u00C9ric \u00C9COLE r\u00E9sum\u00E9 cafe\u0301 e\u0300le\u0300ve "
    "\u00C5ngstr\u00F6m STRA\u00DFE",
    "\u0395\u03BB\u03BB\u03B7\u03BD\u03B9\u03BA\u03AC \u0391\u0392\u0393 \u03B1\u03B2\u03B3 "
    "\u03A3\u03BF\u03C6\u03AF\u03B1",
    "emoji \U0001F600\U0001F601 \U0001F44D\U0001F3FD family \U0001F468\u200D\U0001F469\u200D"
    "\U0001F467 flag \U0001F1EB\U0001F1F7!",
    "punctuation!!! ??? ... --- (parens) [brackets] {braces} \"quotes\" ~tilde~ a~b ~x ~~ x ~y",
    "new\nlines\n\nand\r\nCRLF\n  \n\tindented\t\ttabs   multiple   spaces  ",
    "   leading",
    "trailing   ",
    "def f(x):\n    return x**2 // 3  # comment\nif (a<=b && c!=d) { y[i] = z->w; }\n",
    "/usr/local/bin/ a//b https://example.com/path?q=1&r=2 !!/\n/x ,/\r\n y",
    "HelloWorld iPhone ABCdef camelCaseWord XMLHttpRequest getHTTPResponse ABC",
    "Mixed\u00C9t\u00E9WORD \u01C5ungla \u01C8 \u02B0ello \u1E9E\u00DF",
    "\u0928\u092E\u0938\u094D\u0924\u0947 \u0926\u0941\u0928\u093F\u092F\u093E "
    "\u0E2A\u0E27\u0E31\u0E2A\u0E14\u0E35\u0E04\u0E23\u0E31\u0E1A",
    "mixed\u3000ideographic space and \u00A0nbsp\u2003em\u0085nel",
    "a\x01\x02\x7f control bytes \x1c\x1f end",
    "\uFF21\uFF22\uFF23\uFF11\uFF12\uFF13\uFF14\uFF58\uFF59\uFF5A",
    "x\u00B2 \u00BD \u2153 \u216B \u2460\u2461",
    "zero\u200Bwidth joiner\u200D and \uFEFFbom",
    "\n\n\n",
    " ",
    "a",
    "\U00020000\U00020001 \U0002F800 \uF900 \u3005\u3007 \u309D\u309E\u309B\u309C\u30FC\u30FB",
    "\u05E9\u05DC\u05D5\u05DD \u05E2\u05D5\u05DC\u05DD",
    "1234567890123 \u0661\u0662\u0663\u0664 12\u0663456 \uFF11\uFF12\uFF13\uFF14",
    "rock'n'roll o'clock 'quoted' l'\u00E9t\u00E9 \u2019s",
]

NAMES = list(PRETOK)


def c_string(s, width=88):
    """s as C string literals (UTF-8 bytes, escaped), one per line of at most width."""
    toks, prev_hex = [], False
    for b in s.encode("utf-8"):
        ch = chr(b)
        esc = {0x22: '\\"', 0x5C: "\\\\", 0x0A: "\\n", 0x0D: "\\r", 0x09: "\\t"}.get(b)
        if esc:
            toks.append(esc)
            prev_hex = False
        elif 0x20 <= b < 0x7F and not (prev_hex and ch in "0123456789abcdefABCDEF"):
            toks.append(ch)
            prev_hex = False
        else:
            toks.append("\\x%02x" % b)
            prev_hex = True
    lines, cur = [], ""
    for t in toks:
        if len(cur) + len(t) > width:
            lines.append(cur)
            cur = ""
        cur += t
    lines.append(cur)
    return ['"%s"' % x for x in lines]


def print_c():
    print("static const char *const k_oracle_texts[] = {")
    for t in CORPUS:
        lits = c_string(t)
        for i, lit in enumerate(lits):
            print("    %s%s" % ("" if i == 0 else "    ", lit) + ("," if i + 1 == len(lits) else ""))
    print("};")
    print()
    print("static const oracle_case k_oracle_cases[] = {")
    for name in NAMES:
        for k, t in enumerate(CORPUS):
            ends = byte_ends(t, split(name, t))
            line = '    {"%s", %d, %d, (const uint16_t[]){' % (name, k, len(ends))
            for i, e in enumerate(ends):
                item = "%d%s" % (e, ", " if i + 1 < len(ends) else "}},")
                if len(line) + len(item.rstrip()) > 99:
                    print(line.rstrip())
                    line = "        "
                line += item
            print(line)
    print("};")


def show():
    for name in NAMES:
        for t in CORPUS:
            print(name, "|".join(repr(t[a:b])[1:-1] for a, b in split(name, t)))


def print_classes():
    """Non-ASCII code points that are not \\p{L}, \\p{N} or \\s, by llama.cpp's
    categories as far as the patterns tell them apart: \\p{P} or \\p{S} (one class),
    \\p{M}. Code points that are letters, numbers or spaces are never looked up, so
    runs of one class are merged across them."""
    def cls(c):
        if 0xD800 <= c <= 0xDFFF:
            return None
        ch = chr(c)
        if is_space(ch) or regex.match(r"[\p{L}\p{N}]", ch):
            return "skip"
        if regex.match(r"[\p{P}\p{S}]", ch):
            return "C_PUNCT"
        if regex.match(r"\p{M}", ch):
            return "C_MARK"
        return None
    runs = []
    for c in range(0x80, 0x110000):
        k = cls(c)
        if k == "skip":
            continue
        if runs and runs[-1][2] == k:
            runs[-1][1] = c
        else:
            runs.append([c, c, k])
    runs = [r for r in runs if r[2]]
    line = "   "
    for lo, hi, k in runs:
        item = " {0x%04X, 0x%04X, %s}," % (lo, hi, k)
        if len(line) + len(item) > 92:
            print(line)
            line = "   "
        line += item
    print(line)


if __name__ == "__main__":
    arg = sys.argv[1] if len(sys.argv) > 1 else ""
    if arg == "--show":
        show()
    elif arg == "--classes":
        print_classes()
    else:
        print_c()
