/* debuglink-demo: spins 2 s in a static function; the test strips every symbol from the
   binary and leaves them in a separate debug file named by .gnu_debuglink. */
#include <stdio.h>
#include <time.h>
#include <unistd.h>
static volatile unsigned long sink;
__attribute__((noinline)) static void spin_in_static_function(double secs) {
    struct timespec s, n; clock_gettime(CLOCK_MONOTONIC, &s);
    do { for (int i = 0; i < 100000; i++) sink += i; clock_gettime(CLOCK_MONOTONIC, &n); }
    while ((n.tv_sec - s.tv_sec) + (n.tv_nsec - s.tv_nsec) / 1e9 < secs);
}
int main(void) { printf("ready pid=%d\n", getpid()); fflush(stdout); spin_in_static_function(2.0); return 0; }
