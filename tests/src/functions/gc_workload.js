// A Node program that collects garbage often, recording each collection as Node's own
// perf_hooks reports it (kind: 1 minor, 4 major, 8 incremental marking, 16 weak
// callbacks; duration), for the tests that measure V8's GC from outside.
//
// Protocol (as the other targets): prints `ready pid=N`, runs SECONDS of allocation at
// SIGUSR1, then prints one JSON line of what perf_hooks saw and waits for another
// SIGUSR1 to exit. Usage: node gc_workload.js SECONDS
'use strict';
const { PerformanceObserver } = require('perf_hooks');

const seconds = Number(process.argv[2] || '2');
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
  const end = Date.now() + seconds * 1000;
  let keep = [];
  while (Date.now() < end) {
    const batch = [];
    for (let i = 0; i < 10000; i++) batch.push({ x: i, y: [i] });
    if (Math.random() < 0.05) keep.push(batch);
    if (keep.length > 50) keep = [];
  }
  // perf_hooks delivers its entries asynchronously: let them arrive.
  setTimeout(() => {
    running = false;
    console.log(JSON.stringify({ kinds, minor_major_ns: minorMajorNs }));
    process.once('SIGUSR1', () => process.exit(0));
  }, 300);
}

process.once('SIGUSR1', work);
console.log('ready pid=' + process.pid);
setInterval(() => {}, 1000);
