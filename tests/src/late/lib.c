/* A library the executable dlopens after the tracer attached: one plain probe and one
 * guarded by a semaphore, fired `n` times each right after dlopen returns. */
/* Notes name their semaphores (sys/sdt.h looks for PROVIDER_NAME_semaphore). */
#define _SDT_HAS_SEMAPHORES 1
#include <sys/sdt.h>

unsigned short tracetest_latelib_semaphore __attribute__((section(".probes")));
unsigned short tracetest_guarded_semaphore __attribute__((section(".probes")));

/* How often the guarded probe's semaphore was seen raised: the kernel raised it. */
int fire(int n)
{
    int raised = 0;
    for (int i = 0; i < n; i++) {
        DTRACE_PROBE1(tracetest, latelib, i);
        if (tracetest_guarded_semaphore) {
            raised++;
            DTRACE_PROBE1(tracetest, guarded, i);
        }
    }
    return raised;
}
