/* The "JIT-compiled" code: linked at a fixed address (-Ttext), its code copied there at
 * run time by gdb-jit-demo and the linked object registered through the GDB JIT
 * interface, as a JIT registers the objects it emits. */
long jitted_spin(long n)
{
    long s = 0;
    for (long i = 0; i < n; i++)
        s += i ^ (s >> 3);
    return s;
}
