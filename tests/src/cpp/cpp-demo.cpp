// A C++ target for tests/tests/profile.rs: on CPU for argv[1] milliseconds in
// demo::Worker<int>::spin(double), so the profile must demangle C++ names (templates,
// namespaces, argument types). Built with g++ -O2 -fno-omit-frame-pointer. Prints
// "ready pid=N"; with --wait-for-signal waits for SIGUSR1 first.
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <unistd.h>

static volatile unsigned long sink;
static volatile sig_atomic_t released;

static void on_usr1(int) { released = 1; }

static double now_ms() {
    timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1e3 + ts.tv_nsec / 1e6;
}

namespace demo {
template <typename T> struct Worker {
    T step;
    __attribute__((noinline)) unsigned long spin(double until_ms) {
        unsigned long n = 0;
        while (now_ms() < until_ms) {
            for (T i = 0; i < 100000; i += step) sink += i;
            n++;
        }
        return n;
    }
};
} // namespace demo

int main(int argc, char **argv) {
    double ms = argc > 1 ? atof(argv[1]) : 1000;
    bool wait = argc > 2 && strcmp(argv[2], "--wait-for-signal") == 0;
    sigset_t usr1, old;
    sigemptyset(&usr1);
    sigaddset(&usr1, SIGUSR1);
    sigprocmask(SIG_BLOCK, &usr1, &old);
    signal(SIGUSR1, on_usr1);
    printf("ready pid=%d\n", (int)getpid());
    fflush(stdout);
    if (wait)
        while (!released) sigsuspend(&old);
    demo::Worker<int> worker{1};
    unsigned long n = worker.spin(now_ms() + ms);
    printf("{\"rounds\": %lu}\n", n);
    return 0;
}
