/* A shared library with one SystemTap SDT note written by hand (provider tracer_test, probe
 * lib_probe, no arguments, no semaphore), laid out as sys/sdt.h lays it out: the
 * malformed-note tests patch copies of it and load them into a process with LD_PRELOAD. */

void tracer_test_lib_probe(void)
{
    __asm__ volatile(
        "990: nop\n"
        ".pushsection .note.stapsdt,\"?\",\"note\"\n"
        ".balign 4\n"
        ".4byte 992f-991f, 994f-993f, 3\n"
        "991: .asciz \"stapsdt\"\n"
        "992: .balign 4\n"
        "993: .8byte 990b\n"
        ".8byte _.stapsdt.base\n"
        ".8byte 0\n"
        ".asciz \"tracer_test\"\n"
        ".asciz \"lib_probe\"\n"
        ".asciz \"\"\n"
        "994: .balign 4\n"
        ".popsection\n"
        ".ifndef _.stapsdt.base\n"
        ".pushsection .stapsdt.base,\"aG\",\"progbits\",.stapsdt.base,comdat\n"
        ".weak _.stapsdt.base\n"
        ".hidden _.stapsdt.base\n"
        "_.stapsdt.base: .space 1\n"
        ".size _.stapsdt.base, 1\n"
        ".popsection\n"
        ".endif\n");
}
