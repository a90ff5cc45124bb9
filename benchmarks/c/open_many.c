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

#include "mqtt_setup.h"
#include "report.h"

#define EVENTS 256

struct conn {
    int fd;
    uint32_t out_len, out_sent, out_limit; /* out_limit: what may be written yet */
    uint8_t *out;
    struct setup s; /* last: its buffer is not cleared */
};

static int send_request(struct conn *c, long index);

/* Handle the complete packets read; 1 when the connection is set up. */
static int received(struct conn *c, long index, int version) {
    int connack = 0;
    int done = setup_received(&c->s, index, version, &connack);
    if (connack && c->out_limit < c->out_len) { /* split: the SUBSCRIBE goes now */
        c->out_limit = c->out_len;
        if (!send_request(c, index))
            fail("connection %ld: the SUBSCRIBE did not fit the socket", index);
    }
    return done;
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
        memset(c, 0, offsetof(struct conn, s.in));
        c->fd = fd;
        c->s.receive_max = 65535;
        stdin_rest(&c->s.subscribing, 1);
        stdin_rest(&c->out_len, sizeof c->out_len);
        c->out = malloc(c->out_len);
        stdin_rest(c->out, c->out_len);
        c->out_limit = c->out_len;
        if (split && c->s.subscribing) /* the CONNECT alone first */
            c->out_limit = first_packet_len(c->out, c->out_len, n - 1);
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
                c->s.phase = AWAIT_CONNACK;
                ev.events = EPOLLIN;
            } else {
                c->s.phase = CONNECTING;
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
            if (c->s.phase == CONNECTING) {
                int err = 0;
                socklen_t len = sizeof err;
                getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &len);
                if (err)
                    fail("connect to %s:%s failed: %s", argv[1], argv[2], strerror(err));
                if (send_request(c, index)) {
                    c->s.phase = AWAIT_CONNACK;
                    struct epoll_event ev = {.events = EPOLLIN, .data.fd = fd};
                    epoll_ctl(ep, EPOLL_CTL_MOD, fd, &ev);
                }
                continue;
            }
            ssize_t got = recv(fd, c->s.in + c->s.in_len, IN_MAX - c->s.in_len, 0);
            if (got < 0) {
                if (errno == EAGAIN || errno == EINTR)
                    continue;
                fail("connection %ld: recv failed: %s", index, strerror(errno));
            }
            if (got == 0)
                fail("broker closed connection %ld during setup", index);
            c->s.in_len += (uint32_t)got;
            if (!received(c, index, version))
                continue;
            epoll_ctl(ep, EPOLL_CTL_DEL, fd, NULL);
            pending--;
            done++;
        }
    }
    double elapsed = now_ns() / 1e9 - t0, cpu = cpu_s() - c0;
    printf("{\"elapsed_s\": %.6f, \"cpu_s\": %.6f, \"receive_max\": [", elapsed, cpu);
    for (long i = 0; i < n; i++)
        printf(i ? ",%u" : "%u", conns[i].s.receive_max);
    printf("], \"rest\": {");
    int first = 1;
    for (long i = 0; i < n; i++) {
        if (!conns[i].s.in_len)
            continue;
        printf(first ? "\"%ld\": \"" : ", \"%ld\": \"", i);
        for (uint32_t k = 0; k < conns[i].s.in_len; k++)
            printf("%02x", conns[i].s.in[k]);
        putchar('"');
        first = 0;
    }
    printf("}}\n");
    fflush(stdout);
    return 0;
}
