#!/usr/bin/env node
// A complete rlfleet environment server in Node.js: rlfleet.v1.Environment (Start, Step, End,
// Describe) plus grpc.health.v1.Health, following docs/environments.md.
//
//   npm install && node server.js --port 50061 [--host 127.0.0.1] [--protos DIR]
//
// --port 0 picks a free port. Once it can run episodes, the server prints
// "serving on HOST:PORT" on stdout. SIGTERM or Ctrl-C stop it gracefully.
'use strict';

const path = require('path');
const grpc = require('@grpc/grpc-js');
const protoLoader = require('@grpc/proto-loader');
const game = require('./game');

function option(name, fallback) {
  const at = process.argv.indexOf(`--${name}`);
  return at >= 0 && at + 1 < process.argv.length ? process.argv[at + 1] : fallback;
}

const host = option('host', '127.0.0.1');
const port = Number(option('port', '50061'));
const protosDir = option('protos', path.resolve(__dirname, '..', '..', 'protos'));

const loadOptions = { keepCase: true, longs: Number, enums: String, defaults: true, oneofs: true };
const envProto = grpc.loadPackageDefinition(protoLoader.loadSync(
  path.join(protosDir, 'rlfleet', 'v1', 'environment.proto'), { ...loadOptions, includeDirs: [protosDir] }));
const healthProto = grpc.loadPackageDefinition(protoLoader.loadSync(
  path.join(__dirname, 'health.proto'), loadOptions));

const episodes = new Map(); // episode_id -> the game's state

function invalid(message) {
  return { code: grpc.status.INVALID_ARGUMENT, details: message };
}

// The request-level rules: non-empty unique ids, JSON where JSON is promised.
function checkIds(ids) {
  const seen = new Set();
  for (const id of ids) {
    if (!id) return invalid('an item has an empty episode_id');
    if (seen.has(id)) return invalid(`episode_id ${JSON.stringify(id)} appears twice in one request`);
    seen.add(id);
  }
  return null;
}

function checkJson(text, what, wantObject) {
  if (!text) return null;
  let value;
  try {
    value = JSON.parse(text);
  } catch (err) {
    return invalid(`${what} is not JSON: ${err.message}`);
  }
  if (wantObject && (value === null || typeof value !== 'object' || Array.isArray(value))) {
    return invalid(`${what} must be a JSON object`);
  }
  return null;
}

function failed(id, message) {
  return { episode_id: id, ok: false, error: `episode ${id}: ${message}`, done: true, tool_errors: 0 };
}

// One result per item, in order; an exception fails its episode alone.
function answer(call, callback, ids, problem, handle) {
  if (problem) {
    callback(problem);
    return;
  }
  const results = [];
  for (const [index, id] of ids.entries()) {
    if (call.cancelled) return; // the deadline passed or the client left
    try {
      results.push({ episode_id: id, ok: true, error: '', tool_errors: 0, ...handle(index, id) });
    } catch (err) {
      episodes.delete(id);
      results.push(failed(id, String(err.message || err)));
    }
  }
  callback(null, { results });
}

function start(call, callback) {
  const items = call.request.episodes || [];
  const ids = items.map((e) => e.episode_id);
  const problem = checkIds(ids) || items.map((e) => checkJson(e.extra_info_json,
    `episode ${e.episode_id}: extra_info_json`, true)).find(Boolean);
  answer(call, callback, ids, problem, (index, id) => {
    if (episodes.has(id)) return failed(id, 'is already running'); // the running one plays on
    episodes.set(id, game.start(items[index]));
    return { observation: { messages: [], text: '' }, done: false };
  });
}

function step(call, callback) {
  const actions = call.request.actions || [];
  const ids = actions.map((a) => a.episode_id);
  const problem = checkIds(ids) || actions.flatMap((a) => a.tool_calls.map((c) => checkJson(c.arguments_json,
    `episode ${a.episode_id}: tool call ${c.name}: arguments_json`, false))).find(Boolean);
  answer(call, callback, ids, problem, (index, id) => {
    if (!episodes.has(id)) throw new Error('is not running (never started, or over)');
    const result = game.step(episodes.get(id), actions[index]);
    if (result.done) episodes.delete(id);
    if (result.reward !== undefined && !Number.isFinite(result.reward)) throw new Error('non-finite reward');
    return result;
  });
}

function end(call, callback) {
  const ids = call.request.episode_ids || [];
  answer(call, callback, ids, checkIds(ids), (index, id) => {
    if (!episodes.has(id)) throw new Error('is not running (never started, or over)');
    const reward = game.end(episodes.get(id), call.request.reason);
    episodes.delete(id);
    return { observation: { messages: [], text: '' }, done: true, ...(reward === null ? {} : { reward }) };
  });
}

// The revision of the environment contract this server was written against (docs/environments.md,
// "Contract revisions"); `rlfleet env check` prints it.
const CONTRACT_REVISION = 3;

function describe(call, callback) {
  callback(null, { ...game.description, contract_revision: CONTRACT_REVISION });
}

// The standard health protocol (health.proto): SERVING once episodes can run, NOT_SERVING from the
// moment a shutdown begins; Watch streams are told of each change.
let serving = 'SERVING';
const watchers = new Set();
function known(name) {
  return name === '' || name === 'rlfleet.v1.Environment';
}

function healthCheck(call, callback) {
  const name = call.request.service;
  if (known(name)) {
    callback(null, { status: serving });
  } else {
    callback({ code: grpc.status.NOT_FOUND, details: `unknown service ${name}` });
  }
}

function healthWatch(call) {
  if (!known(call.request.service)) {
    call.write({ status: 'SERVICE_UNKNOWN' });
    return;
  }
  call.write({ status: serving });
  watchers.add(call);
  call.on('cancelled', () => watchers.delete(call));
}

function setServing(status) {
  serving = status;
  for (const call of watchers) call.write({ status });
}

const server = new grpc.Server();
server.addService(envProto.rlfleet.v1.Environment.service,
  { Start: start, Step: step, End: end, Describe: describe });
server.addService(healthProto.grpc.health.v1.Health.service, { Check: healthCheck, Watch: healthWatch });

server.bindAsync(`${host}:${port}`, grpc.ServerCredentials.createInsecure(), (err, boundPort) => {
  if (err) {
    console.error(`cannot bind ${host}:${port}: ${err.message}`);
    process.exit(2);
  }
  console.log(`serving on ${host}:${boundPort}`);
});

function stop(signal) {
  console.error(`${signal}: shutting down`);
  setServing('NOT_SERVING'); // health first, so that watchers and load balancers stop sending work
  for (const call of watchers) call.end();
  server.tryShutdown(() => process.exit(0));
  setTimeout(() => server.forceShutdown(), 5000).unref();
}
process.on('SIGTERM', () => stop('SIGTERM'));
process.on('SIGINT', () => stop('SIGINT'));
