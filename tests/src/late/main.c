/* `late-main LIB N`: prints `ready pid=PID`, waits for a line on standard input, fires
 * its own tracetest:testprobe N times, dlopens LIB and at once calls its fire(N), then
 * prints `raised=R` (how often the library saw its semaphore raised). At the next line
 * it calls fire(N) again and prints `raised=R` again (0 once no tracer holds the
 * semaphore), and it exits at the line after (or end of input). */
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/sdt.h>
#include <unistd.h>

int main(int argc, char **argv)
{
    if (argc < 3)
        return 2;
    int n = atoi(argv[2]);
    printf("ready pid=%d\n", getpid());
    fflush(stdout);
    char line[16];
    if (!fgets(line, sizeof line, stdin))
        return 3;
    for (int i = 0; i < n; i++)
        DTRACE_PROBE1(tracetest, testprobe, i);
    void *lib = dlopen(argv[1], RTLD_NOW);
    if (!lib) {
        fprintf(stderr, "%s\n", dlerror());
        return 4;
    }
    int (*fire)(int) = (int (*)(int))dlsym(lib, "fire");
    printf("raised=%d\n", fire(n));
    fflush(stdout);
    if (fgets(line, sizeof line, stdin)) {
        printf("raised=%d\n", fire(n));
        fflush(stdout);
        (void)!fgets(line, sizeof line, stdin);
    }
    return 0;
}
