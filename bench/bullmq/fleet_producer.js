// The BullMQ producer of the fleet benchmark: open loop at the plan's rate, job ids t<i>, 3
// attempts with exponential backoff from 500 ms; outcomes from QueueEvents (completed, and
// failed, which BullMQ emits only once the last attempt failed). Same protocol as the Python
// producers (bench/fleet/producers/__init__.py): READY, `GO <t0 ms>`, `RESULT <path>`.
//   node fleet_producer.js --url URL --prefix P --queue Q --plan F --out F --deadline-s S
'use strict';
const fs = require('node:fs');
const readline = require('node:readline');
const { Queue, QueueEvents } = require('bullmq');
const { options, connection, say } = require('./common');

async function main() {
  const o = options(process.argv);
  const plan = JSON.parse(fs.readFileSync(o.plan, 'utf8'));
  const n = plan.durations.length;
  const conn = connection(o.url);
  const queue = new Queue(o.queue, { connection: conn, prefix: o.prefix });
  const events = new QueueEvents(o.queue, { connection: conn, prefix: o.prefix });
  await queue.waitUntilReady();
  await events.waitUntilReady();
  const submitted = new Array(n).fill(null);
  const seen = new Array(n).fill(null);
  const outcome = new Array(n).fill(null);
  let left = n;
  let allSeen;
  const done = new Promise((resolve) => { allSeen = resolve; });
  const see = (jobId, ok) => {
    const i = Number(String(jobId).slice(1));
    if (!(i >= 0 && i < n) || outcome[i] !== null) return;
    seen[i] = Date.now();
    outcome[i] = ok ? 'ok' : 'failed';
    if (--left === 0) allSeen();
  };
  events.on('completed', ({ jobId }) => see(jobId, true));
  events.on('failed', ({ jobId }) => see(jobId, false));
  say('READY');
  const lines = readline.createInterface({ input: process.stdin });
  let t0 = null;
  for await (const line of lines) {
    const parts = line.trim().split(/\s+/);
    if (parts[0] === 'GO') { t0 = Number(parts[1]); break; }
  }
  const opts = { attempts: 3, backoff: { type: 'exponential', delay: 500 } };
  for (let i = 0; i < n; i++) {
    const delay = t0 + (i * 1000) / plan.rate - Date.now();
    if (delay > 0) await new Promise((resolve) => setTimeout(resolve, delay));
    submitted[i] = Date.now();
    await queue.add('work', { i, d: plan.durations[i] }, { ...opts, jobId: `t${i}` });
  }
  const horizon = t0 + (n * 1000) / plan.rate + Number(o['deadline-s'] || 120) * 1000;
  await Promise.race([done, new Promise((resolve) => setTimeout(resolve, Math.max(1000, horizon - Date.now())))]);
  const rows = [];
  for (let i = 0; i < n; i++) rows.push([i, `t${i}`, submitted[i], seen[i], outcome[i]]);
  fs.writeFileSync(o.out, JSON.stringify({ tasks: rows }));
  say('RESULT ' + o.out);
  await events.close();
  await queue.close();
  process.exit(0);
}

main().catch((err) => {
  say('ERROR ' + (err && err.stack ? err.stack.split('\n')[0] : err));
  process.exit(1);
});
