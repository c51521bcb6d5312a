// dcp's tokenizer against the reference (@huggingface/tokenizers) on a real tokenizer (DeepSeek-V3's
// byte-level BPE, Llama 2's SentencePiece-style BPE with byte fallback): identical ids for every
// text of a corpus written for the purpose, with and without special tokens, and identical
// decoded text. Usage: node tokenizer_reference.mjs TOKENIZER_DIR path/to/dcp
import { Tokenizer } from "@huggingface/tokenizers";
import { execFileSync } from "node:child_process";
import fs from "node:fs";
import { generator } from "./corpus_random.mjs";

const [dir, dcp] = process.argv.slice(2);
const tok = new Tokenizer(JSON.parse(fs.readFileSync(`${dir}/tokenizer.json`, "utf8")),
                          JSON.parse(fs.readFileSync(`${dir}/tokenizer_config.json`, "utf8")));

const { rand, pick } = generator(0x2545f491);

// Text cases (UTF-8 when written), then byte cases (not all valid UTF-8).
const texts = {
  ascii: "The quick brown fox jumps over the lazy dog. It's 9 o'clock; they'll say \"hi\"!",
  code: "fn main() {\n    let v: Vec<u32> = (0..10).map(|x| x * 2).collect();\n\tprintln!(\"{:?}\", v);\n}\n" +
        "def f(a, b=3, *args, **kw):\n    return {k: v for k, v in kw.items() if v}  # comment\n",
  cjk: "深度求索的模型在推理时使用多头潜在注意力。你好，世界！我们今天学习了很多东西。",
  kana: "ひらがなとカタカナ、そして漢字を混ぜた日本語の文章です。コンピュータ。ｶﾀｶﾅ",
  korean_cyrillic_greek_arabic: "한국어 텍스트. Привет, мир! Γειά σου Κόσμε. مرحبا بالعالم",
  emoji: "I ❤️ tokenizers 🤖🚀👩‍👩‍👧‍👦 flags 🇫🇷🇯🇵 skin 👍🏽 ✨",
  digits: "1 12 123 1234 12345 123456789012 3.14159 2e-10 1,000,000 ٣٤٥ ５６７",
  crlf: "line one\r\nline two\r\n\r\nline four\rcarriage\nnew",
  whitespace: "a  b   c    d\t\te \u00a0nbsp \u2003em\u3000ideographic   \n\n\n   trailing   ",
  specials_inside: "<｜begin▁of▁sentence｜>You are helpful.<｜User｜>Hi<｜Assistant｜>Hello<｜end▁of▁sentence｜>" +
                   "x<｜tool▁calls▁begin｜>y<｜User｜<｜User｜>",
  punctuation: "!!! ??? ... --- ''' \"\"\" ((( ))) [[[ ]]] {{{ }}} @#$%^&*_+=|\\/<>~`",
  mixed_script: "naïve café résumé Straße İstanbul ǅungla ﬁne ß ΣΑΣ ŉ",
  long_word: "supercalifragilisticexpialidocious".repeat(20),
  empty: "",
  only_spaces: "        ",
  combining: "e\u0301 a\u0308 n\u0303 \u0915\u094d\u0937 \u0e01\u0e34",
  llama_specials_inside: "<s>[INST] Hi </s> there<unk>x <s> ▁already marked▁ <0x41> ",
  leading_and_rare: " 𝔘𝔫𝔦𝔠𝔬𝔡𝔢 ꙮ 𓀀 \u{10ffff}",
};
const bytes = {
  invalid_continuation: Buffer.from([0x61, 0x80, 0x62, 0xbf, 0x63]),
  truncated_sequences: Buffer.from([0xe4, 0xbd, 0x61, 0xf0, 0x9f, 0x98, 0x20, 0xc3]),
  overlong_and_surrogate: Buffer.from([0xc0, 0xaf, 0x20, 0xed, 0xa0, 0x80, 0x20, 0xf4, 0x90, 0x80, 0x80]),
  invalid_bytes_in_text: Buffer.concat([Buffer.from("héllo "), Buffer.from([0xff, 0xfe]), Buffer.from(" wörld 你"), Buffer.from([0xe4])]),
};

// At least 200 KB of mixed text from the pieces above and generated words.
const pieces = Object.values(texts).filter((t) => t.length > 0);
const syllables = ["ka", "to", "ri", "an", "the", "ing", "tion", "中", "文", "の", "カ", "ß", "é", "ñ", "🙂", "٣", "д"];
let mixed = "";
while (Buffer.byteLength(mixed) < 210 * 1024) {
  switch (rand(6)) {
    case 0: mixed += pick(pieces); break;
    case 1: { let w = ""; for (let i = 0, n = 1 + rand(6); i < n; ++i) w += pick(syllables); mixed += w; break; }
    case 2: mixed += " ".repeat(1 + rand(4)); break;
    case 3: mixed += String(rand(1000000)); break;
    case 4: mixed += pick(["\n", "\r\n", "\t", ". ", ", ", "; ", "!", "?", "<｜User｜>", "<｜Assistant｜>"]); break;
    default: mixed += pick(["hello", "world", "DeepSeek", "attention", "context", "parallel", "token"]) + " ";
  }
}
texts.mixed_200kb = mixed;

// Texts go through one `dcp tokenize --jsonl` run; byte cases (invalid UTF-8 cannot travel as
// JSON) each through a run of their own on raw stdin. Every case's reference ids are decoded
// back in one --jsonl --decode run, the byte cases' also one run each.
const tokenize = (args, input) =>
  execFileSync(dcp, ["tokenize", "--tokenizer-path", dir, ...args], { input, maxBuffer: 1 << 28 });
const jsonl = (args, values) =>
  tokenize(["--jsonl", ...args], values.map((v) => JSON.stringify(v)).join("\n") + "\n")
    .toString("utf8").split("\n").slice(0, values.length).map((line) => JSON.parse(line));

const decoder = new TextDecoder("utf-8", { fatal: false });  // invalid bytes -> U+FFFD
const cases = [];
for (const [name, t] of Object.entries(texts)) cases.push({ name, input: Buffer.from(t, "utf8"), text: t });
for (const [name, b] of Object.entries(bytes)) cases.push({ name, input: b });
for (const c of cases) c.want = tok.encode(decoder.decode(c.input), { add_special_tokens: false }).ids;

const textCases = cases.filter((c) => c.text !== undefined);
jsonl([], textCases.map((c) => c.text)).forEach((ids, k) => { textCases[k].got = ids; });
for (const c of cases.filter((c) => c.text === undefined)) c.got = JSON.parse(tokenize([], c.input).toString());
jsonl(["--decode"], cases.map((c) => c.want)).forEach((text, k) => { cases[k].decoded = text; });

let failed = 0;
for (const c of cases) {
  const { name, input, want, got } = c;
  const same = got.length === want.length && got.every((v, i) => v === want[i]);
  if (!same) {
    failed++;
    let i = 0;
    while (i < got.length && i < want.length && got[i] === want[i]) ++i;
    console.log(`FAIL ${name}: ids differ at ${i} of ${want.length}: dcp ${JSON.stringify(got.slice(i, i + 8))}, reference ${JSON.stringify(want.slice(i, i + 8))}`);
    console.log(`  reference tokens there: ${JSON.stringify(want.slice(i, i + 8).map((id) => tok.decode([id])))}`);
    continue;
  }
  const ref = want.length ? tok.decode(want, { skip_special_tokens: false }) : "";  // it refuses []
  const decoded = [c.decoded];
  if (c.text === undefined) decoded.push(tokenize(["--decode"], JSON.stringify(want)).toString("utf8"));
  const wrong = decoded.find((text) => text !== ref);
  if (wrong !== undefined) {
    failed++;
    console.log(`FAIL ${name}: decoded text differs (dcp ${JSON.stringify(wrong.slice(0, 80))}, reference ${JSON.stringify(ref.slice(0, 80))})`);
    continue;
  }
  console.log(`ok ${name}: ${want.length} ids, ${input.length} bytes`);
}
// With special tokens, as a server encodes a completion prompt. The reference adds what
// tokenizer.json's post_processor says; transformers' Llama tokenizers (DeepSeek-V3's class) add
// BOS as tokenizer_config.json's add_bos_token says, over a post_processor that adds none, and so
// does dcp: there the expected ids are BOS and the reference's ids without special tokens.
const tokenizerJson = JSON.parse(fs.readFileSync(`${dir}/tokenizer.json`, "utf8"));
const config = JSON.parse(fs.readFileSync(`${dir}/tokenizer_config.json`, "utf8"));
const post = tokenizerJson.post_processor;
const templateBos = post?.type === "TemplateProcessing" && post.single[0]?.SpecialToken !== undefined;
const configBos = config.add_bos_token === true;
for (const t of ["Hello there", " leading space", ""]) {
  let want = tok.encode(t).ids;
  if (configBos && !templateBos) {
    const bos = typeof config.bos_token === "string" ? config.bos_token : config.bos_token.content;
    want = [tok.token_to_id(bos), ...tok.encode(t, { add_special_tokens: false }).ids];
  }
  const got = JSON.parse(tokenize(["--add-special-tokens"], t).toString());
  const same = got.length === want.length && got.every((v, i) => v === want[i]);
  if (!same) {
    failed++;
    console.log(`FAIL special tokens of ${JSON.stringify(t)}: dcp ${JSON.stringify(got)}, reference ${JSON.stringify(want)}`);
  } else {
    console.log(`ok special tokens of ${JSON.stringify(t)}: ${JSON.stringify(got)}`);
  }
}
// Random id sequences, a third of their ids among the first 300 (single bytes: byte-level
// BPE's first tokens, SentencePiece's <0xXX> pieces), so that runs of bytes spell invalid UTF-8
// and a sequence may begin with a space spelled as a byte.
const vocabSize = tok.model.vocab.length ?? Object.keys(tokenizerJson.model.vocab).length;
const sequences = [];
for (let k = 0; k < 400; ++k) {
  const ids = [];
  for (let n = 1 + rand(16); n > 0; --n) ids.push(rand(3) === 0 ? rand(300) : rand(vocabSize));
  sequences.push(ids);
}
let decodeFailed = 0;
jsonl(["--decode"], sequences).forEach((text, k) => {
  const ref = tok.decode(sequences[k], { skip_special_tokens: false });
  if (text !== ref && decodeFailed++ < 5)
    console.log(`FAIL decode ${JSON.stringify(sequences[k])}: dcp ${JSON.stringify(text)}, reference ${JSON.stringify(ref)}`);
});
if (decodeFailed) failed++;
console.log(`${decodeFailed ? "FAIL" : "ok"} decoding ${sequences.length} random id sequences: ${decodeFailed} differ`);
console.log(`${cases.length - failed} passed, ${failed} failed`);
process.exit(failed ? 1 : 0);
