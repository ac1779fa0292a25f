// bench/bullmq/life.js -- BullMQ's side of bench/life.lua: one phase of a
// no-op job's whole life on a Redis of the loopback, so that bench/life.lua
// can read the server's CPU (INFO) between the phases, as it does for moonjob.
//
//   node life.js PORT JOBS add QUEUE        addBulk of JOBS jobs, 1000 a call
//   node life.js PORT JOBS inproc QUEUE     2 Workers, concurrency 50, async no-op
//   node life.js PORT JOBS sandboxed QUEUE  2 Workers, noop_processor.js, concurrency 2
//   node life.js version                    the BullMQ version in use
//
// Prints one JSON line: the phase, the BullMQ version, the jobs, the phase's
// wall time (t0, t1: epoch ms; seconds) and its jobs/s. A drain's time runs
// from the Workers' creation to the last job's "completed" event. Every other
// option is BullMQ's default (no removeOnComplete), as a new user has it.
// BULLMQ_DIR: the folder whose node_modules holds bullmq (default this one's).
'use strict';
const path = require('path');

const dir = process.env.BULLMQ_DIR || __dirname;
const modules = path.join(dir, 'node_modules');
const CHUNK = 1000;
const DEADLINE_MS = 600 * 1000;

function fail(message) {
  process.stderr.write(`life.js: ${message}\n`);
  process.exit(1);
}

function version() {
  return require(path.join(modules, 'bullmq', 'package.json')).version;
}

function parseArgs(argv) {
  const [port, jobs, phase, queue] = argv;
  if (!/^\d+$/.test(port || '')) fail(`bad port ${JSON.stringify(port)}`);
  if (!/^\d+$/.test(jobs || '') || Number(jobs) < 1) fail(`bad job count ${JSON.stringify(jobs)}`);
  if (!['add', 'inproc', 'sandboxed'].includes(phase)) fail(`bad mode ${JSON.stringify(phase)} (add, inproc or sandboxed)`);
  if (!queue) fail('no queue name');
  return { connection: { host: '127.0.0.1', port: Number(port) }, jobs: Number(jobs), phase, queue };
}

async function add(bullmq, args) {
  const queue = new bullmq.Queue(args.queue, { connection: args.connection });
  await queue.waitUntilReady();
  const t0 = Date.now();
  for (let first = 1; first <= args.jobs; first += CHUNK) {
    const bulk = [];
    for (let n = first; n < first + CHUNK && n <= args.jobs; n++) bulk.push({ name: 'noop', data: { n } });
    await queue.addBulk(bulk);
  }
  const t1 = Date.now();
  await queue.close();
  return { t0, t1 };
}

async function drain(bullmq, args) {
  const sandboxed = args.phase === 'sandboxed';
  const processor = sandboxed ? path.join(__dirname, 'noop_processor.js') : async () => {};
  const opts = { connection: args.connection, concurrency: sandboxed ? 2 : 50 };
  let completed = 0;
  let finish;
  const done = new Promise((resolve, reject) => { finish = { resolve, reject }; });
  const t0 = Date.now();
  const workers = [new bullmq.Worker(args.queue, processor, opts), new bullmq.Worker(args.queue, processor, opts)];
  for (const worker of workers) {
    worker.on('completed', () => { if (++completed === args.jobs) finish.resolve(Date.now()); });
    worker.on('failed', (job, err) => finish.reject(new Error(`job ${job && job.id} failed: ${err && err.message}`)));
    worker.on('error', (err) => finish.reject(err));
  }
  const timer = setTimeout(() => finish.reject(new Error(`${completed} of ${args.jobs} jobs done in ${DEADLINE_MS / 1000} s`)), DEADLINE_MS);
  const t1 = await done;
  clearTimeout(timer);
  await Promise.all(workers.map((worker) => worker.close()));
  return { t0, t1 };
}

async function main() {
  if (process.argv[2] === 'version') {
    process.stdout.write(JSON.stringify({ version: version() }) + '\n');
    return;
  }
  const args = parseArgs(process.argv.slice(2));
  const bullmq = require(path.join(modules, 'bullmq'));
  const { t0, t1 } = args.phase === 'add' ? await add(bullmq, args) : await drain(bullmq, args);
  const seconds = (t1 - t0) / 1000;
  process.stdout.write(JSON.stringify({
    phase: args.phase, version: version(), jobs: args.jobs, t0, t1, seconds, rate: args.jobs / seconds,
  }) + '\n');
}

main().then(() => process.exit(0), (err) => fail(err && err.stack || String(err)));
