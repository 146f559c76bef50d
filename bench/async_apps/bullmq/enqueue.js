// Enqueue N jobs for BullMQ's worker of bench/async_io.py (worker.js):
//
//     node enqueue.js N
//
// Queue.addBulk, 1,000 jobs a call, one call at a time; every job is added with
// removeOnComplete: true (its hash and id are deleted when it completes, as arq's
// keep_result 0 and saq's ttl=-1 do) and BullMQ's default removeOnFail (a failed job is
// kept in the failed set). BENCH_REDIS_URL names the server; the enqueue is not part of
// the measured drain.
'use strict';

const { Queue } = require('bullmq');
const { QUEUE, JOB_NAME, redisOptions } = require('./common');

const BATCH = 1000;

async function main() {
  const jobs = Number(process.argv[2]);
  if (!Number.isInteger(jobs) || jobs < 0) {
    throw new Error(`usage: node enqueue.js N (not ${process.argv[2]})`);
  }
  const queue = new Queue(QUEUE, {
    connection: redisOptions(),
    defaultJobOptions: { removeOnComplete: true },
  });
  try {
    for (let start = 0; start < jobs; start += BATCH) {
      const batch = [];
      for (let i = start; i < Math.min(jobs, start + BATCH); i += 1) {
        batch.push({ name: JOB_NAME, data: { i } });
      }
      await queue.addBulk(batch);
    }
  } finally {
    await queue.close();
  }
}

main().catch((err) => {
  console.error(err);
  process.exit(1);
});
