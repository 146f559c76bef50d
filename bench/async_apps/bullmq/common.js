// What worker.js and enqueue.js share: the queue, the job's name, and the Redis that
// bench/async_io.py gives every process it starts (BENCH_REDIS_URL, the name
// bench/peers/apps/bench_counter.py reads; see measure.system_env).
'use strict';

const QUEUE = 'io';
const JOB_NAME = 'wait_io';

// The URL is taken apart here rather than handed to BullMQ as `url`: BullMQ puts host
// 127.0.0.1 and port 6379 under a URL of its own, and a benchmark must never reach a
// redis-server that may be running on 6379.
function redisOptions() {
  const text = process.env.BENCH_REDIS_URL;
  if (!text) {
    throw new Error('BENCH_REDIS_URL is not set (bench/async_io.py sets it)');
  }
  const url = new URL(text);
  const options = {};
  if (url.protocol === 'unix:') {
    options.path = decodeURIComponent(url.pathname);
    const db = url.searchParams.get('db');
    if (db) options.db = Number(db);
  } else if (url.protocol === 'redis:') {
    options.host = url.hostname || '127.0.0.1';
    options.port = url.port ? Number(url.port) : 6379;
    const db = url.pathname.replace(/^\//, '');
    if (db) options.db = Number(db);
  } else {
    throw new Error(`unsupported Redis URL ${text}`);
  }
  if (url.username) options.username = decodeURIComponent(url.username);
  if (url.password) options.password = decodeURIComponent(url.password);
  return options;
}

module.exports = { QUEUE, JOB_NAME, redisOptions };
