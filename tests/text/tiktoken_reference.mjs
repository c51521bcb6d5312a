// dcp's tiktoken path (Kimi's format and pre-tokenizer pattern) against the reference: the npm
// `tiktoken` package, OpenAI's Rust tiktoken built to WebAssembly, whose fancy-regex engine runs
// class intersections natively. The ranks are cl100k_base's (shipped with the package), written
// as a tiktoken.model file; the pattern is Kimi's pat_str; the special tokens Kimi's names, given
// in tokenizer_config.json. Identical ids on every text, identical decoded text.
// Usage: node tiktoken_reference.mjs DEEPSEEK_TOKENIZER_DIR (unused here) path/to/dcp
import { Tiktoken } from "tiktoken/lite";
import cl100k from "tiktoken/encoders/cl100k_base.json" with { type: "json" };
import { execFileSync } from "node:child_process";
import fs from "node:fs";
import os from "node:os";
import path from "node:path";
import { generator } from "./corpus_random.mjs";

const dcp = process.argv[3];
// Kimi-K2's tokenization_kimi.py pat_str, verbatim.
const KIMI_PATTERN = [
  String.raw`[\p{Han}]+`,
  String.raw`[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]*[\p{Ll}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?`,
  String.raw`[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]+[\p{Ll}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?`,
  String.raw`\p{N}{1,3}`,
  String.raw` ?[^\s\p{L}\p{N}]+[\r\n]*`,
  String.raw`\s*[\r\n]+`,
  String.raw`\s+(?!\S)`,
  String.raw`\s+`,
].join("|");

// cl100k's packed ranks ("! FIRST_RANK tok tok ..." per line) as tiktoken.model lines.
const lines = [];
let top = 0;
for (const row of cl100k.bpe_ranks.split("\n")) {
  if (!row) continue;
  const [, offset, ...tokens] = row.split(" ");
  tokens.forEach((t, i) => {
    const rank = Number(offset) + i;
    lines.push(`${t} ${rank}`);
    top = Math.max(top, rank);
  });
}
const specials = {};
["[BOS]", "[EOS]", "<|im_end|>", "<|im_user|>", "<|im_assistant|>", "<|im_system|>", "<|im_middle|>"]
  .forEach((s, i) => { specials[s] = top + 1 + i; });
const dir = fs.mkdtempSync(path.join(os.tmpdir(), "dcp_tiktoken_"));
fs.writeFileSync(path.join(dir, "tiktoken.model"), lines.join("\n") + "\n");
const decoder = {};
for (const [content, id] of Object.entries(specials)) decoder[id] = { content, special: true };
fs.writeFileSync(path.join(dir, "tokenizer_config.json"),
                 JSON.stringify({ added_tokens_decoder: decoder, bos_token: "[BOS]", eos_token: "[EOS]" }));
const enc = new Tiktoken(cl100k.bpe_ranks, specials, KIMI_PATTERN);

const { rand, pick } = generator(0x1234567);
const texts = {
  ascii: "The quick brown fox jumps over the lazy dog. It's 9 o'clock; THEY'LL say \"hi\"!",
  // Where the intersections matter: letters next to Han characters, upper then lower case.
  han_latin: "Hello世界World 漢字ABCdef Kimi模型K2 中文English混合MixedCase 日本語テキストとLatin",
  han_marks: "e\u0301漢 A\u0308字B a\u0303中c 字\u0301x",
  cjk: "深度求索的模型在推理时使用多头潜在注意力。你好，世界！",
  kana: "ひらがなとカタカナ、そして漢字を混ぜた日本語の文章です。ｶﾀｶﾅ",
  scripts: "한국어 텍스트. Привет, МИР! Γειά σου Κόσμε. مرحبا بالعالم ǅungla İstanbul Straße",
  emoji: "I ❤️ tokenizers 🤖🚀👩‍👩‍👧‍👦 flags 🇫🇷🇯🇵 skin 👍🏽",
  digits: "1 12 123 1234 12345 123456789012 3.14159 ٣٤٥ ５６７",
  crlf: "line one\r\nline two\r\n\r\nline four\rcarriage\nnew",
  whitespace: "a  b   c    d\t\te \u00a0nbsp \u3000ideographic   \n\n\n   trailing   ",
  contractions: "I'M you'RE we've they'd it'S DON'T Can't",
  specials_inside: "<|im_system|>system<|im_middle|>You are Kimi.<|im_end|><|im_user|>user<|im_middle|>hi[EOS]x[BOS",
  code: "fn main() {\n    let v: Vec<u32> = (0..10).map(|x| x * 2).collect();\n}\n",
  empty: "",
};
const pieces = Object.values(texts).filter((t) => t.length > 0);
const syllables = ["ka", "TO", "ri", "An", "the", "ING", "中", "文", "の", "カ", "ß", "É", "ñ", "🙂", "٣", "д", "\u0301"];
let mixed = "";
while (Buffer.byteLength(mixed) < 210 * 1024) {
  switch (rand(5)) {
    case 0: mixed += pick(pieces); break;
    case 1: { let w = ""; for (let i = 0, n = 1 + rand(6); i < n; ++i) w += pick(syllables); mixed += w; break; }
    case 2: mixed += " ".repeat(1 + rand(4)); break;
    case 3: mixed += String(rand(1000000)); break;
    default: mixed += pick(["\n", "\r\n", "\t", ". ", ", ", "!", "<|im_user|>", "[EOS]"]);
  }
}
texts.mixed_200kb = mixed;

// Every text through one `dcp tokenize --jsonl` run, every reference id list back through one
// --jsonl --decode run; the mixed text also alone on raw stdin, each way.
const jsonl = (args, values) =>
  execFileSync(dcp, ["tokenize", "--tokenizer-path", dir, "--jsonl", ...args],
               { input: values.map((v) => JSON.stringify(v)).join("\n") + "\n", maxBuffer: 1 << 28 })
    .toString("utf8").split("\n").slice(0, values.length).map((line) => JSON.parse(line));
const names = Object.keys(texts);
const wants = names.map((name) => Array.from(enc.encode(texts[name], "all")));
const gots = jsonl([], names.map((name) => texts[name]));
const decodeds = jsonl(["--decode"], wants);
const k = names.indexOf("mixed_200kb");
const alone = {
  ids: JSON.parse(execFileSync(dcp, ["tokenize", "--tokenizer-path", dir], { input: texts.mixed_200kb, maxBuffer: 1 << 28 })),
  text: execFileSync(dcp, ["tokenize", "--tokenizer-path", dir, "--decode"],
                     { input: JSON.stringify(wants[k]), maxBuffer: 1 << 28 }).toString("utf8"),
};
let failures = 0;
if (JSON.stringify(alone.ids) !== JSON.stringify(gots[k]) || alone.text !== decodeds[k]) {
  failures++;
  console.log("FAIL mixed_200kb: raw stdin and --jsonl disagree");
}
names.forEach((name, i) => {
  const [want, got] = [wants[i], gots[i]];
  const same = got.length === want.length && got.every((v, j) => v === want[j]);
  const decodeSame = decodeds[i] === texts[name];
  if (!same || !decodeSame) {
    failures++;
    const at = got.findIndex((v, j) => v !== want[j]);
    console.log(`FAIL ${name}: ${same ? "" : `ids differ at ${at} (dcp ${got.slice(at, at + 5)}, tiktoken ${want.slice(at, at + 5)})`}${decodeSame ? "" : " decoded text differs"}`);
  } else {
    console.log(`ok ${name}: ${want.length} ids`);
  }
});
fs.rmSync(dir, { recursive: true });
enc.free();
console.log(`${failures} failed of ${names.length} texts (and the mixed one alone)`);
process.exit(failures ? 1 : 0);
