// A BullMQ worker process: concurrency 8 (by default), a no-op processor returning the job data.
// Line protocol with the harness: prints READY once connected, starts on GO, exits on STOP.
//   node worker.js --url URL --prefix P --queue Q --concurrency 8
'use strict';
const readline = require('node:readline');
const { Worker } = require('bullmq');
const { options, connection, say } = require('./common');

async function main() {
  const o = options(process.argv);
  const worker = new Worker(o.queue, async (job) => job.data, {
    connection: connection(o.url),
    prefix: o.prefix,
    concurrency: Number(o.concurrency || 8),
    autorun: false,
  });
  worker.on('error', (err) => say('LOG worker error ' + err));
  await worker.waitUntilReady();
  say('READY');
  const lines = readline.createInterface({ input: process.stdin });
  let running = null;
  for await (const line of lines) {
    const cmd = line.trim();
    if (cmd === 'GO' && !running) {
      running = worker.run();
    } else if (cmd === 'STOP') {
      break;
    }
  }
  await worker.close();
  if (running) await running;
  process.exit(0);
}

main().catch((err) => {
  say('ERROR ' + (err && err.stack ? err.stack.split('\n')[0] : err));
  process.exit(1);
});
