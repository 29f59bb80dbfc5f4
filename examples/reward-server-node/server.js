#!/usr/bin/env node
// A complete rlfleet reward server in Node.js: rlfleet.v1.Reward (Score and
// GetStatus) plus grpc.health.v1.Health, following docs/reward-api.md.
//
//   npm install && node server.js --port 50051 [--host 127.0.0.1] [--protos DIR]
//
// --port 0 picks a free port. Once it can score, the server prints
// "serving on HOST:PORT" on stdout. SIGTERM or Ctrl-C stop it gracefully.
'use strict';

const path = require('path');
const grpc = require('@grpc/grpc-js');
const protoLoader = require('@grpc/proto-loader');
const { scoreItem } = require('./rewards');

function option(name, fallback) {
  const at = process.argv.indexOf(`--${name}`);
  return at >= 0 && at + 1 < process.argv.length ? process.argv[at + 1] : fallback;
}

const host = option('host', '127.0.0.1');
const port = Number(option('port', '50051'));
const protosDir = option('protos', path.resolve(__dirname, '..', '..', 'protos'));

const loadOptions = { keepCase: true, longs: Number, enums: String, defaults: true, oneofs: true };
const rewardProto = grpc.loadPackageDefinition(protoLoader.loadSync(
  path.join(protosDir, 'rlfleet', 'v1', 'reward.proto'), { ...loadOptions, includeDirs: [protosDir] }));
const healthProto = grpc.loadPackageDefinition(protoLoader.loadSync(
  path.join(__dirname, 'health.proto'), loadOptions));

const stats = { scored: 0, lastError: '' };

function invalid(message) {
  return { code: grpc.status.INVALID_ARGUMENT, details: message };
}

// The request-level rules: non-empty unique ids, extra_info_json a JSON object.
function checkRequest(items) {
  const seen = new Set();
  for (const item of items) {
    if (!item.id) return invalid('a score item has an empty id');
    if (seen.has(item.id)) return invalid(`duplicate item id ${JSON.stringify(item.id)}`);
    seen.add(item.id);
    if (item.extra_info_json) {
      let extra;
      try {
        extra = JSON.parse(item.extra_info_json);
      } catch (err) {
        return invalid(`item ${JSON.stringify(item.id)}: extra_info_json is not JSON: ${err.message}`);
      }
      if (extra === null || typeof extra !== 'object' || Array.isArray(extra)) {
        return invalid(`item ${JSON.stringify(item.id)}: extra_info_json must be a JSON object`);
      }
    }
  }
  return null;
}

// One result per item, in order. An item that cannot be scored gets ok=false
// and the reason; a score that is not a finite number is such a case too.
function score(call, callback) {
  const items = call.request.items || [];
  const problem = checkRequest(items);
  if (problem) {
    stats.lastError = problem.details;
    callback(problem);
    return;
  }
  const results = [];
  for (const item of items) {
    if (call.cancelled) return; // the deadline passed or the client left: stop working for it
    try {
      const value = Number(scoreItem(item));
      if (!Number.isFinite(value)) throw new Error(`reward is ${value}`);
      results.push({ id: item.id, score: value, ok: true, error: '' });
    } catch (err) {
      results.push({ id: item.id, score: 0, ok: false, error: String(err.message || err) });
    }
  }
  stats.scored += results.length;
  callback(null, { results });
}

function getStatus(call, callback) {
  callback(null, { role: 'reward', ready: true, last_error: stats.lastError,
                   stats: { scored: stats.scored } });
}

const SERVING = 'SERVING';
function healthCheck(call, callback) {
  const name = call.request.service;
  if (name === '' || name === 'rlfleet.v1.Reward') {
    callback(null, { status: SERVING });
  } else {
    callback({ code: grpc.status.NOT_FOUND, details: `unknown service ${name}` });
  }
}

function healthWatch(call) {
  const name = call.request.service;
  const known = name === '' || name === 'rlfleet.v1.Reward';
  call.write({ status: known ? SERVING : 'SERVICE_UNKNOWN' });
  // The status never changes while the process lives; the stream ends when the client leaves.
}

const server = new grpc.Server();
server.addService(rewardProto.rlfleet.v1.Reward.service, { Score: score, GetStatus: getStatus });
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
  server.tryShutdown(() => process.exit(0));
  setTimeout(() => server.forceShutdown(), 5000).unref();
}
process.on('SIGTERM', () => stop('SIGTERM'));
process.on('SIGINT', () => stop('SIGINT'));
