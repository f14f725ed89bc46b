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
