// The BullMQ producer: enqueue rate (one add at a time, or addBulk) and round trips.
// Prints one line `RESULT {json}` with the elapsed seconds (and round-trip latencies in ms).
//   node producer.js --url URL --prefix P --queue Q --mode one|many|rt --n N
'use strict';
const { Queue, QueueEvents } = require('bullmq');
const { options, connection, say } = require('./common');

async function main() {
  const o = options(process.argv);
  const n = Number(o.n);
  const conn = connection(o.url);
  const queue = new Queue(o.queue, { connection: conn, prefix: o.prefix });
  await queue.waitUntilReady();
  const result = { mode: o.mode, n };
  if (o.mode === 'one') {
    const start = performance.now();
    for (let i = 0; i < n; i++) await queue.add('noop', { i });
    result.elapsed_s = (performance.now() - start) / 1000;
  } else if (o.mode === 'many') {
    const jobs = [];
    const start = performance.now();
    for (let i = 0; i < n; i++) jobs.push({ name: 'noop', data: { i } });
    await queue.addBulk(jobs);
    result.elapsed_s = (performance.now() - start) / 1000;
  } else if (o.mode === 'rt') {
    const events = new QueueEvents(o.queue, { connection: conn, prefix: o.prefix });
    await events.waitUntilReady();
    const latencies = [];
    for (let i = 0; i < n; i++) {
      const start = performance.now();
      const job = await queue.add('noop', { i });
      await job.waitUntilFinished(events, 30000);
      latencies.push(performance.now() - start);
    }
    result.latencies_ms = latencies;
    await events.close();
  } else {
    throw new Error('unknown mode ' + o.mode);
  }
  await queue.close();
  say('RESULT ' + JSON.stringify(result));
  process.exit(0);
}

main().catch((err) => {
  say('ERROR ' + (err && err.stack ? err.stack.split('\n')[0] : err));
  process.exit(1);
});
