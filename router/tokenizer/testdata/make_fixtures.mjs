// Regenerates the tokenizer.json fixtures in this folder and expected.json,
// the ids and text the reference implementation produces for them.
//
//   mkdir -p /tmp/tokref && cd /tmp/tokref && npm init -y &&
//     npm install --ignore-scripts @huggingface/tokenizers@0.2.0
//   node router/tokenizer/testdata/make_fixtures.mjs   # from the repo root
//
// TOKREF overrides /tmp/tokref. The reference is Hugging Face's own JS port
// of `tokenizers`; it needs no network once installed.
//
// Fixtures:
//   byte_level/      a byte-level BPE trained here on the corpus below
//                    (Llama-3 layout: Split regex + ByteLevel, ignore_merges,
//                    merges as pairs, BOS template, special/non-special added
//                    tokens with lstrip/rstrip)
//   gpt2/            the same vocabulary behind GPT-2's layout (ByteLevel
//                    pre-tokenizer with its built-in regex, add_prefix_space,
//                    merges as "a b" strings)
//   qwen2/           the same vocabulary behind Qwen2's layout (NFC, its regex)
//   sp_bpe/          deploy/models/stories260K/tok512.model converted the way
//                    transformers' Llama converter does (Prepend/Replace
//                    normalizer, byte fallback, Strip decoder) + config json
//   metaspace/       the same model behind Mistral v0.3's layout (Metaspace
//                    pre-tokenizer, prepend_scheme "first"; ByteFallback
//                    then Metaspace decoder)
import fs from 'node:fs';
import path from 'node:path';
import { fileURLToPath, pathToFileURL } from 'node:url';

const here = path.dirname(fileURLToPath(import.meta.url));
const repo = path.resolve(here, '../../..');
const tokref = process.env.TOKREF ?? '/tmp/tokref';
const { Tokenizer } = await import(
  pathToFileURL(path.join(tokref, 'node_modules/@huggingface/tokenizers/dist/tokenizers.mjs')).href);
const refVersion = JSON.parse(fs.readFileSync(
  path.join(tokref, 'node_modules/@huggingface/tokenizers/package.json'), 'utf8')).version;

// ---------------------------------------------------------------- byte level

// GPT-2's byte <-> printable character table.
const byteToChar = (() => {
  const printable = [];
  for (let b = 0x21; b <= 0x7e; ++b) printable.push(b);
  for (let b = 0xa1; b <= 0xac; ++b) printable.push(b);
  for (let b = 0xae; b <= 0xff; ++b) printable.push(b);
  const table = new Array(256);
  let extra = 0;
  for (let b = 0; b < 256; ++b) {
    table[b] = String.fromCodePoint(printable.includes(b) ? b : 256 + extra++);
  }
  return table;
})();
const toByteLevel = (s) => Array.from(new TextEncoder().encode(s), (b) => byteToChar[b]).join('');

const LLAMA3_PATTERN =
  "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";
const QWEN2_PATTERN =
  "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";
// LLAMA3_PATTERN in JS syntax (no inline flag groups), for training only.
const TRAIN_SPLIT =
  /'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD]|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+/gu;

const golden = JSON.parse(
  fs.readFileSync(path.join(repo, 'deploy/models/stories260K/golden.json'), 'utf8'));
const corpus = [
  ...golden.cases.map((c) => c.greedy_text),
  `#include <cstdint>
int main(int argc, char** argv) {
  for (int i = 0; i < argc; ++i) { std::printf("%s\\n", argv[i]); }
  return 0;
}
def square(x):
    return x ** 2  # the square of x
    if value != None and value >= 100: print(f"{value:.2f}")
`,
  "The year 2024 had 366 days; 12345 + 67890 = 80235. Prices: $3.14, 1,000,000 and 42%.",
  "I don't think you're right, but we'll see. They've said it's fine; I'm sure he'd agree.",
  "Hello world! Hello again, world. HELLO WORLD?! hello... hello;",
  "Café, naïve, résumé, façade, über, Ärger, crème brûlée, jalapeño, São Paulo.",
  "Москва — столица России. Привет, мир! Ελληνικά γράμματα: αβγδε.",
  "日本語のテキストです。東京は大きい都市です。中文测试：你好，世界！한국어 문장입니다.",
  "Emoji: 😀 😃 😄 👍 👍🏽 ❤️ 🎉 family 👨‍👩‍👧 and flags 🇫🇷 🇯🇵.",
  "Tabs\tand\tnewlines\n\nand   multiple   spaces   here.\r\nWindows line\r\n",
  "JSON: {\"key\": [1, 2, 3], \"nested\": {\"a\": true, \"b\": null}} <html><body>text</body></html>",
];

function trainByteLevelBpe(texts, numMerges) {
  const wordCounts = new Map();
  for (const text of texts) {
    for (const m of text.matchAll(TRAIN_SPLIT)) {
      const w = toByteLevel(m[0]);
      wordCounts.set(w, (wordCounts.get(w) ?? 0) + 1);
    }
  }
  const words = [...wordCounts.entries()].map(([w, n]) => ({ symbols: Array.from(w), n }));
  const merges = [];
  const vocab = new Set(byteToChar);
  for (let step = 0; step < numMerges; ++step) {
    const pairCounts = new Map();
    for (const { symbols, n } of words) {
      for (let i = 0; i + 1 < symbols.length; ++i) {
        const key = symbols[i] + '\u0000' + symbols[i + 1];
        pairCounts.set(key, (pairCounts.get(key) ?? 0) + n);
      }
    }
    let best = null;
    let bestCount = 0;
    for (const [key, count] of pairCounts) {
      // Ties go to the smallest key so the result does not depend on Map order.
      if (count > bestCount || (count === bestCount && best !== null && key < best)) {
        best = key;
        bestCount = count;
      }
    }
    if (best === null) break;
    const [a, b] = best.split('\u0000');
    merges.push([a, b]);
    vocab.add(a + b);
    for (const word of words) {
      const out = [];
      for (let i = 0; i < word.symbols.length; ++i) {
        if (i + 1 < word.symbols.length && word.symbols[i] === a && word.symbols[i + 1] === b) {
          out.push(a + b);
          ++i;
        } else {
          out.push(word.symbols[i]);
        }
      }
      word.symbols = out;
    }
  }
  const vocabObj = {};
  byteToChar.forEach((c, b) => { vocabObj[c] = b; });
  let next = 256;
  for (const [a, b] of merges) {
    if (!(a + b in vocabObj)) vocabObj[a + b] = next++;
  }
  return { vocab: vocabObj, merges, size: next };
}

const bl = trainByteLevelBpe(corpus, 900);
const blAdded = (() => {
  let id = bl.size;
  const t = (content, special, extra = {}) => ({
    id: id++, content, single_word: false, lstrip: false, rstrip: false,
    normalized: !special, special, ...extra,
  });
  return [
    t('<|begin_of_text|>', true), t('<|end_of_text|>', true), t('<|eot_id|>', true),
    t('<|start_header_id|>', true), t('<|end_header_id|>', true),
    t('<|lstrip|>', true, { lstrip: true }), t('<|rstrip|>', true, { rstrip: true }),
    t('<tool_call>', false, { normalized: false }),
  ];
})();
const bosTemplate = (bos, bosId) => ({
  type: 'TemplateProcessing',
  single: [{ SpecialToken: { id: bos, type_id: 0 } }, { Sequence: { id: 'A', type_id: 0 } }],
  pair: [{ SpecialToken: { id: bos, type_id: 0 } }, { Sequence: { id: 'A', type_id: 0 } },
         { SpecialToken: { id: bos, type_id: 1 } }, { Sequence: { id: 'B', type_id: 1 } }],
  special_tokens: { [bos]: { id: bos, ids: [bosId], tokens: [bos] } },
});
const byteLevelModel = (mergesAsStrings, ignoreMerges) => ({
  type: 'BPE', dropout: null, unk_token: null, continuing_subword_prefix: null,
  end_of_word_suffix: null, fuse_unk: false, byte_fallback: false, ignore_merges: ignoreMerges,
  vocab: bl.vocab,
  merges: mergesAsStrings ? bl.merges.map(([a, b]) => `${a} ${b}`) : bl.merges,
});
const splitThenBytes = (pattern) => ({
  type: 'Sequence',
  pretokenizers: [
    { type: 'Split', pattern: { Regex: pattern }, behavior: 'Isolated', invert: false },
    { type: 'ByteLevel', add_prefix_space: false, trim_offsets: true, use_regex: false },
  ],
});
const byteLevelDecoder = { type: 'ByteLevel', add_prefix_space: true, trim_offsets: true, use_regex: true };

const fixtures = {
  byte_level: {
    version: '1.0', truncation: null, padding: null, added_tokens: blAdded, normalizer: null,
    pre_tokenizer: splitThenBytes(LLAMA3_PATTERN),
    post_processor: {
      type: 'Sequence',
      processors: [
        { type: 'ByteLevel', add_prefix_space: true, trim_offsets: false, use_regex: true },
        bosTemplate('<|begin_of_text|>', blAdded[0].id),
      ],
    },
    decoder: byteLevelDecoder, model: byteLevelModel(false, true),
  },
  gpt2: {
    version: '1.0', truncation: null, padding: null,
    added_tokens: [{ id: bl.size, content: '<|endoftext|>', single_word: false, lstrip: false,
                     rstrip: false, normalized: true, special: true }],
    normalizer: null,
    pre_tokenizer: { type: 'ByteLevel', add_prefix_space: true, trim_offsets: true, use_regex: true },
    post_processor: { type: 'ByteLevel', add_prefix_space: true, trim_offsets: false, use_regex: true },
    decoder: byteLevelDecoder, model: byteLevelModel(true, false),
  },
  qwen2: {
    version: '1.0', truncation: null, padding: null,
    added_tokens: [
      { id: bl.size, content: '<|endoftext|>', single_word: false, lstrip: false, rstrip: false,
        normalized: false, special: true },
      { id: bl.size + 1, content: '<|im_start|>', single_word: false, lstrip: false, rstrip: false,
        normalized: false, special: true },
      { id: bl.size + 2, content: '<|im_end|>', single_word: false, lstrip: false, rstrip: false,
        normalized: false, special: true },
    ],
    normalizer: { type: 'NFC' },
    pre_tokenizer: splitThenBytes(QWEN2_PATTERN),
    post_processor: { type: 'ByteLevel', add_prefix_space: false, trim_offsets: false, use_regex: false },
    decoder: { type: 'ByteLevel', add_prefix_space: false, trim_offsets: false, use_regex: false },
    model: byteLevelModel(false, false),
  },
};

// ------------------------------------------------------- SentencePiece-style

// Just enough protobuf to list ModelProto.pieces (field 1: piece=1,
// score=2, type=3).
function readSentencePiece(file) {
  const buf = fs.readFileSync(file);
  let pos = 0;
  const varint = (b) => {
    let r = 0n, shift = 0n;
    for (;;) {
      const c = b.buf[b.pos++];
      r |= BigInt(c & 0x7f) << shift;
      shift += 7n;
      if (c < 0x80) return r;
    }
  };
  const fields = (b, end) => {
    const out = [];
    while (b.pos < end) {
      const key = Number(varint(b));
      const field = key >> 3, wire = key & 7;
      if (wire === 0) out.push([field, varint(b)]);
      else if (wire === 2) {
        const len = Number(varint(b));
        out.push([field, b.buf.subarray(b.pos, b.pos + len)]);
        b.pos += len;
      } else if (wire === 5) { out.push([field, b.buf.readFloatLE(b.pos)]); b.pos += 4; }
      else if (wire === 1) { b.pos += 8; }
      else throw new Error(`wire type ${wire}`);
    }
    return out;
  };
  const top = fields({ buf, pos }, buf.length);
  return top.filter(([f]) => f === 1).map(([, sub]) => {
    const p = { piece: '', score: 0, type: 1 };
    for (const [f, v] of fields({ buf: sub, pos: 0 }, sub.length)) {
      if (f === 1) p.piece = new TextDecoder().decode(v);
      else if (f === 2) p.score = v;
      else if (f === 3) p.type = Number(v);
    }
    return p;
  });
}

const spPieces = readSentencePiece(path.join(repo, 'deploy/models/stories260K/tok512.model'));
const spVocab = {};
spPieces.forEach((p, id) => { spVocab[p.piece] = id; });
// Every split of a normal piece into two pieces is a merge, ranked by the
// merged piece's score (then by the halves' ids), as transformers derives them.
const spMerges = (() => {
  const merges = [];
  spPieces.forEach((p, id) => {
    if (p.type !== 1) return;
    const chars = Array.from(p.piece);
    const local = [];
    for (let i = 1; i < chars.length; ++i) {
      const l = chars.slice(0, i).join(''), r = chars.slice(i).join('');
      if (l in spVocab && r in spVocab) local.push([l, r]);
    }
    local.sort((x, y) => spVocab[x[0]] - spVocab[y[0]] || spVocab[x[1]] - spVocab[y[1]]);
    for (const m of local) merges.push({ m, score: p.score, id });
  });
  merges.sort((x, y) => y.score - x.score || x.id - y.id);
  return merges.map((x) => x.m);
})();
const spAdded = [
  ...['<unk>', '<s>', '</s>'].map((content, id) => ({
    id, content, single_word: false, lstrip: false, rstrip: false, normalized: false,
    special: true })),
  { id: spPieces.length, content: 'big dog', single_word: false, lstrip: false, rstrip: false,
    normalized: true, special: false },
];
const spModel = {
  type: 'BPE', dropout: null, unk_token: '<unk>', continuing_subword_prefix: null,
  end_of_word_suffix: null, fuse_unk: true, byte_fallback: true, ignore_merges: false,
  vocab: spVocab, merges: spMerges,
};
fixtures.sp_bpe = {
  version: '1.0', truncation: null, padding: null, added_tokens: spAdded,
  normalizer: {
    type: 'Sequence',
    normalizers: [{ type: 'Prepend', prepend: '▁' },
                  { type: 'Replace', pattern: { String: ' ' }, content: '▁' }],
  },
  pre_tokenizer: null,
  post_processor: bosTemplate('<s>', 1),
  decoder: {
    type: 'Sequence',
    decoders: [{ type: 'Replace', pattern: { String: '▁' }, content: ' ' },
               { type: 'ByteFallback' }, { type: 'Fuse' },
               { type: 'Strip', content: ' ', start: 1, stop: 0 }],
  },
  model: spModel,
};
fixtures.metaspace = {
  version: '1.0', truncation: null, padding: null, added_tokens: spAdded.slice(0, 3),
  normalizer: null,
  pre_tokenizer: { type: 'Metaspace', replacement: '▁', prepend_scheme: 'first', split: false },
  post_processor: bosTemplate('<s>', 1),
  decoder: {
    type: 'Sequence',
    decoders: [{ type: 'ByteFallback' },
               { type: 'Metaspace', replacement: '▁', prepend_scheme: 'first', split: false }],
  },
  model: spModel,
};
const configs = {
  sp_bpe: { add_bos_token: true, add_eos_token: false, bos_token: '<s>', eos_token: '</s>',
            clean_up_tokenization_spaces: false },
};

// ------------------------------------------------------------------- cases

const texts = [
  '', ' ', 'a', 'Hello world', 'Hello world!', 'hello hello hello',
  'Once upon a time, there was a little girl named Lily.',
  "don't you're I'll we've he'd she's I'M DON'T",
  '12345 and 3.14159 and 1,000,000 and 2024-01-01',
  '  leading spaces', 'trailing spaces   ', 'multiple   spaces\tand\ttabs',
  'line1\nline2\n\nline4\r\nend', '\n\n\n', '\t',
  'int main() { return 0; }\n', 'def f(x):\n    return x**2  # square\n',
  'café naïve résumé Ünïcödé', 'e\u0301 and é and A\u030a and Å',
  '日本語のテキスト', '中文测试：你好，世界！', '한국어 문장',
  'emoji 😀👍🏽 family 👨‍👩‍👧 flag 🇫🇷', 'Привет, мир! αβγ',
  '$100.00 @user #tag https://example.com/path?q=1&r=2',
  '!!!???...', 'aaaaaaaaaaaaaaaaaaaaaaaa', 'x\u00a0y\u2003z',
  '<|begin_of_text|>Hi<|eot_id|>', 'x <|lstrip|> y', 'x <|rstrip|>   y',
  'call <tool_call> now<tool_call>', '<|im_start|>user\nhi<|im_end|>\n',
  '<s>Hello</s> world', 'Lily and Ben', 'The big dog and the big dog.',
  'Hello <|endoftext|> there', '<unk> token',
];

const expected = {
  generator: `router/tokenizer/testdata/make_fixtures.mjs with @huggingface/tokenizers@${refVersion} (npm), node ${process.version}`,
  notes: 'ids: encode(text) with the post-processor (add_special_tokens=true); ids_plain: without it. decoded: decode(ids, skip_special_tokens=true, clean_up_tokenization_spaces=false); decoded_all: the same with skip_special_tokens=false. decode entries are absent for empty id lists.',
  fixtures: {},
};
for (const [name, json] of Object.entries(fixtures)) {
  const dir = path.join(here, name);
  fs.mkdirSync(dir, { recursive: true });
  fs.writeFileSync(path.join(dir, 'tokenizer.json'), JSON.stringify(json, null, 1) + '\n');
  const config = configs[name] ?? {};
  if (configs[name]) {
    fs.writeFileSync(path.join(dir, 'tokenizer_config.json'), JSON.stringify(config, null, 1) + '\n');
  }
  const tok = new Tokenizer(json, config);
  const cases = [];
  for (const text of texts) {
    const ids = tok.encode(text).ids;
    const plain = tok.encode(text, { add_special_tokens: false }).ids;
    const c = { text, ids, ids_plain: plain };
    if (ids.length > 0) {
      c.decoded = tok.decode(ids, { skip_special_tokens: true, clean_up_tokenization_spaces: false });
      c.decoded_all = tok.decode(ids, { skip_special_tokens: false, clean_up_tokenization_spaces: false });
    }
    cases.push(c);
  }
  expected.fixtures[name] = { cases };
}
fs.writeFileSync(path.join(here, 'expected.json'), JSON.stringify(expected, null, 1) + '\n');
console.log(`byte-level vocab ${bl.size}, ${bl.merges.length} merges; sp merges ${spMerges.length}`);
