// The official Node.js driver against staleguard (driven by tests/node_driver.rs).
//
// Usage: node driver_check.js MODE URI
//
// Each mode asserts what a Node.js application sees and prints one line "OK MODE {...}";
// any failed expectation exits non-zero with the reason.
'use strict';

const { MongoClient, MongoServerError } = require('mongodb');

const OPTIONS = { serverSelectionTimeoutMS: 5000, connectTimeoutMS: 5000 };

function fail(msg) {
  console.log(`FAIL ${msg}`);
  process.exit(1);
}

function expect(cond, msg) {
  if (!cond) fail(msg);
}

// A client that counts its pool's events: a policy reply must not cost a connection.
function watchedClient(uri, extra = {}) {
  const client = new MongoClient(uri, { ...OPTIONS, ...extra });
  const events = { created: 0, closed: [], cleared: 0 };
  client.on('connectionCreated', () => events.created++);
  client.on('connectionClosed', (e) => events.closed.push(e.reason));
  client.on('connectionPoolCleared', () => events.cleared++);
  return { client, events };
}

async function expectServerError(what, promise) {
  try {
    const got = await promise;
    fail(`${what} should fail, got ${JSON.stringify(got)}`);
  } catch (e) {
    if (!(e instanceof MongoServerError)) fail(`${what}: not a server error: ${e}`);
    return e;
  }
}

// An ungoverned namespace: insert, then read back (primary and secondary).
async function relay(uri) {
  const client = new MongoClient(uri, OPTIONS);
  try {
    const coll = client.db('shop').collection('orders');
    const docs = [0, 1, 2].map((i) => ({ _id: i, item: `order ${i}`, qty: i * 10 }));
    const res = await coll.insertMany(docs);
    expect(res.insertedCount === 3, `inserted ${res.insertedCount}`);
    const got = await coll.find({}, { readPreference: 'secondary' }).sort({ _id: 1 }).toArray();
    expect(JSON.stringify(got) === JSON.stringify(docs), `read back ${JSON.stringify(got)}`);
    return { docs: got.length };
  } finally {
    await client.close();
  }
}

// The proxy hides a StaleConfig from the application: the documents come back.
async function fallbackRetry(uri) {
  const client = new MongoClient(uri, OPTIONS);
  try {
    const coll = client.db('demo').collection('store_inventory', { readPreference: 'secondary' });
    const docs = await coll.find({}, { maxTimeMS: 5000 }).sort({ _id: 1 }).toArray();
    const ids = docs.map((d) => d._id);
    expect(JSON.stringify(ids) === '[0,1,2,3,4]', `documents: ${JSON.stringify(docs)}`);
    expect(docs[0].item === 'item 0', `first document: ${JSON.stringify(docs[0])}`);
    return { docs: docs.length };
  } finally {
    await client.close();
  }
}

// Three upstream StaleConfig errors open the strict breaker; the fourth read fails fast
// with staleguard's error, and the same client (same connection, same pool) goes on working.
async function strictFailFast(uri) {
  const { client, events } = watchedClient(uri, { maxPoolSize: 1 });
  try {
    await client.db('admin').command({ ping: 1 });
    const coll = client.db('pay').collection('accounts', { readPreference: 'secondary' });
    for (let i = 0; i < 3; i++) {
      const e = await expectServerError(`read ${i}`, coll.findOne({}));
      expect(e.code === 13388, `read ${i}: code ${e.code}`);
      expect(!e.errmsg.startsWith('staleguard:'), `read ${i}: upstream error expected`);
    }
    const createdBefore = events.created;
    const started = performance.now();
    const e = await expectServerError('the fourth read', coll.findOne({}));
    const took = performance.now() - started;
    expect(e.code === 13388, `fail-fast code ${e.code}`);
    expect(e.codeName === 'StaleConfig', `codeName ${e.codeName}`);
    expect(e.errmsg.startsWith('staleguard:'), `errmsg ${JSON.stringify(e.errmsg)}`);
    expect(e.errmsg.includes('pay.accounts'), `errmsg names the namespace: ${e.errmsg}`);
    expect(!e.hasErrorLabel('RetryableError'), 'no retry label');
    expect(took < 50, `fail fast took ${took.toFixed(1)} ms`);
    // The connection survived: the same client keeps working, on the same connection.
    await client.db('admin').command({ ping: 1 });
    const doc = await client.db('pay').collection('accounts').findOne({});
    expect(doc !== null && doc._id === 0, `primary read after the refusal: ${JSON.stringify(doc)}`);
    expect(events.created === createdBefore, `new connections: ${events.created - createdBefore}`);
    expect(events.closed.length === 0, `connections closed: ${events.closed}`);
    expect(events.cleared === 0, `pool cleared ${events.cleared} times`);
    return { fail_fast_ms: Number(took.toFixed(2)), errmsg: e.errmsg, connections: events.created };
  } finally {
    await client.close();
  }
}

// A strict read asking for readConcern "available" is refused before it is sent.
async function strictAvailable(uri) {
  const { client, events } = watchedClient(uri, { maxPoolSize: 1 });
  try {
    const seen = [];
    for (const mode of ['secondary', 'nearest', 'primary']) {
      const coll = client.db('pay').collection('accounts', {
        readPreference: mode,
        readConcern: { level: 'available' },
      });
      const e = await expectServerError(`${mode} read`, coll.find({}).toArray());
      expect(e.code === 72, `${mode}: code ${e.code}`);
      expect(e.codeName === 'InvalidOptions', `${mode}: codeName ${e.codeName}`);
      expect(e.errmsg.startsWith('staleguard:'), `${mode}: errmsg ${e.errmsg}`);
      expect(e.errmsg.includes('pay.accounts'), `${mode}: errmsg ${e.errmsg}`);
      expect(e.errmsg.includes('available'), `${mode}: errmsg ${e.errmsg}`);
      seen.push(e.code);
    }
    await client.db('admin').command({ ping: 1 });
    expect(events.closed.length === 0, `connections closed: ${events.closed}`);
    expect(events.cleared === 0, `pool cleared ${events.cleared} times`);
    return { codes: seen };
  } finally {
    await client.close();
  }
}

const MODES = {
  relay,
  'fallback-retry': fallbackRetry,
  'strict-fail-fast': strictFailFast,
  'strict-available': strictAvailable,
};

async function main() {
  const [mode, uri] = process.argv.slice(2);
  if (process.argv.length !== 4 || !(mode in MODES)) {
    fail(`usage: driver_check.js {${Object.keys(MODES).join('|')}} URI`);
  }
  const result = await MODES[mode](uri);
  console.log(`OK ${mode} ${JSON.stringify(result)}`);
}

main().catch((e) => {
  console.log(`FAIL ${e && e.stack ? e.stack : e}`);
  process.exit(1);
});
