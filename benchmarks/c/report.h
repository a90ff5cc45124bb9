/* What the benchmark's C programs share: their error report (one JSON line on stdout, exit
 * status 1), reading their records from stdin, the monotonic clock (Python's time.monotonic())
 * and their own CPU time. */
#ifndef BENCHMARKS_REPORT_H
#define BENCHMARKS_REPORT_H

#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/resource.h>
#include <sys/time.h>
#include <time.h>
#include <errno.h>
#include <unistd.h>

__attribute__((noreturn, format(printf, 1, 2))) static inline void fail(const char *fmt, ...) {
    char msg[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    printf("{\"error\": \"");
    for (const char *p = msg; *p; p++) {
        if (*p == '"' || *p == '\\')
            putchar('\\');
        putchar((unsigned char)*p >= 0x20 ? *p : ' ');
    }
    printf("\"}\n");
    fflush(stdout);
    exit(1);
}

/* Read n bytes of stdin into dst, however the pipe splits them: 1 when read, 0 when stdin ended
 * before the first byte (the end of the records); stdin ending after it is an error. */
static inline int stdin_read(void *dst, size_t n) {
    uint8_t *p = dst;
    size_t left = n;
    while (left) {
        ssize_t got = read(0, p, left);
        if (got < 0 && errno == EINTR)
            continue;
        if (got <= 0) {
            if (left == n && got == 0)
                return 0;
            fail("stdin ended inside a record");
        }
        p += got;
        left -= (size_t)got;
    }
    return 1;
}

/* Read the n bytes of stdin that the rest of a record holds: stdin ending first is an error. */
static inline void stdin_rest(void *dst, size_t n) {
    if (!stdin_read(dst, n))
        fail("stdin ended inside a record");
}

static inline int64_t now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

static inline double cpu_s(void) {
    struct rusage ru;
    getrusage(RUSAGE_SELF, &ru);
    return ru.ru_utime.tv_sec + ru.ru_stime.tv_sec + (ru.ru_utime.tv_usec + ru.ru_stime.tv_usec) / 1e6;
}

#endif
