/* C functions with one-letter names, which a C++ demangler would read as builtin types
 * (`f` float, `i` int, `w` wchar_t): prints `ready pid=N`, waits for a line on stdin,
 * then spins in f, i and w for the milliseconds given. */
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
#include <unistd.h>

static double now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1e3 + ts.tv_nsec / 1e6;
}

__attribute__((noinline)) long w(long n)
{
    long s = 0;
    for (long k = 0; k < n; k++)
        s += k ^ (s >> 2);
    return s;
}

__attribute__((noinline)) long i(long n) { return w(n) + 1; }

__attribute__((noinline)) long f(long n) { return i(n) + 1; }

int main(int argc, char **argv)
{
    printf("ready pid=%d\n", getpid());
    fflush(stdout);
    char line[16];
    if (!fgets(line, sizeof line, stdin))
        return 2;
    double end = now_ms() + (argc > 1 ? atof(argv[1]) : 1000);
    volatile long sink = 0;
    while (now_ms() < end)
        sink += f(100000);
    printf("spun\n");
    return 0;
}
