#!/bin/sh
# Smoke test of a tracer install: run gc-demo, attach tracer to it, check that every GC
# was counted and that the off-CPU flamegraph was written. Exits 0 on success, 1 on any
# failure (with the reason and the tracer's output on stderr).
#
# Runs as is on a host (as root) and in the privileged container of tests/docker:
#   TRACER=target/release/tracer GC_DEMO=target/release/gc-demo sh tests/smoke.sh
# TRACER and GC_DEMO default to `tracer` and `gc-demo` on $PATH; GCS (default 10) is the
# number of collections gc-demo runs. With OUT set (the container sets OUT=/out), the
# results stay in that directory, for whoever mounted it to check them: report.txt (the
# tracer's report: GC histograms, tasks, threads), tracer.err, demo.out (gc-demo's
# `ready pid=` line and its own measurements, one JSON line) and profile/ (flamegraphs).
set -u

TRACER=${TRACER:-tracer}
GC_DEMO=${GC_DEMO:-gc-demo}
GCS=${GCS:-10}

if [ -n "${OUT:-}" ]; then
    work=$OUT
    mkdir -p "$work" || exit 1
    rm -rf "$work/profile" "$work/report.txt" "$work/tracer.err" "$work/demo.out"
else
    work=$(mktemp -d "${TMPDIR:-/tmp}/tracer-smoke.XXXXXX") || exit 1
fi
demo_pid=
tracer_pid=
cleanup() {
    [ -n "$tracer_pid" ] && kill "$tracer_pid" 2>/dev/null
    [ -n "$demo_pid" ] && kill "$demo_pid" 2>/dev/null
    [ -n "${OUT:-}" ] || rm -rf "$work"
}
trap cleanup EXIT
trap 'exit 1' INT TERM

fail() {
    echo "smoke: FAIL: $*" >&2
    for log in tracer.err report.txt demo.out; do
        if [ -s "$work/$log" ]; then
            echo "--- $log" >&2
            cat "$work/$log" >&2
        fi
    done
    exit 1
}

# Waits up to 10 s for a line starting with $2 in file $1; fails if process $3 exits first.
wait_for_line() {
    tries=0
    until grep -q "^$2" "$1" 2>/dev/null; do
        kill -0 "$3" 2>/dev/null || fail "$4 exited before printing '$2'"
        tries=$((tries + 1))
        [ "$tries" -le 200 ] || fail "no '$2' from $4 after 10 s"
        sleep 0.05
    done
}

# gc-demo prints `ready pid=PID`, then waits for SIGUSR1 so the tracer attaches first.
"$GC_DEMO" --gcs "$GCS" --pause-ms 10 --interval-ms 20 --wait-for-signal \
    >"$work/demo.out" 2>&1 &
demo_pid=$!
wait_for_line "$work/demo.out" "ready pid=" "$demo_pid" "gc-demo"
echo "smoke: gc-demo is pid $demo_pid in PID namespace $(readlink /proc/self/ns/pid)"

"$TRACER" attach --pid "$demo_pid" -o "$work/profile" \
    >"$work/report.txt" 2>"$work/tracer.err" &
tracer_pid=$!
wait_for_line "$work/tracer.err" "Attached" "$tracer_pid" "tracer"

kill -USR1 "$demo_pid" || fail "cannot signal gc-demo"
wait "$demo_pid" || fail "gc-demo failed"
demo_pid=
# The tracer stops by itself once the target has exited.
wait "$tracer_pid" || fail "tracer failed"
tracer_pid=

grep -q "target exited" "$work/tracer.err" || fail "the tracer did not notice the target exit"
grep -q "^GC: $GCS collections" "$work/report.txt" ||
    fail "expected 'GC: $GCS collections' in the report"
svg="$work/profile/offcpu.svg"
[ -s "$svg" ] || fail "no flamegraph at $svg"
grep -q "<svg" "$svg" || fail "$svg is not an SVG"
[ -s "$work/profile/offcpu.folded" ] || fail "no folded stacks"

echo "smoke: OK: $GCS GCs counted, flamegraph written ($(wc -c <"$svg") bytes)"
