"""The Python target of `cargo xtask bench`, figure 8 (the cost of Python frames): threads
that switch often, each time from deep in Python.

Every unit of work is a descent through DEPTH nested Python calls that do a little
arithmetic on the way down; at the bottom, two threads hand a token to each other through
a pair of queue.Queue, one sleeps briefly, one computes. Each thread blocks and wakes from
the bottom of its descent, so every context switch leaves or finds a Python stack DEPTH
frames deep.

Protocol (as the Rust target programs): with --wait-for-signal it prints `ready pid=N`
and waits for SIGUSR1; then it works for --seconds (default 3) and prints one JSON line:
`ops`, the descents completed by all threads (the throughput), and each thread's own.
"""

import argparse
import json
import os
import queue
import signal
import threading
import time

DEPTH = 20
# Sleeps short enough that the sleeper switches often, long enough to leave the CPU.
NAP_SECONDS = 0.0002
# Descents the cruncher does between two sleeps: it yields the GIL at each sleep, so the
# ping-pong is never held up for a whole switch interval behind it.
CRUNCH_BATCH = 20

done = {}
done_lock = threading.Lock()


def descend(depth, bottom, acc=0):
    """`bottom()` at the end of `depth` nested calls, each adding a little arithmetic."""
    acc = (acc * 31 + depth) % 1000003
    if depth == 0:
        bottom()
        return acc
    return descend(depth - 1, bottom, acc)


def count(name, ops):
    with done_lock:
        done[name] = ops


def ping(end, there, back):
    ops = 0
    while time.perf_counter() < end:
        descend(DEPTH, lambda: (there.put(ops), back.get()))
        ops += 1
    there.put(None)
    count("ping", ops)


def pong(there, back):
    ops = 0
    token = []

    def answer():
        token[:] = [there.get()]
        if token[0] is not None:
            back.put(token[0])

    while True:
        descend(DEPTH, answer)
        if token[0] is None:
            break
        ops += 1
    count("pong", ops)


def sleeper(end):
    ops = 0
    while time.perf_counter() < end:
        descend(DEPTH, lambda: time.sleep(NAP_SECONDS))
        ops += 1
    count("sleeper", ops)


def cruncher(end):
    ops = 0
    while time.perf_counter() < end:
        for _ in range(CRUNCH_BATCH):
            descend(DEPTH, lambda: None)
        ops += CRUNCH_BATCH
        descend(DEPTH, lambda: time.sleep(0))
    count("cruncher", ops)


def run(seconds):
    end = time.perf_counter() + seconds
    there, back = queue.Queue(), queue.Queue()
    threads = [
        threading.Thread(target=ping, args=(end, there, back), name="ping"),
        threading.Thread(target=pong, args=(there, back), name="pong"),
        threading.Thread(target=sleeper, args=(end,), name="sleeper"),
        threading.Thread(target=cruncher, args=(end,), name="cruncher"),
    ]
    started = time.perf_counter_ns()
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    elapsed_ns = time.perf_counter_ns() - started
    return dict(ops=sum(done.values()), ns=elapsed_ns, **done)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=3.0)
    parser.add_argument("--wait-for-signal", action="store_true")
    args = parser.parse_args()
    if args.wait_for_signal:
        signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGUSR1})
        print(f"ready pid={os.getpid()}", flush=True)
        signal.sigwait({signal.SIGUSR1})
    print(json.dumps(run(args.seconds)), flush=True)


if __name__ == "__main__":
    main()
