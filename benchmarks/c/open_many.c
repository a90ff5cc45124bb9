/* Connection set-up in C: connects sockets the caller made, sends each its request, reads
 * each its CONNACK (and SUBACK), and leaves the connections open for the caller.
 *
 *   open_many HOST PORT VERSION CONCURRENCY TIMEOUT_S [split] < requests
 *
 * The caller (benchmarks/client.py, open_many) creates the sockets, non-blocking, and passes
 * them to this process as inherited descriptors; stdin holds one record per connection, in
 * order: the descriptor (int32), whether the request ends with a SUBSCRIBE (uint8), the
 * request's length (uint32) and its bytes (the CONNECT, then the SUBSCRIBE if any), all encoded
 * by Python (benchmarks/wire.py), in the machine's byte order. Once stdin is read this process
 * starts the clock and keeps at most CONCURRENCY connections being set up at once: connect(),
 * write the whole request as soon as the connection is made (one send, unless the socket takes
 * part of it; a client need not wait for the CONNACK before it subscribes), read until the
 * CONNACK has reason code 0 (anything else is a refusal) and, when subscribing, the SUBACK has
 * only codes below 0x80. With "split" a subscribing connection writes its SUBSCRIBE only once its
 * CONNACK has come (two round trips, as clients that wait for the CONNACK do). HOST is an IPv4 address (the caller resolves names). The clock stops
 * when the last connection is set up. The result is one JSON line on stdout:
 *   {"elapsed_s": ..., "cpu_s": ..., "receive_max": [per connection],
 *    "rest": {"<index>": "<hex of bytes read after the last awaited packet>", ...}}
 * cpu_s is this process's own (getrusage) over the timed part. A refusal, an unexpected
 * packet, a closed connection or TIMEOUT_S passing is {"error": "..."} and exit status 1; the
 * caller closes the sockets. The descriptors stay open in the caller, which goes on using them.
 */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <unistd.h>

#include "report.h"

#define IN_MAX 1024 /* a CONNACK and a SUBACK with their properties, and what follows */
#define EVENTS 256

enum phase { IDLE, CONNECTING, AWAIT_CONNACK, AWAIT_SUBACK, DONE };

struct conn {
    int fd;
    uint8_t subscribing;
    uint8_t phase;
    uint32_t out_len, out_sent, out_limit; /* out_limit: what may be written yet */
    uint8_t *out;
    uint32_t in_len;
    uint8_t in[IN_MAX];
    uint16_t receive_max;
};

/* A variable byte integer at buf[*pos] (below end): its value, *pos moved past it; -1 when
 * incomplete, -2 when malformed. */
static long varint(const uint8_t *buf, uint32_t *pos, uint32_t end) {
    long value = 0;
    for (int shift = 0; shift < 28; shift += 7) {
        if (*pos >= end)
            return -1;
        uint8_t b = buf[(*pos)++];
        value |= (long)(b & 0x7F) << shift;
        if (!(b & 0x80))
            return value;
    }
    return -2;
}

/* MQTT 5 CONNACK properties in [pos, end): the Receive Maximum, 65535 when absent. */
static uint16_t receive_maximum(const uint8_t *p, uint32_t pos, uint32_t end) {
    long len = varint(p, &pos, end);
    if (len < 0 || pos + (uint32_t)len > end)
        return 65535;
    end = pos + (uint32_t)len;
    while (pos < end) {
        uint8_t id = p[pos++];
        switch (id) {
        case 0x21: /* Receive Maximum */
            return pos + 2 <= end ? (uint16_t)(p[pos] << 8 | p[pos + 1]) : 65535;
        case 0x01: case 0x17: case 0x19: case 0x24: case 0x25: case 0x28: case 0x29: case 0x2A:
            pos += 1;
            break;
        case 0x13: case 0x22:
            pos += 2;
            break;
        case 0x02: case 0x11: case 0x27:
            pos += 4;
            break;
        case 0x0B: {
            long v = varint(p, &pos, end);
            if (v < 0)
                return 65535;
            break;
        }
        case 0x26: { /* user property: two strings */
            for (int k = 0; k < 2 && pos + 2 <= end; k++)
                pos += 2 + (p[pos] << 8 | p[pos + 1]);
            break;
        }
        default: /* a string or binary data */
            if (pos + 2 > end)
                return 65535;
            pos += 2 + (p[pos] << 8 | p[pos + 1]);
        }
    }
    return 65535;
}

static int send_request(struct conn *c, long index);

/* Handle the complete packets in c->in; 1 when the connection is set up. */
static int received(struct conn *c, long index, int version) {
    uint32_t pos = 0;
    while (c->phase == AWAIT_CONNACK || c->phase == AWAIT_SUBACK) {
        uint32_t body = pos + 1;
        long len = varint(c->in, &body, c->in_len);
        if (len == -2)
            fail("connection %ld: malformed remaining length", index);
        if (len < 0 || body + (uint32_t)len > c->in_len)
            break;
        uint8_t first = c->in[pos];
        uint32_t end = body + (uint32_t)len;
        const uint8_t *b = c->in + body;
        if (c->phase == AWAIT_CONNACK && first >> 4 == 2 && len >= 2) {
            if (b[1] != 0)
                fail("CONNACK refused connection %ld: reason 0x%02X", index, b[1]);
            if (version == 5)
                c->receive_max = receive_maximum(c->in, body + 2, end);
            c->phase = c->subscribing ? AWAIT_SUBACK : DONE;
            if (c->out_limit < c->out_len) { /* split: the SUBSCRIBE goes now */
                c->out_limit = c->out_len;
                if (!send_request(c, index))
                    fail("connection %ld: the SUBSCRIBE did not fit the socket", index);
            }
        } else if (c->phase == AWAIT_SUBACK && first >> 4 == 9 && len >= 3) {
            uint32_t at = body + 2;
            if (version == 5) {
                long props = varint(c->in, &at, end);
                if (props < 0)
                    fail("connection %ld: malformed SUBACK", index);
                at += (uint32_t)props;
            }
            if (at >= end)
                fail("SUBACK without reason codes for connection %ld", index);
            for (; at < end; at++)
                if (c->in[at] >= 0x80)
                    fail("SUBACK refused for connection %ld: code 0x%02X", index, c->in[at]);
            c->phase = DONE;
        } else {
            fail("connection %ld: unexpected packet 0x%02X during setup", index, first);
        }
        pos = end;
    }
    memmove(c->in, c->in + pos, c->in_len - pos);
    c->in_len -= pos;
    return c->phase == DONE;
}

/* Write what is left of the request; 1 when all of it is written. */
static int send_request(struct conn *c, long index) {
    while (c->out_sent < c->out_limit) {
        ssize_t n = send(c->fd, c->out + c->out_sent, c->out_limit - c->out_sent, MSG_NOSIGNAL);
        if (n < 0) {
            if (errno == EAGAIN || errno == EINTR || errno == ENOTCONN)
                return 0;
            fail("connection %ld: send failed: %s", index, strerror(errno));
        }
        c->out_sent += (uint32_t)n;
    }
    return 1;
}

int main(int argc, char **argv) {
    if (argc != 6 && !(argc == 7 && strcmp(argv[6], "split") == 0))
        fail("usage: open_many HOST PORT VERSION CONCURRENCY TIMEOUT_S [split] < requests");
    int split = argc == 7;
    struct sockaddr_in addr = {.sin_family = AF_INET, .sin_port = htons((uint16_t)atoi(argv[2]))};
    if (inet_pton(AF_INET, argv[1], &addr.sin_addr) != 1)
        fail("not an IPv4 address: %s", argv[1]);
    int version = atoi(argv[3]);
    long concurrency = atol(argv[4]);
    double timeout = atof(argv[5]);
    if (concurrency < 1)
        fail("concurrency must be at least 1");

    long n = 0, cap = 1024;
    struct conn *conns = malloc(cap * sizeof *conns);
    for (;;) {
        int32_t fd;
        if (!stdin_read(&fd, sizeof fd))
            break;
        if (n == cap)
            conns = realloc(conns, (cap *= 2) * sizeof *conns);
        struct conn *c = &conns[n++];
        memset(c, 0, offsetof(struct conn, in));
        c->fd = fd;
        c->receive_max = 65535;
        stdin_rest(&c->subscribing, 1);
        stdin_rest(&c->out_len, sizeof c->out_len);
        c->out = malloc(c->out_len);
        stdin_rest(c->out, c->out_len);
        c->out_limit = c->out_len;
        if (split && c->subscribing) { /* the CONNECT alone first */
            uint32_t pos = 1;
            long len = varint(c->out, &pos, c->out_len);
            if (len < 0 || pos + (uint32_t)len > c->out_len)
                fail("request %ld: malformed CONNECT", n - 1);
            c->out_limit = pos + (uint32_t)len;
        }
    }
    /* the connection of a descriptor, for epoll: descriptors are small integers */
    int max_fd = 0;
    for (long i = 0; i < n; i++)
        if (conns[i].fd > max_fd)
            max_fd = conns[i].fd;
    long *by_fd = malloc((max_fd + 1) * sizeof *by_fd);

    int ep = epoll_create1(0);
    if (ep < 0)
        fail("epoll_create1: %s", strerror(errno));
    struct epoll_event events[EVENTS];
    double t0 = now_ns() / 1e9, c0 = cpu_s(), deadline = t0 + timeout;
    long next = 0, pending = 0, done = 0;
    while (done < n) {
        while (pending < concurrency && next < n) {
            struct conn *c = &conns[next];
            by_fd[c->fd] = next;
            if (connect(c->fd, (struct sockaddr *)&addr, sizeof addr) < 0 && errno != EINPROGRESS)
                fail("connect to %s:%s failed: %s", argv[1], argv[2], strerror(errno));
            struct epoll_event ev = {.data.fd = c->fd};
            if (send_request(c, next)) {
                c->phase = AWAIT_CONNACK;
                ev.events = EPOLLIN;
            } else {
                c->phase = CONNECTING;
                ev.events = EPOLLOUT;
            }
            if (epoll_ctl(ep, EPOLL_CTL_ADD, c->fd, &ev) < 0)
                fail("epoll_ctl: %s", strerror(errno));
            pending++;
            next++;
        }
        if (now_ns() / 1e9 > deadline)
            fail("%ld connection(s) not set up after %.0f s", pending, timeout);
        int ready = epoll_wait(ep, events, EVENTS, 1000);
        if (ready < 0 && errno != EINTR)
            fail("epoll_wait: %s", strerror(errno));
        for (int k = 0; k < ready; k++) {
            int fd = events[k].data.fd;
            long index = by_fd[fd];
            struct conn *c = &conns[index];
            if (c->phase == CONNECTING) {
                int err = 0;
                socklen_t len = sizeof err;
                getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &len);
                if (err)
                    fail("connect to %s:%s failed: %s", argv[1], argv[2], strerror(err));
                if (send_request(c, index)) {
                    c->phase = AWAIT_CONNACK;
                    struct epoll_event ev = {.events = EPOLLIN, .data.fd = fd};
                    epoll_ctl(ep, EPOLL_CTL_MOD, fd, &ev);
                }
                continue;
            }
            ssize_t got = recv(fd, c->in + c->in_len, IN_MAX - c->in_len, 0);
            if (got < 0) {
                if (errno == EAGAIN || errno == EINTR)
                    continue;
                fail("connection %ld: recv failed: %s", index, strerror(errno));
            }
            if (got == 0)
                fail("broker closed connection %ld during setup", index);
            c->in_len += (uint32_t)got;
            if (!received(c, index, version)) {
                if (c->in_len == IN_MAX)
                    fail("connection %ld: more than %d bytes without the packet awaited", index, IN_MAX);
                continue;
            }
            epoll_ctl(ep, EPOLL_CTL_DEL, fd, NULL);
            pending--;
            done++;
        }
    }
    double elapsed = now_ns() / 1e9 - t0, cpu = cpu_s() - c0;
    printf("{\"elapsed_s\": %.6f, \"cpu_s\": %.6f, \"receive_max\": [", elapsed, cpu);
    for (long i = 0; i < n; i++)
        printf(i ? ",%u" : "%u", conns[i].receive_max);
    printf("], \"rest\": {");
    int first = 1;
    for (long i = 0; i < n; i++) {
        if (!conns[i].in_len)
            continue;
        printf(first ? "\"%ld\": \"" : ", \"%ld\": \"", i);
        for (uint32_t k = 0; k < conns[i].in_len; k++)
            printf("%02x", conns[i].in[k]);
        putchar('"');
        first = 0;
    }
    printf("}}\n");
    fflush(stdout);
    return 0;
}
