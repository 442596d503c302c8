import OpenAI from 'openai';
const client = new OpenAI({ baseURL: process.argv[2] + '/v1', apiKey: 'none' });
const stream = await client.chat.completions.create({ model: process.argv[3], stream: true, max_tokens: 6,
  stream_options: { include_usage: true }, messages: [{ role: 'user', content: 'hello' }] });
let text = '', finish = null, usage = null, role = null;
for await (const chunk of stream) {
  if (chunk.usage) usage = chunk.usage;
  for (const c of chunk.choices) {
    if (c.delta.role) role = c.delta.role;
    if (c.delta.content) text += c.delta.content;
    if (c.finish_reason) finish = c.finish_reason;
  }
}
console.log(JSON.stringify({ role, text, finish, usage }));
