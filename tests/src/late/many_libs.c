/* `late-many-libs LIB...`: dlopens every LIB given (options, `--...`, are passed over) (copies of one library, each a file
 * of its own), prints `ready pid=PID`, then calls each one's fire(1) every 10 ms until
 * SIGTERM, and prints {"rounds": R}. */
#include <dlfcn.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
#include <unistd.h>

static volatile sig_atomic_t stop;

static void on_term(int signal)
{
    (void)signal;
    stop = 1;
}

int main(int argc, char **argv)
{
    int (**fire)(int) = calloc(argc, sizeof *fire);
    for (int i = 1; i < argc; i++) {
        if (argv[i][0] == '-')
            continue;
        void *lib = dlopen(argv[i], RTLD_NOW | RTLD_LOCAL);
        if (!lib) {
            fprintf(stderr, "%s\n", dlerror());
            return 4;
        }
        fire[i] = (int (*)(int))dlsym(lib, "fire");
    }
    signal(SIGTERM, on_term);
    printf("ready pid=%d\n", getpid());
    fflush(stdout);
    long rounds = 0;
    struct timespec nap = {0, 10000000};
    while (!stop) {
        for (int i = 1; i < argc; i++)
            if (fire[i])
                fire[i](1);
        rounds++;
        nanosleep(&nap, 0);
    }
    printf("{\"rounds\": %ld}\n", rounds);
    return 0;
}
