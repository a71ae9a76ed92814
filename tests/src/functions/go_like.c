// A C program carrying a `.go.buildinfo` section, the mark of a Go program, so that the
// refusal of return probes on Go code is tested without a Go toolchain.
__attribute__((section(".go.buildinfo"), used)) static const char buildinfo[32] =
    "\xff Go buildinf:";

int main(void) { return 0; }
