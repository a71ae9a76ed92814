// A target for function probes: a recursive function timed per call, and one whose
// arguments and return value are known. Protocol of the tests' `Target`: prints
// `ready pid=N`, waits for SIGUSR1 with --wait-for-signal, runs, then prints its own
// counts as one JSON line.
//
// Usage: functions ROUNDS DEPTH [--wait-for-signal]
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

static volatile sig_atomic_t released;
static void on_usr1(int sig) { (void)sig; released = 1; }

static long calls;

// Recurses `depth` levels; the innermost call sleeps 1 ms, so each level's call lasts at
// least that long, the outer ones longer.
__attribute__((noinline)) long descend(long depth) {
    calls++;
    if (depth <= 1) {
        struct timespec ms = {0, 1000000};
        nanosleep(&ms, NULL);
        return 1;
    }
    long below = descend(depth - 1);
    __asm__ volatile("" ::: "memory");
    return below + 1;
}

// Six integer arguments, returned combined.
__attribute__((noinline)) uint64_t combine(uint64_t a, uint64_t b, uint64_t c, uint64_t d,
                                           uint64_t e, uint64_t f) {
    __asm__ volatile("" ::: "memory");
    return a + 2 * b + 3 * c + 4 * d + 5 * e + 6 * f;
}

int main(int argc, char **argv) {
    if (argc < 3) {
        fprintf(stderr, "usage: functions ROUNDS DEPTH [--wait-for-signal]\n");
        return 2;
    }
    long rounds = atol(argv[1]), depth = atol(argv[2]);
    int wait = argc > 3 && strcmp(argv[3], "--wait-for-signal") == 0;
    signal(SIGUSR1, on_usr1);
    printf("ready pid=%d\n", getpid());
    fflush(stdout);
    while (wait && !released) {
        pause();
    }
    uint64_t checksum = 0;
    for (long i = 0; i < rounds; i++) {
        descend(depth);
        checksum += combine(i, i + 1, i + 2, i + 3, i + 4, i + 5);
    }
    printf("{\"calls\": %ld, \"rounds\": %ld, \"checksum\": %lu}\n", calls, rounds,
           (unsigned long)checksum);
    return 0;
}
