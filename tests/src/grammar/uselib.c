/* Links the library built from lib.c, fires its probe and its own, prints "ready" and
 * waits to be killed. */
#include <stdio.h>
#include <sys/sdt.h>
#include <unistd.h>

void gx_fire(int value);

int main(int argc, char **argv)
{
    gx_fire(argc);
    DTRACE_PROBE(mainprov, ready);
    printf("ready\n");
    fflush(stdout);
    pause();
    return 0;
}
