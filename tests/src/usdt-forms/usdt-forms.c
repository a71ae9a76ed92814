/* USDT argument forms that compilers emit beyond registers and stack slots, each probe
 * fired once per round with values this program prints afterwards as one JSON line:
 *
 *   usdt-forms [--loops N] [--wait-for-signal]
 *
 * prints `ready pid=PID`, waits for SIGUSR1 if asked, fires N rounds (default 1) and
 * prints {"globals": [...], "floats": [...], "float_globals": [...], "wide": [...],
 * "sizeless": [...], "handwritten": [...]}, each the values its probe passes, in order (floats as numbers,
 * "wide" the low 8 bytes of each 16-byte value as a signed integer; "handwritten" has
 * null where the argument cannot be read at a uprobe).
 *
 *   tt:globals        t1[4], g_long, g_uint, s_short: at -O2 gcc reads them in place,
 *                     `-1@4+t1(%rip) -8@g_long(%rip) 4@g_uint(%rip) -2@s_short(%rip)`
 *   tt:floats         a double and a float (`8f@`, `4f@`: registers at -O2, stack at -O0)
 *   tt:float_globals  a global double and float (`8f@g_double(%rip)` at -O2)
 *   tt:wide           an __int128 (`-16@%rax` at -O2, `-16@-16(%rbp)` at -O0)
 *   tt:sizeless       `%rdi %rsi`, operands without a size as old notes have them
 *   tt:handwritten    specs written by hand in the note, forms gcc does not emit itself:
 *                     `-1@t1+5(%rip) -1@t1_end-2(%rip) %rdi 8f@%xmm0 -2@s_short(%rip)`
 */
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/sdt.h>
#include <unistd.h>

volatile signed char t1[8] = {11, -12, 13, -14, -15, 16, -17, 18};
volatile long g_long = -1234567890123L;
volatile unsigned int g_uint = 4000000000u;
static volatile short s_short = -300;
volatile double g_double = -2.75;
volatile float g_float = 1.5f;
/* The address just past t1, for a `sym-N` operand. */
__asm__(".globl t1_end\n.set t1_end, t1+8\n");

/* Apart, so the value is in a legacy register pair: gcc cannot name half of an
 * extended one (r8-r15) in a 16-byte operand. */
__attribute__((noinline)) static void fire_wide(__int128 wide)
{
    DTRACE_PROBE1(tt, wide, wide);
}

static void sizeless(unsigned long rdi, unsigned long rsi)
{
    __asm__ __volatile__(STAP_PROBE_ASM(tt, sizeless, %%rdi %%rsi) : : "D"(rdi), "S"(rsi));
}

static void handwritten(unsigned long rdi, double xmm0)
{
    register double in_xmm0 __asm__("xmm0") = xmm0;
    __asm__ __volatile__(
        STAP_PROBE_ASM(tt, handwritten,
                       -1@t1+5(%%rip) -1@t1_end-2(%%rip) %%rdi 8f@%%xmm0 -2@s_short(%%rip))
        :
        : "D"(rdi), "x"(in_xmm0)
        : "memory");
}

int main(int argc, char **argv)
{
    long loops = 1;
    int wait = 0;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--loops") && i + 1 < argc)
            loops = atol(argv[++i]);
        else if (!strcmp(argv[i], "--wait-for-signal"))
            wait = 1;
    }
    printf("ready pid=%d\n", getpid());
    fflush(stdout);
    if (wait) {
        sigset_t set;
        int sig;
        sigemptyset(&set);
        sigaddset(&set, SIGUSR1);
        sigprocmask(SIG_BLOCK, &set, NULL);
        sigwait(&set, &sig);
    }
    /* From argc so the compiler cannot fold them into constants. */
    volatile int one = argc > 0;
    double d = one * 3.25;
    float f = one * -0.5f;
    __int128 wide = ((__int128)(one * 0x0102030405060708L) << 64) | (unsigned long)(one * -42L);
    unsigned long rdi = one * 0xfeedfacecafebeefUL;
    for (long i = 0; i < loops; i++) {
        DTRACE_PROBE4(tt, globals, t1[4], g_long, g_uint, s_short);
        DTRACE_PROBE2(tt, floats, d, f);
        DTRACE_PROBE2(tt, float_globals, g_double, g_float);
        fire_wide(wide);
        sizeless(rdi, 77);
        handwritten(rdi, d);
    }
    printf("{\"globals\": [%d, %ld, %u, %d], \"floats\": [%.17g, %.9g], "
           "\"float_globals\": [%.17g, %.9g], \"wide\": [%ld], "
           "\"sizeless\": [%lu, 77], \"handwritten\": [%d, %d, %lu, null, %d]}\n",
           t1[4], g_long, g_uint, s_short, d, f, g_double, g_float, (long)wide, rdi, t1[5],
           t1[6], rdi, s_short);
    return 0;
}
