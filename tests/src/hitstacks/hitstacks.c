// A target for tests/tests/hit_stacks.rs: fires hitstacks:hit argv[1] times from
// path_a and argv[2] times from path_b, through call chains the test knows
// (main -> run_a -> path_a, main -> run_b -> path_b). Built with
// -fno-omit-frame-pointer so the kernel can walk its stacks. Sleeps argv[3] ms (default
// 200) before and after, so a tracer given its PID attaches first and a stack read at
// the end finds the process still there.
#include <stdio.h>
#include <stdlib.h>
#include <sys/sdt.h>
#include <unistd.h>

static volatile int sink;

__attribute__((noinline)) void consume(int i) { sink += i; }

// Not leaves, so they have frames of their own (GCC leaves leaf functions without one
// even with -fno-omit-frame-pointer, and a frame-pointer walk from a probe in such a
// function skips its caller). The probe comes after a call, once the frame is set up.
__attribute__((noinline)) void path_a(int i) {
    consume(i);
    DTRACE_PROBE1(hitstacks, hit, 1);
    consume(i);
}

__attribute__((noinline)) void path_b(int i) {
    consume(i);
    DTRACE_PROBE1(hitstacks, hit, 2);
    consume(i);
}

__attribute__((noinline)) void run_a(int n) {
    for (int i = 0; i < n; i++) path_a(i);
    sink++;
}

__attribute__((noinline)) void run_b(int n) {
    for (int i = 0; i < n; i++) path_b(i);
    sink++;
}

int main(int argc, char **argv) {
    int a = argc > 1 ? atoi(argv[1]) : 30;
    int b = argc > 2 ? atoi(argv[2]) : 70;
    int pause_ms = argc > 3 ? atoi(argv[3]) : 200;
    printf("ready pid=%d\n", (int)getpid());
    fflush(stdout);
    usleep(pause_ms * 1000);
    run_a(a);
    run_b(b);
    usleep(pause_ms * 1000);
    return sink == 0;
}
