/* A program that registers code through the GDB JIT interface: it maps the code of
 * jitted.o at the address it was linked for, registers the linked object (as LLVM's
 * JITs do), prints `ready pid=N`, waits for a line on stdin, then spins in that code for
 * the number of milliseconds given. Usage: gdb-jit-demo OBJECT CODE ADDRESS MS */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

struct jit_code_entry {
    struct jit_code_entry *next_entry;
    struct jit_code_entry *prev_entry;
    const char *symfile_addr;
    uint64_t symfile_size;
};

struct jit_descriptor {
    uint32_t version;
    uint32_t action_flag;
    struct jit_code_entry *relevant_entry;
    struct jit_code_entry *first_entry;
};

struct jit_descriptor __jit_debug_descriptor = {1, 0, 0, 0};

void __attribute__((noinline)) __jit_debug_register_code(void) { __asm__ volatile(""); }

static char *slurp(const char *path, size_t *size)
{
    FILE *f = fopen(path, "rb");
    if (!f) { perror(path); exit(2); }
    fseek(f, 0, SEEK_END);
    *size = (size_t)ftell(f);
    fseek(f, 0, SEEK_SET);
    char *bytes = malloc(*size);
    if (fread(bytes, 1, *size, f) != *size) { perror(path); exit(2); }
    fclose(f);
    return bytes;
}

static double now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1e3 + ts.tv_nsec / 1e6;
}

int main(int argc, char **argv)
{
    if (argc != 5) { fprintf(stderr, "usage: %s OBJECT CODE ADDRESS MS\n", argv[0]); return 2; }
    size_t object_size, code_size;
    char *object = slurp(argv[1], &object_size);
    char *code = slurp(argv[2], &code_size);
    uintptr_t address = strtoull(argv[3], 0, 0);
    void *at = mmap((void *)address, 1 << 16, PROT_READ | PROT_WRITE | PROT_EXEC,
                    MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED_NOREPLACE, -1, 0);
    if (at != (void *)address) { perror("mmap"); return 2; }
    memcpy(at, code, code_size);
    static struct jit_code_entry entry;
    entry.symfile_addr = object;
    entry.symfile_size = object_size;
    __jit_debug_descriptor.first_entry = &entry;
    __jit_debug_descriptor.relevant_entry = &entry;
    __jit_debug_descriptor.action_flag = 1;
    __jit_debug_register_code();
    printf("ready pid=%d\n", getpid());
    fflush(stdout);
    char line[16];
    if (!fgets(line, sizeof line, stdin)) return 2;
    long (*spin)(long) = (long (*)(long))at;
    double end = now_ms() + atof(argv[4]);
    volatile long sink = 0;
    while (now_ms() < end)
        sink += spin(100000);
    printf("spun %ld\n", (long)sink);
    return 0;
}
