// Drives `dcp serve` with the official OpenAI Node client (npm `openai`): what a real client
// sends and parses must work. Usage: node openai_client.mjs BASE_URL MODEL API_KEY
import OpenAI from "openai";

const [baseURL, model, apiKey] = process.argv.slice(2);
const client = new OpenAI({ baseURL, apiKey, maxRetries: 0 });
let failures = 0;
const check = (cond, what) => {
  if (!cond) {
    failures++;
    console.log("FAIL:", what);
  }
};

// Another key is refused as OpenAI refuses one: the client raises its AuthenticationError.
try {
  await new OpenAI({ baseURL, apiKey: apiKey + "x", maxRetries: 0 }).models.list();
  check(false, "a wrong API key is refused");
} catch (e) {
  check(e instanceof OpenAI.AuthenticationError && e.status === 401, `a wrong API key: ${e}`);
}

const models = await client.models.list();
check(models.data.some((m) => m.id === model), `models.list names ${model}`);
const retrieved = await client.models.retrieve(model);
check(retrieved.id === model && retrieved.object === "model", `models.retrieve: ${JSON.stringify(retrieved)}`);

// Completions: whole and streamed, greedy, must agree.
const body = { model, prompt: "In a small village", max_tokens: 20, temperature: 0 };
const whole = await client.completions.create(body);
check(whole.choices.length === 1 && typeof whole.choices[0].text === "string", "completion shape");
check(whole.usage.completion_tokens >= 1, "completion usage");
let streamed = "";
let finish = null;
for await (const chunk of await client.completions.create({ ...body, stream: true })) {
  streamed += chunk.choices[0]?.text ?? "";
  finish = chunk.choices[0]?.finish_reason ?? finish;
}
check(streamed === whole.choices[0].text, `streamed completion ${JSON.stringify(streamed)} == whole ${JSON.stringify(whole.choices[0].text)}`);
check(finish === whole.choices[0].finish_reason, "streamed finish_reason");

// Chat: whole and streamed, with usage in the stream.
const chat = {
  model,
  messages: [
    { role: "system", content: "You are terse." },
    { role: "user", content: "Say something." },
  ],
  max_tokens: 16,
  temperature: 0,
};
const reply = await client.chat.completions.create(chat);
check(reply.choices[0].message.role === "assistant", "chat reply role");
let content = "";
let usage = null;
for await (const chunk of await client.chat.completions.create({ ...chat, stream: true, stream_options: { include_usage: true } })) {
  content += chunk.choices[0]?.delta?.content ?? "";
  if (chunk.usage) usage = chunk.usage;
}
check(content === reply.choices[0].message.content, "streamed chat equals whole");
check(usage && usage.total_tokens === reply.usage.total_tokens, "stream usage equals whole usage");

// Seeded sampling repeats.
const seeded = { ...body, temperature: 0.9, top_p: 0.95, seed: 11 };
const a = await client.completions.create(seeded);
const b = await client.completions.create(seeded);
check(a.choices[0].text === b.choices[0].text, "same seed, same text");

// A batch of prompts, and the penalties and bias as the client sends them: each choice is its
// prompt's alone, in order.
const batch = { ...body, max_tokens: 8, frequency_penalty: 0.5, presence_penalty: -0.5, logit_bias: { "7": 3 } };
const both = await client.completions.create({ ...batch, prompt: ["In a small village", "The sea"] });
const first = await client.completions.create({ ...batch, prompt: "In a small village" });
const second = await client.completions.create({ ...batch, prompt: "The sea" });
check(both.choices.length === 2 && both.choices[0].index === 0 && both.choices[1].index === 1, "batch choices in order");
check(both.choices[0].text === first.choices[0].text && both.choices[1].text === second.choices[0].text,
  "each choice of a batch equals its prompt's alone");

// Tool calls as the client reads them: a named function whole, and "required" through the client's
// stream helper, which assembles the calls from their deltas as it would OpenAI's.
const tools = [
  { type: "function", function: { name: "get_weather", description: "The weather in a city.",
    parameters: { type: "object", properties: { city: { type: "string", maxLength: 8 } }, required: ["city"] } } },
  { type: "function", function: { name: "now", parameters: { type: "object", properties: {} } } },
];
const ask = { ...chat, max_tokens: 200, tools };
const named = await client.chat.completions.create({ ...ask, tool_choice: { type: "function", function: { name: "get_weather" } } });
const call = named.choices[0].message.tool_calls?.[0];
check(call && call.type === "function" && call.function.name === "get_weather" && typeof call.id === "string"
  && typeof JSON.parse(call.function.arguments).city === "string", `named tool call: ${JSON.stringify(named.choices[0])}`);
const required = await client.chat.completions.create({ ...ask, tool_choice: "required" });
const stream = client.beta.chat.completions.stream({ ...ask, tool_choice: "required" });
const final = await stream.finalChatCompletion();
const calls = (m) => (m.tool_calls ?? []).map((t) => [t.function.name, t.function.arguments]);
check(required.choices[0].finish_reason === "tool_calls" && calls(required.choices[0].message).length >= 1,
  `required tool calls: ${JSON.stringify(required.choices[0])}`);
check(JSON.stringify(calls(final.choices[0].message)) === JSON.stringify(calls(required.choices[0].message))
  && final.choices[0].finish_reason === "tool_calls", `the stream helper's calls equal the whole reply's: ${JSON.stringify(final.choices[0])}`);
const namedStream = client.beta.chat.completions.stream({ ...ask, tool_choice: { type: "function", function: { name: "get_weather" } } });
const namedFinal = await namedStream.finalChatCompletion();
check(JSON.stringify(calls(namedFinal.choices[0].message)) === JSON.stringify(calls(named.choices[0].message)),
  `a named call streamed as its arguments come: ${JSON.stringify(namedFinal.choices[0])}`);

// "auto": the model's own calls in DeepSeek V3's format (forced by a guided_regex: the random model
// writes none), two of them; the stream sends each as it is read, and the helper's assembly equals
// the whole reply.
const dsCall = (name, args) => `<｜tool▁call▁begin｜>function<｜tool▁sep｜>${name}\n\`\`\`json\n${args}\n\`\`\`<｜tool▁call▁end｜>`;
const written = `Sure. <｜tool▁calls▁begin｜>${dsCall("get_weather", '{"city": "Paris"}')}\n${dsCall("get_weather", '{"city": "Oslo"}')}<｜tool▁calls▁end｜>`;
const forced = { ...ask, max_tokens: 400, guided_regex: written.replace(/[.*+?^${}()|[\]\\]/g, "\\$&") };
const auto = await client.chat.completions.create(forced);
const autoFinal = await client.beta.chat.completions.stream(forced).finalChatCompletion();
const wantAuto = JSON.stringify([["get_weather", '{"city": "Paris"}'], ["get_weather", '{"city": "Oslo"}']]);
check(JSON.stringify(calls(auto.choices[0].message)) === wantAuto && auto.choices[0].message.content === "Sure. "
  && auto.choices[0].finish_reason === "tool_calls", `auto tool calls: ${JSON.stringify(auto.choices[0])}`);
check(JSON.stringify(calls(autoFinal.choices[0].message)) === wantAuto && autoFinal.choices[0].message.content === "Sure. "
  && autoFinal.choices[0].finish_reason === "tool_calls", `auto tool calls streamed: ${JSON.stringify(autoFinal.choices[0])}`);

// Errors arrive as the client's typed errors.
try {
  await client.completions.create({ ...body, max_tokens: 0 });
  check(false, "max_tokens 0 accepted");
} catch (e) {
  check(e instanceof OpenAI.BadRequestError && e.status === 400, `max_tokens 0: ${e}`);
}
try {
  await client.completions.create({ ...body, model: "not-this-one" });
  check(false, "unknown model accepted");
} catch (e) {
  check(e instanceof OpenAI.NotFoundError && e.status === 404, `unknown model: ${e}`);
}
console.log(`${failures} failure(s)`);
process.exit(failures ? 1 : 0);
