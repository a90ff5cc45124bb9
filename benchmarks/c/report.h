/* What the benchmark's C programs share: their error report (one JSON line on stdout, exit
 * status 1), the monotonic clock (Python's time.monotonic()) and their own CPU time. */
#ifndef BENCHMARKS_REPORT_H
#define BENCHMARKS_REPORT_H

#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/resource.h>
#include <sys/time.h>
#include <time.h>

static void fail(const char *fmt, ...) {
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

static int64_t now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

static double cpu_s(void) {
    struct rusage ru;
    getrusage(RUSAGE_SELF, &ru);
    return ru.ru_utime.tv_sec + ru.ru_stime.tv_sec + (ru.ru_utime.tv_usec + ru.ru_stime.tv_usec) / 1e6;
}

#endif
