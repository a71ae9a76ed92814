"""Python calling into a real Julia 1.13 runtime (the juliac-compiled bundle of the
`ace-jax-coupling` wheel, built without USDT probes), both collecting garbage, for the
test that tells the two runtimes' collections apart. Julia's own record is its `gc_num`
(collections in `pause`) and `jl_gc_total_hrtime` (nanoseconds marking and sweeping);
Python's is `gc.callbacks`.

Protocol (as the other targets): prints `ready pid=N`, works at SIGUSR1, prints one JSON
line of both runtimes' records, then waits for another SIGUSR1 to exit. Usage (with the
bundle's venv python): julia_gc.py [COUPLINGS] [COLLECTIONS]
"""

import ctypes
import gc
import glob
import itertools
import json
import os
import signal
import sys

from ace_jax_coupling import _api, _loader

couplings = int(sys.argv[1]) if len(sys.argv) > 1 else 3
collections = int(sys.argv[2]) if len(sys.argv) > 2 else 100

_loader.lib()
library = glob.glob(
    os.path.join(os.path.dirname(_loader.__file__), "_lib/lib/julia/*libjulia-internal.so.1.*")
)[0]
julia = ctypes.CDLL(library)


class GcNum(ctypes.Structure):
    """`jl_gc_num_t` of Julia 1.13 (232 bytes)."""

    _fields_ = (
        [(n, ctypes.c_int64) for n in ("allocd", "deferred_alloc", "freed")]
        + [
            (n, ctypes.c_uint64)
            for n in (
                "malloc", "realloc", "poolalloc", "bigalloc", "freecall",
                "total_time", "total_allocd", "interval",
            )
        ]
        + [("pause", ctypes.c_int), ("full_sweep", ctypes.c_int)]
        + [
            (n, ctypes.c_uint64)
            for n in (
                "max_pause", "max_memory", "time_to_safepoint", "max_time_to_safepoint",
                "total_time_to_safepoint", "sweep_time", "mark_time", "stack_pool_sweep_time",
                "total_sweep_time", "total_sweep_page_walk_time", "total_sweep_madvise_time",
                "total_sweep_free_mallocd_memory_time", "total_mark_time",
                "total_stack_pool_sweep_time", "last_full_sweep", "last_incremental_sweep",
                "image_remset_size",
            )
        ]
    )


assert ctypes.sizeof(GcNum) == 232
julia.ijl_gc_num.restype = GcNum
julia.ijl_gc_total_hrtime.restype = ctypes.c_uint64
julia.ijl_gc_collect.argtypes = [ctypes.c_int]

python_collections = 0


def on_python_gc(phase, info):
    global python_collections
    if phase == "stop":
        python_collections += 1


def record():
    num = julia.ijl_gc_num()
    return num.pause, julia.ijl_gc_total_hrtime()


# Enough work for Julia to collect by itself: about 0.3 s and 70 ms of collections each.
orbitals = [(n, l) for n in range(1, 4) for l in range(5)]
harmonics = [(l, m) for l in range(5) for m in range(-l, l + 1)]
bases = [list(c) for c in itertools.combinations_with_replacement(orbitals, 4)][:1500]

signal.signal(signal.SIGUSR1, lambda *_: None)
print(f"ready pid={os.getpid()}", flush=True)
signal.pause()
gc.callbacks.append(on_python_gc)
pauses, hrtime = record()
for _ in range(couplings):
    _api.couple_raw(bases, orbitals, harmonics)
for i in range(collections):
    julia.ijl_gc_collect(1 if i % 10 == 0 else 0)
    # Python garbage too: cycles only its collector frees.
    junk = [[] for _ in range(2000)]
    for a, b in zip(junk, junk[1:]):
        a.append(b)
        b.append(a)
    del junk
pauses_after, hrtime_after = record()
gc.callbacks.remove(on_python_gc)
print(
    json.dumps(
        {
            "julia_collections": pauses_after - pauses,
            "julia_gc_ns": hrtime_after - hrtime,
            "python_collections": python_collections,
        }
    ),
    flush=True,
)
signal.pause()
