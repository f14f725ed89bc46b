// The real server on the demo model, driven by the official OpenAI client and by raw HTTP.
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import OpenAI from 'openai';
import { startServer, rawRequest, postJson, metrics, greedyGenerate, assertSameGreedy, onGpu } from './helpers.mjs';

let srv;
let client;
const MODEL = 'moeserve-demo';

before(async () => {
  srv = await startServer(['--reasoning-parser', 'qwen3', '--tool-call-parser', 'qwen3_coder',
    '--max-body-bytes', '1048576']);
  client = new OpenAI({ baseURL: `${srv.base}/v1`, apiKey: 'unused', maxRetries: 0 });
});

after(async () => {
  const { code } = await srv.stop();
  assert.equal(code, 0, `SIGTERM must exit 0; log:\n${srv.log()}`);
});

test('health is 503 while starting, then 200; health_generate works', async () => {
  assert.ok(srv.sawStarting, '/health should have answered 503 before the model was ready');
  assert.equal((await fetch(`${srv.base}/health`)).status, 200);
  assert.equal((await fetch(`${srv.base}/health_generate`)).status, 200);
});

test('models, model info, server info', async () => {
  const models = await client.models.list();
  assert.equal(models.data[0].id, MODEL);
  // OpenAI's retrieve: the served name (through the client, which percent-encodes it) or the model path; else a 404.
  const card = await client.models.retrieve(MODEL);
  assert.deepEqual(card, models.data[0]);
  const byPath = await fetch(`${srv.base}/v1/models/${encodeURIComponent(card.root)}`);
  assert.equal(byPath.status, 200);
  assert.equal((await byPath.json()).id, MODEL);
  await assert.rejects(client.models.retrieve('no-such-model'), (e) => e.status === 404 && /no-such-model/.test(e.message));
  for (const path of ['/v1/models/', '/v1/modelsx']) assert.equal((await fetch(`${srv.base}${path}`)).status, 404, path);
  assert.equal((await fetch(`${srv.base}/v1/models/${MODEL}`, { method: 'POST' })).status, 405);
  const info = await (await fetch(`${srv.base}/get_model_info`)).json();
  assert.equal(info.served_model_name, MODEL);
  const sinfo = await (await fetch(`${srv.base}/get_server_info`)).json();
  assert.ok(sinfo.kernel_backends.moe.reason.length > 0);
});

test('chat: non-streaming and streaming give the same greedy text', async () => {
  // The second request finds the prompt in the prefix cache and computes only its last token (M = 1 GEMMs instead
  // of the prompt's M), so on the GPU the BF16 sums round differently: there the texts must agree token by token
  // until the first near-tie of the first run (top-2 gap < 0.1, as assertSameGreedy); on the CPU exactly.
  const gpu = await onGpu(srv.base);
  const req = { model: MODEL, messages: [{ role: 'system', content: 'Be brief.' }, { role: 'user', content: 'Hello!' }],
    max_tokens: 12, temperature: 0, ...(gpu ? { logprobs: true, top_logprobs: 2 } : {}) };
  const full = await client.chat.completions.create(req);
  assert.equal(full.object, 'chat.completion');
  assert.equal(full.choices[0].finish_reason, 'length');
  assert.equal(full.usage.completion_tokens, 12);
  assert.ok(full.usage.prompt_tokens > 5);
  const stream = await client.chat.completions.create({ ...req, stream: true, stream_options: { include_usage: true } });
  let text = '';
  let finish = null;
  let usage = null;
  const streamedTokens = [];
  for await (const chunk of stream) {
    if (chunk.usage) usage = chunk.usage;
    for (const ch of chunk.choices) {
      text += ch.delta.content ?? '';
      for (const e of ch.logprobs?.content ?? []) streamedTokens.push(e.token);
      if (ch.finish_reason) finish = ch.finish_reason;
    }
  }
  if (!gpu) {
    assert.equal(text, full.choices[0].message.content);
  } else {
    const lp = full.choices[0].logprobs.content;
    assert.equal(lp.length, 12);
    assert.equal(streamedTokens.length, 12, 'the stream carries one logprob entry a token');
    for (let i = 0; i < lp.length; ++i) {
      if (lp[i].top_logprobs[0].logprob - lp[i].top_logprobs[1].logprob < 0.1) break;
      assert.equal(streamedTokens[i], lp[i].token, `token ${i}`);
    }
  }
  assert.equal(finish, 'length');
  assert.equal(usage.completion_tokens, 12);
});

test('chat: logprobs and top_logprobs', async () => {
  const r = await client.chat.completions.create({ model: MODEL, messages: [{ role: 'user', content: 'Hi' }],
    max_tokens: 4, temperature: 0, logprobs: true, top_logprobs: 3 });
  const lp = r.choices[0].logprobs.content;
  assert.equal(lp.length, 4);
  for (const e of lp) {
    assert.equal(e.top_logprobs.length, 3);
    assert.ok(e.logprob <= 0);
    // Greedy: the chosen token is the most likely one.
    assert.ok(Math.abs(e.logprob - e.top_logprobs[0].logprob) < 1e-6);
  }
});

test('completions with token ids, logprobs and echo', async () => {
  const r = await client.completions.create({ model: MODEL, prompt: [9707, 11, 1879], max_tokens: 5, temperature: 0,
    logprobs: 2 });
  assert.equal(r.choices[0].logprobs.token_logprobs.length, 5);
  assert.equal(Object.keys(r.choices[0].logprobs.top_logprobs[0]).length <= 2, true);
  const e = await client.completions.create({ model: MODEL, prompt: 'Hello', max_tokens: 3, temperature: 0, echo: true });
  assert.ok(e.choices[0].text.startsWith('Hello'));
  const batch = await client.completions.create({ model: MODEL, prompt: ['a b', 'c d'], max_tokens: 2, temperature: 0 });
  assert.equal(batch.choices.length, 2);
  // Echo by prompt: token ids echo their decoded text, a text its own (the ids' choice once echoed the text).
  const mixed = await client.completions.create({ model: MODEL, prompt: [[9707, 11, 1879], 'Once upon'], max_tokens: 2,
    temperature: 0, echo: true });
  const byIndex = Object.fromEntries(mixed.choices.map((c) => [c.index, c.text]));
  assert.ok(byIndex[0].startsWith('Hello, world'), byIndex[0]);
  assert.ok(byIndex[1].startsWith('Once upon'), byIndex[1]);
  assert.ok(!byIndex[0].includes('Once upon'), byIndex[0]);
});

test('logit_bias moves greedy choices as OpenAI describes; bad maps are 400s', async () => {
  const prompt = [9707, 11, 1879];
  // +100 on one token: greedy picks it every step (OpenAI: "exclusive selection"), natively and through the client.
  const forced = await greedyGenerate(srv.base, prompt, 4, { sampling_params: { max_new_tokens: 4, temperature: 0,
    ignore_eos: true, logit_bias: { 42: 100 } } });
  assert.equal(forced.status, 200, forced.text);
  assert.deepEqual(forced.json.output_ids, [42, 42, 42, 42]);
  const viaClient = await client.completions.create({ model: MODEL, prompt, max_tokens: 3, temperature: 0,
    logit_bias: { 42: 100 } });
  const expected = (await postJson(srv.base, '/detokenize', { tokens: [42, 42, 42] })).json.prompt;
  assert.equal(viaClient.choices[0].text, expected);
  // -100 on the greedy first token: another one comes first; the logprobs stay the raw distribution's.
  const solo = (await greedyGenerate(srv.base, prompt, 1)).json;
  const avoided = await greedyGenerate(srv.base, prompt, 1, { sampling_params: { max_new_tokens: 1, temperature: 0,
    ignore_eos: true, logit_bias: { [solo.output_ids[0]]: -100 } } });
  assert.notEqual(avoided.json.output_ids[0], solo.output_ids[0]);
  assert.ok(avoided.json.meta_info.output_token_logprobs[0][0] < solo.meta_info.output_token_logprobs[0][0]);
  for (const lb of [[1], { abc: 1 }, { '01': 1 }, { '-1': 1 }, { 99999999: 1 }, { 5: 101 }, { 5: 'x' }]) {
    const r = await postJson(srv.base, '/v1/completions', { prompt: 'x', max_tokens: 1, logit_bias: lb });
    assert.equal(r.status, 400, `${JSON.stringify(lb)}: ${r.text}`);
    assert.equal(r.json.error.param, 'logit_bias', r.text);
  }
});

// An independent check of a value against the JSON Schema subset the tests use (not the server's matcher).
function schemaErrors(v, s, defs, path = '$') {
  if (s.$ref) return schemaErrors(v, defs[s.$ref.split('/').pop()], defs, path);
  if (s.anyOf) return s.anyOf.some((a) => schemaErrors(v, a, defs, path).length === 0) ? [] : [`${path}: no anyOf matches`];
  if (s.enum) return s.enum.some((e) => JSON.stringify(e) === JSON.stringify(v)) ? [] : [`${path}: not in enum`];
  const type = v === null ? 'null' : Array.isArray(v) ? 'array' : typeof v;
  const want = s.type;
  if (want === 'integer' ? !Number.isInteger(v) : want && want !== type) return [`${path}: ${type}, not ${want}`];
  const errs = [];
  if (type === 'string') {
    const n = [...v].length;
    if (s.maxLength !== undefined && n > s.maxLength) errs.push(`${path}: longer than ${s.maxLength}`);
    if (s.minLength !== undefined && n < s.minLength) errs.push(`${path}: shorter than ${s.minLength}`);
  }
  if (type === 'array') {
    if (s.maxItems !== undefined && v.length > s.maxItems) errs.push(`${path}: more than ${s.maxItems} items`);
    if (s.minItems !== undefined && v.length < s.minItems) errs.push(`${path}: fewer than ${s.minItems} items`);
    v.forEach((x, k) => errs.push(...schemaErrors(x, s.items ?? {}, defs, `${path}[${k}]`)));
  }
  if (type === 'object' && s.properties) {
    const order = Object.keys(s.properties);
    const keys = Object.keys(v);
    for (const k of s.required ?? []) if (!(k in v)) errs.push(`${path}: ${k} missing`);
    for (const k of keys) if (!(k in s.properties)) errs.push(`${path}: unexpected ${k}`);
    // Properties come in the schema's order (the grammar's rule, as xgrammar's).
    const idx = keys.map((k) => order.indexOf(k));
    if (idx.some((x, k) => k > 0 && x < idx[k - 1])) errs.push(`${path}: keys out of order ${keys}`);
    for (const k of keys) if (k in s.properties) errs.push(...schemaErrors(v[k], s.properties[k], defs, `${path}.${k}`));
  }
  return errs;
}

const PERSON = {
  type: 'object',
  properties: {
    name: { type: 'string', minLength: 1, maxLength: 10 },
    age: { type: 'integer' },
    mood: { enum: ['happy', 'sad', 3, null] },
    tags: { type: 'array', items: { type: 'string', maxLength: 4 }, maxItems: 2 },
    ok: { type: 'boolean' },
    pos: { $ref: '#/$defs/point' },
    note: { anyOf: [{ type: 'null' }, { type: 'string', maxLength: 3 }] },
  },
  required: ['name', 'age', 'mood', 'tags', 'ok', 'pos'],
  additionalProperties: false,
  $defs: { point: { type: 'object', properties: { x: { type: 'number' } }, required: ['x'] } },
};

test('response_format json_schema: every output is a document of the schema, streamed or not', async () => {
  const base = { model: MODEL, messages: [{ role: 'user', content: 'Describe a person as JSON' }], max_tokens: 400,
    chat_template_kwargs: { enable_thinking: false },
    response_format: { type: 'json_schema', json_schema: { name: 'person', schema: PERSON, strict: true } } };
  const sampled = await client.chat.completions.create({ ...base, temperature: 1.0, n: 3, seed: 11 });
  const greedy = await client.chat.completions.create({ ...base, temperature: 0 });
  for (const c of [...sampled.choices, ...greedy.choices]) {
    assert.equal(c.finish_reason, 'stop', c.message.content);
    const v = JSON.parse(c.message.content);
    assert.deepEqual(schemaErrors(v, PERSON, PERSON.$defs), [], c.message.content);
  }
  // The same document streamed (the grammar steps are the same; so are the deltas' concatenation).
  const s = await client.chat.completions.create({ ...base, temperature: 0, stream: true });
  let text = '';
  for await (const ch of s) text += ch.choices[0]?.delta?.content ?? '';
  assert.equal(text, greedy.choices[0].message.content);
  // Beside unconstrained requests, which the constrained one must not disturb.
  const prompt = [785, 3974, 13876, 38835, 34208];
  const solo = (await greedyGenerate(srv.base, prompt, 12)).json.output_ids;
  const [batched] = await Promise.all([greedyGenerate(srv.base, prompt, 12),
    client.chat.completions.create({ ...base, temperature: 0 })]);
  await assertSameGreedy(srv.base, prompt, 12, batched.json, solo, 'beside a constrained request');
});

test('constrained decoding on every endpoint: json_object, vLLM guided_json, SGLang json_schema; recursive EBNF and structural tags refused', async () => {
  const small = { type: 'object', properties: { a: { type: 'integer' }, b: { enum: ['x', 'y'] } }, required: ['a', 'b'] };
  const obj = await client.chat.completions.create({ model: MODEL, messages: [{ role: 'user', content: 'JSON please' }],
    max_tokens: 200, temperature: 0, chat_template_kwargs: { enable_thinking: false }, response_format: { type: 'json_object' } });
  // A free-form object's strings may run long: a finished one parses, a cut one still opened the object.
  const o = obj.choices[0];
  assert.ok(o.message.content.trimStart().startsWith('{'), o.message.content);
  if (o.finish_reason === 'stop') assert.equal(typeof JSON.parse(o.message.content), 'object');
  const cases = [
    ['/v1/completions', { prompt: 'x', max_tokens: 100, temperature: 0, guided_json: small }, (j) => j.choices[0].text],
    ['/v1/completions', { prompt: 'x', max_tokens: 100, temperature: 0.8, seed: 3,
      response_format: { type: 'json_schema', json_schema: { name: 's', schema: small } } }, (j) => j.choices[0].text],
    ['/v1/chat/completions', { messages: [{ role: 'user', content: 'x' }], max_tokens: 100, temperature: 0,
      structured_outputs: { json: small }, chat_template_kwargs: { enable_thinking: false } }, (j) => j.choices[0].message.content],
    ['/generate', { text: 'x', sampling_params: { max_new_tokens: 100, temperature: 0, json_schema: JSON.stringify(small) } },
      (j) => j.text],
  ];
  for (const [path, body, textOf] of cases) {
    const r = await postJson(srv.base, path, body);
    assert.equal(r.status, 200, `${path}: ${r.text}`);
    const v = JSON.parse(textOf(r.json));
    assert.deepEqual(schemaErrors(v, small, {}), [], `${path}: ${textOf(r.json)}`);
  }
  // min_tokens cannot hold the output past its complete document: the grammar decides where it ends.
  const early = await postJson(srv.base, '/v1/completions', { prompt: 'x', max_tokens: 300, min_tokens: 250, temperature: 0,
    guided_json: small });
  assert.equal(early.status, 200, early.text);
  assert.equal(early.json.choices[0].finish_reason, 'stop', early.text);
  assert.deepEqual(schemaErrors(JSON.parse(early.json.choices[0].text), small, {}), [], early.text);
  const chat = { model: MODEL, messages: [{ role: 'user', content: 'Give me JSON' }], max_tokens: 2, temperature: 0 };
  const refused = [
    ['/v1/chat/completions', { ...chat, response_format: { type: 'json_schema', json_schema: { name: 'a',
      schema: { type: 'object', patternProperties: { '^x': { type: 'integer' } } } } } }, 'response_format', /patternProperties/],
    ['/v1/chat/completions', { ...chat, response_format: { type: 'json_schema', json_schema: { name: 'a',
      schema: { type: 'string', pattern: '(a)\\1' } } } }, 'response_format', /backreference/],
    ['/v1/chat/completions', { ...chat, response_format: { type: 'json_schema', json_schema: { name: 'a',
      schema: { $ref: '#/$defs/missing' } } } }, 'response_format', /missing/],
    ['/v1/chat/completions', { ...chat, response_format: 'json' }, 'response_format', /type/],
    ['/v1/chat/completions', { ...chat, response_format: { type: 'yaml' } }, 'response_format', /yaml/],
    ['/v1/chat/completions', { ...chat, guided_json: small, response_format: { type: 'json_object' } }, 'guided_json', /both/],
    ['/v1/chat/completions', { ...chat, tools: [{ type: 'function', function: { name: 'f', parameters: {} } }],
      tool_choice: 'required', response_format: { type: 'json_object' } }, 'tool_choice', /tool/],
    ['/v1/completions', { prompt: 'x', max_tokens: 1, guided_json: '{not json' }, 'guided_json', /not valid JSON/],
    ['/generate', { text: 'x', sampling_params: { max_new_tokens: 1, ebnf: 'root ::= "(" root ")" | "x"' } }, 'ebnf',
      /recursive/],
    ['/generate', { text: 'x', sampling_params: { max_new_tokens: 1, structural_tag: '{}' } }, 'structural_tag', /structural tags/],
  ];
  for (const [path, body, param, message] of refused) {
    const r = await postJson(srv.base, path, body);
    assert.equal(r.status, 400, `${path} ${JSON.stringify(body)}: ${r.text}`);
    assert.equal(r.json.error.param, param, r.text);
    assert.match(r.json.error.message, message, r.text);
  }
  // The plain forms still generate unconstrained.
  const text = await client.chat.completions.create({ ...chat, response_format: { type: 'text' } });
  assert.ok(text.usage.completion_tokens >= 1 && text.usage.completion_tokens <= 2, JSON.stringify(text.usage));
  const nulls = await postJson(srv.base, '/generate', { text: 'x', sampling_params: { max_new_tokens: 1, regex: null,
    json_schema: null } });
  assert.equal(nulls.status, 200, nulls.text);
});

test('constrained decoding by regular expression and choice: vLLM guided_regex / guided_choice / structured_outputs, SGLang regex', async () => {
  const phone = /^\d{3}-\d{4}$/;
  const sentiments = ['positive', 'negative', 'neutral', 'neutral-ish (mixed)'];
  const chat = (extra) => ({ model: MODEL, messages: [{ role: 'user', content: 'Classify: great stuff' }], max_tokens: 40,
    temperature: 0, chat_template_kwargs: { enable_thinking: false }, ...extra });
  // The official client (vLLM's fields ride in the body as extra fields), greedy and sampled, streamed and not.
  const greedy = await client.completions.create({ model: MODEL, prompt: 'Call me at', max_tokens: 30, temperature: 0,
    guided_regex: '\\d{3}-\\d{4}' });
  assert.match(greedy.choices[0].text, phone, greedy.choices[0].text);
  assert.equal(greedy.choices[0].finish_reason, 'stop');
  const sampled = await client.completions.create({ model: MODEL, prompt: 'Call me at', max_tokens: 30, temperature: 1,
    n: 3, seed: 5, guided_regex: '\\d{3}-\\d{4}' });
  for (const c of sampled.choices) assert.match(c.text, phone, c.text);
  const picked = await client.chat.completions.create(chat({ guided_choice: sentiments }));
  assert.ok(sentiments.includes(picked.choices[0].message.content), picked.choices[0].message.content);
  const stream = await client.chat.completions.create(chat({ guided_choice: sentiments, stream: true, temperature: 0.9, seed: 1 }));
  let streamed = '';
  for await (const c of stream) streamed += c.choices[0]?.delta?.content ?? '';
  assert.ok(sentiments.includes(streamed), streamed);
  // Free text under a bound: a word list, then the end (at the latest once the 40th character is in).
  const words = /^(yes|no)( because [a-z ]{1,40})?$/;
  const cases = [
    ['/v1/chat/completions', chat({ structured_outputs: { regex: '(yes|no)( because [a-z ]{1,40})?' } }),
      (j) => j.choices[0].message.content, words],
    ['/v1/chat/completions', chat({ structured_outputs: { choice: ['A', 'B', 'AB'] } }), (j) => j.choices[0].message.content,
      /^(A|B|AB)$/],
    ['/generate', { text: 'Answer:', sampling_params: { max_new_tokens: 80, temperature: 0.7, regex: '(yes|no)( because [a-z ]{1,40})?' } },
      (j) => j.text, words],
    ['/generate', { text: 'Date:', sampling_params: { max_new_tokens: 20, temperature: 0, regex: '^20[0-9]{2}-(0[1-9]|1[0-2])$' } },
      (j) => j.text, /^20[0-9]{2}-(0[1-9]|1[0-2])$/],
    ['/v1/completions', { prompt: 'Emoji:', max_tokens: 20, temperature: 0.5, seed: 2, guided_regex: '[\\u{1F600}-\\u{1F64F}é]{2,3}' },
      (j) => j.choices[0].text, /^[\u{1F600}-\u{1F64F}é]{2,3}$/u],
    // EBNF grammars of regular languages: SGLang's ebnf, vLLM's guided_grammar and structured_outputs {grammar}.
    ['/generate', { text: 'Answer:', sampling_params: { max_new_tokens: 40, temperature: 0.8,
      ebnf: 'root ::= answer " (" conf ")"\nanswer ::= "yes" | "no"  # the verdict\nconf ::= [0-9] "%"' } },
      (j) => j.text, /^(yes|no) \([0-9]%\)$/],
    ['/v1/chat/completions', chat({ guided_grammar: 'root ::= ("ab" | "c"){1,5} "!"' }), (j) => j.choices[0].message.content,
      /^(ab|c){1,5}!$/],
    ['/generate', { text: 'List:', sampling_params: { max_new_tokens: 40, temperature: 0.9, seed: 7,
      ebnf: 'root ::= list "."\nlist ::= item ("," list)?\nitem ::= "a" | "bc"' } }, (j) => j.text, /^(a|bc)(,(a|bc))*\.$/],
    ['/v1/completions', { prompt: 'Grade:', max_tokens: 10, temperature: 1, seed: 3,
      structured_outputs: { grammar: 'root ::= [A-C] [+-]?' } }, (j) => j.choices[0].text, /^[A-C][+-]?$/],
  ];
  // JSON Schema strings with a pattern (search semantics) and a format: the decoded values match.
  const patterned = { type: 'object', properties: { code: { type: 'string', pattern: '^[A-Z]{3}-\\d{2}$' },
    day: { type: 'string', format: 'date' }, tag: { type: 'string', pattern: 'x', maxLength: 6 } },
    required: ['code', 'day', 'tag'] };
  let finished = 0;
  for (const temperature of [0, 0.9]) {
    const r = await postJson(srv.base, '/v1/completions', { prompt: 'JSON:', max_tokens: 300, temperature, seed: 4,
      response_format: { type: 'json_schema', json_schema: { name: 'p', schema: patterned } } });
    assert.equal(r.status, 200, r.text);
    const c = r.json.choices[0];
    if (c.finish_reason !== 'stop') continue;  // a cut document is only a prefix
    const v = JSON.parse(c.text);
    assert.match(v.code, /^[A-Z]{3}-\d{2}$/, c.text);
    assert.match(v.day, /^\d{4}-(0[1-9]|1[0-2])-(0[1-9]|[12]\d|3[01])$/, c.text);
    assert.ok(v.tag.includes('x') && [...v.tag].length <= 6, c.text);
    finished++;
  }
  assert.ok(finished > 0, 'no patterned document finished within 300 tokens');
  for (const [path, body, textOf, re] of cases) {
    const r = await postJson(srv.base, path, body);
    assert.equal(r.status, 200, `${path}: ${r.text}`);
    assert.match(textOf(r.json), re, `${path} ${JSON.stringify(body)}: ${r.text}`);
  }
  const refused = [
    ['/v1/completions', { prompt: 'x', max_tokens: 1, guided_regex: '(a)\\1' }, 'guided_regex', /backreference/],
    ['/v1/completions', { prompt: 'x', max_tokens: 1, guided_regex: '(?=a)a' }, 'guided_regex', /lookahead|lookaround/],
    ['/generate', { text: 'x', sampling_params: { max_new_tokens: 1, regex: 5 } }, 'regex', /regular expression/],
    ['/v1/chat/completions', chat({ guided_choice: [] }), 'guided_choice', /non-empty list/],
    ['/v1/chat/completions', chat({ guided_choice: ['a', 3] }), 'guided_choice', /list of strings/],
    ['/v1/completions', { prompt: 'x', max_tokens: 1, guided_json: { type: 'object' }, guided_regex: 'a' }, 'guided_regex', /both/],
    ['/v1/chat/completions', chat({ structured_outputs: { grammar: 'root ::= a\na ::= "(" a ")" | "x"' } }),
      'structured_outputs', /refers to itself/],
    ['/v1/chat/completions', chat({ guided_grammar: 'root ::= "a' }), 'guided_grammar', /line 1 column 10: this string literal is not closed/],
    ['/v1/completions', { prompt: 'x', max_tokens: 1, guided_regex: 'a{2000}' }, 'guided_regex', /1000|repetition/],
  ];
  for (const [path, body, param, message] of refused) {
    const r = await postJson(srv.base, path, body);
    assert.equal(r.status, 400, `${path} ${JSON.stringify(body)}: ${r.text}`);
    assert.equal(r.json.error.param, param, r.text);
    assert.match(r.json.error.message, message, r.text);
  }
  const health = await fetch(`${srv.base}/health`);
  assert.equal(health.status, 200);
});

test('n and seed: n choices, same seed same samples', async () => {
  const req = { model: MODEL, messages: [{ role: 'user', content: 'Tell me a story' }], max_tokens: 8, n: 3, seed: 42,
    temperature: 1.0 };
  const a = await client.chat.completions.create(req);
  const b = await client.chat.completions.create(req);
  assert.equal(a.choices.length, 3);
  assert.deepEqual(a.choices.map((c) => c.message.content), b.choices.map((c) => c.message.content));
  assert.equal(new Set(a.choices.map((c) => c.index)).size, 3);
});

test('stop strings are matched across tokens and not emitted', async () => {
  const base = { model: MODEL, prompt: 'The quick brown fox', max_tokens: 24, temperature: 0 };
  const full = (await client.completions.create(base)).choices[0].text;
  assert.ok(full.length > 12, `need some text, got ${JSON.stringify(full)}`);
  const stop = full.slice(6, 10);
  const cut = full.slice(0, full.indexOf(stop));
  const r = await client.completions.create({ ...base, stop: [stop] });
  assert.equal(r.choices[0].text, cut);
  assert.equal(r.choices[0].finish_reason, 'stop');
  // Streaming cuts at the same place.
  const s = await client.completions.create({ ...base, stop: [stop], stream: true });
  let text = '';
  for await (const c of s) text += c.choices[0]?.text ?? '';
  assert.equal(text, cut);
  // Kept when asked (vLLM's include_stop_str_in_output; SGLang's no_stop_trim in /generate), streamed or not.
  const kept = await client.completions.create({ ...base, stop: [stop], include_stop_str_in_output: true });
  assert.equal(kept.choices[0].text, cut + stop);
  const ks = await client.completions.create({ ...base, stop: [stop], include_stop_str_in_output: true, stream: true });
  let kt = '';
  for await (const c of ks) kt += c.choices[0]?.text ?? '';
  assert.equal(kt, cut + stop);
  const native = await postJson(srv.base, '/generate', { text: 'The quick brown fox',
    sampling_params: { max_new_tokens: 24, temperature: 0, stop: [stop], no_stop_trim: true } });
  assert.equal(native.json.text, cut + stop);
  // vLLM's continuous_usage_stats: every chunk with choices carries the usage so far.
  const cu = await client.completions.create({ ...base, max_tokens: 4, stream: true,
    stream_options: { include_usage: true, continuous_usage_stats: true } });
  const seen = [];
  for await (const c of cu) if (c.choices.length) seen.push(c.usage.completion_tokens);
  assert.ok(seen.length >= 2 && seen.every((n, i) => i === 0 || n >= seen[i - 1]) && seen.at(-1) === 4, String(seen));
});

test('tools are accepted; tool_choice is validated; a required or named call follows the parameters', async () => {
  const tools = [{ type: 'function', function: { name: 'get_weather', description: 'Weather for a city',
    parameters: { type: 'object', properties: { city: { type: 'string' } }, required: ['city'] } } }];
  const r = await client.chat.completions.create({ model: MODEL, messages: [{ role: 'user', content: 'Weather in Paris?' }],
    tools, tool_choice: 'auto', max_tokens: 6, temperature: 0 });
  assert.ok(['length', 'stop', 'tool_calls'].includes(r.choices[0].finish_reason));
  await assert.rejects(
    client.chat.completions.create({ model: MODEL, messages: [{ role: 'user', content: 'x' }], tools,
      tool_choice: { type: 'function', function: { name: 'nope' } }, max_tokens: 2 }),
    (e) => e.status === 400);
  // A named tool_choice: the model continues inside a call of that function (the prompt opens the call).
  const named = { model: MODEL, messages: [{ role: 'user', content: 'Weather in Paris?' }], tools,
    tool_choice: { type: 'function', function: { name: 'get_weather' } }, max_tokens: 24, temperature: 0 };
  const n1 = await client.chat.completions.create(named);
  const calls = n1.choices[0].message.tool_calls;
  assert.ok(calls && calls.length >= 1, JSON.stringify(n1.choices[0]));
  assert.equal(calls[0].function.name, 'get_weather');
  assert.ok(calls[0].id.startsWith('call_'));
  JSON.parse(calls[0].function.arguments);
  // Streaming gives the same call: name first, then argument fragments that concatenate to the same JSON.
  const s = await client.chat.completions.create({ ...named, stream: true });
  let name = null;
  let args = '';
  for await (const chunk of s)
    for (const ch of chunk.choices)
      for (const tc of ch.delta.tool_calls ?? []) {
        if (tc.function?.name) name = tc.function.name;
        args += tc.function?.arguments ?? '';
      }
  assert.equal(name, 'get_weather');
  assert.equal(args, calls[0].function.arguments);
  // tool_choice named / required with qwen3_coder: the call follows the tools' parameters (tool_grammar.h). Enum and
  // boolean parameters keep it short; the demo model's random weights would write anything without the grammar.
  const typed = [{ type: 'function', function: { name: 'set_units', parameters: { type: 'object',
      properties: { unit: { type: 'string', enum: ['C', 'F'] }, detailed: { type: 'boolean' } },
      required: ['unit', 'detailed'] } } },
    { type: 'function', function: { name: 'toggle', parameters: { type: 'object',
      properties: { on: { type: 'boolean' } }, required: ['on'] } } }];
  const checkCall = (call, names) => {
    assert.ok(names.includes(call.name), JSON.stringify(call));
    const a = JSON.parse(call.arguments);
    if (call.name === 'set_units') {
      assert.deepEqual(Object.keys(a), ['unit', 'detailed'], call.arguments);
      assert.ok(['C', 'F'].includes(a.unit) && typeof a.detailed === 'boolean', call.arguments);
    } else {
      assert.deepEqual(Object.keys(a), ['on'], call.arguments);
      assert.equal(typeof a.on, 'boolean', call.arguments);
    }
  };
  // Named, and required without parallel calls: exactly one call, then the end.
  for (const [choice, names, extra] of [[{ type: 'function', function: { name: 'set_units' } }, ['set_units'], {}],
                                        ['required', ['set_units', 'toggle'], { parallel_tool_calls: false }]]) {
    for (const temperature of [0, 1]) {
      const t = await client.chat.completions.create({ model: MODEL, messages: [{ role: 'user', content: 'Units?' }],
        tools: typed, tool_choice: choice, max_tokens: 64, temperature, seed: 4, ...extra });
      const ch = t.choices[0];
      assert.equal(ch.finish_reason, 'tool_calls', JSON.stringify(ch));
      assert.equal(ch.message.tool_calls.length, 1, JSON.stringify(ch));
      checkCall(ch.message.tool_calls[0].function, names);
    }
  }
  // Required with parallel calls (the default): one or more, each a declared function with its arguments (the last
  // may be cut by max_tokens).
  const par = await client.chat.completions.create({ model: MODEL, messages: [{ role: 'user', content: 'Units?' }],
    tools: typed, tool_choice: 'required', max_tokens: 96, temperature: 1, seed: 9 });
  const pch = par.choices[0];
  assert.ok(pch.message.tool_calls.length >= 1, JSON.stringify(pch));
  const complete = pch.finish_reason === 'tool_calls' ? pch.message.tool_calls : pch.message.tool_calls.slice(0, -1);
  for (const c of complete) checkCall(c.function, ['set_units', 'toggle']);
  // A conversation with a tool call and its result renders and runs.
  const r2 = await client.chat.completions.create({ model: MODEL, tools, max_tokens: 3, temperature: 0, messages: [
    { role: 'user', content: 'Weather in Paris?' },
    { role: 'assistant', content: null, tool_calls: [{ id: 'call_1', type: 'function',
      function: { name: 'get_weather', arguments: '{"city": "Paris"}' } }] },
    { role: 'tool', tool_call_id: 'call_1', content: '18C, sunny' }] });
  assert.equal(r2.choices.length, 1);
});

test('errors use the OpenAI shape with the right status', async () => {
  await assert.rejects(client.chat.completions.create({ model: 'nope', messages: [{ role: 'user', content: 'x' }] }),
    (e) => e.status === 404);
  const cases = [
    ['POST', '/v1/chat/completions', '{not json', 400],
    ['POST', '/v1/chat/completions', JSON.stringify({ messages: [] }), 400],
    ['POST', '/v1/chat/completions', JSON.stringify({ messages: [{ role: 'wizard', content: 'x' }] }), 400],
    ['POST', '/v1/chat/completions', JSON.stringify({ messages: 'hi' }), 400],
    ['POST', '/v1/chat/completions', JSON.stringify({ messages: [{ role: 'user', content: 'x' }], temperature: 'hot' }), 400],
    ['POST', '/v1/chat/completions', JSON.stringify({ messages: [{ role: 'user', content: 'x' }], temperature: 7 }), 400],
    ['POST', '/v1/chat/completions', JSON.stringify({ messages: [{ role: 'user', content: 'x' }], max_tokens: -1 }), 400],
    ['POST', '/v1/chat/completions', JSON.stringify({ messages: [{ role: 'user', content: 'x' }], n: 0 }), 400],
    ['POST', '/v1/completions', JSON.stringify({ prompt: [1, 2, 99999999] }), 400],
    ['POST', '/v1/completions', JSON.stringify({ prompt: [] }), 400],
    ['POST', '/generate', JSON.stringify({ input_ids: [-1] }), 400],
    ['POST', '/generate', JSON.stringify({ input_ids: new Array(40000).fill(5) }), 400],
    ['POST', '/generate', JSON.stringify({ text: 'x', sampling_params: { top_p: 0 } }), 400],
    ['POST', '/detokenize', JSON.stringify({ tokens: [1, 'a'] }), 400],
    // /tokenize with messages checks them as chat completions do.
    ['POST', '/tokenize', JSON.stringify({ messages: [{ role: 'user', content: 'x' }], tools: 'x' }), 400],
    ['POST', '/tokenize', JSON.stringify({ messages: [{ role: 'user', content: 'x' }], chat_template_kwargs: [1] }), 400],
    ['POST', '/tokenize', JSON.stringify({ messages: [{ role: 'user', content: 'x' }], add_generation_prompt: 1 }), 400],
    ['POST', '/generate', JSON.stringify({ text: 'x', input_ids: [1, 2] }), 400],
    ['POST', '/generate', JSON.stringify({ text: 'x', return_logprob: true, logprob_start_len: -2 }), 400],
    // Out of the int64 range: refused before any conversion (9.3e18 as an int64 was undefined behaviour).
    ['POST', '/v1/completions', JSON.stringify({ prompt: 'x', seed: 9.3e18 }), 400],
    ['POST', '/v1/completions', '{"prompt": "x", "seed": 18446744073709551615}', 400],
    // Nesting deep enough to exhaust a thread's stack in a JSON library's recursive copy / print / compare.
    ['POST', '/v1/completions', `{"prompt": ${'['.repeat(200000)}${']'.repeat(200000)}}`, 400],
    ['POST', '/generate', `{"text": "x", "sampling_params": ${'{"a":'.repeat(100000)}1${'}'.repeat(100000)}}`, 400],
    ['GET', '/v1/nothing', undefined, 404],
    ['GET', '/v1/chat/completions', undefined, 405],
  ];
  for (const [method, p, body, status] of cases) {
    const r = await rawRequest(srv.port, method, p, body, body ? { 'content-type': 'application/json' } : {});
    assert.equal(r.status, status, `${method} ${p} ${String(body).slice(0, 80)} -> ${r.status} ${r.text}`);
    assert.ok(r.json && r.json.error && typeof r.json.error.message === 'string', r.text);
  }
  // Invalid UTF-8 in the body.
  const bad = Buffer.concat([Buffer.from('{"prompt": "a'), Buffer.from([0xff, 0xfe]), Buffer.from('"}')]);
  const r = await rawRequest(srv.port, 'POST', '/v1/completions', bad, { 'content-type': 'application/json' });
  assert.equal(r.status, 400, r.text);
  // Too large a body.
  const big = await rawRequest(srv.port, 'POST', '/v1/completions', 'x'.repeat(1100000), { 'content-type': 'application/json' });
  assert.equal(big.status, 413);
  // A tool call's arguments nested past the limit stay a string for the chat template (they are not parsed).
  const deepArgs = await client.chat.completions.create({ max_tokens: 1, messages: [
    { role: 'user', content: 'x' },
    { role: 'assistant', content: null, tool_calls: [{ id: 'call_1', type: 'function',
      function: { name: 'f', arguments: `${'{"a":'.repeat(300)}1${'}'.repeat(300)}` } }] },
    { role: 'tool', tool_call_id: 'call_1', content: 'ok' }] });
  assert.equal(deepArgs.choices.length, 1);
  assert.equal((await fetch(`${srv.base}/health`)).status, 200, 'still healthy after bad input');
});

test('bad input does not harm a request in flight', async () => {
  const ids = [9707, 11, 1879, 0, 42];
  const solo = await greedyGenerate(srv.base, ids, 32);
  const inflight = greedyGenerate(srv.base, ids, 32);
  for (let i = 0; i < 20; ++i) {
    await rawRequest(srv.port, 'POST', '/v1/chat/completions', '{"messages": [', { 'content-type': 'application/json' });
    await rawRequest(srv.port, 'POST', '/generate', JSON.stringify({ input_ids: [1e9] }), { 'content-type': 'application/json' });
  }
  const r = await inflight;
  assert.equal(r.status, 200);
  assert.deepEqual(r.json.output_ids, solo.json.output_ids);
});

test('tokenize and detokenize round trip; chat messages tokenize', async () => {
  const t = await postJson(srv.base, '/tokenize', { prompt: 'Hello world! 123' });
  assert.equal(t.status, 200);
  assert.equal(t.json.count, t.json.tokens.length);
  const d = await postJson(srv.base, '/detokenize', { tokens: t.json.tokens });
  assert.equal(d.json.prompt, 'Hello world! 123');
  const m = await postJson(srv.base, '/tokenize', { messages: [{ role: 'user', content: 'Hi' }], add_generation_prompt: true });
  const text = (await postJson(srv.base, '/detokenize', { tokens: m.json.tokens })).json.prompt;
  assert.equal(text, '<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n');
  // OpenAI's 'developer' role is the system prompt for a template that does not name it (Qwen3's would drop it).
  const dev = await postJson(srv.base, '/tokenize', { messages: [{ role: 'developer', content: 'Be brief.' },
    { role: 'user', content: 'Hi' }] });
  const sys = await postJson(srv.base, '/tokenize', { messages: [{ role: 'system', content: 'Be brief.' },
    { role: 'user', content: 'Hi' }] });
  assert.equal(dev.status, 200);
  assert.deepEqual(dev.json.tokens, sys.json.tokens);
  const devText = (await postJson(srv.base, '/detokenize', { tokens: dev.json.tokens })).json.prompt;
  assert.ok(devText.startsWith('<|im_start|>system\nBe brief.<|im_end|>'), devText);
});

test('native /generate with logprobs; streaming events', async () => {
  const r = await postJson(srv.base, '/generate', { text: 'Hello', sampling_params: { max_new_tokens: 4, temperature: 0 },
    return_logprob: true, top_logprobs_num: 2 });
  assert.equal(r.status, 200);
  assert.equal(r.json.output_ids.length, 4);
  assert.equal(r.json.meta_info.output_token_logprobs.length, 4);
  assert.equal(r.json.meta_info.output_top_logprobs[0].length, 2);
  assert.equal(r.json.meta_info.finish_reason.type, 'length');
  const s = await fetch(`${srv.base}/generate`, { method: 'POST', body: JSON.stringify({ text: 'Hello',
    sampling_params: { max_new_tokens: 4, temperature: 0 }, stream: true }) });
  const body = await s.text();
  const events = body.split('\n\n').filter((e) => e.startsWith('data: ')).map((e) => e.slice(6));
  assert.equal(events.at(-1), '[DONE]');
  const last = JSON.parse(events.at(-2));
  assert.deepEqual(last.output_ids, r.json.output_ids);
  assert.equal(last.text, r.json.text);
});

test('native /generate batches: lists of texts or token-id lists give a list of results, streamed with index', async () => {
  const N = 4;
  const idsBatch = [[9707, 11, 1879], [785, 6722, 315, 9625, 374], [151643, 40]];
  const solo = [];
  for (const ids of idsBatch) solo.push((await greedyGenerate(srv.base, ids, N)).json);
  const batch = await greedyGenerate(srv.base, idsBatch, N);
  assert.equal(batch.status, 200, batch.text);
  assert.ok(Array.isArray(batch.json) && batch.json.length === idsBatch.length, batch.text);
  for (const [i, r] of batch.json.entries()) {
    assert.equal(r.meta_info.prompt_tokens, idsBatch[i].length, `prompt ${i}`);
    await assertSameGreedy(srv.base, idsBatch[i], N, r, solo[i].output_ids, `batch item ${i}`);
  }
  // A batch of one is still a list (SGLang's shape follows the request's).
  const one = await greedyGenerate(srv.base, [idsBatch[0]], N);
  assert.ok(Array.isArray(one.json) && one.json.length === 1, one.text);
  // Texts: each item's text and prompt as its own request's.
  const texts = ['Hello', 'The capital of France is'];
  const tb = await postJson(srv.base, '/generate', { text: texts, sampling_params: { max_new_tokens: N, temperature: 0 } });
  assert.equal(tb.status, 200, tb.text);
  for (const [i, t] of texts.entries()) {
    const alone = await postJson(srv.base, '/generate', { text: t, sampling_params: { max_new_tokens: N, temperature: 0 } });
    assert.equal(tb.json[i].meta_info.prompt_tokens, alone.json.meta_info.prompt_tokens, `text ${i}`);
  }
  // Streamed: every event names its prompt by index; each index's last event holds that prompt's whole output.
  const s = await fetch(`${srv.base}/generate`, { method: 'POST', body: JSON.stringify({ input_ids: idsBatch,
    sampling_params: { max_new_tokens: N, temperature: 0, ignore_eos: true }, stream: true }) });
  const events = (await s.text()).split('\n\n').filter((e) => e.startsWith('data: ')).map((e) => e.slice(6));
  assert.equal(events.at(-1), '[DONE]');
  const last = new Map();
  for (const e of events.slice(0, -1).map((x) => JSON.parse(x))) {
    assert.ok(Number.isInteger(e.index) && e.index >= 0 && e.index < idsBatch.length, JSON.stringify(e));
    last.set(e.index, e);
  }
  assert.equal(last.size, idsBatch.length);
  for (const [i, e] of last) {
    assert.equal(e.output_ids.length, N);
    assert.equal(e.meta_info.finish_reason.type, 'length', `stream item ${i}`);
  }
  // What a batch cannot be: a 400 naming the field.
  for (const [body, param] of [
    [{ input_ids: [[1, 2], []] }, 'input_ids'],
    [{ input_ids: [[1, 2], 3] }, 'input_ids'],
    [{ text: [] }, 'text'],
    [{ text: ['a', 5] }, 'text'],
    [{ text: new Array(257).fill('a') }, 'text'],
    [{ input_ids: new Array(257).fill([1]) }, 'input_ids'],
    [{ text: ['a', 'b'], sampling_params: [{ max_new_tokens: 1 }, { max_new_tokens: 2 }] }, 'sampling_params'],
  ]) {
    const r = await postJson(srv.base, '/generate', body);
    assert.equal(r.status, 400, `${JSON.stringify(body)}: ${r.text}`);
    assert.equal(r.json.error.param, param, r.text);
  }
});

// The requests of the serving benchmarks operators run against every server (SGLang's bench_serving with its
// sglang, sglang-oai and sglang-oai-chat backends; vLLM's `vllm bench serve` with openai and openai-chat), with
// the fields they send (nulls and extensions included) and what their stream parsers need to count tokens:
// /generate events whose text grows and whose meta_info.completion_tokens counts, [DONE] last; OpenAI chunks that
// all carry choices[0] unless usage was asked for, and then one usage chunk with empty choices; and
// /get_server_info's internal_states[0], which bench_serving reads after a run against an "sglang" server.
function sseData(body) {
  return body.split('\n\n').map((e) => e.trim()).filter((e) => e.startsWith('data: ')).map((e) => e.slice(6));
}

async function postStream(pathName, payload) {
  const r = await fetch(`${srv.base}${pathName}`, { method: 'POST', headers: { 'content-type': 'application/json' },
    body: JSON.stringify(payload) });
  assert.equal(r.status, 200, `${pathName}: ${r.status}`);
  const events = sseData(await r.text());
  assert.equal(events.at(-1), '[DONE]', `${pathName}: the stream ends with [DONE]`);
  return events.slice(0, -1).map((e) => JSON.parse(e));
}

test('benchmark clients: SGLang bench_serving and vLLM bench serve requests parse as they expect', async () => {
  const N = 6;
  const prompt = 'The quick brown fox jumps over the lazy dog.';
  const promptTokens = (await postJson(srv.base, '/tokenize', { prompt })).json.count;
  // bench_serving --backend sglang: text, or input_ids with --tokenize-prompt.
  for (const input of [{ text: prompt }, { input_ids: [9707, 11, 1879, 0, 576, 3974] }]) {
    const events = await postStream('/generate', { ...input,
      sampling_params: { temperature: 0.0, max_new_tokens: N, ignore_eos: true },
      stream: true, lora_path: null, return_logprob: false, logprob_start_len: -1 });
    let text = '';
    let count = 0;
    for (const e of events) {
      assert.ok(e.text.startsWith(text), 'each event carries the whole text so far');
      assert.ok(e.meta_info.completion_tokens >= count, 'completion_tokens never goes back');
      text = e.text;
      count = e.meta_info.completion_tokens;
    }
    assert.equal(count, N, JSON.stringify(events.at(-1).meta_info));
    assert.equal(events.at(-1).output_ids.length, N);
  }
  const info = await (await fetch(`${srv.base}/get_server_info`)).json();
  assert.ok(Array.isArray(info.internal_states) && info.internal_states.length >= 1, JSON.stringify(info));
  const state = info.internal_states[0];
  assert.equal(state.avg_spec_accept_length, undefined, 'no speculative decoding: no accept length');
  assert.ok(state.last_gen_throughput > 0, JSON.stringify(state));
  assert.ok(state.kv_cache_total_tokens > 0 && state.generated_tokens >= 2 * N, JSON.stringify(state));

  // bench_serving --backend sglang-oai: every chunk's choices[0].text is read (no usage chunk without asking).
  const oai = await postStream('/v1/completions', { model: MODEL, prompt, temperature: 0.0, best_of: 1,
    max_tokens: N, stream: true, ignore_eos: true });
  assert.ok(oai.length >= 1 && oai.every((c) => c.choices.length === 1 && typeof c.choices[0].text === 'string'));
  assert.equal(oai.at(-1).choices[0].finish_reason, 'length');
  // bench_serving --backend sglang-oai-chat: choices[0].delta in every chunk.
  const chat = await postStream('/v1/chat/completions', { model: MODEL, messages: [{ role: 'user', content: prompt }],
    temperature: 0.0, max_tokens: N, stream: true, ignore_eos: true });
  assert.ok(chat.every((c) => c.choices.length === 1 && typeof c.choices[0].delta === 'object'));
  assert.equal(chat.at(-1).choices[0].finish_reason, 'length');

  // vllm bench serve (openai): chunks with choices count tokens; one chunk with empty choices carries the usage.
  const vllm = await postStream('/v1/completions', { model: MODEL, prompt, repetition_penalty: 1.0, max_tokens: N,
    logprobs: null, stream: true, stream_options: { include_usage: true }, ignore_eos: true });
  const usage = vllm.filter((c) => !(c.choices && c.choices.length));
  assert.equal(usage.length, 1, 'one usage chunk');
  assert.equal(usage[0].usage.completion_tokens, N);
  assert.equal(usage[0].usage.prompt_tokens, promptTokens);
  assert.ok(vllm.some((c) => c.choices && c.choices.length), 'token chunks before the usage chunk');
  // vllm bench serve (openai-chat): text parts, max_completion_tokens.
  const vchat = await postStream('/v1/chat/completions', { model: MODEL,
    messages: [{ role: 'user', content: [{ type: 'text', text: prompt }] }], max_completion_tokens: N, stream: true,
    stream_options: { include_usage: true }, ignore_eos: true });
  const vusage = vchat.filter((c) => !(c.choices && c.choices.length));
  assert.equal(vusage.length, 1);
  assert.equal(vusage[0].usage.completion_tokens, N);
  assert.ok(vchat.slice(0, -1).every((c) => typeof c.choices[0].delta === 'object'));
});

test('max_tokens 0: the prompt only, no token (it still fills the prefix cache)', async () => {
  const ids = Array.from({ length: 40 }, (_, i) => (i * 53 + 11) % 5000);
  const g = await greedyGenerate(srv.base, ids, 0);
  assert.equal(g.status, 200, g.text);
  assert.deepEqual(g.json.output_ids, []);
  assert.equal(g.json.meta_info.completion_tokens, 0);
  assert.equal(g.json.meta_info.finish_reason.type, 'length');
  const again = await greedyGenerate(srv.base, ids, 1);
  assert.ok(again.json.meta_info.cached_tokens >= 32, JSON.stringify(again.json.meta_info));
  const c = await client.completions.create({ model: MODEL, prompt: 'Hello there', max_tokens: 0, echo: true });
  assert.equal(c.choices[0].text, 'Hello there');
  assert.equal(c.usage.completion_tokens, 0);
  const s = await fetch(`${srv.base}/generate`, { method: 'POST', body: JSON.stringify({ input_ids: ids,
    sampling_params: { max_new_tokens: 0 }, stream: true }) });
  const events = (await s.text()).split('\n\n').filter((e) => e.startsWith('data: ')).map((e) => e.slice(6));
  assert.equal(events.at(-1), '[DONE]');
  assert.deepEqual(JSON.parse(events.at(-2)).output_ids, []);
});

// Prompt logprobs: OpenAI's echo with logprobs (lm-eval's loglikelihood requests: max_tokens 0, logprobs 1) and SGLang's
// input_token_logprobs from logprob_start_len. A prompt's last token scored there has the logprob the same token got as
// the greedy output of the prompt before it (and is that position's top token); both APIs give the same numbers;
// streamed, the echoed prompt and its logprobs lead the first chunk.
test('prompt logprobs: echo with logprobs and input_token_logprobs', async () => {
  const tol = (await onGpu(srv.base)) ? 0.4 : 1e-3;  // (the GPU: other kernels at other token counts, BF16)
  const x = [9707, 11, 1879, 374, 264, 1273];
  const a = await greedyGenerate(srv.base, x, 1, { top_logprobs_num: 3 });
  assert.equal(a.status, 200, a.text);
  const [[lastLp, t]] = a.json.meta_info.output_token_logprobs;
  const ids = [...x, t];
  const e = await client.completions.create({ model: MODEL, prompt: ids, max_tokens: 0, echo: true, logprobs: 1,
    temperature: 0 });
  const lp = e.choices[0].logprobs;
  assert.equal(e.usage.completion_tokens, 0);
  assert.equal(lp.tokens.length, ids.length);
  assert.equal(lp.tokens.join(''), e.choices[0].text);
  assert.equal(lp.token_logprobs[0], null);
  assert.equal(lp.top_logprobs[0], null);
  for (let i = 1; i < ids.length; ++i) {
    assert.ok(lp.token_logprobs[i] <= 0 && Number.isFinite(lp.token_logprobs[i]), JSON.stringify(lp));
    assert.equal(Object.keys(lp.top_logprobs[i]).length, 1);
    assert.ok(Math.max(...Object.values(lp.top_logprobs[i])) >= lp.token_logprobs[i] - 1e-6);
    assert.ok(lp.text_offset[i] >= lp.text_offset[i - 1]);
  }
  assert.ok(Math.abs(lp.token_logprobs.at(-1) - lastLp) < tol, `${lp.token_logprobs.at(-1)} vs ${lastLp}`);
  // lm-eval's is_greedy: the continuation's token is its position's top token.
  assert.ok(Math.abs(Math.max(...Object.values(lp.top_logprobs.at(-1))) - lp.token_logprobs.at(-1)) < tol);

  const g = await postJson(srv.base, '/generate', { input_ids: ids, return_logprob: true, logprob_start_len: 2,
    top_logprobs_num: 2, return_text_in_logprobs: true, sampling_params: { max_new_tokens: 2, temperature: 0 } });
  assert.equal(g.status, 200, g.text);
  const m = g.json.meta_info;
  assert.equal(m.input_token_logprobs.length, ids.length - 2);
  assert.equal(m.input_top_logprobs.length, ids.length - 2);
  m.input_token_logprobs.forEach(([l, id, text], k) => {
    assert.equal(id, ids[k + 2]);
    assert.equal(typeof text, 'string');
    assert.ok(Math.abs(l - lp.token_logprobs[k + 2]) < tol, `${l} vs ${lp.token_logprobs[k + 2]}`);
    assert.equal(m.input_top_logprobs[k].length, 2);
  });
  assert.equal(m.output_token_logprobs.length, 2);
  const g0 = await postJson(srv.base, '/generate', { input_ids: ids, return_logprob: true, logprob_start_len: 0,
    sampling_params: { max_new_tokens: 0 } });
  assert.equal(g0.json.meta_info.input_token_logprobs.length, ids.length);
  assert.equal(g0.json.meta_info.input_token_logprobs[0][0], null);
  assert.equal(g0.json.meta_info.input_token_logprobs[0][1], ids[0]);

  // Streamed: the prompt and its logprobs first, then each token's; with max_tokens 0, in the last chunk.
  for (const maxTokens of [3, 0]) {
    const s = await client.completions.create({ model: MODEL, prompt: ids, max_tokens: maxTokens, echo: true,
      logprobs: 1, temperature: 0, stream: true });
    let text = '';
    const all = [];
    for await (const ch of s) {
      const c = ch.choices[0];
      text += c.text;
      if (c.logprobs) all.push(...c.logprobs.token_logprobs);
    }
    assert.equal(all.length, ids.length + maxTokens, JSON.stringify(all));
    assert.equal(all[0], null);
    assert.ok(Math.abs(all[ids.length - 1] - lp.token_logprobs.at(-1)) < tol);
    assert.ok(text.startsWith(e.choices[0].text), text);
  }
});

test("prompt logprobs: vLLM's prompt_logprobs with ranks, completions and chat", async () => {
  const tol = (await onGpu(srv.base)) ? 0.4 : 1e-3;
  const ids = [9707, 11, 1879, 374, 264, 1273, 13];
  // The reference: echo + logprobs 3 on the same prompt (token logprobs and each position's top 3).
  const e = await client.completions.create({ model: MODEL, prompt: ids, max_tokens: 0, echo: true, logprobs: 3,
    temperature: 0 });
  const ref = e.choices[0].logprobs;
  const check = (pl, n) => {
    assert.equal(pl.length, ids.length, JSON.stringify(pl));
    assert.equal(pl[0], null);
    for (let i = 1; i < ids.length; ++i) {
      const own = pl[i][String(ids[i])];
      assert.ok(own, `position ${i}: no entry for the prompt token ${ids[i]}: ${JSON.stringify(pl[i])}`);
      assert.ok(Math.abs(own.logprob - ref.token_logprobs[i]) < tol, `${own.logprob} vs ${ref.token_logprobs[i]}`);
      assert.equal(typeof own.decoded_token, 'string');
      assert.ok(Number.isInteger(own.rank) && own.rank >= 1, JSON.stringify(own));
      const entries = Object.entries(pl[i]);
      assert.ok(entries.length === n || entries.length === n + 1, JSON.stringify(pl[i]));
      const tops = entries.filter(([id, v]) => id !== String(ids[i]) || v.rank <= n).sort((a, b) => a[1].rank - b[1].rank);
      // The top n have ranks 1 .. n in logprob order; the prompt token's rank counts the tokens above it.
      tops.slice(0, n).forEach(([, v], k) => assert.equal(v.rank, k + 1, JSON.stringify(pl[i])));
      for (let k = 1; k < n; ++k) assert.ok(tops[k - 1][1].logprob >= tops[k][1].logprob - 1e-6, JSON.stringify(pl[i]));
      const above = entries.filter(([id, v]) => id !== String(ids[i]) && v.logprob > own.logprob + 1e-6).length;
      if (own.rank > n) assert.ok(above === n && own.logprob <= tops[n - 1][1].logprob + 1e-6, JSON.stringify(pl[i]));
      else assert.equal(own.rank, above + 1, JSON.stringify(pl[i]));
      // echo's top list: the same tokens (its keys are token texts)
      assert.ok(Math.abs(tops[0][1].logprob - Math.max(...Object.values(ref.top_logprobs[i]))) < tol);
    }
  };
  const c = await postJson(srv.base, '/v1/completions', { model: MODEL, prompt: ids, max_tokens: 2, temperature: 0,
    prompt_logprobs: 2 });
  assert.equal(c.status, 200, c.text);
  check(c.json.choices[0].prompt_logprobs, 2);
  assert.equal(c.json.choices[0].logprobs, null);  // the output's logprobs were not asked
  // Both forms at once, each with its own n.
  const both = await postJson(srv.base, '/v1/completions', { model: MODEL, prompt: ids, max_tokens: 0, temperature: 0,
    echo: true, logprobs: 1, prompt_logprobs: 3 });
  assert.equal(both.status, 200, both.text);
  check(both.json.choices[0].prompt_logprobs, 3);
  assert.equal(Object.keys(both.json.choices[0].logprobs.top_logprobs[1]).length, 1);
  // Streamed: in the choice's first chunk (with max_tokens 0: its only one).
  for (const maxTokens of [2, 0]) {
    const s = await client.completions.create({ model: MODEL, prompt: ids, max_tokens: maxTokens, temperature: 0,
      stream: true, prompt_logprobs: 2 });
    const got = [];
    for await (const ch of s) if (ch.choices[0]?.prompt_logprobs) got.push(ch.choices[0].prompt_logprobs);
    assert.equal(got.length, 1, `max_tokens ${maxTokens}`);
    check(got[0], 2);
  }
  // Chat: beside the choices, over the templated prompt.
  const chat = await postJson(srv.base, '/v1/chat/completions', { model: MODEL, max_tokens: 1, temperature: 0,
    messages: [{ role: 'user', content: 'Hello there' }], prompt_logprobs: 1 });
  assert.equal(chat.status, 200, chat.text);
  const pl = chat.json.prompt_logprobs;
  assert.equal(pl.length, chat.json.usage.prompt_tokens);
  assert.equal(pl[0], null);
  assert.ok(pl.slice(1).every((m) => m && Object.values(m).some((v) => v.rank === 1)), JSON.stringify(pl));
  // Bad values are 400s naming the field.
  for (const bad of [-1, 21, 'two']) {
    const r = await postJson(srv.base, '/v1/completions', { model: MODEL, prompt: ids, max_tokens: 1, prompt_logprobs: bad });
    assert.equal(r.status, 400, r.text);
    assert.equal(r.json.error.param, 'prompt_logprobs', r.text);
  }
});

test('prefix cache: a repeated prompt reports cached tokens; flush_cache empties it', async () => {
  const ids = Array.from({ length: 70 }, (_, i) => (i * 37) % 5000);
  await greedyGenerate(srv.base, ids, 2);
  const again = await greedyGenerate(srv.base, ids, 2);
  assert.ok(again.json.meta_info.cached_tokens >= 64, JSON.stringify(again.json.meta_info));
  assert.equal((await fetch(`${srv.base}/flush_cache`, { method: 'POST' })).status, 200);
  const m = await metrics(srv.base);
  assert.ok(m.values.moeserve_prefix_cache_hit_rate > 0);
  assert.equal(m.values.moeserve_kv_cache_used_tokens, 0);
});

test('n choices of one prompt compute the prompt once: the others take it from the prefix cache', async () => {
  const ids = Array.from({ length: 100 }, (_, i) => (i * 53 + 11) % 7000);
  const before = (await metrics(srv.base)).values.moeserve_cached_prompt_tokens_total;
  const r = await postJson(srv.base, '/v1/completions', { model: MODEL, prompt: ids, max_tokens: 4, n: 4, temperature: 1.0 });
  assert.equal(r.status, 200, r.text);
  assert.equal(r.json.choices.length, 4);
  const cached = (await metrics(srv.base)).values.moeserve_cached_prompt_tokens_total - before;
  assert.ok(cached >= 3 * 64, `${cached} prompt tokens from the cache for 3 more choices of a 100-token prompt`);
  // usage counts the prompt once, and its cached tokens once: a part of prompt_tokens, as OpenAI reports them.
  const u = r.json.usage;
  assert.equal(u.prompt_tokens, 100);
  assert.ok(u.prompt_tokens_details.cached_tokens >= 64 && u.prompt_tokens_details.cached_tokens <= u.prompt_tokens,
    `cached_tokens ${u.prompt_tokens_details.cached_tokens} of ${u.prompt_tokens} prompt tokens`);
});

test('64 simultaneous greedy requests equal their solo results', async () => {
  const prompts = Array.from({ length: 64 }, (_, i) => Array.from({ length: 3 + (i % 7) }, (_, k) => (i * 131 + k * 17) % 150000));
  const solo = [];
  for (const p of prompts) solo.push((await greedyGenerate(srv.base, p, 4)).json.output_ids);
  const together = await Promise.all(prompts.map((p) => greedyGenerate(srv.base, p, 4)));
  for (const [i, r] of together.entries()) await assertSameGreedy(srv.base, prompts[i], 4, r.json, solo[i], `request ${i}`);
});

test('a client that disconnects mid-stream frees its KV at once', async () => {
  const ctrl = new AbortController();
  const r = await fetch(`${srv.base}/v1/completions`, { method: 'POST', signal: ctrl.signal,
    headers: { 'content-type': 'application/json' },
    body: JSON.stringify({ prompt: 'Once upon a time', max_tokens: 5000, ignore_eos: true, stream: true }) });
  const reader = r.body.getReader();
  for (let i = 0; i < 3; ++i) await reader.read();
  let m = await metrics(srv.base);
  assert.ok(m.values.moeserve_kv_cache_request_tokens > 0, 'the request holds KV while streaming');
  ctrl.abort();
  // The KV figures come from the engine's snapshot after the step that freed it; the aborted count from the
  // request's sink, which the delivery thread runs after that step: poll until both show the abort.
  const deadline = Date.now() + 10000;
  for (;;) {
    m = await metrics(srv.base);
    if (m.values.moeserve_kv_cache_request_tokens === 0 && m.values.moeserve_num_running_requests === 0 &&
        m.values.moeserve_requests_aborted_total >= 1) break;
    assert.ok(Date.now() < deadline, `KV not freed or the abort not counted: ${m.text}`);
    await new Promise((res) => setTimeout(res, 50));
  }
});

test('metrics are Prometheus text', async () => {
  const m = await metrics(srv.base);
  for (const name of ['moeserve_num_running_requests', 'moeserve_num_queued_requests', 'moeserve_prompt_tokens_total',
    'moeserve_generation_tokens_total', 'moeserve_kv_cache_usage_ratio', 'moeserve_prefix_cache_hit_rate']) {
    assert.ok(name in m.values, `${name} missing`);
  }
  assert.match(m.text, /moeserve_time_to_first_token_seconds_bucket\{le="\+Inf"\} \d+/);
  assert.match(m.text, /moeserve_e2e_request_latency_seconds_count \d+/);
  // A constrained request counts, with a mask a generated token (the end's included) and the time they took.
  const before = (await metrics(srv.base)).values;
  const r = await postJson(srv.base, '/generate', { text: 'x', sampling_params: { max_new_tokens: 8, temperature: 0,
    regex: '[ab]{3}' } });
  assert.equal(r.status, 200, r.text);
  const after = (await metrics(srv.base)).values;
  assert.equal(after.moeserve_constrained_requests_total - before.moeserve_constrained_requests_total, 1);
  const masks = after.moeserve_grammar_masks_total - before.moeserve_grammar_masks_total;
  assert.ok(masks >= r.json.meta_info.completion_tokens, `${masks} masks for ${r.json.meta_info.completion_tokens} tokens`);
  assert.ok(after.moeserve_grammar_mask_seconds_total > before.moeserve_grammar_mask_seconds_total);
});
