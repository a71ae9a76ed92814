/* Figure 2's site kinds (cargo xtask bench): fires one USDT probe --iters times in a tight
 * loop, timed with clock_gettime, after SIGUSR1 (--wait-for-signal). --site nop: a site
 * as Debian's sys/sdt.h emits it, a lone nop (a uprobe there traps); --site nop5: a nop
 * then a 5-byte nop, as newer SDT headers emit it (a uprobe on the 5-byte nop runs without
 * a trap on Linux 6.18). Prints "ready pid=N", then {"ns": ELAPSED}. */
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/sdt.h>
#include <time.h>
#include <unistd.h>

static void __attribute__((noinline)) fire_nop(unsigned long i)
{
    __asm__ __volatile__(STAP_PROBE_ASM(kinds, trap, %%rdi) : : "D"(i));
}

static void __attribute__((noinline)) fire_nop5(unsigned long i)
{
    __asm__ __volatile__(STAP_PROBE_ASM(kinds, optimized, %%rdi)
                         ".byte 0x0f, 0x1f, 0x44, 0x00, 0x00\n"
                         :
                         : "D"(i));
}

static unsigned long long now_ns(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec * 1000000000ULL + t.tv_nsec;
}

int main(int argc, char **argv)
{
    unsigned long iters = 1000000;
    int nop5 = 0, wait = 0;
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--iters") == 0 && i + 1 < argc)
            iters = strtoul(argv[++i], 0, 10);
        else if (strcmp(argv[i], "--site") == 0 && i + 1 < argc)
            nop5 = strcmp(argv[++i], "nop5") == 0;
        else if (strcmp(argv[i], "--wait-for-signal") == 0)
            wait = 1;
    }
    /* Blocked before saying ready, so an early SIGUSR1 waits instead of killing us. */
    sigset_t set;
    int sig;
    sigemptyset(&set);
    sigaddset(&set, SIGUSR1);
    sigprocmask(SIG_BLOCK, &set, 0);
    printf("ready pid=%d\n", getpid());
    fflush(stdout);
    if (wait)
        sigwait(&set, &sig);
    unsigned long long start = now_ns();
    if (nop5)
        for (unsigned long i = 0; i < iters; i++)
            fire_nop5(i);
    else
        for (unsigned long i = 0; i < iters; i++)
            fire_nop(i);
    printf("{\"ns\": %llu}\n", now_ns() - start);
    return 0;
}
