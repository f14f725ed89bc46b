#!/usr/bin/env python3
"""Writes corpus.json: the texts every tokenizer reference (reference_js.json, reference_hf.json) covers.

Deterministic; rerun after editing and regenerate the references:
    python3 tests/data/tokenizer/make_corpus.py
    node tests/data/tokenizer/make_reference_js.js
"""
import json
import os
import random

HERE = os.path.dirname(os.path.abspath(__file__))


def shared_reference_texts():
    path = os.path.join(HERE, "..", "..", "..", "..", "shared", "testdata", "tokenizer_qwen3_reference.json")
    if not os.path.exists(path):
        return []
    with open(path, encoding="utf-8") as f:
        return [c["text"] for c in json.load(f)["cases"]]


PROSE = (
    "The committee met on Tuesday, and after three hours of debate it decided, reluctantly, to postpone the "
    "vote. \"We're not ready,\" said the chair; others disagreed. In 1987 the river flooded twice; in 2003, "
    "once. Nobody knows why. It's a mystery that we'll probably never solve, isn't it?"
)

CONTRACTIONS = [
    "I'm you're they've he'll we'd it's she's",
    "I'M YOU'RE THEY'VE HE'LL WE'D IT'S",
    "I'm You'Re tHeY'vE He'lL we'D iT'S",
    "don't can't won't shouldn't y'all ma'am o'clock",
    "O'Neil's rock'n'roll 'tis '90s ''quoted'' '",
    "it\u2019s curly \u2018quotes\u2019 and \u201cdouble\u201d",
    "long s: it'\u017f and '\u017f alone; CAPS: IT'S",
    "'s 't 're 've 'm 'll 'd 'S 'T 'RE 'VE 'M 'LL 'D",
    "x's y'all z'x ''s '''t",
    "'\u017ftuff '\u017fs IT'\u017fS",
]

DIGITS = [
    "1234567890",
    "3.14159265358979 2.71828 -0.5 +1e-10 6.022e23",
    "1,000,000 and 12,345.67 and 0001 and 007",
    "v1.2.3-rc4 build 20240615 sha 9f86d081",
    "Arabic-Indic \u0663\u0664\u0665 Devanagari \u0967\u0968\u0969 fullwidth \uff11\uff12\uff13",
    "Roman \u2160\u2161\u216b circled \u2460\u2461\u2462 fractions \u00bd\u00be superscript x\u00b2\u00b3",
    "9" * 100,
    "phone +1 (555) 123-4567, 2024-06-15T12:34:56Z",
]

WHITESPACE = [
    " ",
    "  ",
    "\t",
    "\n",
    "\r\n",
    "\r",
    "a b",
    "a  b",
    "a\tb",
    "a\nb",
    "a \n b",
    "a\r\n\r\nb",
    "   leading",
    "trailing   ",
    "  both  ",
    "x" + " " * 64 + "y",
    " " * 200,
    "\t \n\t \r\n  x  \n\n\t",
    "line one\n\n\n\nline two\n",
    "a\u3000b\u3000\u3000c",
    "\u00a0\u00a0nbsp \u00a0 x",
    "next\u0085line",
    "\u0085\u0085x word\u0085\u0085\u0085 a \u0085 b",
    "\ufeff\ufeffx word\ufeff\ufeff a \ufeff b",
    "\ufeffBOM at start",
    "para\u2028line\u2029sep",
    "thin\u2009space hair\u200aspace narrow\u202fspace",
    "\u1680ogham \u180emongolian",
    "mixed \t\n \t\n\n   end",
    "    def f():\n        return 1\n\n\n",
]

SCRIPTS = [
    "\u4eba\u5de5\u667a\u80fd\u6b63\u5728\u6539\u53d8\u4e16\u754c\u3002\u6211\u4eec\u9700\u8981\u66f4\u5feb\u7684\u63a8\u7406\u670d\u52a1\u5668\uff01",
    "\u6771\u4eac\u306f\u65e5\u672c\u306e\u9996\u90fd\u3067\u3059\u3002\u30ab\u30bf\u30ab\u30ca\u3068\u3072\u3089\u304c\u306a\u3002",
    "\ud55c\uad6d\uc5b4 \ubb38\uc7a5\uc785\ub2c8\ub2e4. \uac10\uc0ac\ud569\ub2c8\ub2e4!",
    "\u0e20\u0e32\u0e29\u0e32\u0e44\u0e17\u0e22\u0e44\u0e21\u0e48\u0e21\u0e35\u0e0a\u0e48\u0e2d\u0e07\u0e27\u0e48\u0e32\u0e07\u0e23\u0e30\u0e2b\u0e27\u0e48\u0e32\u0e07\u0e04\u0e33",
    "\u0939\u093f\u0928\u094d\u0926\u0940 \u092e\u0947\u0902 \u092f\u0939 \u090f\u0915 \u0935\u093e\u0915\u094d\u092f \u0939\u0948\u0964",
    "\u0627\u0644\u0639\u0631\u0628\u064a\u0629 \u0645\u0646 \u0627\u0644\u064a\u0645\u064a\u0646 \u0625\u0644\u0649 \u0627\u0644\u064a\u0633\u0627\u0631\u060c \u0645\u0639 \u062a\u0634\u0643\u064a\u0644: \u0643\u064e\u062a\u064e\u0628\u064e",
    "\u05e2\u05d1\u05e8\u05d9\u05ea \u05e2\u05dd \u05e0\u05d9\u05e7\u05d5\u05d3: \u05e9\u05b8\u05dc\u05d5\u05b9\u05dd",
    "\u0395\u03bb\u03bb\u03b7\u03bd\u03b9\u03ba\u03ac: \u03a3\u03af\u03c3\u03c5\u03c6\u03bf\u03c2 \u039f\u0394\u03a5\u03a3\u03a3\u0395\u03a5\u03a3",
    "\u0420\u0443\u0441\u0441\u043a\u0438\u0439 \u0442\u0435\u043a\u0441\u0442: \u0401\u0436\u0438\u043a \u0438 \u0451\u043b\u043a\u0430.",
    "\u0540\u0561\u0575\u0565\u0580\u0565\u0576 \u10e5\u10d0\u10e0\u10d7\u10e3\u10da\u10d8 \u12a0\u121b\u122d\u129b",
    "\u0f56\u0f7c\u0f51\u0f0b\u0f61\u0f72\u0f42 \u182e\u1823\u1829\u182d\u1823\u182f \u13e3\u13b3\u13a9",
    "Ti\u1ebfng Vi\u1ec7t c\u00f3 d\u1ea5u: \u0111\u01b0\u1eddng ph\u1ed1",
    "emoji \U0001F600\U0001F603 \U0001F44D\U0001F3FD \U0001F1EB\U0001F1F7 \U0001F468\u200d\U0001F469\u200d\U0001F467\u200d\U0001F466 1\ufe0f\u20e3 \u2764\ufe0f",
    "\U0001F389" * 20,
    "math \U0001D400\U0001D401\U0001D402 \u2200x\u2208\u211d: x\u00b2\u22650 \u2211\u222b\u221a\u221e",
    "plane 2 \U00020000\U0002A6D6 plane 1 \U00010300\U00010330 music \U0001D11E",
    "private \ue000\uf8ff \U000F0000\U0010FFFD",
    "decomposed e\u0301 a\u0308 o\u0302 n\u0303 vs composed \u00e9 \u00e4 \u00f4 \u00f1",
    "stacked a\u0308\u0301 zalgo z\u0351\u0352\u0353a\u0354\u0355l\u0356g\u0357o\u0358",
    "jamo \u1100\u1161\u11a8 angstrom \u212b ohm \u2126 kelvin \u212a",
    "ligature \ufb01 halfwidth \uff76\uff80\uff76\uff85 fullwidth \uff21\uff22\uff23",
    "\u0301leading combining mark",
    "Caf\u00e9 na\u00efve r\u00e9sum\u00e9 coo\u0308perate \u00c5ngstr\u00f6m Stra\u00dfe",
]

CODE = [
    "def fib(n: int) -> int:\n    if n < 2:\n        return n\n    return fib(n - 1) + fib(n - 2)\n",
    "#include <vector>\nint main() {\n\tstd::vector<int> v{1, 2, 3};\n\tfor (auto& x : v) x *= 2;\n\treturn 0;\n}\n",
    "fn main() {\n    let xs: Vec<u32> = (0..10).map(|x| x * x).collect();\n    println!(\"{:?}\", xs);\n}\n",
    "const f = async (a, b) => { await sleep(10); return a ?? b; };\nconsole.log(`${f}`);\n",
    "func main() {\n\tch := make(chan int, 3)\n\tgo func() { ch <- 42 }()\n\tfmt.Println(<-ch)\n}\n",
    "SELECT u.id, COUNT(*) AS n FROM users u JOIN orders o ON o.user_id = u.id WHERE o.total > 100 GROUP BY u.id;",
    "#!/bin/bash\nset -euo pipefail\nfor f in *.txt; do wc -l \"$f\" | awk '{print $1}'; done 2>&1 >/dev/null\n",
    '{"model": "qwen3", "messages": [{"role": "user", "content": "hi"}], "temperature": 0.7, "stream": true}',
    "<html>\n  <body class=\"main\">\n    <p>Hello &amp; welcome!</p>\n  </body>\n</html>\n",
    "\\begin{equation}\n  E = mc^2 \\quad \\int_0^\\infty e^{-x^2} dx = \\frac{\\sqrt{\\pi}}{2}\n\\end{equation}",
    "regex: ^(?:[a-z0-9!#$%&'*+/=?^_`{|}~-]+)@[a-z]+\\.[a-z]{2,}$",
    "--- a/file.py\n+++ b/file.py\n@@ -1,3 +1,4 @@\n-old line\n+new line\n+another\n",
    "| col1 | col2 |\n|------|------|\n| a    | b    |\n",
    "C:\\Users\\name\\Documents\\file.txt and /usr/local/bin/python3.12",
    "https://example.com/path?q=hello+world&x=1#frag mailto:someone@example.org",
    "x+=1;y-=2;z*=3;w/=4;a%=5;b<<=1;c>>=2;d&&=e||f;g!==h===i",
    "    \n\t\t\n        code with trailing spaces    \n",
    "camelCaseName PascalCaseName snake_case_name SCREAMING_CASE kebab-case-name __dunder__",
]

SPECIAL = [
    "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n<|im_start|>user\nHi!<|im_end|>\n<|im_start|>assistant\n",
    "<think>\nLet me think about this.\n</think>\n\nThe answer is 42.",
    "abc<|endoftext|>def",
    "<|im_start|><|im_start|><|im_end|>",
    "  <|im_start|>  spaced  <|im_end|>  ",
    "<|im_start broken <|im_end| <|im_start|",
    "< |im_start|> <<|im_start|>> <|<|im_end|>|>",
    "<tool_call>\n{\"name\": \"f\", \"arguments\": {}}\n</tool_call>",
    "<|fim_prefix|>def f():<|fim_suffix|>\n<|fim_middle|>",
    "<s>[INST] Hello [/INST] Hi</s><s>[INST] Again [/INST]",
    "<unk> and <s> and </s>",
    "text<s>text</s>text",
    "<|begin_of_text|><|start_header_id|>user<|end_header_id|>\n\nHi<|eot_id|>",
    "<|reserved_special_token_5|>",
    "<\uff5cbegin\u2581of\u2581sentence\uff5c>Hello<\uff5cUser\uff5c>hi<\uff5cAssistant\uff5c>",
    "<\uff5ctool\u2581calls\u2581begin\uff5c><\uff5ctool\u2581call\u2581begin\uff5c>function",
    "<|start|>assistant<|channel|>analysis<|message|>thinking<|end|><|return|>",
    "<|endoftext|>",
    "<think></think>",
    "word <think>in</think> word",
]

ODD = [
    "\x00",
    "nul\x00inside",
    "\x01\x02\x1f\x7f controls",
    "zero\u200bwidth\u200cnon\u200djoiner",
    "\ufffd replacement",
    "\ufffe\uffff nonchars \U0001FFFE",
    "rtl \u202eoverride\u202c end",
    "variation \u2764\ufe0e \u2764\ufe0f",
    "tags \U000E0041\U000E0042",
    "soft\u00adhyphen",
    "\u2581already metaspace \u2581\u2581x",
    "\u0120G-dot and \u010a newline char",
    "ends with a quote'",
    "'",
    "''",
    "\"",
    "...",
    "!!!???",
    "\u2014em dash\u2013en dash",
    "\u201cq\u201d \u00abg\u00bb \u300cj\u300d",
]


# Added-token flags, for the synthetic tokenizers in synthetic/ (make_synthetic.js gives them these tokens).
FLAGS = [
    "a  [LSTRIP]  b",
    "a  [RSTRIP]  b",
    "x [BOTH] y",
    "[BOTH][BOTH]",
    " [LSTRIP]",
    "[RSTRIP] ",
    "\u3000[LSTRIP]\u3000[RSTRIP]\u3000",
    "\n\n[BOTH]\n\n",
    "xyzzy sxyzzyfish xyzzys xyzzy. (xyzzy) _xyzzy xyzzy_ 1xyzzy xyzzy\u00f6 xyzzy\u0301 \u00e9xyzzy xyzzy",
    "<sw> a<sw>b <sw>",
    "cafe\u0301 caf\u00e9 cafe",
    "Ohm \u2126 omega \u03a9",
    "hello world hello  world helloworld",
    "\u0120weird \u0120 weird",
]


def long_texts(rng):
    words = PROSE.split()
    para = " ".join(rng.choice(words) for _ in range(900))
    return [
        para,
        "a" * 3000,
        "ab" * 1500,
        "\u4e2d" * 500,
        "!" * 500,
        "0123456789" * 100,
        "\U0001F600" * 200,
        "word " * 400,
        "x\n" * 300,
        "".join(rng.choice("aA1 !\t\n\u00e9\u4e2d'") for _ in range(2000)),
    ]


def main():
    rng = random.Random(20240615)
    texts = []
    texts += shared_reference_texts()
    texts += [PROSE, PROSE.upper(), PROSE.lower()]
    texts += CONTRACTIONS + DIGITS + WHITESPACE + SCRIPTS + CODE + SPECIAL + ODD + FLAGS
    texts += long_texts(rng)
    # Random mixtures of everything above, to hit boundaries between categories.
    pool = CONTRACTIONS + DIGITS + WHITESPACE + SCRIPTS + SPECIAL + ODD + FLAGS
    for _ in range(40):
        texts.append("".join(rng.choice(pool)[: rng.randint(1, 12)] for _ in range(rng.randint(2, 6))))
    seen = set()
    unique = [t for t in texts if not (t in seen or seen.add(t))]
    with open(os.path.join(HERE, "corpus.json"), "w", encoding="utf-8") as f:
        json.dump(unique, f, ensure_ascii=False, indent=0)
        f.write("\n")
    print(f"corpus.json: {len(unique)} texts")


if __name__ == "__main__":
    main()
