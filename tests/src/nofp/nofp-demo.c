/* A target without frame pointers for tests/tests/unwind.rs: main -> chain_a ->
 * chain_b -> chain_c -> spin_leaf, for argv[1] milliseconds: on CPU spinning in user
 * mode, or with `read` reading /dev/zero (mostly in the kernel, entered through glibc),
 * or with `sleep` off CPU in 2 ms sleeps (nanosleep through glibc), or with `naps`
 * alternating nap_short (1 ms) and nap_long (3 ms): two callers that block at the same
 * instruction with the same stack pointer, told apart only by their return addresses;
 * or with `signal` all of it inside a signal handler (spin_leaf raises SIGUSR2 once, and
 * handler_leaf alternates spinning and 2 ms sleeps): below the handler, the kernel's
 * signal frame, then the interrupted chain.
 * Built with gcc -O2 -fomit-frame-pointer -fno-optimize-sibling-calls (no tail calls, so
 * every caller stays on the stack). Prints "ready pid=N" and, with --wait-for-signal,
 * waits for SIGUSR1 first; prints a JSON line when done. */
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

static volatile unsigned long sink;
static volatile sig_atomic_t released;
static int zero_fd = -1;
static int sleeping;
static int napping;
static int in_signal;

__attribute__((noinline)) void nap_short(void) {
    struct timespec t = {0, 1000000};
    nanosleep(&t, NULL);
}

__attribute__((noinline)) void nap_long(void) {
    struct timespec t = {0, 3000000};
    nanosleep(&t, NULL);
}
static char buf[1 << 16];

static void on_usr1(int sig) { (void)sig; released = 1; }

static double now_ms(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1e3 + ts.tv_nsec / 1e6;
}

static double handler_until_ms;

__attribute__((noinline)) void handler_leaf(void) {
    unsigned long n = 0;
    while (now_ms() < handler_until_ms) {
        if (n++ & 1) {
            struct timespec two_ms = {0, 2000000};
            nanosleep(&two_ms, NULL);
        } else {
            double spin_until = now_ms() + 2;
            while (now_ms() < spin_until) sink += n;
        }
    }
}

static void on_usr2(int sig) { (void)sig; handler_leaf(); }

__attribute__((noinline)) unsigned long spin_leaf(double until_ms) {
    unsigned long n = 0;
    if (in_signal) {
        handler_until_ms = until_ms;
        signal(SIGUSR2, on_usr2);
        raise(SIGUSR2);
        return 1;
    }
    while (now_ms() < until_ms) {
        if (napping) {
            if (n & 1) nap_long(); else nap_short();
        } else if (sleeping) {
            struct timespec two_ms = {0, 2000000};
            nanosleep(&two_ms, NULL);
        } else if (zero_fd >= 0) {
            for (int i = 0; i < 16; i++) sink += read(zero_fd, buf, sizeof buf);
        } else {
            for (int i = 0; i < 100000; i++) sink += i;
        }
        n++;
    }
    return n;
}

__attribute__((noinline)) unsigned long chain_c(double until_ms) {
    unsigned long n = spin_leaf(until_ms);
    sink += n;
    return n + 1;
}

__attribute__((noinline)) unsigned long chain_b(double until_ms) {
    unsigned long n = chain_c(until_ms);
    sink += n;
    return n + 1;
}

__attribute__((noinline)) unsigned long chain_a(double until_ms) {
    unsigned long n = chain_b(until_ms);
    sink += n;
    return n + 1;
}

int main(int argc, char **argv) {
    double ms = argc > 1 ? atof(argv[1]) : 1000;
    int wait = 0;
    for (int i = 2; i < argc; i++) {
        if (strcmp(argv[i], "--wait-for-signal") == 0) wait = 1;
        if (strcmp(argv[i], "read") == 0) zero_fd = open("/dev/zero", O_RDONLY);
        if (strcmp(argv[i], "sleep") == 0) sleeping = 1;
        if (strcmp(argv[i], "naps") == 0) napping = 1;
        if (strcmp(argv[i], "signal") == 0) in_signal = 1;
    }
    sigset_t usr1, old;
    sigemptyset(&usr1);
    sigaddset(&usr1, SIGUSR1);
    sigprocmask(SIG_BLOCK, &usr1, &old);
    signal(SIGUSR1, on_usr1);
    printf("ready pid=%d\n", (int)getpid());
    fflush(stdout);
    if (wait)
        while (!released) sigsuspend(&old);
    unsigned long n = chain_a(now_ms() + ms);
    printf("{\"rounds\": %lu}\n", n);
    return 0;
}
