/*
 * The chaos harness's clock step (issue 27): preloaded into one API replica, it shifts that
 * process's wall clock (CLOCK_REALTIME, which Rust's SystemTime reads through libc's
 * clock_gettime) by the milliseconds written in the file CORRAL_CHAOS_CLOCK_FILE names. The
 * monotonic clocks are left alone, as a real step of the system clock leaves them. The file is
 * read again at most every 20 ms of the monotonic clock, so a step takes effect at once.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <fcntl.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <time.h>
#include <unistd.h>

typedef int (*clock_gettime_fn)(clockid_t, struct timespec *);

static _Atomic(clock_gettime_fn) real;
static _Atomic long long offset_ms;
static _Atomic long long read_at_ns = -1;

static clock_gettime_fn real_clock_gettime(void) {
    clock_gettime_fn f = atomic_load(&real);
    if (!f) {
        f = (clock_gettime_fn)dlsym(RTLD_NEXT, "clock_gettime");
        atomic_store(&real, f);
    }
    return f;
}

static long long current_offset_ms(void) {
    struct timespec mono;
    if (real_clock_gettime()(CLOCK_MONOTONIC, &mono) != 0) {
        return atomic_load(&offset_ms);
    }
    long long now = (long long)mono.tv_sec * 1000000000LL + mono.tv_nsec;
    long long last = atomic_load(&read_at_ns);
    if (last >= 0 && now - last < 20000000LL) {
        return atomic_load(&offset_ms);
    }
    atomic_store(&read_at_ns, now);
    const char *path = getenv("CORRAL_CHAOS_CLOCK_FILE");
    if (!path) {
        return 0;
    }
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
        return atomic_load(&offset_ms);
    }
    char buf[32];
    ssize_t n = read(fd, buf, sizeof buf - 1);
    close(fd);
    if (n > 0) {
        buf[n] = 0;
        atomic_store(&offset_ms, strtoll(buf, NULL, 10));
    }
    return atomic_load(&offset_ms);
}

int clock_gettime(clockid_t clock, struct timespec *ts) {
    int r = real_clock_gettime()(clock, ts);
    if (r == 0 && (clock == CLOCK_REALTIME || clock == CLOCK_REALTIME_COARSE)) {
        long long ns = (long long)ts->tv_sec * 1000000000LL + ts->tv_nsec +
                       current_offset_ms() * 1000000LL;
        ts->tv_sec = ns / 1000000000LL;
        ts->tv_nsec = ns % 1000000000LL;
    }
    return r;
}
