/* A USDT site as newer SDT headers emit it: a nop then a 5-byte nop, which Linux 6.18
 * runs as an optimized uprobe (a call into a trampoline, no trap) when the uprobe is on
 * the 5-byte nop. Debian's sys/sdt.h emits the nop alone, so the 5-byte nop follows its
 * STAP_PROBE_ASM by hand. The probe passes the iteration in %rdi and a global read
 * %rip-relative (placed from the attach address, one byte past the note's).
 *
 * argv[1]: hits (default 1000). With --wait-for-signal: prints "ready pid=N", waits for
 * SIGUSR1 before firing, then prints {"fired": N, "global": G, "trampoline": T}, T
 * whether the kernel mapped a [uprobes-trampoline] into it by then (it does at the first
 * hit of an optimized uprobe), and waits for SIGUSR1 again before exiting. */
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/sdt.h>
#include <unistd.h>

unsigned long nop5_global = 0x1122334455667788UL;

static void __attribute__((noinline)) fire(unsigned long i)
{
    __asm__ __volatile__(STAP_PROBE_ASM(opt, fired, %%rdi 8@nop5_global(%%rip))
                         ".byte 0x0f, 0x1f, 0x44, 0x00, 0x00\n"
                         :
                         : "D"(i));
}

int main(int argc, char **argv)
{
    unsigned long hits = 1000;
    int wait = 0;
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--wait-for-signal") == 0)
            wait = 1;
        else
            hits = strtoul(argv[i], 0, 10);
    }
    if (wait) {
        sigset_t set;
        int sig;
        sigemptyset(&set);
        sigaddset(&set, SIGUSR1);
        /* Blocked before saying ready, so an early SIGUSR1 waits instead of killing us. */
        sigprocmask(SIG_BLOCK, &set, 0);
        printf("ready pid=%d\n", getpid());
        fflush(stdout);
        sigwait(&set, &sig);
    }
    for (unsigned long i = 0; i < hits; i++)
        fire(i);
    int trampoline = 0;
    FILE *maps = fopen("/proc/self/maps", "r");
    char line[512];
    while (maps && fgets(line, sizeof line, maps))
        trampoline |= strstr(line, "[uprobes-trampoline]") != 0;
    if (maps)
        fclose(maps);
    printf("{\"fired\": %lu, \"global\": %lu, \"trampoline\": %s}\n", hits, nop5_global,
           trampoline ? "true" : "false");
    fflush(stdout);
    if (wait) {
        sigset_t set;
        int sig;
        sigemptyset(&set);
        sigaddset(&set, SIGUSR1);
        sigwait(&set, &sig);
    }
    return 0;
}
