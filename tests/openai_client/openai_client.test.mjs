// The real `openai` npm client against a running ringlane cluster: chat and
// completions, streamed and not, with seed, stop, logprobs and n=2; golden
// greedy text; seed reproducibility; error mapping; response_format
// json_schema (validated by ajv) and tools with tool_choice, streamed and not. run.sh starts the cluster
// and sets RINGLANE_BASE_URL (http://HOST:PORT/v1).
//
//   RINGLANE_BASE_URL=http://127.0.0.1:8080/v1 node --test
import assert from 'node:assert/strict';
import { readFileSync } from 'node:fs';
import { test } from 'node:test';

import Ajv from 'ajv';
import OpenAI from 'openai';

const baseURL = process.env.RINGLANE_BASE_URL;
if (!baseURL) {
  throw new Error('RINGLANE_BASE_URL is not set (run tests/openai_client/run.sh)');
}
const client = new OpenAI({
  baseURL,
  apiKey: process.env.RINGLANE_API_KEY || 'none',
  maxRetries: 0,
  timeout: 120_000,
});

const MODEL = 'stories260K';
const GOLDEN = JSON.parse(
  readFileSync(new URL('../../deploy/models/stories260K/golden.json', import.meta.url), 'utf8'),
);

// Sampled (temperature 0.8) with a seed: with this seed both endpoints give a
// choice cut by the stop string "park" and one that runs to max_tokens.
const SAMPLED = { seed: 5, temperature: 0.8, max_tokens: 48, stop: ['park'], n: 2 };
const COMPLETION = { model: MODEL, prompt: 'Once upon a time', ...SAMPLED, logprobs: 2 };
const CHAT = {
  model: MODEL,
  messages: [{ role: 'user', content: 'Lily and Ben went to the park.' }],
  ...SAMPLED,
  logprobs: true,
  top_logprobs: 2,
};

// Drains a stream into per-choice state; returns { choices, usage, chunks }.
async function collect(stream, chat) {
  const choices = [];
  let usage = null;
  let chunks = 0;
  for await (const chunk of stream) {
    ++chunks;
    assert.equal(usage, null, 'no chunk may follow the usage chunk');
    if (chunk.usage) {
      assert.deepEqual(chunk.choices, [], 'the usage chunk has no choices');
      usage = chunk.usage;
      continue;
    }
    for (const c of chunk.choices) {
      const s = (choices[c.index] ??= {
        text: '',
        finish_reason: null,
        logprobs: 0,
        roles: [],
        deltas: 0,
      });
      assert.equal(s.finish_reason, null, `choice ${c.index}: a delta after its finish_reason`);
      if (chat) {
        if (c.delta.role !== undefined) s.roles.push({ role: c.delta.role, at: s.deltas });
        s.text += c.delta.content ?? '';
        s.logprobs += c.logprobs?.content?.length ?? 0;
      } else {
        s.text += c.text;
        s.logprobs += c.logprobs?.tokens?.length ?? 0;
        if (c.logprobs) {
          assert.equal(c.logprobs.token_logprobs.length, c.logprobs.tokens.length);
          assert.equal(c.logprobs.top_logprobs.length, c.logprobs.tokens.length);
        }
      }
      ++s.deltas;
      s.finish_reason = c.finish_reason ?? null;
    }
  }
  return { choices, usage, chunks };
}

function checkUsage(usage, label) {
  assert.ok(usage, `${label}: usage present`);
  assert.ok(usage.prompt_tokens > 0, `${label}: prompt_tokens > 0`);
  assert.ok(usage.completion_tokens > 0, `${label}: completion_tokens > 0`);
  assert.equal(usage.total_tokens, usage.prompt_tokens + usage.completion_tokens, label);
  const cached = usage.prompt_tokens_details?.cached_tokens;
  assert.equal(typeof cached, 'number', `${label}: prompt_tokens_details.cached_tokens`);
  assert.ok(cached >= 0 && cached <= usage.prompt_tokens, `${label}: 0 <= cached <= prompt`);
}

// Same usage apart from cached_tokens (the second request hits the prefix cache).
function sameUsage(a, b) {
  for (const k of ['prompt_tokens', 'completion_tokens', 'total_tokens']) {
    assert.equal(a[k], b[k], `usage.${k}: streamed vs not`);
  }
}

// Every choice of `cut` (with stop "park") is `full` (without stop) cut just
// before its first "park", or all of it; at least one was cut.
function checkStopCuts(cut, full) {
  let cuts = 0;
  for (let i = 0; i < cut.length; ++i) {
    const a = cut[i];
    const b = full[i];
    assert.ok(b.text.startsWith(a.text), `choice ${i}: ${JSON.stringify(a.text)} is a prefix of ${JSON.stringify(b.text)}`);
    const at = b.text.indexOf('park');
    if (at >= 0) {
      assert.equal(a.text, b.text.slice(0, at), `choice ${i}: cut right before "park"`);
      assert.equal(a.finish_reason, 'stop', `choice ${i}`);
      ++cuts;
    } else {
      assert.equal(a.text, b.text, `choice ${i}: not cut`);
      assert.equal(a.finish_reason, b.finish_reason, `choice ${i}`);
    }
  }
  assert.ok(cuts > 0, 'the stop string cut at least one choice (pick another seed if the model changed)');
}

test('models.list() serves stories260K', async () => {
  const ids = [];
  for await (const m of client.models.list()) ids.push(m.id);
  assert.ok(ids.includes(MODEL), `models: ${ids}`);
});

// The same request whole and streamed (with the usage chunk): both with two
// choices and right usage, the same counts in each.
async function wholeAndStreamed(api, params, object, chat) {
  const full = await api.create(params);
  assert.equal(full.object, object);
  assert.equal(full.model, MODEL);
  assert.equal(full.choices.length, 2);
  checkUsage(full.usage, 'non-streamed');

  const stream = await api.create({
    ...params,
    stream: true,
    stream_options: { include_usage: true },
  });
  const got = await collect(stream, chat);
  assert.equal(got.choices.length, 2);
  assert.ok(got.chunks > 2 * 3, `streamed in ${got.chunks} chunks`);
  checkUsage(got.usage, 'streamed');
  sameUsage(got.usage, full.usage);
  return { full, got };
}

test('completions: streamed == not streamed (seed, stop, logprobs, n=2)', async () => {
  const { full, got } =
    await wholeAndStreamed(client.completions, COMPLETION, 'text_completion', false);

  let entries = 0;
  for (const c of full.choices) {
    const s = got.choices[c.index];
    assert.ok(s, `streamed choice ${c.index}`);
    assert.equal(s.text, c.text, `choice ${c.index}: streamed text`);
    assert.equal(s.finish_reason, c.finish_reason, `choice ${c.index}: finish_reason`);
    assert.ok(['stop', 'length'].includes(c.finish_reason), c.finish_reason);
    assert.ok(!c.text.includes('park'), `choice ${c.index}: stop string in ${JSON.stringify(c.text)}`);
    const lp = c.logprobs;
    assert.ok(lp, `choice ${c.index}: logprobs`);
    assert.equal(lp.token_logprobs.length, lp.tokens.length);
    assert.equal(lp.text_offset.length, lp.tokens.length);
    assert.equal(lp.top_logprobs.length, lp.tokens.length);
    for (let t = 0; t < lp.tokens.length; ++t) {
      assert.ok(lp.token_logprobs[t] <= 0, `logprob ${lp.token_logprobs[t]}`);
      const top = Object.entries(lp.top_logprobs[t]);
      assert.ok(top.length >= 2 && top.length <= 3, `top_logprobs: ${JSON.stringify(top)}`);
    }
    assert.equal(s.logprobs, lp.tokens.length, `choice ${c.index}: streamed logprob entries`);
    if (c.finish_reason === 'length') {
      assert.equal(lp.tokens.length, COMPLETION.max_tokens, `choice ${c.index}: tokens at length`);
    }
    entries += lp.tokens.length;
  }
  assert.equal(full.usage.completion_tokens, entries, 'completion_tokens == logprob entries');
  assert.notEqual(full.choices[0].text, full.choices[1].text, 'n=2 choices differ');

  // The same request without the stop string: each choice is the same sample
  // up to the first "park".
  const nostop = await client.completions.create({ ...COMPLETION, stop: null });
  const byIndex = (r) => [...r.choices].sort((a, b) => a.index - b.index);
  checkStopCuts(byIndex(full), byIndex(nostop));
});

test('chat: streamed == not streamed (seed, stop, logprobs, n=2)', async () => {
  const { full, got } =
    await wholeAndStreamed(client.chat.completions, CHAT, 'chat.completion', true);

  let entries = 0;
  for (const c of full.choices) {
    const s = got.choices[c.index];
    assert.ok(s, `streamed choice ${c.index}`);
    assert.equal(c.message.role, 'assistant');
    assert.equal(typeof c.message.content, 'string');
    assert.deepEqual(s.roles, [{ role: 'assistant', at: 0 }],
      `choice ${c.index}: role "assistant" in its first chunk only`);
    assert.equal(s.text, c.message.content, `choice ${c.index}: streamed text`);
    assert.equal(s.finish_reason, c.finish_reason, `choice ${c.index}: finish_reason`);
    assert.ok(['stop', 'length'].includes(c.finish_reason), c.finish_reason);
    assert.ok(!c.message.content.includes('park'), `choice ${c.index}: stop string in ${JSON.stringify(c.message.content)}`);
    const content = c.logprobs?.content;
    assert.ok(Array.isArray(content), `choice ${c.index}: logprobs.content`);
    for (const e of content) {
      assert.equal(typeof e.token, 'string');
      assert.ok(e.logprob <= 0, `logprob ${e.logprob}`);
      assert.ok(Array.isArray(e.bytes));
      assert.equal(e.top_logprobs.length, 2, 'top_logprobs: 2');
    }
    assert.equal(s.logprobs, content.length, `choice ${c.index}: streamed logprob entries`);
    if (c.finish_reason === 'length') {
      assert.equal(content.length, CHAT.max_tokens, `choice ${c.index}: tokens at length`);
    }
    entries += content.length;
  }
  assert.equal(full.usage.completion_tokens, entries, 'completion_tokens == logprob entries');
  assert.notEqual(full.choices[0].message.content, full.choices[1].message.content,
    'n=2 choices differ');

  const nostop = await client.chat.completions.create({ ...CHAT, stop: null });
  const flat = (r) => [...r.choices].sort((a, b) => a.index - b.index)
    .map((c) => ({ text: c.message.content, finish_reason: c.finish_reason }));
  checkStopCuts(flat(full), flat(nostop));
});

test('completions: golden greedy text (temperature 0, echo)', async () => {
  assert.ok(GOLDEN.cases.length > 0);
  for (const g of GOLDEN.cases) {
    const r = await client.completions.create({
      model: MODEL,
      prompt: g.prompt,
      max_tokens: g.greedy_ids.length,
      temperature: 0,
      echo: true,
    });
    assert.equal(r.choices.length, 1);
    assert.equal(r.choices[0].text, g.greedy_text, `golden case ${JSON.stringify(g.prompt)}`);
    assert.equal(r.usage.prompt_tokens, g.prompt_ids.length, `prompt tokens of ${JSON.stringify(g.prompt)}`);
    assert.equal(r.usage.completion_tokens, g.greedy_ids.length);
  }
});

test('seed: the same sampled request twice gives the same text', async () => {
  const req = { model: MODEL, prompt: 'The cat', max_tokens: 40, temperature: 1.0, seed: 1234 };
  const a = await client.completions.create(req);
  const b = await client.completions.create(req);
  assert.equal(a.choices[0].text, b.choices[0].text);
  const other = await client.completions.create({ ...req, seed: 4321 });
  assert.notEqual(other.choices[0].text, a.choices[0].text, 'another seed, another sample');
  const c = await client.chat.completions.create({
    model: MODEL, messages: [{ role: 'user', content: 'Hi' }], max_tokens: 40, temperature: 1.0,
    seed: 1234,
  });
  const d = await client.chat.completions.create({
    model: MODEL, messages: [{ role: 'user', content: 'Hi' }], max_tokens: 40, temperature: 1.0,
    seed: 1234,
  });
  assert.equal(c.choices[0].message.content, d.choices[0].message.content);
});

test('errors: unknown model is a 404 APIError', async () => {
  await assert.rejects(
    client.completions.create({ model: 'no-such-model', prompt: 'x' }),
    (e) => {
      assert.ok(e instanceof OpenAI.APIError, `${e}`);
      assert.ok(e instanceof OpenAI.NotFoundError, `${e}`);
      assert.equal(e.status, 404);
      return true;
    },
  );
  await assert.rejects(
    client.chat.completions.create({
      model: 'no-such-model', messages: [{ role: 'user', content: 'x' }],
    }),
    (e) => e instanceof OpenAI.APIError && e.status === 404,
  );
});

test('errors: max_tokens past the context is a 400 naming the context', async () => {
  await assert.rejects(
    client.completions.create({ model: MODEL, prompt: 'x', max_tokens: 100000 }),
    (e) => {
      assert.ok(e instanceof OpenAI.BadRequestError, `${e}`);
      assert.equal(e.status, 400);
      assert.match(e.message, /context/);
      assert.equal(e.param, 'max_tokens');
      return true;
    },
  );
  await assert.rejects(
    client.chat.completions.create({
      model: MODEL, messages: [{ role: 'user', content: 'x' }], max_tokens: 100000,
    }),
    (e) => e instanceof OpenAI.BadRequestError && /context/.test(e.message),
  );
});

// Structured output: the schema bounds its strings, since the bundled
// 260K-parameter model would not close an unbounded one by itself.
const PERSON = {
  type: 'object',
  properties: {
    name: { type: 'string', maxLength: 10 },
    age: { type: 'integer' },
    pets: { type: 'array', items: { enum: ['cat', 'dog', 'fish'] }, maxItems: 2 },
  },
  required: ['name', 'age', 'pets'],
  additionalProperties: false,
};

test('response_format json_schema: valid JSON, the same streamed and not', async () => {
  const validate = new Ajv().compile(PERSON);
  for (const temperature of [0, 0.9]) {
    const req = {
      model: MODEL,
      messages: [{ role: 'user', content: 'Tell me about Tom.' }],
      response_format: {
        type: 'json_schema', json_schema: { name: 'person', schema: PERSON, strict: true },
      },
      temperature, seed: 3, max_tokens: 300,
    };
    const whole = await client.chat.completions.create(req);
    const text = whole.choices[0].message.content;
    assert.equal(whole.choices[0].finish_reason, 'stop', text);
    const value = JSON.parse(text);
    assert.ok(validate(value), `${text}: ${JSON.stringify(validate.errors)}`);
    let streamed = '';
    for await (const chunk of await client.chat.completions.create({ ...req, stream: true })) {
      for (const ch of chunk.choices) streamed += ch.delta.content ?? '';
    }
    assert.equal(streamed, text);
  }
  // json_object leaves strings unbounded, which this model may not close
  // within max_tokens: then the text is the start of an object.
  const obj = await client.chat.completions.create({
    model: MODEL, messages: [{ role: 'user', content: 'Hi' }],
    response_format: { type: 'json_object' }, max_tokens: 100,
  });
  const content = obj.choices[0].message.content;
  assert.match(content, /^ ?\{/);
  if (obj.choices[0].finish_reason === 'stop') {
    assert.equal(typeof JSON.parse(content), 'object');
  } else {
    assert.equal(obj.choices[0].finish_reason, 'length');
  }
});

const TOOLS = [
  {
    type: 'function',
    function: {
      name: 'get_weather',
      parameters: {
        type: 'object',
        properties: { city: { type: 'string', maxLength: 8 }, unit: { enum: ['c', 'f'] } },
        required: ['city', 'unit'],
        additionalProperties: false,
      },
    },
  },
];

test('tools: tool_choice required and a named function give calls, streamed and not', async () => {
  const validate = new Ajv().compile(TOOLS[0].function.parameters);
  for (const tool_choice of ['required', { type: 'function', function: { name: 'get_weather' } }]) {
    const req = {
      model: MODEL,
      messages: [{ role: 'user', content: 'Weather in Paris?' }],
      // One call: "required" alone allows more, which a small model may
      // not stop writing. No max_tokens: the tools fill most of the
      // 512-token context.
      tools: TOOLS, tool_choice, parallel_tool_calls: false,
    };
    const whole = await client.chat.completions.create(req);
    const msg = whole.choices[0].message;
    assert.equal(whole.choices[0].finish_reason, 'tool_calls', JSON.stringify(msg));
    assert.equal(msg.tool_calls.length, 1);
    for (const call of msg.tool_calls) {
      assert.equal(call.type, 'function');
      assert.equal(call.function.name, 'get_weather');
      assert.ok(validate(JSON.parse(call.function.arguments)), call.function.arguments);
    }
    // The stream's deltas add up to the same calls: each call's first delta
    // carries its id and whole name, the rest append to its arguments.
    const calls = [];
    let finish = null;
    for await (const chunk of await client.chat.completions.create({ ...req, stream: true })) {
      for (const ch of chunk.choices) {
        if (ch.finish_reason) finish = ch.finish_reason;
        for (const d of ch.delta.tool_calls ?? []) {
          if (d.id) {
            assert.equal(d.function.name, 'get_weather', 'a name comes whole');
            calls[d.index] = { id: d.id, name: d.function.name, arguments: '' };
          }
          calls[d.index].arguments += d.function.arguments ?? '';
        }
      }
    }
    assert.equal(finish, 'tool_calls');
    // Ids are per response; the calls are the same.
    for (const c of calls) assert.match(c.id, /^call_/);
    assert.deepEqual(
      calls.map((c) => ({ name: c.name, arguments: c.arguments })),
      msg.tool_calls.map((c) => ({ name: c.function.name, arguments: c.function.arguments })),
    );
  }
  // The conversation goes on with the call and its result.
  const first = await client.chat.completions.create({
    model: MODEL, messages: [{ role: 'user', content: 'Weather in Paris?' }],
    tools: TOOLS, tool_choice: 'required', parallel_tool_calls: false,
  });
  const call = first.choices[0].message.tool_calls[0];
  const next = await client.chat.completions.create({
    model: MODEL,
    messages: [
      { role: 'user', content: 'Weather in Paris?' },
      { role: 'assistant', content: null, tool_calls: [call] },
      { role: 'tool', tool_call_id: call.id, content: '{"temp": 21}' },
    ],
    tools: TOOLS, max_tokens: 16,
  });
  assert.equal(typeof next.choices[0].message.content, 'string');
});

test('errors: an unknown tool in tool_choice is a 400 naming it', async () => {
  await assert.rejects(
    client.chat.completions.create({
      model: MODEL, messages: [{ role: 'user', content: 'x' }], tools: TOOLS,
      tool_choice: { type: 'function', function: { name: 'nope' } },
    }),
    (e) => e instanceof OpenAI.BadRequestError && e.param === 'tool_choice.function.name',
  );
});
