/* Target of the specifier-grammar tests: probes in two providers, one named with quotes
 * (`"probe1"`, as bpftrace's usdt_quoted_probe has it). Fires each once; with `wait` it
 * then prints "ready" and waits to be killed, so its mappings can be listed. */
#include <stdio.h>
#include <string.h>
#include <sys/sdt.h>
#include <unistd.h>

int main(int argc, char **argv)
{
    volatile int value = 42;
    DTRACE_PROBE1(prov, start, value);
    DTRACE_PROBE1(prov, "probe1", value);
    DTRACE_PROBE(other, stop);
    if (argc > 1 && strcmp(argv[1], "wait") == 0) {
        printf("ready\n");
        fflush(stdout);
        pause();
    }
    return 0;
}
