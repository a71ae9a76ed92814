"""A Python service in miniature for the tracer's tests: threads that spin under a lock,
sleep, collect garbage and wait on a socket, each timing itself.

Protocol (as the Rust target programs): with --wait-for-signal it prints `ready pid=N`
and waits for SIGUSR1; at the end it prints one JSON line of what it measured. With
--park it instead parks every thread where it blocks for good, prints `parked` and the
stacks Python itself sees (`sys._current_frames()`) as JSON, then waits for stdin to close.
"""

import gc
import json
import os
import signal
import socket
import sys
import threading
import time

SECONDS = 2.0
spent = {}
tids = {}
spent_lock = threading.Lock()
work_lock = threading.Lock()


def add(name, ns):
    with spent_lock:
        spent[name] = spent.get(name, 0) + ns


def named_thread(target):
    """`target`, noting the thread's id under its name first."""

    def run(*args):
        tids[threading.current_thread().name] = threading.get_native_id()
        return target(*args)

    return run


def spin_python(seconds):
    start = time.perf_counter_ns()
    total = 0
    with work_lock:
        deadline = time.perf_counter() + seconds
        while time.perf_counter() < deadline:
            for i in range(2000):
                total += i * i
    add("spin_python", time.perf_counter_ns() - start)
    return total


def nap(seconds):
    start = time.perf_counter_ns()
    time.sleep(seconds)
    add("nap", time.perf_counter_ns() - start)


def cpu_worker(end):
    while time.perf_counter() < end:
        spin_python(0.02)
        nap(0.02)


def sleep_in_python(end):
    start = time.perf_counter_ns()
    while time.perf_counter() < end:
        time.sleep(0.05)
    add("sleep_in_python", time.perf_counter_ns() - start)


class Node:
    def __init__(self):
        self.peer = self


def churn_garbage():
    start = time.perf_counter_ns()
    junk = [Node() for _ in range(20000)]
    del junk
    gc.collect()
    add("churn_garbage", time.perf_counter_ns() - start)


def collector(end):
    while time.perf_counter() < end:
        churn_garbage()
        nap(0.01)


def wait_on_socket(sock):
    start = time.perf_counter_ns()
    data = sock.recv(1)
    add("wait_on_socket", time.perf_counter_ns() - start)
    return data


def run_workload():
    end = time.perf_counter() + SECONDS
    left, right = socket.socketpair()
    threads = [
        threading.Thread(target=named_thread(cpu_worker), args=(end,), name="cpu-1"),
        threading.Thread(target=named_thread(cpu_worker), args=(end,), name="cpu-2"),
        threading.Thread(
            target=named_thread(sleep_in_python), args=(end,), name="sleeper"
        ),
        threading.Thread(target=named_thread(collector), args=(end,), name="collector"),
        threading.Thread(target=named_thread(wait_on_socket), args=(left,), name="socket"),
    ]
    for thread in threads:
        thread.start()
    for thread in threads[:-1]:
        thread.join()
    right.send(b"x")
    threads[-1].join()
    return dict(spent, tids=tids)


def park_forever(event):
    event.wait()


def park():
    """Every thread blocked where it stays; Python's own view of their stacks."""
    event = threading.Event()
    left, _right = socket.socketpair()
    threads = [
        threading.Thread(target=park_forever, args=(event,), name="parked"),
        threading.Thread(target=wait_on_socket, args=(left,), name="socket"),
    ]
    for thread in threads:
        thread.daemon = True
        thread.start()
    time.sleep(0.3)
    frames = sys._current_frames()
    stacks = {}
    for thread in threading.enumerate():
        frame = frames.get(thread.ident)
        if thread is threading.current_thread() or frame is None:
            continue
        stack = []
        while frame is not None:
            stack.append([frame.f_code.co_name, frame.f_lineno])
            frame = frame.f_back
        stacks[str(thread.native_id)] = stack
    print("parked " + json.dumps(stacks), flush=True)
    sys.stdin.read()


def spin_in_child(seconds):
    deadline = time.perf_counter() + seconds
    total = 0
    while time.perf_counter() < deadline:
        total += sum(range(1000))
    return total


def child_work():
    spin_in_child(0.4)
    nap(0.4)


def supervise(children):
    for child in children:
        os.waitpid(child, 0)


def fork_workers():
    """A server forking its workers: each child works in Python, then exits."""
    children = []
    for _ in range(2):
        child = os.fork()
        if child == 0:
            child_work()
            os._exit(0)
        children.append(child)
    supervise(children)
    return {"children": children}


def allocate_cycles():
    return [Node() for _ in range(3000)]


def collect_garbage_often():
    """Collections the allocations trigger, and explicit ones."""
    explicit = 0
    for _ in range(20):
        junk = allocate_cycles()
        del junk
        gc.collect()
        explicit += 1
    return {"explicit": explicit}


def deep(levels):
    """Recursion deeper than the Python frames a stack keeps, then a sleep."""
    if levels == 0:
        time.sleep(1.0)
        return 0
    return deep(levels - 1) + 1


def fork_short_workers(count):
    """Short-lived workers one after the other, then a pause while the parent lives on."""
    children = []
    for _ in range(count):
        child = os.fork()
        if child == 0:
            spin_in_child(0.03)
            os._exit(0)
        os.waitpid(child, 0)
        children.append(child)
    print("workers done", flush=True)
    time.sleep(2.0)
    return {"children": children}


def main():
    if "--park" in sys.argv:
        park()
        return
    if "--wait-for-signal" in sys.argv:
        signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGUSR1})
        print(f"ready pid={os.getpid()}", flush=True)
        signal.sigwait({signal.SIGUSR1})
    work = run_workload
    if "--fork" in sys.argv:
        work = fork_workers
    elif "--gc" in sys.argv:
        work = collect_garbage_often
    elif "--fork-many" in sys.argv:
        work = lambda: fork_short_workers(30)
    elif "--deep" in sys.argv:
        work = lambda: {"depth": deep(100)}
    print(json.dumps(work()), flush=True)


if __name__ == "__main__":
    main()
