/* A runtime that carries Julia's USDT probes (provider `julia`, the names and arguments of
 * Julia's src/uprobes.d: task probes take a `jl_task_t *`, so task ids are addresses),
 * for tests/tests/julia.rs: Julia itself is not installable here.
 *
 * The collector (the main thread) runs GCS collections of PAUSE_MS each: gc__begin,
 * gc__stop_the_world, gc__mark__begin, spinning, gc__mark__end, gc__sweep__begin,
 * spinning, gc__sweep__end, gc__end; then sleeps INTERVAL_MS. Meanwhile thread `worker-a`
 * switches between two tasks each round: `compute` spins 8 ms in compute_kernel; `io`
 * sleeps 5 ms in blocking_read while it is the running task (a task blocking its
 * thread); thread `worker-b` runs task `waiter`, which parks in wait_for_channel until
 * worker-a's round ends. Each task's own clocks (CLOCK_MONOTONIC) count its running,
 * blocked-while-running and parked time. A task's last run ends with rt__finish__task
 * then rt__pause__task, Julia's order.
 *
 * Usage: julia-probes GCS PAUSE_MS INTERVAL_MS [--wait-for-signal]. Prints "ready pid=N"
 * and with --wait-for-signal waits for SIGUSR1; at the end one JSON line with the GCs
 * and each task's id (its address, decimal), runs and times. */
#define _GNU_SOURCE
#include <pthread.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/sdt.h>
#include <time.h>
#include <unistd.h>

/* What Julia's jl_task_t is to the probes: an address. */
struct task {
    const char *name;
    uint64_t runs, running_ns, blocked_ns, parked_ns;
    uint64_t run_since, parked_since;
};

static struct task compute = {"compute"}, io_task = {"io"}, waiter = {"waiter"};
static volatile unsigned long sink;
static volatile int done;
static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t changed = PTHREAD_COND_INITIALIZER;
static unsigned rounds_done;

static uint64_t now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000u + ts.tv_nsec;
}

__attribute__((noinline)) static void spin_ns(uint64_t ns) {
    uint64_t end = now_ns() + ns;
    while (now_ns() < end)
        for (int i = 0; i < 1000; i++) sink = sink * 6364136223846793005ul + 1;
}

static void run_task(struct task *t) {
    DTRACE_PROBE1(julia, rt__run__task, t);
    uint64_t now = now_ns();
    if (t->parked_since) t->parked_ns += now - t->parked_since;
    t->parked_since = 0;
    t->runs++;
    t->run_since = now;
}

static void pause_task(struct task *t) {
    uint64_t now = now_ns();
    t->running_ns += now - t->run_since;
    t->parked_since = now_ns();
    DTRACE_PROBE1(julia, rt__pause__task, t);
}

/* A task's last run ends as Julia's do: rt__finish__task inside the run, then
 * rt__pause__task as the scheduler switches away. */
static void end_task(struct task *t) {
    DTRACE_PROBE1(julia, rt__finish__task, t);
    t->running_ns += now_ns() - t->run_since;
    DTRACE_PROBE1(julia, rt__pause__task, t);
}

__attribute__((noinline)) void compute_kernel(void) { spin_ns(8000000); }

__attribute__((noinline)) uint64_t blocking_read(void) {
    uint64_t start = now_ns();
    struct timespec t = {0, 5000000};
    nanosleep(&t, NULL);
    return now_ns() - start;
}

__attribute__((noinline)) int wait_for_channel(unsigned round) {
    pause_task(&waiter);
    pthread_mutex_lock(&lock);
    while (rounds_done < round && !done) pthread_cond_wait(&changed, &lock);
    int through = rounds_done >= round;
    pthread_mutex_unlock(&lock);
    run_task(&waiter);
    return through;
}

static void *worker_a(void *arg) {
    (void)arg;
    pthread_setname_np(pthread_self(), "worker-a");
    DTRACE_PROBE1(julia, rt__start__task, &compute);
    DTRACE_PROBE1(julia, rt__start__task, &io_task);
    for (unsigned round = 1; !done; round++) {
        run_task(&compute);
        compute_kernel();
        pause_task(&compute);
        run_task(&io_task);
        io_task.blocked_ns += blocking_read();
        pause_task(&io_task);
        pthread_mutex_lock(&lock);
        rounds_done = round;
        pthread_cond_broadcast(&changed);
        pthread_mutex_unlock(&lock);
    }
    run_task(&compute);
    end_task(&compute);
    run_task(&io_task);
    end_task(&io_task);
    return NULL;
}

static void *worker_b(void *arg) {
    (void)arg;
    pthread_setname_np(pthread_self(), "worker-b");
    run_task(&waiter);
    for (unsigned round = 1;; round++) {
        spin_ns(100000);
        if (!wait_for_channel(round)) break;
    }
    end_task(&waiter);
    return NULL;
}

static void print_task(const struct task *t, const char *sep) {
    printf("{\"id\":%lu,\"name\":\"%s\",\"runs\":%lu,\"running_ns\":%lu,\"blocked_ns\":%lu,"
           "\"parked_ns\":%lu}%s",
           (unsigned long)(uintptr_t)t, t->name, (unsigned long)t->runs,
           (unsigned long)t->running_ns, (unsigned long)t->blocked_ns,
           (unsigned long)t->parked_ns, sep);
}

int main(int argc, char **argv) {
    if (argc < 4) {
        fprintf(stderr, "usage: julia-probes GCS PAUSE_MS INTERVAL_MS [--wait-for-signal]\n");
        return 2;
    }
    int gcs = atoi(argv[1]);
    uint64_t pause = strtoull(argv[2], NULL, 10) * 1000000, interval = strtoull(argv[3], NULL, 10) * 1000000;
    sigset_t set;
    sigemptyset(&set);
    sigaddset(&set, SIGUSR1);
    pthread_sigmask(SIG_BLOCK, &set, NULL);
    printf("ready pid=%d\n", getpid());
    fflush(stdout);
    if (argc > 4 && strcmp(argv[4], "--wait-for-signal") == 0) {
        int sig;
        sigwait(&set, &sig);
    }
    pthread_t a, b;
    DTRACE_PROBE2(julia, rt__new__task, 0, &compute);
    DTRACE_PROBE2(julia, rt__new__task, 0, &io_task);
    DTRACE_PROBE2(julia, rt__new__task, 0, &waiter);
    pthread_create(&a, NULL, worker_a, NULL);
    pthread_create(&b, NULL, worker_b, NULL);
    printf("{\"pid\":%d,\"pause_ns\":[", getpid());
    for (int i = 0; i < gcs; i++) {
        uint64_t start = now_ns();
        DTRACE_PROBE1(julia, gc__begin, 0);
        DTRACE_PROBE(julia, gc__stop_the_world);
        DTRACE_PROBE(julia, gc__mark__begin);
        spin_ns(pause * 6 / 10);
        DTRACE_PROBE2(julia, gc__mark__end, (int64_t)(i + 1) << 20, (int64_t)i << 12);
        DTRACE_PROBE1(julia, gc__sweep__begin, i % 4 == 0);
        while (now_ns() - start < pause) sink++;
        DTRACE_PROBE(julia, gc__sweep__end);
        DTRACE_PROBE(julia, gc__end);
        printf("%s%lu", i ? "," : "", (unsigned long)(now_ns() - start));
        struct timespec t = {interval / 1000000000, interval % 1000000000};
        nanosleep(&t, NULL);
    }
    pthread_mutex_lock(&lock);
    done = 1;
    pthread_cond_broadcast(&changed);
    pthread_mutex_unlock(&lock);
    pthread_join(a, NULL);
    pthread_join(b, NULL);
    printf("],\"tasks\":[");
    print_task(&compute, ",");
    print_task(&io_task, ",");
    print_task(&waiter, "");
    printf("]}\n");
    return 0;
}
