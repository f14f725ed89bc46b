// Servers started with limits: a tiny KV cache (queueing and preemption must not change results) and an API key.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import OpenAI from 'openai';
import { startServer, greedyGenerate, metrics, assertSameGreedy } from './helpers.mjs';

test('KV exhaustion: a tiny cache queues and preempts, results stay exact', async () => {
  const srv = await startServer(['--max-total-tokens', '96', '--page-size', '4', '--max-running-requests', '8',
    '--chunked-prefill-size', '32']);
  try {
    const prompts = Array.from({ length: 12 }, (_, i) => Array.from({ length: 24 }, (_, k) => (i * 977 + k * 31) % 150000));
    const solo = [];
    for (const p of prompts) solo.push((await greedyGenerate(srv.base, p, 20)).json.output_ids);
    const together = await Promise.all(prompts.map((p) => greedyGenerate(srv.base, p, 20)));
    for (const [i, r] of together.entries()) {
      assert.equal(r.status, 200, r.text);
      await assertSameGreedy(srv.base, prompts[i], 20, r.json, solo[i], `request ${i}`);
    }
    // /metrics reads a snapshot taken after each engine step: wait for the step that finished the last request.
    let m = await metrics(srv.base);
    for (let i = 0; i < 100 && m.values.moeserve_kv_cache_request_tokens !== 0; ++i) {
      await new Promise((res) => setTimeout(res, 20));
      m = await metrics(srv.base);
    }
    assert.ok(m.values.moeserve_preemptions_total > 0, 'the tiny cache should have forced preemption');
    assert.equal(m.values.moeserve_kv_cache_request_tokens, 0);
    // A prompt that can never fit is refused, not queued forever.
    const tooBig = await greedyGenerate(srv.base, new Array(200).fill(7), 1);
    assert.equal(tooBig.status, 400);
  } finally {
    assert.equal((await srv.stop()).code, 0);
  }
});

test('--api-key: 401 without it, 200 with it; /health stays open', async () => {
  const srv = await startServer(['--api-key', 'sekret']);
  try {
    assert.equal((await fetch(`${srv.base}/v1/models`)).status, 401);
    const bad = new OpenAI({ baseURL: `${srv.base}/v1`, apiKey: 'wrong', maxRetries: 0 });
    await assert.rejects(bad.models.list(), (e) => e.status === 401);
    const good = new OpenAI({ baseURL: `${srv.base}/v1`, apiKey: 'sekret', maxRetries: 0 });
    assert.equal((await good.models.list()).data.length, 1);
    assert.equal((await fetch(`${srv.base}/health`)).status, 200);
  } finally {
    assert.equal((await srv.stop()).code, 0);
  }
});

// Requests with random fields changed to random values (a fixed seed: the same 480 requests every run), 8 at a time,
// beside a valid greedy request that must still equal its solo result: only 200 / 400 / 404 answers (never a 5xx or a
// hang), every 4xx in the OpenAI error shape, every streamed 200 with its end, /health 200 throughout.
test('random field mutations: clear errors only, no crash, no hang, no other request harmed', async () => {
  const srv = await startServer(['--reasoning-parser', 'qwen3', '--tool-call-parser', 'qwen3_coder']);
  try {
    let seed = 20261207;
    const rnd = () => { seed = (seed * 1103515245 + 12345) % 2147483648; return seed / 2147483648; };
    const pick = (a) => a[Math.floor(rnd() * a.length)];
    const values = [null, true, false, 0, -1, 1, 2.5, -1e308, 1e308, 4294967297, '', 'x', '\u0000', '\ud800',
      'é'.repeat(50), [], [1], [[1, 2]], [[]], {}, { a: 1 }, [null], ['x', 1], { type: 'text' }, { type: 'json_object' },
      { type: 'function', function: { name: 'f' } }, '0', 'NaN', [-5], [151936], [1e9], 'x'.repeat(5000),
      JSON.parse('['.repeat(40) + '1' + ']'.repeat(40)), { role: 'user' }, { role: 'user', content: [] },
      { role: 'tool', content: 'x' }, { role: 'assistant', tool_calls: [{ function: { name: 'f', arguments: '{' } }] }];
    const bases = [
      ['/v1/chat/completions', () => ({ model: 'moeserve-demo', messages: [{ role: 'user', content: 'hi' }], max_tokens: 3 })],
      ['/v1/completions', () => ({ model: 'moeserve-demo', prompt: 'hello', max_tokens: 3 })],
      ['/generate', () => ({ text: 'hello', sampling_params: { max_new_tokens: 3 } })],
      ['/generate', () => ({ input_ids: [1, 2, 3], sampling_params: { max_new_tokens: 3 } })],
      ['/tokenize', () => ({ prompt: 'hello' })],
      ['/detokenize', () => ({ tokens: [1, 2, 3] })],
    ];
    const fields = ['model', 'messages', 'prompt', 'max_tokens', 'max_completion_tokens', 'temperature', 'top_p', 'top_k',
      'n', 'stream', 'stream_options', 'logprobs', 'top_logprobs', 'stop', 'stop_token_ids', 'seed', 'logit_bias', 'echo',
      'tools', 'tool_choice', 'chat_template_kwargs', 'prompt_logprobs', 'min_tokens', 'ignore_eos', 'presence_penalty',
      'frequency_penalty', 'repetition_penalty', 'min_p', 'text', 'input_ids', 'sampling_params', 'return_logprob',
      'logprob_start_len', 'top_logprobs_num', 'separate_reasoning', 'skip_special_tokens', 'response_format', 'tokens',
      'add_generation_prompt', 'include_stop_str_in_output', 'best_of', 'suffix'];
    const spFields = ['max_new_tokens', 'temperature', 'stop', 'n', 'min_new_tokens', 'top_k', 'logit_bias', 'regex'];
    const clamp = (o, k, hi) => { if (o && typeof o[k] === 'number' && o[k] > hi) o[k] = hi; };
    const mutate = (b) => {
      const k = rnd() < 0.2 ? Object.keys(b)[0] : pick(fields);
      const r = rnd();
      if (r < 0.1) delete b[k];
      else if (k === 'messages' && r < 0.5) b.messages = [pick([{ role: 'user', content: pick(values) }, pick(values)])];
      else if (k === 'sampling_params' && r < 0.6) b.sampling_params = { ...(b.sampling_params || {}), [pick(spFields)]: pick(values) };
      else b[k] = pick(values);
      // Keep each generation short (the CPU demo model): the mutations are about parsing, not length.
      clamp(b, 'max_tokens', 8); clamp(b, 'max_completion_tokens', 8); clamp(b, 'n', 4); clamp(b, 'prompt_logprobs', 2);
      clamp(b.sampling_params, 'max_new_tokens', 8); clamp(b.sampling_params, 'n', 4);
    };
    const control = Array.from({ length: 16 }, (_, k) => (k * 7919) % 150000);
    const solo = (await greedyGenerate(srv.base, control, 24)).json.output_ids;
    const problems = [];
    const statuses = {};
    const one = async () => {
      const [path, make] = pick(bases);
      const b = make();
      if (rnd() < 0.3 && !path.includes('tokenize')) b.stream = true;
      for (let j = 1 + Math.floor(rnd() * 3); j > 0; --j) mutate(b);
      const raw = rnd() < 0.05 ? JSON.stringify(b).slice(0, Math.floor(rnd() * 40)) : JSON.stringify(b);
      const res = await fetch(srv.base + path, { method: 'POST', headers: { 'content-type': 'application/json' },
        body: raw, signal: AbortSignal.timeout(60000) });
      const text = await res.text();
      statuses[res.status] = (statuses[res.status] || 0) + 1;
      const streamed = (res.headers.get('content-type') || '').includes('text/event-stream');
      const what = `${path} ${raw.slice(0, 300)} -> ${res.status} ${text.slice(0, 200)}`;
      if (![200, 400, 404].includes(res.status)) problems.push(what);
      else if (res.status !== 200 && !JSON.parse(text).error?.message) problems.push(`no error message: ${what}`);
      else if (streamed && !text.trimEnd().endsWith('data: [DONE]')) problems.push(`stream without its end: ${what}`);
    };
    for (let i = 0; i < 60; ++i) {
      const harmed = i % 10 === 0 ? greedyGenerate(srv.base, control, 24) : null;
      await Promise.all(Array.from({ length: 8 }, one));
      if (harmed) await assertSameGreedy(srv.base, control, 24, (await harmed).json, solo, `control request ${i}`);
      assert.equal((await fetch(`${srv.base}/health`)).status, 200, `after batch ${i}`);
    }
    assert.deepEqual(problems, []);
    assert.ok(statuses[200] > 50 && statuses[400] > 50, JSON.stringify(statuses));  // both kinds were really exercised
  } finally {
    assert.equal((await srv.stop()).code, 0);
  }
});
