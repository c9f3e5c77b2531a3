// A BullMQ agent of the fleet benchmark (python -m bench fleet): one Worker, concurrency 4.
// Each job sleeps for its drawn duration times this agent's factor and logs its execution the
// way bench/fleet/behaviour.py does (S/E lines in FLEET_LOG; FLEET_CONTROL says how to misbehave).
// A completion BullMQ refuses because the job's lock was lost is logged as `R <task> <agent> <ms>`.
// Prints READY once connected; exits on STOP.
//   FLEET_AGENT=a1 FLEET_LOG=F FLEET_CONTROL=F node fleet_worker.js --url URL --prefix P --queue Q
'use strict';
const fs = require('node:fs');
const readline = require('node:readline');
const { Worker } = require('bullmq');
const { options, connection, say } = require('./common');

const agent = process.env.FLEET_AGENT || 'agent';
const log = fs.openSync(process.env.FLEET_LOG || '/dev/null', 'a');
const controlPath = process.env.FLEET_CONTROL || '';
let control = {};
let controlMtime = -1;
let firstStart = null;

function readControl() {
  if (!controlPath) return control;
  try {
    const mtime = fs.statSync(controlPath).mtimeMs;
    if (mtime !== controlMtime) {
      control = JSON.parse(fs.readFileSync(controlPath, 'utf8'));
      controlMtime = mtime;
    }
  } catch (err) {
    // (the harness is renaming a new file in: read it next time)
  }
  return control;
}

function factor(c, started) {
  let f = 1;
  if (c.slow_from_ms != null && started >= c.slow_from_ms) f = c.slow_factor || 1;
  if (c.cold_ms && started < firstStart + c.cold_ms) f = Math.max(f, c.cold_factor || 1);
  return f;
}

async function work(job) {
  const task = job.data.i;
  const started = Date.now();
  if (firstStart === null) firstStart = started;
  fs.writeSync(log, `S ${task} ${agent} ${started}\n`);
  const c = readControl();
  if (c.fail) {
    fs.writeSync(log, `E ${task} ${agent} ${started} ${Date.now()} fail\n`);
    throw new Error('upstream key expired');
  }
  await new Promise((resolve) => setTimeout(resolve, job.data.d * factor(c, started)));
  fs.writeSync(log, `E ${task} ${agent} ${started} ${Date.now()} ok\n`);
  return { i: task };
}

async function main() {
  const o = options(process.argv);
  const worker = new Worker(o.queue, work, {
    connection: connection(o.url), prefix: o.prefix, concurrency: Number(o.concurrency || 4),
  });
  worker.on('error', (err) => {
    const text = String(err);
    const match = /lock/i.test(text) && /job t(\d+)/.exec(text);
    if (match) fs.writeSync(log, `R ${match[1]} ${agent} ${Date.now()}\n`);
    say('LOG worker error ' + text);
  });
  await worker.waitUntilReady();
  say('READY');
  const lines = readline.createInterface({ input: process.stdin });
  for await (const line of lines) {
    if (line.trim() === 'STOP') break;
  }
  await worker.close();
  process.exit(0);
}

main().catch((err) => {
  say('ERROR ' + (err && err.stack ? err.stack.split('\n')[0] : err));
  process.exit(1);
});
