/* Scenario 1w's publishers in C: one PUBLISH per send, none while the previous one is still
 * queued in its socket.
 *
 *   one_per_write COUNTERS_FD < publishers
 *
 * The caller (benchmarks/devices.py, OnePerWriteC) passes the publishers' connected sockets
 * (non-blocking, TCP_NODELAY) as inherited descriptors, and stdin holds one record per
 * publisher: the descriptor (int32), the PUBLISH's length (uint32) and its bytes, encoded by
 * Python, in the machine's byte order. COUNTERS_FD is an inherited file of at least 32 bytes,
 * mapped shared by both processes: four uint64, [stop, sent, attempts, held]. Once stdin is
 * read, this process goes round the publishers until the caller sets stop: each attempt reads
 * the socket's bytes not yet sent (SIOCOUTQNSD) and, when there are none, sends the PUBLISH
 * (a partial send is finished before anything else); an attempt that finds bytes still queued,
 * or a full socket, is held. The counters are stored after every round. A publisher whose send
 * fails is left out from then on. At stop it prints {"failed": [indices]} and exits; an error
 * is {"error": "..."} and exit status 1.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <linux/sockios.h>
#include <poll.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <unistd.h>

#include "report.h"

enum { STOP, SENT, ATTEMPTS, HELD, COUNTERS };

struct publisher {
    int fd;
    int failed;
    uint32_t len;
    uint8_t *packet;
};

/* The rest of a partial send, waiting for room: nothing else may go out on this socket first. */
static int send_rest(int fd, const uint8_t *p, size_t n) {
    while (n) {
        ssize_t sent = send(fd, p, n, MSG_NOSIGNAL);
        if (sent < 0) {
            if (errno == EINTR)
                continue;
            if (errno != EAGAIN)
                return -1;
            struct pollfd w = {.fd = fd, .events = POLLOUT};
            poll(&w, 1, 1000);
            continue;
        }
        p += sent;
        n -= (size_t)sent;
    }
    return 0;
}

int main(int argc, char **argv) {
    if (argc != 2)
        fail("usage: one_per_write COUNTERS_FD < publishers");
    volatile uint64_t *counters =
        mmap(NULL, COUNTERS * sizeof(uint64_t), PROT_READ | PROT_WRITE, MAP_SHARED, atoi(argv[1]), 0);
    if (counters == MAP_FAILED)
        fail("mmap of descriptor %s: %s", argv[1], strerror(errno));
    int n = 0, cap = 16;
    struct publisher *pubs = malloc(cap * sizeof *pubs);
    for (;;) {
        int32_t fd;
        if (!stdin_read(&fd, sizeof fd))
            break;
        if (n == cap)
            pubs = realloc(pubs, (cap *= 2) * sizeof *pubs);
        struct publisher *p = &pubs[n++];
        p->fd = fd;
        p->failed = 0;
        stdin_rest(&p->len, sizeof p->len);
        p->packet = malloc(p->len);
        stdin_rest(p->packet, p->len);
    }
    uint64_t sent = 0, attempts = 0, held = 0;
    while (!__atomic_load_n(&counters[STOP], __ATOMIC_ACQUIRE)) {
        for (int i = 0; i < n; i++) {
            struct publisher *p = &pubs[i];
            if (p->failed)
                continue;
            attempts++;
            int unsent = 0;
            if (ioctl(p->fd, SIOCOUTQNSD, &unsent) < 0 || unsent > 0) {
                held++;
                continue;
            }
            ssize_t k = send(p->fd, p->packet, p->len, MSG_DONTWAIT | MSG_NOSIGNAL);
            if (k < 0) {
                if (errno == EAGAIN || errno == EINTR)
                    held++;
                else
                    p->failed = 1;
                continue;
            }
            if ((uint32_t)k < p->len && send_rest(p->fd, p->packet + k, p->len - (size_t)k) < 0) {
                p->failed = 1;
                continue;
            }
            sent++;
        }
        __atomic_store_n(&counters[SENT], sent, __ATOMIC_RELAXED);
        __atomic_store_n(&counters[ATTEMPTS], attempts, __ATOMIC_RELAXED);
        __atomic_store_n(&counters[HELD], held, __ATOMIC_RELAXED);
    }
    printf("{\"failed\": [");
    for (int i = 0, first = 1; i < n; i++) {
        if (pubs[i].failed) {
            printf(first ? "%d" : ", %d", i);
            first = 0;
        }
    }
    printf("]}\n");
    fflush(stdout);
    return 0;
}
