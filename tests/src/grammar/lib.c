/* A shared library with one probe, for listing a process's libraries by name, path and
 * wildcard. */
#include <sys/sdt.h>

void gx_fire(int value)
{
    DTRACE_PROBE1(libprov, fired, value);
}
