// BullMQ's worker for bench/async_io.py: one Node process, one BullMQ Worker on the
// queue `io` with `concurrency` jobs at once; each job waits 100 ms (a timer, standing in
// for an HTTP call) then counts itself done.
//
//     node worker.js CONCURRENCY COUNTER_KEY
//
// CONCURRENCY falls back to $BULLMQ_CONCURRENCY, then 1000; COUNTER_KEY to
// $BENCH_COUNTER_KEY, then bench:done (bench/peers/apps/bench_counter.py's key).
//
// How a job says it is done follows bench/async_apps/tally.py, chosen by BENCH_WORK:
// - `wait` (the default): a count kept in this process, added to the counter with one
//   INCRBY every 5 ms while it changed, from a client of its own; the job itself does
//   no I/O to say it finished;
// - `wait+incr`: the job INCRs the counter itself through ioredis, BullMQ's Redis client
//   (one connection of its own, which pipelines the jobs' commands).
//
// The Worker runs with BullMQ's defaults (lock 30 s, stalled check every 30 s, the
// events stream); the jobs are added with removeOnComplete: true and BullMQ's default
// removeOnFail (see enqueue.js).
'use strict';

const { setTimeout: sleep } = require('node:timers/promises');
const { Worker } = require('bullmq');
const Redis = require('ioredis');
const { QUEUE, redisOptions } = require('./common');

const WAIT_MS = 100;
const REPORT_EVERY_MS = 5; // the driver reads the counter every 10 ms

const concurrency = Number(process.argv[2] || process.env.BULLMQ_CONCURRENCY || 1000);
const counterKey = process.argv[3] || process.env.BENCH_COUNTER_KEY || 'bench:done';
const incrInJob = (process.env.BENCH_WORK || 'wait') === 'wait+incr';
if (!Number.isInteger(concurrency) || concurrency < 1) {
  throw new Error(`concurrency must be a positive integer, not ${process.argv[2]}`);
}

// tally.py's scheme: `done` only grows; a loop, started by the first job done, sends
// what was added since its last INCRBY, then sleeps 5 ms (one INCRBY at a time, as the
// reporter thread does).
let done = 0;
let reporting = false;

async function report() {
  const client = new Redis(redisOptions());
  let sent = 0;
  for (;;) {
    await sleep(REPORT_EVERY_MS);
    const now = done;
    if (now !== sent) {
      await client.incrby(counterKey, now - sent);
      sent = now;
    }
  }
}

function countDone() {
  done += 1;
  if (!reporting) {
    reporting = true;
    report().catch(fail);
  }
}

let incrClient = null;

async function waitIo() {
  await sleep(WAIT_MS);
  if (incrInJob) {
    incrClient = incrClient || new Redis(redisOptions());
    await incrClient.incr(counterKey);
  } else {
    countDone();
  }
}

function fail(err) {
  console.error(err);
  process.exit(1);
}

const worker = new Worker(QUEUE, waitIo, { connection: redisOptions(), concurrency });
worker.on('error', (err) => console.error('worker error:', err));
worker.on('failed', (job, err) => console.error(`job ${job && job.id} failed:`, err));

// The driver stops the worker with SIGTERM once the counter reads N: every job is done
// by then, so there is nothing to wait for.
process.on('SIGTERM', () => process.exit(0));
