/* Target of the concurrency test of `trace --str`: THREADS threads each fire
 * strs:storm(string, thread, round) ROUNDS times at once, the string naming its thread
 * and round, so an event carrying another hit's string would show. */
#include <pthread.h>
#include <stdio.h>
#include <sys/sdt.h>

#define THREADS 4
#define ROUNDS 5000

static void *run(void *arg)
{
    long thread = (long)arg;
    char text[48];
    for (long round = 0; round < ROUNDS; round++) {
        snprintf(text, sizeof text, "thread %ld round %ld", thread, round);
        DTRACE_PROBE3(strs, storm, text, thread, round);
    }
    return NULL;
}

int main(void)
{
    pthread_t threads[THREADS];
    for (long i = 0; i < THREADS; i++)
        pthread_create(&threads[i], NULL, run, (void *)i);
    for (long i = 0; i < THREADS; i++)
        pthread_join(threads[i], NULL);
    return 0;
}
