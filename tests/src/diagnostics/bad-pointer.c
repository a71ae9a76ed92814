/* Fires probe diag:bad N times with an argument the compiler leaves in memory at a bad
 * address (the probe is a nop, so the program never reads it; the tracer's read fails),
 * and probe diag:good with readable arguments. argv[1]: N (default 20). */
#include <stdio.h>
#include <stdlib.h>
#include <sys/sdt.h>
#include <unistd.h>

int main(int argc, char **argv) {
    int hits = argc > 1 ? atoi(argv[1]) : 20;
    /* From the pid, so the compiler cannot fold it into a constant address. */
    volatile int *bad = (int *)((long)(getpid() > 0) << 3);
    for (int i = 0; i < hits; i++) {
        DTRACE_PROBE2(diag, bad, *bad, i);
        DTRACE_PROBE1(diag, good, i);
    }
    return 0;
}
