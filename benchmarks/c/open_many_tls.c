/* Connection set-up over TLS in C (OpenSSL): makes its own sockets, does each connection's TLS
 * handshake, sends its request, reads its CONNACK (and SUBACK), and holds the connections open,
 * idle, until told to close them.
 *
 *   open_many_tls HOST PORT VERSION CONCURRENCY TIMEOUT_S CAFILE TLS_VERSION RESUMPTION [split]
 *
 * stdin holds the number of connections (uint32), then one record per connection: whether the
 * request ends with a SUBSCRIBE (uint8), the request's length (uint32) and its bytes, encoded
 * by Python (benchmarks/wire.py), in the machine's byte order. HOST is an IPv4 address, which
 * the server's certificate must name (its subjectAltName); the certificate is verified against
 * CAFILE. TLS_VERSION is 1.2 or 1.3 (that version only). RESUMPTION is "off" (every handshake a
 * full one), "slot" (a priming round first sets up every connection once, each keeping the
 * session, or TLS 1.3 ticket, it was given, and closes it; connection i then offers the session
 * of its own slot) or "shared" (a priming round of one connection; every connection offers its
 * session). "split" writes a subscribing connection's SUBSCRIBE only once its CONNACK has come.
 *
 * Each connection: connect(), the TLS handshake driven by epoll, the whole request in one
 * SSL_write, then SSL_read until the CONNACK has reason code 0 (and the SUBACK only codes below
 * 0x80). At most CONCURRENCY connections are being set up at once.
 *
 * The conversation, one JSON line on stdout per step:
 *   after the records (and the priming round): {"ready": true, "sessions": <slots with a session
 *     to offer>, "primed_s": ...}; then it waits for one byte on stdin before it starts;
 *   when all are set up: {"elapsed_s": ..., "cpu_s": ..., "handshakes": N, "resumed": <how many
 *     of them the server resumed>, "receive_max": [per connection]}, from the first connect()
 *     to the last CONNACK (or SUBACK), cpu_s its own (getrusage); then it holds them, reading
 *     nothing, until stdin ends (or another byte comes);
 *   then, for each connection, what the broker has sent it since its CONNACK (SUBACK), read
 *     without waiting, and whether the broker has closed it, a DISCONNECT, close_notify and
 *     close(): {"dropped": <connections the broker had closed>, "publishes": <PUBLISH packets
 *     they had been sent, e.g. a persistent session's queued messages>}, exit status 0.
 * A refusal, a failed handshake (a certificate that does not verify says so), an unexpected
 * packet, a closed connection or TIMEOUT_S passing is {"error": "..."} and exit status 1.
 */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <signal.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <openssl/err.h>
#include <openssl/ssl.h>
#include <openssl/x509v3.h>

#include "mqtt_setup.h"
#include "report.h"

#define EVENTS 256

enum resumption { OFF, SLOT, SHARED };

struct conn {
    int fd;
    uint32_t events; /* what epoll watches for it (0: not registered) */
    SSL *ssl;
    SSL_SESSION *session; /* its slot's, with RESUMPTION slot */
    uint8_t resumed;
    uint32_t out_len, out_sent, out_limit; /* out_limit: what may be written yet */
    uint8_t *out;
    struct setup s; /* last: its buffer is not cleared */
};

static struct conn *conns;
static long n;
static SSL_CTX *ctx;
static enum resumption resumption = OFF;
static SSL_SESSION *shared_session;
static struct sockaddr_in addr;
static int version, split, ep;
static const char *host_name;

/* OpenSSL's new-session callback: keep the session (TLS 1.2) or ticket (TLS 1.3) for the
 * connection's slot, or the first one for all; 1 when kept (the reference is ours). */
static int new_session(SSL *ssl, SSL_SESSION *session) {
    struct conn *c = SSL_get_app_data(ssl);
    if (resumption == SLOT) {
        if (c->session)
            SSL_SESSION_free(c->session);
        c->session = session;
        return 1;
    }
    if (resumption == SHARED && !shared_session) {
        shared_session = session;
        return 1;
    }
    return 0;
}

static void watch(struct conn *c, long index, uint32_t events) {
    if (c->events == events)
        return;
    struct epoll_event ev = {.events = events, .data.u64 = (uint64_t)index};
    if (epoll_ctl(ep, c->events ? EPOLL_CTL_MOD : EPOLL_CTL_ADD, c->fd, &ev) < 0)
        fail("epoll_ctl: %s", strerror(errno));
    c->events = events;
}

/* An SSL call returned r <= 0: watch for what it waits for, or fail with why it failed. */
static void wait_or_fail(struct conn *c, long index, int r, const char *doing) {
    int err = SSL_get_error(c->ssl, r);
    if (err == SSL_ERROR_WANT_READ) {
        watch(c, index, EPOLLIN);
        return;
    }
    if (err == SSL_ERROR_WANT_WRITE) {
        watch(c, index, EPOLLOUT);
        return;
    }
    long verify = SSL_get_verify_result(c->ssl);
    if (verify != X509_V_OK)
        fail("connection %ld: TLS handshake failed: certificate verify failed: %s", index,
             X509_verify_cert_error_string(verify));
    unsigned long code = ERR_get_error();
    if (code) {
        char why[256];
        ERR_error_string_n(code, why, sizeof why);
        fail("connection %ld: %s failed: %s", index, doing, why);
    }
    if (err == SSL_ERROR_ZERO_RETURN || (err == SSL_ERROR_SYSCALL && errno == 0))
        fail("broker closed connection %ld during setup (%s)", index, doing);
    fail("connection %ld: %s failed: %s", index, doing, strerror(errno));
}

/* Write what may be written of the request; 1 when all of it is. */
static int send_request(struct conn *c, long index) {
    while (c->out_sent < c->out_limit) {
        int r = SSL_write(c->ssl, c->out + c->out_sent, (int)(c->out_limit - c->out_sent));
        if (r <= 0) {
            wait_or_fail(c, index, r, "writing the request");
            return 0;
        }
        c->out_sent += (uint32_t)r;
    }
    return 1;
}

static void close_conn(struct conn *c) {
    static const uint8_t disconnect[2] = {0xE0, 0x00};
    if (c->ssl) {
        ERR_clear_error();
        if (SSL_write(c->ssl, disconnect, sizeof disconnect) > 0)
            SSL_shutdown(c->ssl); /* close_notify, not waiting for the broker's */
        SSL_free(c->ssl);
        c->ssl = NULL;
    }
    if (c->fd >= 0)
        close(c->fd);
    c->fd = -1;
    c->events = 0;
}

/* Start connection index: a socket, connect(), its SSL. */
static void start(struct conn *c, long index) {
    c->fd = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (c->fd < 0)
        fail("socket: %s", strerror(errno));
    int one = 1;
    setsockopt(c->fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    c->ssl = SSL_new(ctx);
    if (!c->ssl)
        fail("SSL_new failed");
    SSL_set_fd(c->ssl, c->fd);
    SSL_set_connect_state(c->ssl);
    SSL_set_app_data(c->ssl, c);
    SSL_SESSION *offer = resumption == SLOT ? c->session : shared_session;
    if (offer && !SSL_set_session(c->ssl, offer))
        fail("connection %ld: SSL_set_session failed", index);
    c->out_sent = c->s.in_len = 0;
    c->s.phase = HANDSHAKE;
    if (connect(c->fd, (struct sockaddr *)&addr, sizeof addr) < 0) {
        if (errno != EINPROGRESS)
            fail("connect to %s:%d failed: %s", host_name, ntohs(addr.sin_port), strerror(errno));
        c->s.phase = CONNECTING;
    }
}

/* Take connection index as far as it goes now: 1 when it is set up. */
static int drive(struct conn *c, long index) {
    for (;;) {
        int r;
        switch (c->s.phase) {
        case CONNECTING: {
            int err = 0;
            socklen_t len = sizeof err;
            getsockopt(c->fd, SOL_SOCKET, SO_ERROR, &err, &len);
            if (err == EINPROGRESS || err == EALREADY) {
                watch(c, index, EPOLLOUT);
                return 0;
            }
            if (err)
                fail("connect to %s:%d failed: %s", host_name, ntohs(addr.sin_port), strerror(err));
            c->s.phase = HANDSHAKE;
            break;
        }
        case HANDSHAKE:
            ERR_clear_error();
            r = SSL_do_handshake(c->ssl);
            if (r <= 0) {
                wait_or_fail(c, index, r, "TLS handshake");
                return 0;
            }
            c->resumed = (uint8_t)SSL_session_reused(c->ssl);
            c->s.phase = SENDING;
            break;
        case SENDING:
            ERR_clear_error();
            if (!send_request(c, index))
                return 0;
            c->s.phase = AWAIT_CONNACK;
            break;
        case AWAIT_CONNACK:
        case AWAIT_SUBACK: {
            ERR_clear_error();
            r = SSL_read(c->ssl, c->s.in + c->s.in_len, (int)(IN_MAX - c->s.in_len));
            if (r <= 0) {
                wait_or_fail(c, index, r, "reading the CONNACK");
                return 0;
            }
            c->s.in_len += (uint32_t)r;
            int connack = 0;
            int done = setup_received(&c->s, index, version, &connack);
            if (connack && c->out_limit < c->out_len) { /* split: the SUBSCRIBE goes now */
                c->out_limit = c->out_len;
                if (!send_request(c, index))
                    fail("connection %ld: the SUBSCRIBE did not fit the socket", index);
            }
            if (done)
                return 1;
            break;
        }
        default:
            return 1;
        }
    }
}

/* Connection index is set up: out of epoll; a priming round closes it (its session kept). */
static void finished(struct conn *c, int priming) {
    if (c->events)
        epoll_ctl(ep, EPOLL_CTL_DEL, c->fd, NULL);
    c->events = 0;
    if (priming) {
        char byte; /* (reads a TLS 1.3 ticket that came after the CONNACK) */
        ERR_clear_error();
        SSL_read(c->ssl, &byte, 1);
        close_conn(c);
    }
}

/* Set up connections [0, count), at most concurrency at once: the time it took, this
 * process's CPU meanwhile, and how many handshakes the server resumed. */
static void set_up(long count, long concurrency, double timeout, int priming, double *elapsed,
                   double *cpu, long *resumed) {
    struct epoll_event events[EVENTS];
    double t0 = now_ns() / 1e9, c0 = cpu_s(), deadline = t0 + timeout;
    long next = 0, pending = 0, done = 0;
    *resumed = 0;
    while (done < count) {
        while (pending < concurrency && next < count) {
            struct conn *c = &conns[next];
            start(c, next);
            if (drive(c, next)) { /* (never before the broker's answer, in practice) */
                *resumed += c->resumed;
                finished(c, priming);
                done++;
            } else {
                pending++;
            }
            next++;
        }
        if (done == count)
            break;
        if (now_ns() / 1e9 > deadline)
            fail("%ld connection(s) not set up after %.0f s", pending, timeout);
        int ready = epoll_wait(ep, events, EVENTS, 1000);
        if (ready < 0 && errno != EINTR)
            fail("epoll_wait: %s", strerror(errno));
        for (int k = 0; k < ready; k++) {
            long index = (long)events[k].data.u64;
            struct conn *c = &conns[index];
            if (c->s.phase == DONE || !drive(c, index))
                continue;
            *resumed += c->resumed;
            finished(c, priming);
            pending--;
            done++;
        }
    }
    *elapsed = now_ns() / 1e9 - t0;
    *cpu = cpu_s() - c0;
}

/* What connection index has been sent since it was set up (the bytes its setup read beyond
 * the CONNACK or SUBACK included), read without waiting: how many PUBLISH packets, counted by
 * their fixed headers (a packet longer than IN_MAX is counted, then its rest skipped); *closed
 * set when the broker has closed the connection. */
static long received_publishes(struct conn *c, long index, int *closed) {
    long count = 0;
    uint32_t skip = 0; /* of a long packet already counted, the bytes not read yet */
    for (;;) {
        uint32_t pos = 0;
        while (pos < c->s.in_len) {
            uint32_t body = pos + 1;
            long len = varint(c->s.in, &body, c->s.in_len);
            if (len == -2)
                fail("connection %ld: malformed remaining length after setup", index);
            if (len < 0)
                break;
            uint32_t end = body + (uint32_t)len;
            if (end > c->s.in_len && end - pos <= IN_MAX)
                break; /* the rest of it is still to come */
            count += c->s.in[pos] >> 4 == 3;
            if (end > c->s.in_len) {
                skip = end - c->s.in_len;
                pos = c->s.in_len;
                break;
            }
            pos = end;
        }
        memmove(c->s.in, c->s.in + pos, c->s.in_len - pos);
        c->s.in_len -= pos;
        ERR_clear_error();
        int r = SSL_read(c->ssl, c->s.in + c->s.in_len, (int)(IN_MAX - c->s.in_len));
        if (r <= 0) {
            *closed = SSL_get_error(c->ssl, r) != SSL_ERROR_WANT_READ;
            return count;
        }
        uint32_t got = (uint32_t)r, gone = got < skip ? got : skip;
        skip -= gone;
        memmove(c->s.in + c->s.in_len, c->s.in + c->s.in_len + gone, got - gone);
        c->s.in_len += got - gone;
    }
}

/* Wait for a byte on stdin: 1 when one came, 0 when stdin ended. */
static int wait_stdin(void) {
    char byte;
    for (;;) {
        ssize_t got = read(0, &byte, 1);
        if (got < 0 && errno == EINTR)
            continue;
        return got > 0;
    }
}

int main(int argc, char **argv) {
    if (argc != 9 && !(argc == 10 && strcmp(argv[9], "split") == 0))
        fail("usage: open_many_tls HOST PORT VERSION CONCURRENCY TIMEOUT_S CAFILE TLS_VERSION "
             "RESUMPTION [split] < requests");
    split = argc == 10;
    signal(SIGPIPE, SIG_IGN); /* a connection the broker closed fails its write instead */
    host_name = argv[1];
    addr = (struct sockaddr_in){.sin_family = AF_INET, .sin_port = htons((uint16_t)atoi(argv[2]))};
    if (inet_pton(AF_INET, argv[1], &addr.sin_addr) != 1)
        fail("not an IPv4 address: %s", argv[1]);
    version = atoi(argv[3]);
    long concurrency = atol(argv[4]);
    double timeout = atof(argv[5]);
    if (concurrency < 1)
        fail("concurrency must be at least 1");
    int tls_version;
    if (strcmp(argv[7], "1.2") == 0)
        tls_version = TLS1_2_VERSION;
    else if (strcmp(argv[7], "1.3") == 0)
        tls_version = TLS1_3_VERSION;
    else
        fail("TLS_VERSION must be 1.2 or 1.3, not %s", argv[7]);
    if (strcmp(argv[8], "off") == 0)
        resumption = OFF;
    else if (strcmp(argv[8], "slot") == 0)
        resumption = SLOT;
    else if (strcmp(argv[8], "shared") == 0)
        resumption = SHARED;
    else
        fail("RESUMPTION must be off, slot or shared, not %s", argv[8]);

    ctx = SSL_CTX_new(TLS_client_method());
    if (!ctx)
        fail("SSL_CTX_new failed");
    SSL_CTX_set_min_proto_version(ctx, tls_version);
    SSL_CTX_set_max_proto_version(ctx, tls_version);
    if (SSL_CTX_load_verify_locations(ctx, argv[6], NULL) != 1)
        fail("cannot load the CA file %s", argv[6]);
    SSL_CTX_set_verify(ctx, SSL_VERIFY_PEER, NULL);
    if (X509_VERIFY_PARAM_set1_ip_asc(SSL_CTX_get0_param(ctx), argv[1]) != 1)
        fail("cannot check the certificate for %s", argv[1]);
    SSL_CTX_set_mode(ctx, SSL_MODE_RELEASE_BUFFERS);
    SSL_CTX_set_session_cache_mode(ctx, SSL_SESS_CACHE_CLIENT | SSL_SESS_CACHE_NO_INTERNAL_STORE);
    SSL_CTX_sess_set_new_cb(ctx, new_session);

    uint32_t count;
    stdin_rest(&count, sizeof count);
    n = count;
    conns = calloc(n ? (size_t)n : 1, sizeof *conns);
    if (!conns)
        fail("out of memory for %ld connections", n);
    for (long i = 0; i < n; i++) {
        struct conn *c = &conns[i];
        c->fd = -1;
        c->s.receive_max = 65535;
        stdin_rest(&c->s.subscribing, 1);
        stdin_rest(&c->out_len, sizeof c->out_len);
        c->out = malloc(c->out_len);
        stdin_rest(c->out, c->out_len);
        c->out_limit = c->out_len;
        if (split && c->s.subscribing) /* the CONNECT alone first */
            c->out_limit = first_packet_len(c->out, c->out_len, i);
    }
    ep = epoll_create1(0);
    if (ep < 0)
        fail("epoll_create1: %s", strerror(errno));

    double elapsed = 0, cpu;
    long resumed, sessions = 0;
    if (resumption != OFF && n) {
        set_up(resumption == SLOT ? n : 1, concurrency, timeout, 1, &elapsed, &cpu, &resumed);
        for (long i = 0; i < n; i++) {
            struct conn *c = &conns[i];
            sessions += resumption == SLOT ? c->session != NULL : shared_session != NULL;
            c->s.receive_max = 65535;
            c->out_limit = split && c->s.subscribing ? first_packet_len(c->out, c->out_len, i)
                                                     : c->out_len;
        }
    }
    printf("{\"ready\": true, \"sessions\": %ld, \"primed_s\": %.6f}\n", sessions, elapsed);
    fflush(stdout);
    if (!wait_stdin())
        return 0;

    set_up(n, concurrency, timeout, 0, &elapsed, &cpu, &resumed);
    printf("{\"elapsed_s\": %.6f, \"cpu_s\": %.6f, \"handshakes\": %ld, \"resumed\": %ld, "
           "\"receive_max\": [", elapsed, cpu, n, resumed);
    for (long i = 0; i < n; i++)
        printf(i ? ",%u" : "%u", conns[i].s.receive_max);
    printf("]}\n");
    fflush(stdout);

    wait_stdin();
    long dropped = 0, publishes = 0;
    for (long i = 0; i < n; i++) {
        struct conn *c = &conns[i];
        int closed;
        publishes += received_publishes(c, i, &closed);
        dropped += closed;
        close_conn(c);
    }
    printf("{\"dropped\": %ld, \"publishes\": %ld}\n", dropped, publishes);
    fflush(stdout);
    return 0;
}
