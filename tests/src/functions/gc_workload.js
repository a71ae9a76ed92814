// A Node program that collects garbage often, recording each collection as Node's own
// perf_hooks reports it (kind: 1 minor, 4 major, 8 incremental marking, 16 weak
// callbacks; duration), for the tests that measure V8's GC from outside.
//
// Protocol (as the other targets): prints `ready pid=N`, runs SECONDS of allocation at
// SIGUSR1, then prints one JSON line of what perf_hooks saw and waits for another
// SIGUSR1 to exit. With `--rounds N` it does a fixed amount of work instead (the
// benchmark's), prints its JSON with `ns`, the time the work took, and exits.
// Usage: node gc_workload.js SECONDS|--rounds N
'use strict';
const { PerformanceObserver } = require('perf_hooks');

const fixedRounds = process.argv[2] === '--rounds' ? Number(process.argv[3]) : null;
const seconds = fixedRounds === null ? Number(process.argv[2] || '2') : 0;
const kinds = {};
let minorMajorNs = 0;
let running = false;

const observer = new PerformanceObserver((list) => {
  for (const entry of list.getEntries()) {
    if (!running) continue;
    const kind = entry.detail ? entry.detail.kind : entry.kind;
    kinds[kind] = (kinds[kind] || 0) + 1;
    // Minor and major collections are pauses; incremental marking steps are not
    // collections of their own.
    if (kind === 1 || kind === 4) minorMajorNs += Math.round(entry.duration * 1e6);
  }
});
observer.observe({ entryTypes: ['gc'] });

function work() {
  running = true;
  const began = process.hrtime.bigint();
  const end = Date.now() + seconds * 1000;
  let keep = [];
  let rounds = 0;
  while (fixedRounds === null ? Date.now() < end : rounds++ < fixedRounds) {
    const batch = [];
    for (let i = 0; i < 10000; i++) batch.push({ x: i, y: [i] });
    if (Math.random() < 0.05) keep.push(batch);
    if (keep.length > 50) keep = [];
  }
  const ns = Number(process.hrtime.bigint() - began);
  // perf_hooks delivers its entries asynchronously: let them arrive.
  setTimeout(() => {
    running = false;
    console.log(JSON.stringify({ kinds, minor_major_ns: minorMajorNs, ns }));
    if (fixedRounds !== null) process.exit(0);
    process.once('SIGUSR1', () => process.exit(0));
  }, 300);
}

process.once('SIGUSR1', work);
console.log('ready pid=' + process.pid);
setInterval(() => {}, 1000);
