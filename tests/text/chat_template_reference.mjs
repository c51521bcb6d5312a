// dcp's chat templates against the reference Jinja (@huggingface/jinja): DeepSeek-V3's real
// template on conversations of every kind, and templates written here for the rest of the Jinja
// chat templates use, rendered byte for byte alike. Usage:
//   node chat_template_reference.mjs TOKENIZER_DIR path/to/dcp
import { Template } from "@huggingface/jinja";
import { Tokenizer } from "@huggingface/tokenizers";
import { execFileSync } from "node:child_process";
import fs from "node:fs";
import os from "node:os";
import path from "node:path";

const [dir, dcp] = process.argv.slice(2);
const tokenizerJson = fs.readFileSync(`${dir}/tokenizer.json`, "utf8");
const config = JSON.parse(fs.readFileSync(`${dir}/tokenizer_config.json`, "utf8"));
const tok = new Tokenizer(JSON.parse(tokenizerJson), config);
const scratch = fs.mkdtempSync(path.join(os.tmpdir(), "dcp-chat-"));
// Two tokenizer folders whose template each check rewrites: DeepSeek-V3's, for its own template
// (the ids are compared too), and the small one dcp gen-checkpoint writes, for the templates
// written here, which only render (it loads in milliseconds, DeepSeek's 128K vocabulary in a
// good part of a second: a run per template).
const deepseek = { dir: `${scratch}/deepseek`, config, bos: "<｜begin▁of▁sentence｜>", eos: "<｜end▁of▁sentence｜>" };
fs.mkdirSync(deepseek.dir);
fs.copyFileSync(`${dir}/tokenizer.json`, `${deepseek.dir}/tokenizer.json`);
execFileSync(dcp, ["gen-checkpoint", "--out", `${scratch}/small`], { stdio: ["ignore", "ignore", "inherit"] });
const smallConfig = JSON.parse(fs.readFileSync(`${scratch}/small/tokenizer_config.json`, "utf8"));
const small = { dir: `${scratch}/small`, config: smallConfig, bos: smallConfig.bos_token, eos: smallConfig.eos_token };

let failed = 0, passed = 0;
const withTemplate = (folder, template) =>
  fs.writeFileSync(`${folder.dir}/tokenizer_config.json`, JSON.stringify({ ...folder.config, chat_template: template }));
// The variables apply_chat_template adds: the folder's special tokens and the generation flag.
const fullContext = (folder, context) =>
  ({ bos_token: folder.bos, eos_token: folder.eos, add_generation_prompt: false, ...context });
// Reports the first difference between dcp's prompt and the reference's; true when alike.
function same(name, got, want) {
  if (got === want) return true;
  failed++;
  let i = 0;
  while (i < got.length && got[i] === want[i]) ++i;
  console.log(`FAIL ${name}: differs at ${i}: dcp ${JSON.stringify(got.slice(i, i + 60))}, reference ${JSON.stringify(want.slice(i, i + 60))}`);
  return false;
}
// Renders `template` on `context` with both, and compares the text (and with `ids`, the ids dcp
// tokenizes it to against the reference tokenizer's; DeepSeek's folder only).
function check(name, folder, template, context, ids = false) {
  withTemplate(folder, template);
  const full = fullContext(folder, context);
  let want;
  try {
    want = new Template(template).render(full);
  } catch (e) {
    want = { error: String(e) };
  }
  let got;
  try {
    got = execFileSync(dcp, ["tokenize", "--tokenizer-path", folder.dir, "--chat", "--print-prompt"],
                       { input: JSON.stringify(full), stdio: ["pipe", "pipe", "pipe"] }).toString("utf8");
  } catch (e) {
    got = { error: e.stderr.toString() };
  }
  if (typeof want !== "string" || typeof got !== "string") {
    // Both must fail (raise_exception, a bad context), or it is a mismatch.
    if (typeof want === typeof got) { passed++; console.log(`ok ${name}: both refuse`); return; }
    failed++;
    console.log(`FAIL ${name}: reference ${JSON.stringify(want)}, dcp ${JSON.stringify(got)}`);
    return;
  }
  if (!same(name, got, want)) return;
  if (ids) {
    const dcpIds = JSON.parse(execFileSync(dcp, ["tokenize", "--tokenizer-path", folder.dir, "--chat"], { input: JSON.stringify(full) }).toString());
    const refIds = tok.encode(want, { add_special_tokens: false }).ids;
    if (JSON.stringify(dcpIds) !== JSON.stringify(refIds)) {
      failed++;
      console.log(`FAIL ${name}: the prompt renders alike but tokenizes differently`);
      return;
    }
  }
  passed++;
  console.log(`ok ${name}: ${want.length} characters`);
}

// DeepSeek-V3's template.
const ds = config.chat_template;
const call = (name, args) => ({ type: "function", function: { name, arguments: JSON.stringify(args) } });
const conversations = {
  user_only: { messages: [{ role: "user", content: "Hello" }] },
  user_generation_prompt: { messages: [{ role: "user", content: "Hello" }], add_generation_prompt: true },
  system_user_assistant: { messages: [{ role: "system", content: "You are terse." }, { role: "user", content: "2+2?" },
                                      { role: "assistant", content: "4" }], add_generation_prompt: false },
  multi_turn: { messages: [{ role: "system", content: "Be kind." }, { role: "user", content: "Hi" }, { role: "assistant", content: "Hello! How can I help?" },
                           { role: "user", content: "Tell me a joke." }, { role: "assistant", content: "Why did the GPU cross the road?" },
                           { role: "user", content: "Why?" }], add_generation_prompt: true },
  two_system_prompts: { messages: [{ role: "system", content: "First." }, { role: "system", content: "Second." }, { role: "user", content: "Go" }],
                        add_generation_prompt: true },
  tool_calls_and_outputs: { messages: [{ role: "user", content: "Weather in Paris and Tokyo?" },
                                       { role: "assistant", content: null, tool_calls: [call("get_weather", { city: "Paris" }), call("get_weather", { city: "Tokyo" })] },
                                       { role: "tool", content: "{\"temp\": 18}" }, { role: "tool", content: "{\"temp\": 25}" },
                                       { role: "assistant", content: "Paris 18°C, Tokyo 25°C." }, { role: "user", content: "Thanks" }],
                            add_generation_prompt: true },
  tool_output_last: { messages: [{ role: "user", content: "Run it" }, { role: "assistant", content: null, tool_calls: [call("run", {})] },
                                 { role: "tool", content: "done" }], add_generation_prompt: true },
  unicode_and_template_syntax: { messages: [{ role: "user", content: "深度求索 🤖 {{ not a tag }} {% if %} \\n tabs\tand\nnewlines" }],
                                 add_generation_prompt: true },
  empty: { messages: [] },
};
// One conversation a run of its own, then all of them through one run of `--chat --jsonl`
// (prompts, then ids): the tokenizer loads once.
check("deepseek_v3.user_only_alone", deepseek, ds, conversations.user_only, true);
withTemplate(deepseek, ds);
const contexts = Object.values(conversations).map((c) => fullContext(deepseek, c));
const lines = contexts.map((c) => JSON.stringify(c)).join("\n") + "\n";
const dcpLines = (flags) =>
  execFileSync(dcp, ["tokenize", "--tokenizer-path", deepseek.dir, "--chat", "--jsonl", ...flags], { input: lines })
    .toString("utf8").trimEnd().split("\n").map((l) => JSON.parse(l));
const prompts = dcpLines(["--print-prompt"]), idLists = dcpLines([]);
Object.keys(conversations).forEach((key, i) => {
  const name = `deepseek_v3.${key}`, want = new Template(ds).render(contexts[i]);
  if (prompts.length !== contexts.length || idLists.length !== contexts.length) {
    failed++;
    console.log(`FAIL ${name}: dcp answered ${prompts.length} and ${idLists.length} lines for ${contexts.length}`);
    return;
  }
  if (!same(name, prompts[i], want)) return;
  if (JSON.stringify(idLists[i]) !== JSON.stringify(tok.encode(want, { add_special_tokens: false }).ids)) {
    failed++;
    console.log(`FAIL ${name}: the prompt renders alike but tokenizes differently`);
    return;
  }
  passed++;
  console.log(`ok ${name}: ${want.length} characters`);
});

// The rest of the Jinja chat templates use.
const msgs = [{ role: "system", content: "  sys  " }, { role: "user", content: "a" }, { role: "assistant", content: "b" }, { role: "user", content: "c" }];
const templates = {
  whitespace_control: "{% for m in messages %}\n  {{- m.role -}}\n  : {{ m.content }}\n{% endfor %}\n",
  lstrip_and_trim_blocks: "<s>\n    {% if true %}\n    yes\n    {% endif %}\n  {# a comment #}\nend",
  loop_variables: "{% for m in messages %}{{ loop.index }}/{{ loop.length }}{% if loop.first %}F{% endif %}{% if loop.last %}L{% endif %}{{ ' ' if not loop.last }}{% endfor %}",
  if_elif_else: "{% for m in messages %}{% if m.role == 'system' %}S{% elif m.role == 'user' %}U{% else %}A{% endif %}{% endfor %}",
  namespace_and_set: "{% set ns = namespace(n=0, last='') %}{% for m in messages %}{% set ns.n = ns.n + 1 %}{% set ns.last = m.role %}{% endfor %}{{ ns.n }} {{ ns.last }}",
  slice_and_index: "{{ messages[0]['content'] | trim }}|{% for m in messages[1:] %}{{ m.content }}{% endfor %}|{{ messages[-1].content }}",
  filters: "{{ messages | length }} {{ messages | map(attribute='role') | join(',') }} {{ (messages | first).role | upper }} {{ (messages | last)['role'] }}",
  selectattr: "{% for m in messages | selectattr('role', 'equalto', 'user') %}{{ m.content }}{% endfor %}",
  // Booleans are tested, not printed: Python's Jinja prints True where the JavaScript one prints
  // true (dcp prints as Python does, as transformers' apply_chat_template would).
  tests: "{% for t in [x is defined, y is none, messages is iterable, 'a' is string, 3 is number, z is not defined, x is none] %}{{ 'Y' if t else 'N' }}{% endfor %}",
  operators: "{{ 7 // 2 }} {{ 7 % 3 }} {{ 2 ** 5 }} {{ 'ab' ~ 3 }} {{ 1 + 2 * 3 }} {{ (1 + 2) * 3 }} {{ 'Y' if (not false and true or false) }} {{ 'Y' if 'b' in 'abc' }} {{ 'Y' if 4 not in [1, 2] }} {{ -3 // 2 }} {{ 2 ** 3 ** 2 }} {{ -2 ** 2 }} {{ 2 * 3 ** 2 }}",  // (-7 % 3: Python's 2, JavaScript's -1)
  conditional_expression: "{% for m in messages %}{{ m.content if m.role == 'user' else '-' }}{% endfor %}",
  string_methods: "{{ '  pad  '.strip() }}|{{ 'a,b'.split(',') | join(' ') }}|{{ 'Y' if 'abc'.startswith('ab') }}|{{ 'Hello'.lower() }}|{{ 'x-y'.replace('-', '+') }}",
  dict_items: "{% for k, v in tool.items() %}{{ k }}={{ v }};{% endfor %}",
  default_filter: "{{ missing | default('fallback') }} {{ '' | default('empty', true) }}",
  tojson: "{{ tool | tojson }}",
  raise_exception: "{% if messages[0].role != 'user' %}{{ raise_exception('Conversation must start with a user message') }}{% endif %}",
  for_else: "{% for m in [] %}x{% else %}none{% endfor %}",
  list_and_dict_literals: "{% set d = {'a': 1, 'b': [1, 2]} %}{{ d['b'][1] }} {{ [1, 2, 3][1:] | length }}",
  nested_braces_in_a_tag: "{{ {'a': {'b': [1, {'c': 2}]}}['a']['b'][1]['c'] }}",
  // What Kimi's templates are built from: macros with defaults and keywords, a backward scan that
  // breaks at the last assistant turn, content as a string or a list of parts.
  macros_and_loop_controls: "{%- macro head(m) -%}<|{{ m.role }}|>{{ m.get('name') or m.role }}:{%- endmacro -%}\n" +
    "{%- macro body(m, sep='') -%}{%- set c = m.get('content') -%}{%- if c is string -%}{{ c }}{%- elif c is not none -%}" +
    "{%- for p in c -%}{{ p.text }}{{ sep if not loop.last }}{%- endfor -%}{%- endif -%}{%- endmacro -%}\n" +
    "{%- set ns = namespace(last=-1) -%}\n" +
    "{%- for i in range(messages | length - 1, -1, -1) -%}{%- if messages[i].role == 'assistant' -%}{%- set ns.last = i -%}{%- break -%}{%- endif -%}{%- endfor -%}\n" +
    "{%- for m in messages -%}{{ head(m) }}{{ body(m) }}{{ '*' if loop.index0 == ns.last }};{%- endfor -%}\n" +
    "{{ body({'content': [{'text': 'p'}, {'text': 'q'}]}, sep='|') }}{{ body({'content': none}) }}",
  continue_and_break: "{% for m in messages %}{% if m.role == 'system' %}{% continue %}{% endif %}{% if m.content == 'c' %}{% break %}{% endif %}{{ m.content }}{% endfor %}",
  for_filter: "{% for m in messages if m.role != 'system' %}{{ loop.index }}/{{ loop.length }}{{ m.content }}{% endfor %}",
  split_with_maxsplit: "{% for m in messages %}{{ (m.content ~ '</think>x</think>y').split('</think>', 1)[1] }};{% endfor %}{{ 'a b  c'.split(none, 1) | join('/') }}",
  dictsort_and_indented_json: "{% for k, v in tool | dictsort %}{{ k }}={{ v }};{% endfor %}{{ tool | tojson(indent=2) }}",
  none_has_no_attributes: "{% set x = none %}[{{ x.foo }}]{{ 'Y' if x.foo is defined else 'N' }}{{ 'Y' if x['a'] is defined else 'N' }}{{ 'Y' if tool.missing is none else 'N' }}",
  // What MiniCPM3's tool template is built from: a recursive macro that starts from what its call
  // block renders (caller() inside namespace()), call blocks inside loops and macros, a caller
  // with parameters.
  call_blocks: "{%- macro fields(spec, indent) -%}{%- set ns = namespace(f = caller()) -%}" +
    "{%- for name, p in spec.properties | items -%}{%- if p.type == 'object' and p.properties -%}" +
    "{%- call fields(p, indent ~ '  ') -%}{{ '\\nclass ' ~ name | title ~ ':\\n' }}{%- endcall -%}{%- endif -%}" +
    "{%- set ns.f = ns.f ~ indent ~ name ~ ': ' ~ p.type ~ ('' if name in spec.required else ' = None') ~ '\\n' -%}" +
    "{%- endfor -%}{{- ns.f -}}{%- endmacro -%}" +
    "{%- for t in tools -%}{%- call fields(t.parameters, '    ') -%}{{ '\\ndef ' ~ t.name ~ '(' ~ loop.index ~ '):\\n' }}{%- endcall -%}{%- endfor -%}" +
    "{%- macro wrap(tag) -%}<{{ tag }}>{{ caller(tag | upper, n=2) }}|{{ caller('z') }}</{{ tag }}>{%- endmacro -%}" +
    "{% call(t, n=1) wrap('b') %}{{ t }}x{{ n }}{{ messages | length }}{% endcall %}",
};
const vars = {
  messages: msgs, x: 1, y: null, tool: { name: "f", n: 2 },
  tools: [{ name: "get_weather", parameters: { type: "object", required: ["city"], properties: {
              city: { type: "string" }, where: { type: "object", properties: { lat: { type: "number" },
              area: { type: "object", properties: { name: { type: "string" } } } } }, unit: { type: "string" } } } },
          { name: "now", parameters: { type: "object", properties: {} } }],
};
for (const [name, t] of Object.entries(templates)) check(`jinja.${name}`, small, t, vars);

fs.rmSync(scratch, { recursive: true, force: true });
console.log(`${passed} passed, ${failed} failed`);
process.exit(failed ? 1 : 0);
