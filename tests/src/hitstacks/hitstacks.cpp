// A C++ target for tests/tests/hit_stacks.rs: fires hitstacks:record argv[1] times from
// demo::Recorder<int>::record(int), so stacks at the probe must be demangled
// (namespace, template, argument types). Built with -fno-omit-frame-pointer.
#include <cstdio>
#include <cstdlib>
#include <sys/sdt.h>
#include <unistd.h>

static volatile int sink;

__attribute__((noinline)) static void store(int value) { sink = value; }

namespace demo {
template <typename T> struct Recorder {
    T total;
    // Calls before the probe: a function with a frame of its own (see hitstacks.c).
    __attribute__((noinline)) void record(T value) {
        total += value;
        store(total);
        DTRACE_PROBE1(hitstacks, record, value);
        store(total);
    }
};
} // namespace demo

int main(int argc, char **argv) {
    int n = argc > 1 ? atoi(argv[1]) : 5;
    std::printf("ready pid=%d\n", (int)getpid());
    std::fflush(stdout);
    usleep(200 * 1000);
    demo::Recorder<int> recorder{0};
    for (int i = 0; i < n; i++) recorder.record(i);
    usleep(200 * 1000);
    return 0;
}
