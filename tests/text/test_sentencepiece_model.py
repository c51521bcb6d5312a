"""tokenizer.model (a SentencePiece BPE model, what a checkpoint without tokenizer.json ships)
against SentencePiece itself (Debian's python3-sentencepiece): a model trained here with byte
fallback, then ids and decoded text of random texts compared with `dcp tokenize`; the same for
models with normalization rules (NFKC and its variants, rules from a TSV, collapsed spaces) on
texts full of the characters those rules rewrite; the refusals of models dcp would not run the
same way. Exits 77 (skipped) without the sentencepiece module.

Usage: test_sentencepiece_model.py path/to/dcp"""
import json
import os
import random
import subprocess
import sys
import tempfile

try:
    import sentencepiece as spm
except ImportError:
    print("skipped: no sentencepiece module (Debian: apt-get install python3-sentencepiece)")
    sys.exit(77)

DCP = sys.argv[1]
SYMBOLS = ["<|im_start|>", "<|im_end|>"]
WORDS = ["the", "cat", "sat", "on", "a", "mat", "hello", "world", "tokenizer", "byte", "über",
         "naïve", "日本語", "テキスト", "café", "123", "4567", "x", "don't", "e-mail", "ünïcödé"]
# Characters the training text never has: they reach the model as byte pieces.
RARE = ["😀", "ÿ", "Ω", "\t", "\r", "€", "𝔘", "ß", "ı"]


def train(folder, **options):
    os.makedirs(folder, exist_ok=True)
    rng = random.Random(7)
    corpus = os.path.join(folder, "corpus.txt")
    with open(corpus, "w") as f:
        for _ in range(3000):
            f.write(" ".join(rng.choice(WORDS) for _ in range(rng.randint(3, 14))) + "\n")
    settings = dict(model_type="bpe", vocab_size=420, byte_fallback=True,
                    normalization_rule_name="identity", remove_extra_whitespaces=False,
                    user_defined_symbols=SYMBOLS, character_coverage=1.0, minloglevel=2)
    settings.update(options)
    spm.SentencePieceTrainer.train(input=corpus, model_prefix=os.path.join(folder, "tokenizer"),
                                   **settings)
    os.remove(corpus)
    os.remove(os.path.join(folder, "tokenizer.vocab"))
    return spm.SentencePieceProcessor(model_file=os.path.join(folder, "tokenizer.model"))


def dcp_lines(folder, lines, *flags):
    out = subprocess.run([DCP, "tokenize", "--tokenizer-path", folder, "--jsonl", *flags],
                         input="\n".join(json.dumps(x) for x in lines) + "\n",
                         capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    # One line per input; "\n" only ends one (str.splitlines would split at a U+2028 in a text).
    return [json.loads(line) for line in out.stdout.split("\n")[:-1]]


def random_text(rng, symbols):
    parts = []
    for _ in range(rng.randint(0, 12)):
        r = rng.random()
        if r < 0.6:
            parts.append(rng.choice(WORDS))
        elif r < 0.8:
            parts.append(rng.choice(RARE))
        elif r < 0.9:
            parts.append(" " * rng.randint(1, 3))
        elif symbols:
            parts.append(rng.choice(SYMBOLS))
        else:
            parts.append("\n")
        if rng.random() < 0.7:
            parts.append(" ")
    return "".join(parts)


# Characters NFKC rewrites (full-width and half-width forms, ligatures, compatibility and
# circled characters, combining sequences it composes, spaces and controls nmt_nfkc maps to a
# space or drops, case for the _cf variants), and the ASCII some rules produce.
NFKC = ["ＡＢＣ", "ｃａｔ", "ﬁ", "ﬂ", "①", "㍿", "ｶﾀｶﾅ", "ﾊﾟ", "e\u0301", "A\u030a", "\u212b", "²", "™",
        "…", "¼", "Ⅻ", "㈱", "ﻼ", "ǆ", "ℌ", "\u1100\u1161", "\u00a0", "\u3000", "\u200b", "\ufeff",
        "\u2028", "\x01", "\t", "\r\n", "CAT", "Straße", "ΣΑΣ", "İ", "AB", "BA"]


def nfkc_text(rng, symbols):
    parts = []
    for _ in range(rng.randint(0, 12)):
        r = rng.random()
        if r < 0.35:
            parts.append(rng.choice(NFKC))
        elif r < 0.55:
            parts.append(rng.choice(WORDS))
        elif r < 0.75:  # any character of the ranges compatibility forms live in
            lo, hi = rng.choice([(0xA0, 0x24F), (0x300, 0x36F), (0x1100, 0x11FF), (0x2000, 0x33FF),
                                 (0xF900, 0xFAFF), (0xFB00, 0xFFEF), (0x1D400, 0x1D7FF)])
            parts.append(chr(rng.randint(lo, hi)))
        elif r < 0.9:
            parts.append(rng.choice([" ", "  ", "   ", "\u3000", " \u00a0 "]))
        elif symbols:
            parts.append(rng.choice(SYMBOLS))
        if rng.random() < 0.5:
            parts.append(" ")
    return "".join(parts)


def transformers_ids(sp, text):
    """Transformers' legacy Llama tokenizer: the text split at its added tokens, each stretch
    encoded on its own (so each begins with the U+2581 mark)."""
    ids, rest = [], text
    while rest:
        hits = [(rest.find(s), s) for s in SYMBOLS if s in rest]
        if not hits:
            return ids + sp.encode(rest)
        at, symbol = min(hits)
        ids += sp.encode(rest[:at]) + [sp.piece_to_id(symbol)]
        rest = rest[at + len(symbol):]
    return ids


def encode_failures(folder, sp, plain, marked, name):
    """Texts without added tokens against SentencePiece's own encoding, id for id; texts with
    added tokens as Transformers encodes them. Returns the number that differ."""
    failures = 0
    for text, ids in zip(plain, dcp_lines(folder, plain)):
        if ids != sp.encode(text):
            failures += 1
            print(f"FAIL {name} encode {text!r}: sentencepiece {sp.encode(text)}, dcp {ids}")
    for text, ids in zip(marked, dcp_lines(folder, marked)):
        if ids != transformers_ids(sp, text):
            failures += 1
            print(f"FAIL {name} encode {text!r}: expected {transformers_ids(sp, text)}, dcp {ids}")
    return failures


def main():
    rng = random.Random(11)
    failures = 0
    with tempfile.TemporaryDirectory() as tmp:
        good = os.path.join(tmp, "bpe")
        sp = train(good)
        plain = [random_text(rng, False) for _ in range(1500)]
        plain += ["", " ", "  two", "trailing  ", "\n", "x\ny", "😀😀", "ÿ", " the  cat\t"]
        marked = [random_text(rng, True) for _ in range(500)]
        failures += encode_failures(good, sp, plain, marked, "bpe")
        # BOS from the model's bos_id.
        bos = dcp_lines(good, ["hello world"], "--add-special-tokens")[0]
        if bos != sp.encode("hello world", add_bos=True):
            failures += 1
            print(f"FAIL bos: {bos}")
        # Decoding what SentencePiece encoded, and random sequences of its word pieces. (Byte
        # pieces alone can spell invalid UTF-8, and a first one can be a space: there dcp decodes
        # as Transformers' converted tokenizer does, a U+FFFD per invalid run and the first space
        # dropped, where SentencePiece writes a U+FFFD per byte and keeps a space spelled as a
        # byte; tokenizer_reference_llama2 checks those against @huggingface/tokenizers.)
        words = [i for i in range(sp.get_piece_size())
                 if not (sp.is_byte(i) or sp.is_control(i) or sp.is_unknown(i))]
        sequences = [sp.encode(t) for t in plain[:500]]
        sequences += [[rng.choice(words) for _ in range(rng.randint(1, 20))] for _ in range(300)]
        sequences = [s for s in sequences if s]
        texts = dcp_lines(good, sequences, "--decode")
        for ids, text in zip(sequences, texts):
            want = sp.decode(ids)
            if text != want:
                failures += 1
                print(f"FAIL decode {ids}: sentencepiece {want!r}, dcp {text!r}")
        print(f"{len(plain)} plain texts, {len(marked)} with added tokens, "
              f"{len(sequences)} decodes compared")

        # tokenizer_config.json's added_tokens_decoder: tokens after the model's pieces (as
        # MiniCPM3's chat tokens are), matched whole in the text like the model's own.
        n = sp.get_piece_size()
        extra = {str(n): "<|tool_call|>", str(n + 1): "<|fim_prefix|>"}
        config = {"added_tokens_decoder": {
            k: {"content": v, "lstrip": False, "rstrip": False, "normalized": False,
                "single_word": False, "special": True} for k, v in extra.items()}}
        with open(os.path.join(good, "tokenizer_config.json"), "w") as f:
            json.dump(config, f)
        text = "call<|tool_call|>the cat<|fim_prefix|><|im_end|> x"
        want = (sp.encode("call") + [n] + sp.encode("the cat") + [n + 1] +
                [sp.piece_to_id("<|im_end|>")] + sp.encode(" x"))
        got = dcp_lines(good, [text])[0]
        if got != want:
            failures += 1
            print(f"FAIL added_tokens_decoder: expected {want}, dcp {got}")
        # Each stretch after an added token began with the mark, which decodes as a space (as
        # Transformers' converted tokenizer decodes it); only the text's first one is dropped.
        decoded = dcp_lines(good, [want], "--decode")[0]
        if decoded != "call<|tool_call|> the cat<|fim_prefix|><|im_end|>  x":
            failures += 1
            print(f"FAIL added_tokens_decoder: decoded {decoded!r}")
        skipped = dcp_lines(good, [want], "--decode", "--skip-special-tokens")[0]
        if skipped != "call the cat<|im_end|>  x":  # <|im_end|> is user-defined, not special
            failures += 1
            print(f"FAIL added_tokens_decoder: decoded without special tokens {skipped!r}")
        config["added_tokens_decoder"]["5"] = {"content": "<|not piece 5|>"}
        with open(os.path.join(good, "tokenizer_config.json"), "w") as f:
            json.dump(config, f)
        out = subprocess.run([DCP, "tokenize", "--tokenizer-path", good], input="hi",
                             capture_output=True, text=True)
        if out.returncode == 0 or "added_tokens_decoder['5'] is '<|not piece 5|>'" not in out.stderr:
            failures += 1
            print(f"FAIL added_tokens_decoder mismatch: rc {out.returncode}, {out.stderr.strip()}")

        # Normalization rules, run as SentencePiece runs them: the compiled NFKC maps (spm_train's
        # default, nmt_nfkc, with runs of spaces collapsed), case folding, rules from a TSV
        # (longest match first), and collapsed spaces alone.
        rules = os.path.join(tmp, "rules.tsv")
        with open(rules, "w") as f:  # A -> a, AB -> x, full-width A -> AB (not applied again)
            f.write("41\t61\n41 42\t78\nFF21\t41 42\n")
        for name, options in [
                ("nmt_nfkc", {"normalization_rule_name": "nmt_nfkc",
                              "remove_extra_whitespaces": True}),
                ("nfkc_cf", {"normalization_rule_name": "nfkc_cf"}),
                ("nmt_nfkc_keep_spaces", {"normalization_rule_name": "nmt_nfkc"}),
                ("tsv_rules", {"normalization_rule_tsv": rules, "remove_extra_whitespaces": True}),
                ("collapse", {"remove_extra_whitespaces": True})]:
            folder = os.path.join(tmp, name)
            nsp = train(folder, **options)
            texts = [nfkc_text(rng, False) for _ in range(600)]
            texts += ["", " ", "   ", "\u3000", "\u200b", " ＡＢ  c ", "AAB", "ＡB", "e\u0301\u0301"]
            marked = [nfkc_text(rng, True) for _ in range(200)]
            failures += encode_failures(folder, nsp, texts, marked, name)
            sequences = [i for i in (nsp.encode(t) for t in texts) if i]
            for ids, text in zip(sequences, dcp_lines(folder, sequences, "--decode")):
                if text != nsp.decode(ids):
                    failures += 1
                    print(f"FAIL {name} decode {ids}: sentencepiece {nsp.decode(ids)!r}, "
                          f"dcp {text!r}")
            print(f"{name}: {len(texts)} plain texts, {len(marked)} with added tokens, "
                  f"{len(sequences)} decodes compared")

        # Models dcp would not tokenize as SentencePiece does: refused, naming the field.
        denormalize = os.path.join(tmp, "denormalize.tsv")
        with open(denormalize, "w") as f:
            f.write("61\t41\n")
        for name, options, message in [
                ("unigram", {"model_type": "unigram", "vocab_size": 330},
                 "trainer_spec.model_type = UNIGRAM"),
                ("denormalizer", {"denormalization_rule_tsv": denormalize},
                 "denormalizer_spec.precompiled_charsmap"),
                ("nobytes", {"byte_fallback": False, "vocab_size": 100},
                 "trainer_spec.byte_fallback = false")]:
            folder = os.path.join(tmp, name)
            train(folder, **options)
            out = subprocess.run([DCP, "tokenize", "--tokenizer-path", folder], input="hi",
                                 capture_output=True, text=True)
            if out.returncode == 0 or message not in out.stderr:
                failures += 1
                print(f"FAIL refusal {name}: rc {out.returncode}, {out.stderr.strip()}")
        # byte_fallback (trainer_spec field 35) sent again as bytes instead of a varint: a field
        # dcp reads, in a form it cannot read, is refused rather than skipped.
        wrong = os.path.join(tmp, "wrong_wire_type")
        os.makedirs(wrong)
        with open(os.path.join(good, "tokenizer.model"), "rb") as f:
            model = f.read()
        with open(os.path.join(wrong, "tokenizer.model"), "wb") as f:
            f.write(model + bytes([0x12, 4, 0x9a, 0x02, 1, 1]))
        out = subprocess.run([DCP, "tokenize", "--tokenizer-path", wrong], input="hi",
                             capture_output=True, text=True)
        if out.returncode == 0 or "a trainer_spec field has the wrong wire type" not in out.stderr:
            failures += 1
            print(f"FAIL wrong wire type: rc {out.returncode}, {out.stderr.strip()}")
        garbage = os.path.join(tmp, "garbage")
        os.makedirs(garbage)
        with open(os.path.join(garbage, "tokenizer.model"), "wb") as f:
            f.write(b"\xff" * 12)
        out = subprocess.run([DCP, "tokenize", "--tokenizer-path", garbage], input="hi",
                             capture_output=True, text=True)
        if out.returncode == 0 or "not a SentencePiece model?" not in out.stderr:
            failures += 1
            print(f"FAIL garbage: rc {out.returncode}, {out.stderr.strip()}")
    print("PASS" if failures == 0 else f"{failures} FAILURES")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
