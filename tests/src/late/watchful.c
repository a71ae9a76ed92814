/* `late-watchful LIB`: prints `ready pid=PID`, counts the SIGCONT signals it gets in a
 * handler installed without SA_RESTART (so a read they interrupt fails with EINTR, which
 * it counts too), and for each line on standard input (read with read(2) itself)
 * dlopens LIB (mapped at the first line, found loaded at the others) and calls its
 * fire(1). At the end of input it prints
 * {"sigcont": N, "eintr": M, "rounds": R}. */
#include <dlfcn.h>
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

static volatile sig_atomic_t sigcont;

static void on_cont(int signal)
{
    (void)signal;
    sigcont++;
}

int main(int argc, char **argv)
{
    if (argc < 2)
        return 2;
    struct sigaction action;
    memset(&action, 0, sizeof action);
    action.sa_handler = on_cont;
    sigaction(SIGCONT, &action, 0);
    printf("ready pid=%d\n", getpid());
    fflush(stdout);
    int eintr = 0, rounds = 0;
    char c;
    for (;;) {
        ssize_t got = read(0, &c, 1);
        if (got < 0 && errno == EINTR) {
            eintr++;
            continue;
        }
        if (got <= 0)
            break;
        if (c != '\n')
            continue;
        void *lib = dlopen(argv[1], RTLD_NOW);
        if (!lib) {
            fprintf(stderr, "%s\n", dlerror());
            return 4;
        }
        int (*fire)(int) = (int (*)(int))dlsym(lib, "fire");
        fire(1);
        rounds++;
    }
    printf("{\"sigcont\": %d, \"eintr\": %d, \"rounds\": %d}\n", (int)sigcont, eintr, rounds);
    return 0;
}
