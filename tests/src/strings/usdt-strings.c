/* Target of the string-argument tests (`trace --str`): its probes fire once each, in this
 * order, with strings of known content; the tests expect exactly these. */
#include <string.h>
#include <sys/sdt.h>

/* Fired as strs:text(string, index); traced with an 8-byte limit. */
static const char *const texts[] = {
    "hi",                  /* short */
    "12345678",            /* exactly the limit */
    "123456789abc",        /* longer: cut */
    "\xff\xfe ok",         /* not UTF-8 */
    "",                    /* empty, which is not unavailable */
    NULL,                  /* NULL: unavailable */
    (const char *)1,       /* unmapped: unavailable */
    "tab\there \"q\"",     /* control character and quotes, cut */
};

int main(void)
{
    long count = (long)(sizeof texts / sizeof texts[0]);
    /* Touch each string first, as a program has usually just used what it passes: the
     * kernel reads at the probe without faulting pages in, so a string on a page the
     * process never touched would show as unavailable. */
    volatile size_t total = 0;
    for (long i = 0; i < count; i++)
        if ((unsigned long)texts[i] > 4096)
            total += strlen(texts[i]);
    for (long i = 0; i < count; i++)
        DTRACE_PROBE2(strs, text, texts[i], i);
    /* strs:wide(string), traced with the default limit of 64: exactly it, then one more. */
    char wide[66];
    memset(wide, 'a', 64);
    wide[64] = 0;
    DTRACE_PROBE1(strs, wide, wide);
    memset(wide, 'b', 65);
    wide[65] = 0;
    DTRACE_PROBE1(strs, wide, wide);
    /* Two strings in one event, each with its own limit. */
    DTRACE_PROBE2(strs, pair, "left", "right side");
    /* An integer argument, which --str refuses. */
    volatile int number = 42;
    DTRACE_PROBE1(strs, number, number);
    return 0;
}
