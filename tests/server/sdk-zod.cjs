// What the SDK schema tests share (sdk-schema.cjs: chat completions,
// sdk-responses.cjs: the Responses API): the node modules from PKV_NODE_DIR, one
// zod corpus of common types, a fetch that keeps each request body as it leaves,
// and ajv (+ ajv-formats) to validate outputs against the schema actually sent.
'use strict';
const { createRequire } = require('module');
const path = require('path');
const req = createRequire(path.join(process.env.PKV_NODE_DIR || __dirname, 'x.js'));
const { z } = req('zod');
const Ajv = req('ajv').default;
const Ajv2020 = req('ajv/dist/2020').default;
const addFormats = req('ajv-formats').default;

let failures = 0, checks = 0;
function check(cond, what) {
  checks++;
  if (!cond) { failures++; console.error('FAIL:', what); }
}
function summary(name) {
  console.error(`${name}: ${checks - failures}/${checks} checks passed`);
  return failures ? 1 : 0;
}

// every request body, in order, as the SDKs sent them
const sent = [];
async function spyFetch(url, init) {
  if (init && typeof init.body === 'string') sent.push(JSON.parse(init.body));
  return fetch(url, init);
}
function lastBody() { return sent[sent.length - 1]; }

// ajv for the schema's draft: draft 7 tuples (items as an array) need the classic one
function validator(schema) {
  const s = JSON.parse(JSON.stringify(schema));
  delete s.$schema;
  const text = JSON.stringify(s);
  const draft7 = /"additionalItems"|"items":\[/.test(text);
  // multipleOfPrecision: ajv divides in doubles (1.15 / 0.01 is 114.99999999999999)
  const opts = { strict: false, allErrors: true, multipleOfPrecision: 9 };
  const v = draft7 ? new Ajv(opts) : new Ajv2020(opts);
  addFormats(v);
  return v.compile(s);
}
function validate(what, schema, value) {
  if (process.env.PKV_SDK_DEBUG) console.error(what, JSON.stringify(value));
  let v;
  try { v = validator(schema); } catch (e) { check(false, `${what}: ajv cannot compile the sent schema: ${e.message}`); return; }
  check(v(value), `${what}: ${JSON.stringify(value)} invalid: ${JSON.stringify(v.errors)}`);
}

// zod schemas of common types. OpenAI's strict mode wants every property required:
// optional ones are nullable there.
const Address = z.object({ city: z.string().max(10), zip: z.string().regex(/^\d{5}$/) });
function person(strict) {
  const opt = t => (strict ? t.nullable() : t.optional());
  return z.object({
    id: z.number().int(),
    age: z.number().int().positive().max(150),
    score: z.number().positive(),
    price: z.number().min(0.5).max(99.5),
    ratio: z.number().positive().multipleOf(0.01),
    step: z.number().int().min(-1000).max(1000).multipleOf(250),
    email: z.string().email(),
    uid: z.string().uuid(),
    site: z.string().url(),
    at: z.string().datetime(),
    code: z.string().regex(/^[A-Z]{2}-\d{3}$/),
    pair: z.tuple([z.string().max(5), z.number().int()]),
    counts: z.record(z.string().max(6), z.number().int().min(0).max(99)),
    kind: z.enum(['a', 'b', 'c']),
    nick: opt(z.string().max(8)),
    note: z.string().max(8).nullable(),
    home: Address,
    past: z.array(Address).max(2),
  });
}
const Weather = z.object({ city: z.string().max(12), days: z.number().int().min(1).max(7),
                           unit: z.enum(['C', 'F']).nullable(), when: z.iso.date() });

// tokens: the grammar must finish before this (an output cut short would not parse);
// the longest seen was 976 (uri, email and date-time fractions are long, records open)
const MAX = 3000;
const ask = 'Describe a person.';

module.exports = { req, z, check, summary, sent, spyFetch, lastBody, validate, person, Weather, MAX, ask };
