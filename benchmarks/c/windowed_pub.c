/* Scenario 8's publisher in C: one process, one blocking socket, W QoS 1 PUBLISHes in flight.
 *
 *   windowed_pub HOST PORT CONNECT_HEX PUBLISH_HEX PID_OFFSET DISCONNECT_HEX WARMUP DURATION SETTLE
 *
 * Every byte it sends is encoded by Python (benchmarks/windowed.py): the CONNECT, one PUBLISH
 * (QoS 1) whose 2-byte packet identifier sits at PID_OFFSET, and the DISCONNECT. This program
 * connects, sends the CONNECT, checks the CONNACK's reason code and prints
 *   {"ready": 1, "connack": "<the CONNACK frame in hex>"}
 * then reads one line "START WINDOW" from stdin: START on CLOCK_MONOTONIC in seconds (Python's
 * time.monotonic()), WINDOW the PUBLISHes to keep unacknowledged (identifiers 1..WINDOW, one per
 * slot). At START it writes the whole window; from then on each PUBACK (any form: 3.1.1's 4 bytes,
 * MQTT 5's 4 bytes, 5 bytes with a reason code, or more with properties) releases the PUBLISH of
 * its identifier, and all the PUBLISHes released by one read leave in one send. PUBACKs read in
 * [START + WARMUP, START + WARMUP + DURATION) have their publish-to-PUBACK latency counted in a
 * histogram (µs to 3 significant digits, as windowed.py keeps them); the counters and the CPU
 * time (getrusage) are taken at both ends of that window. After it, nothing more is released;
 * the last acks are awaited for up to SETTLE seconds, then DISCONNECT, and the broker is left to
 * close first. The result is one JSON line on stdout, the same object windowed.py prints (plus
 * window_acked, cpu_s and the process's own percentiles); a failure is {"error": "..."} and exit
 * status 1.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <time.h>
#include <unistd.h>

#include "report.h"

#define RECV_TIMEOUT_US 10000 /* how late the end of a phase may be noticed */
#define BUF_SIZE 65536
#define SETUP_TIMEOUT_S 10
#define DECADES 7 /* histogram: exact below 1 ms, then 3 significant digits up to 10^10 µs */
#define BUCKETS (1000 + 900 * DECADES)

static uint64_t hist[BUCKETS];
static uint64_t others[256]; /* unexpected packets by first byte */

static int bucket(uint64_t us) {
    if (us < 1000)
        return (int)us;
    int decade = 0;
    while (us >= 1000) {
        us /= 10;
        decade++;
    }
    if (decade > DECADES)
        return BUCKETS - 1;
    return 1000 + (decade - 1) * 900 + (int)(us - 100);
}

static uint64_t bucket_value(int i) {
    if (i < 1000)
        return (uint64_t)i;
    uint64_t value = 100 + (i - 1000) % 900;
    for (int d = 0; d <= (i - 1000) / 900; d++)
        value *= 10;
    return value;
}

static uint64_t percentile(uint64_t n, double q) {
    uint64_t rank = ((uint64_t)(q * n * 1e6) + 999999) / 1000000; /* ceil(q n), as windowed.py */
    if (rank < 1)
        rank = 1;
    uint64_t seen = 0;
    for (int i = 0; i < BUCKETS; i++) {
        seen += hist[i];
        if (hist[i] && seen >= rank)
            return bucket_value(i);
    }
    return 0;
}

static size_t unhex(const char *hex, unsigned char **out) {
    size_t n = strlen(hex);
    if (n % 2 || !n)
        fail("not a hex string: %s", hex);
    *out = malloc(n / 2);
    for (size_t i = 0; i < n / 2; i++) {
        unsigned int byte;
        if (sscanf(hex + 2 * i, "%2x", &byte) != 1)
            fail("not a hex string: %s", hex);
        (*out)[i] = (unsigned char)byte;
    }
    return n / 2;
}

static void send_all(int fd, const unsigned char *p, size_t n, int *lost) {
    while (n && !*lost) {
        ssize_t k = send(fd, p, n, MSG_NOSIGNAL);
        if (k < 0) {
            if (errno == EINTR || errno == EAGAIN)
                continue;
            *lost = 1;
            return;
        }
        p += k;
        n -= (size_t)k;
    }
}

/* A frame at data[0..have): its total size, or 0 while incomplete; -1 if malformed.
 * *body is where its variable header starts, *rl its remaining length. */
static long frame_size(const unsigned char *data, size_t have, size_t *body, size_t *rl) {
    size_t value = 0;
    for (size_t i = 1; i < 5; i++) {
        if (i >= have)
            return 0;
        value |= (size_t)(data[i] & 0x7F) << (7 * (i - 1));
        if (!(data[i] & 0x80)) {
            *body = i + 1;
            *rl = value;
            return (long)(i + 1 + value);
        }
    }
    return -1;
}

int main(int argc, char **argv) {
    if (argc != 10)
        fail("usage: windowed_pub HOST PORT CONNECT_HEX PUBLISH_HEX PID_OFFSET DISCONNECT_HEX "
             "WARMUP DURATION SETTLE");
    unsigned char *connect_pkt, *publish, *disconnect_pkt;
    size_t connect_len = unhex(argv[3], &connect_pkt);
    size_t plen = unhex(argv[4], &publish);
    size_t pid_offset = (size_t)atol(argv[5]);
    size_t disconnect_len = unhex(argv[6], &disconnect_pkt);
    double warmup = atof(argv[7]), duration = atof(argv[8]), settle = atof(argv[9]);
    if (pid_offset + 2 > plen || (publish[0] & 0xF6) != 0x32)
        fail("PUBLISH_HEX is not a QoS 1 PUBLISH with its identifier at %zu", pid_offset);

    struct addrinfo hints = {0}, *ai;
    hints.ai_socktype = SOCK_STREAM;
    int rc = getaddrinfo(argv[1], argv[2], &hints, &ai);
    if (rc)
        fail("%s:%s: %s", argv[1], argv[2], gai_strerror(rc));
    int fd = socket(ai->ai_family, SOCK_STREAM, 0);
    if (fd < 0 || connect(fd, ai->ai_addr, ai->ai_addrlen) < 0)
        fail("connect to %s:%s: %s", argv[1], argv[2], strerror(errno));
    freeaddrinfo(ai);
    int one = 1;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    struct timeval tv = {SETUP_TIMEOUT_S, 0};
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    int lost = 0;
    send_all(fd, connect_pkt, connect_len, &lost);

    /* CONNACK: the first frame; its reason code (3.1.1: return code) is its second byte. */
    static unsigned char buf[BUF_SIZE];
    size_t have = 0, body = 0, rl = 0;
    long size;
    while ((size = frame_size(buf, have, &body, &rl)) == 0 || (size_t)size > have) {
        if (size < 0 || size > BUF_SIZE)
            fail("malformed CONNACK");
        ssize_t n = lost ? -1 : recv(fd, buf + have, BUF_SIZE - have, 0);
        if (n == 0)
            fail("no CONNACK: the broker closed the connection");
        if (n < 0)
            fail("no CONNACK within %d s: %s", SETUP_TIMEOUT_S, strerror(errno));
        have += (size_t)n;
    }
    if (buf[0] != 0x20 || rl < 2)
        fail("expected CONNACK, got packet 0x%02X", buf[0]);
    if (buf[body + 1] != 0)
        fail("CONNACK refused: reason 0x%02X", buf[body + 1]);
    printf("{\"ready\": 1, \"connack\": \"");
    for (long i = 0; i < size; i++)
        printf("%02x", buf[i]);
    printf("\"}\n");
    fflush(stdout);
    memmove(buf, buf + size, have - (size_t)size);
    have -= (size_t)size;

    double start_s;
    int window;
    if (scanf("%lf %d", &start_s, &window) != 2 || window < 1 || window > 65535)
        fail("expected \"START WINDOW\" on stdin");
    int64_t start = (int64_t)(start_s * 1e9);
    int64_t w0 = start + (int64_t)(warmup * 1e9), w1 = w0 + (int64_t)(duration * 1e9);
    int64_t settle_until = w1 + (int64_t)(settle * 1e9);

    /* One pre-encoded PUBLISH per slot (identifier slot + 1), patched once. */
    unsigned char *packets = malloc(plen * (size_t)window);
    unsigned char *out = malloc(plen * (size_t)window);
    int64_t *sent_at = calloc((size_t)window, sizeof *sent_at);
    unsigned char *in_flight = calloc((size_t)window, 1);
    int *released = malloc(sizeof(int) * (size_t)window);
    if (!packets || !out || !sent_at || !in_flight || !released)
        fail("out of memory for a window of %d", window);
    for (int s = 0; s < window; s++) {
        memcpy(packets + plen * s, publish, plen);
        packets[plen * s + pid_offset] = (unsigned char)((s + 1) >> 8);
        packets[plen * s + pid_offset + 1] = (unsigned char)(s + 1);
    }
    tv.tv_sec = 0;
    tv.tv_usec = RECV_TIMEOUT_US;
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);

    uint64_t acked = 0, failed = 0, sent = 0, reads = 0, recorded = 0;
    int64_t worst = -1;
    int marks = 0, recording = 0, stopping = 0, waiting = window; /* PUBLISHes in flight */
    double mark_t[2], mark_cpu[2];
    uint64_t mark_acked[2], mark_failed[2], mark_sent[2], mark_reads[2];
    size_t skip = 0; /* bytes still to drop of a frame larger than the buffer */

    struct timespec at = {(time_t)(start / 1000000000), (long)(start % 1000000000)};
    while (clock_nanosleep(CLOCK_MONOTONIC, TIMER_ABSTIME, &at, NULL) == EINTR)
        ;
    int64_t t = now_ns();
    for (int s = 0; s < window; s++) {
        sent_at[s] = t;
        in_flight[s] = 1;
    }
    sent = (uint64_t)window;
    send_all(fd, packets, plen * (size_t)window, &lost);

    while (!lost) {
        ssize_t n = recv(fd, buf + have, BUF_SIZE - have, 0);
        if (n == 0 || (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR)) {
            lost = 1;
            break;
        }
        int64_t now = now_ns();
        if (marks < 2 && now >= (marks ? w1 : w0)) {
            mark_t[marks] = now / 1e9;
            mark_cpu[marks] = cpu_s();
            mark_acked[marks] = acked;
            mark_failed[marks] = failed;
            mark_sent[marks] = sent;
            mark_reads[marks] = reads;
            marks++;
            recording = marks == 1;
            stopping = marks == 2;
        }
        int nreleased = 0;
        if (n > 0) {
            reads++;
            have += (size_t)n;
            size_t pos = 0;
            if (skip) {
                size_t k = skip < have ? skip : have;
                skip -= k;
                pos = k;
            }
            while (pos < have) {
                size = frame_size(buf + pos, have - pos, &body, &rl);
                if (size < 0)
                    fail("malformed frame from the broker (first byte 0x%02X)", buf[pos]);
                if (size == 0)
                    break;
                if ((size_t)size > have - pos) {
                    if (size > BUF_SIZE) { /* too large to hold: drop it as it comes */
                        others[buf[pos]]++;
                        skip = (size_t)size - (have - pos);
                        pos = have;
                    }
                    break;
                }
                const unsigned char *f = buf + pos;
                pos += (size_t)size;
                int pid = rl >= 2 ? (f[body] << 8 | f[body + 1]) : 0;
                if (f[0] != 0x40 || pid < 1 || pid > window || !in_flight[pid - 1]) {
                    others[f[0]]++; /* not a PUBACK of one of our PUBLISHes in flight */
                    continue;
                }
                int s = pid - 1;
                acked++;
                if (rl > 2 && f[body + 2] >= 0x80)
                    failed++;
                if (recording) {
                    int64_t lat = now - sent_at[s];
                    hist[bucket((uint64_t)(lat / 1000))]++;
                    recorded++;
                    if (lat > worst)
                        worst = lat;
                }
                in_flight[s] = 0;
                waiting--;
                if (!stopping)
                    released[nreleased++] = s;
            }
            memmove(buf, buf + pos, have - pos);
            have -= pos;
        }
        if (nreleased) {
            for (int i = 0; i < nreleased; i++)
                memcpy(out + plen * i, packets + plen * released[i], plen);
            t = now_ns();
            for (int i = 0; i < nreleased; i++) {
                sent_at[released[i]] = t;
                in_flight[released[i]] = 1;
            }
            sent += (uint64_t)nreleased;
            waiting += nreleased;
            send_all(fd, out, plen * (size_t)nreleased, &lost);
        }
        if (stopping && (waiting == 0 || now >= settle_until))
            break;
    }
    while (marks < 2) { /* the connection ended early: the window ends here */
        mark_t[marks] = now_ns() / 1e9;
        mark_cpu[marks] = cpu_s();
        mark_acked[marks] = acked;
        mark_failed[marks] = failed;
        mark_sent[marks] = sent;
        mark_reads[marks] = reads;
        marks++;
    }
    if (!lost) { /* DISCONNECT; the broker closes first (TIME_WAIT stays on its side) */
        send_all(fd, disconnect_pkt, disconnect_len, &lost);
        int64_t until = now_ns() + 3000000000LL;
        while (!lost && now_ns() < until) {
            ssize_t n = recv(fd, buf, BUF_SIZE, 0);
            if (n == 0 || (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR))
                break;
        }
    }
    close(fd);

    printf("{\"window\": %d, \"marks\": [", window);
    for (int m = 0; m < 2; m++)
        printf("%s[%.9f, %.6f, {\"acked\": %llu, \"failed\": %llu, \"sent\": %llu, \"reads\": %llu}]",
               m ? ", " : "", mark_t[m], mark_cpu[m], (unsigned long long)mark_acked[m],
               (unsigned long long)mark_failed[m], (unsigned long long)mark_sent[m],
               (unsigned long long)mark_reads[m]);
    printf("], \"window_acked\": %llu", (unsigned long long)(mark_acked[1] - mark_acked[0]));
    printf(", \"acked\": %llu, \"failed\": %llu, \"sent\": %llu, \"settled\": %s, \"lost\": %s",
           (unsigned long long)acked, (unsigned long long)failed, (unsigned long long)sent,
           waiting == 0 ? "true" : "false", lost ? "true" : "false");
    printf(", \"others\": {");
    for (int b = 0, first = 1; b < 256; b++)
        if (others[b]) {
            printf("%s\"0x%02X\": %llu", first ? "" : ", ", b, (unsigned long long)others[b]);
            first = 0;
        }
    printf("}, \"latency_hist_us\": {");
    for (int i = 0, first = 1; i < BUCKETS; i++)
        if (hist[i]) {
            printf("%s\"%llu\": %llu", first ? "" : ", ", (unsigned long long)bucket_value(i),
                   (unsigned long long)hist[i]);
            first = 0;
        }
    printf("}");
    if (recorded)
        printf(", \"latency_max_ms\": %.3f, \"latency_p50_ms\": %.3f, \"latency_p99_ms\": %.3f",
               worst / 1e6, percentile(recorded, 0.50) / 1e3, percentile(recorded, 0.99) / 1e3);
    else
        printf(", \"latency_max_ms\": null, \"latency_p50_ms\": null, \"latency_p99_ms\": null");
    printf(", \"cpu_s\": %.6f}\n", cpu_s());
    fflush(stdout);
    return 0;
}
