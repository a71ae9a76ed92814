"""A Python program that collects garbage often, timing each collection itself through
`gc.callbacks` (the interpreter's own start and stop of every collection, with its
generation), for the tests that measure CPython's GC from outside.

Protocol (as the other targets): with --wait-for-signal it prints `ready pid=N` and
waits for SIGUSR1; at the end it prints one JSON line: collections by generation and the
time between each start and stop callback, then (with --wait-for-signal) waits for
another SIGUSR1 to exit, so that a tracer can be stopped before the collections of the
interpreter's exit. With `--rounds N` instead of SECONDS it does a fixed amount of work
(the benchmark's), prints its JSON with `ns`, the time the work took, and exits. Usage:
gc_workload.py SECONDS|--rounds N [--wait-for-signal].
"""

import gc
import json
import os
import signal
import sys
import time

started = {}
by_generation = {}
total_ns = 0


def on_gc(phase, info):
    global total_ns
    generation = info["generation"]
    if phase == "start":
        started[generation] = time.perf_counter_ns()
        return
    elapsed = time.perf_counter_ns() - started.pop(generation)
    count, ns = by_generation.get(generation, (0, 0))
    by_generation[generation] = (count + 1, ns + elapsed)
    total_ns += elapsed


class Node:
    def __init__(self, parent):
        self.parent = parent
        self.children = []
        if parent is not None:
            parent.children.append(self)


def make_cycles(n):
    """Trees whose nodes point at each other: garbage only the collector frees."""
    keep = []
    for i in range(n):
        root = Node(None)
        for _ in range(8):
            Node(root)
        if i % 50 == 0:
            keep.append(root)
    return len(keep)


def main():
    fixed_rounds = int(sys.argv[2]) if sys.argv[1] == "--rounds" else None
    seconds = float(sys.argv[1]) if fixed_rounds is None else 0.0
    wait = "--wait-for-signal" in sys.argv
    # Few, large collections: each spans far more than the callbacks' own cost, which
    # the callbacks' timing includes.
    gc.set_threshold(50000, 5, 5)
    live = [Node(None) for _ in range(200000)]
    if wait:
        signal.signal(signal.SIGUSR1, lambda *_: None)
        print(f"ready pid={os.getpid()}", flush=True)
        signal.pause()
    gc.callbacks.append(on_gc)
    began = time.perf_counter_ns()
    deadline = time.perf_counter() + seconds
    rounds = 0
    while (
        rounds < fixed_rounds if fixed_rounds is not None else time.perf_counter() < deadline
    ):
        make_cycles(2000)
        rounds += 1
        if rounds % 10 == 0:
            gc.collect(rounds // 10 % 3)
    del live
    elapsed = time.perf_counter_ns() - began
    gc.callbacks.remove(on_gc)
    print(
        json.dumps(
            {
                "collections": sum(c for c, _ in by_generation.values()),
                "by_generation": {str(g): c for g, (c, _) in sorted(by_generation.items())},
                "total_ns": total_ns,
                "ns": elapsed,
            }
        ),
        flush=True,
    )
    if wait and fixed_rounds is None:
        signal.pause()


main()
