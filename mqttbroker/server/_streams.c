/* The broker's own TCP transport (Linux): see streams.py, which uses it.
 *
 * A Poller owns an epoll instance that the event loop watches as one descriptor
 * (loop.add_reader(poller.fileno(), poller.poll)). Each call of poll() takes what epoll has
 * ready, without waiting: it accepts on the listening sockets and, for each connection, writes
 * what is buffered and reads (again while a read fills the buffer, as libuv), handing the bytes
 * to the protocol. Interest in an event is added at once and dropped lazily, when epoll
 * reports one no longer wanted (as libuv, which applies changes at its next poll). A lone
 * read after a quiet spell is acknowledged (TCP) after the protocol has handled it. Hooks
 * (begin, end), when set, are called before and after each poll() that finds something ready,
 * end() even after a callback that raised: the broker flushes the pass's output there. With
 * ``gather`` set (seconds), a pass that found two or more sockets ready is followed by a sleep
 * (the GIL released) until that long after it began, so that the next pass reads in one go
 * what arrived meanwhile: fewer passes, system calls and writes per message, each message
 * waiting up to that long (gather_us in the README). Not after a pass that read a socket
 * written to since its previous read: its client may be waiting for that answer (a PUBACK)
 * before it sends more. Nor while sockets have been found ready at a rate that would gather
 * fewer than GATHER_MIN in one sleep (measured over RATE_WINDOW_NS): the sleep is a wake-up
 * of its own, tens of microseconds of CPU on a virtual machine, which a few messages more per
 * pass do not pay back, where at a high rate it replaces many passes. Each connection is a
 * Stream: an asyncio transport (write, close, abort, write_eof, pause_reading...) of 64 bytes,
 * where uvloop's transport and libuv's handle hold about 1,250 bytes per socket. What a write
 * leaves unsent waits in the stream's queue (Pending), copied or, a bytes object of REF_MIN
 * bytes or more, by reference (the
 * broker writes one encoding of a message to all its subscribers: shared, not copied for each
 * client that does not read), and goes out with sendmsg() over the queue, in order. On a TLS
 * listener each Stream is a TLSStream, OpenSSL on its socket (see "TLS" below).
 *
 * The protocol's callbacks are asyncio's: connection_made and data_received are called from
 * poll(), connection_lost with loop.call_soon once the socket is closed, pause_writing and
 * resume_writing around the write buffer's high and low water marks. An exception from one of
 * them goes to loop.call_exception_handler and aborts that connection, as in asyncio.
 *
 * References: the Poller's table holds each open Stream; a Stream holds its protocol until
 * connection_lost was called, and only a borrowed pointer to its Poller, used while it is
 * open (the Poller closes every Stream before it goes). Neither type is tracked by the cycle
 * collector: the one cycle (Stream -> protocol -> Stream) is broken when connection_lost is
 * called, or when the Poller goes.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <stddef.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

#ifdef MQTTBROKER_TLS
#include <openssl/err.h>
#include <openssl/ssl.h>
#include <openssl/x509v3.h>
#endif

#define READ_SIZE (256 * 1024) /* as uvloop's */
#define MAX_EVENTS 1024        /* per poll(), as libuv's */
#define ACCEPT_BATCH 100       /* accepts per listening socket and poll() */
#define READ_REPEAT 32         /* reads per socket and poll() while each fills the buffer */
#define DEFAULT_HIGH (64 * 1024)
#define SHRINK_ABOVE (256 * 1024) /* a write buffer larger shrinks once mostly written */
#define QUIET_NS 100000           /* this long after poll() last ended: the loop was idle */
#define RATE_WINDOW_NS 10000000   /* the rate of sockets found ready is measured over this */
#define GATHER_MIN 4              /* sockets a gather sleep must be expected to gather */
#define REF_MIN (16 * 1024)       /* unsent bytes of a bytes object kept by reference, from */
#define INLINE_CHUNKS 4           /* chunks a Pending holds in itself (a power of 2) */
#define IOV_BATCH 64              /* chunks per sendmsg() */

static char read_buffer[READ_SIZE]; /* copied out before any Python code runs */

static PyObject *s_data_received, *s_eof_received, *s_connection_made, *s_connection_lost,
    *s_pause_writing, *s_resume_writing, *s_call_exception_handler, *s_remove_reader,
    *s_peername, *s_sockname, *s_lost;

typedef struct Poller Poller;

/* A run of the bytes written and not yet sent: the rest of a bytes object kept by reference
 * (``ref``, from ``offset``), or (``ref`` NULL) the next ``size`` bytes of the copy buffer. */
typedef struct {
    PyObject *ref;
    size_t offset, size;
} Chunk;

/* What is written and not yet taken by the socket, in order: a queue of chunks. A bytes object
 * of at least REF_MIN bytes unsent that someone else holds too is kept by reference (it cannot
 * change; the broker writes the one encoding of a message to every subscriber, so that many
 * connections share it). Anything smaller, or mutable (bytearray, memoryview), is copied into
 * the buffer ``data``, consecutive copies one chunk; so is a bytes object only the caller
 * holds (a reference count of 1: made for this write, a join of the packets of a pass, and let
 * go of after it): held, it would save no memory, and its block would come back to the
 * allocator later and out of order (a client that reads fast, 64 KiB writes: 5 to 15 times the
 * page faults, 13% more CPU per byte), where copied it is reused by the next write at once.
 * Allocated while anything is unsent, NULL otherwise. */
typedef struct {
    size_t total;                /* bytes of all chunks: get_write_buffer_size() */
    size_t start, end, capacity; /* the copy buffer: its unsent bytes are data[start..end) */
    Chunk *chunks;               /* a ring of ``room`` chunks: inline_chunks or its own */
    uint32_t head, count, room;
    Chunk inline_chunks[INLINE_CHUNKS];
    char data[];
} Pending;

typedef struct {
    PyObject_HEAD
    int fd; /* -1 once closed */
    unsigned closing : 1;      /* close() or abort() called, or a fatal error */
    unsigned reading : 1;      /* reading wanted: not paused */
    unsigned at_eof : 1;       /* the peer's EOF was read */
    unsigned eof_pending : 1;  /* write_eof(): shut writing down once the buffer is written */
    unsigned eof_sent : 1;
    unsigned write_paused : 1; /* the protocol was told pause_writing */
    unsigned registered : 1;   /* in the epoll set */
    unsigned written : 1;      /* written to since it was last read (see Poller_poll) */
    unsigned tls : 1;          /* a TLSStream: its SSL on the socket (see "TLS" below) */
    unsigned handshaking : 1;  /* TLS: the handshake is not done; the protocol has no connection */
    unsigned hs_want_write : 1;   /* TLS: the handshake waits for the socket to take more */
    unsigned read_want_write : 1; /* TLS: SSL_read waits for the socket to take more */
    unsigned write_want_read : 1; /* TLS: SSL_write waits for the peer's bytes */
    unsigned shut_want_write : 1; /* TLS: the close_notify waits for the socket to take it */
    unsigned tls_done : 1;     /* TLS: no more SSL calls (close_notify sent, or a fatal error) */
    unsigned draining : 1;     /* TLS: closed, FIN sent; reading and dropping until the peer's */
    unsigned again : 1;        /* TLS: in the poller's list to read again (see read_again) */
    uint32_t events;           /* the epoll mask registered */
    uint32_t high, low;        /* write buffer limits */
    Poller *poller;            /* borrowed, while fd >= 0 */
    PyObject *protocol;
    Pending *pending;
} Stream;

#ifdef MQTTBROKER_TLS
/* A Stream of a TLS listener: the SSL object over its socket (NULL once closed). */
typedef struct {
    Stream base;
    SSL *ssl;
} TLSStream;
#define SSL_OF(s) (((TLSStream *)(s))->ssl)
#else
typedef struct SSL_CTX SSL_CTX; /* never made: TLS listeners use the Python layer */
#endif

/* A TLS handshake's end of time: the stream (a reference) and when (monotonic_ns). */
typedef struct {
    Stream *stream;
    uint64_t at;
} Deadline;

typedef struct {
    PyObject_HEAD
    int fd;
    int registered;
    PyObject *factory;  /* () -> protocol */
    PyObject *on_error; /* (fd, OSError): accepting failed and is paused */
    SSL_CTX *ctx;       /* a TLS listener's context (a reference of ours), or NULL */
    int nodelay;        /* TCP_NODELAY: NODELAY_UNKNOWN, NODELAY_INHERITED or NODELAY_EACH */
} Acceptor;

/* TCP_NODELAY is set on the listening socket, and Linux gives it to each socket accepted from
 * it (the new socket is a copy of the listener's): the first accepted one is asked, and only if
 * it does not have it is it set on each (a system call per connection). */
enum { NODELAY_UNKNOWN, NODELAY_INHERITED, NODELAY_EACH };

struct Poller {
    PyObject_HEAD
    int epfd;
    int shutting_down;
    double accept_retry; /* seconds without accepting after running out of descriptors */
    PyObject *loop;
    PyObject *call_soon;
    PyObject *pass_begin, *pass_end; /* () -> None around each poll() that found events: both
                                      * callables, or both NULL */
    PyObject **table; /* fd -> Stream or Acceptor (a reference each), or NULL */
    int table_size;
    Py_ssize_t streams;
    int acceptors;
    uint64_t last_end; /* when poll() last ended: ns of CLOCK_MONOTONIC */
    uint64_t rate_begin; /* the window counting sockets found ready began (ns) */
    uint64_t rate_ready; /* sockets found ready in it so far */
    int dense;           /* the last window's rate would gather GATHER_MIN in one sleep */
    uint64_t gather;   /* ns from a busy pass's start to the next pass's, at least (0: off) */
    uint64_t holds;    /* sleeps for it */
    uint64_t hs_timeout;  /* ns a TLS handshake may take (0: no limit) */
    Deadline *hs_queue;   /* the handshakes begun, oldest first: [hs_head, hs_head + hs_count) */
    size_t hs_head, hs_count, hs_room;
    PyObject *hs_timer;   /* the loop's TimerHandle for the oldest, or NULL */
    Stream **again;       /* TLS streams to read again (a reference each; see read_again) */
    size_t again_count, again_room;
    int again_scheduled;  /* a poll() is scheduled with call_soon for them */
    struct epoll_event events[MAX_EVENTS];
};

static PyTypeObject StreamType, AcceptorType, PollerType;
static int release(Poller *p);
static int flush(Stream *s);
static void finish(Stream *s, PyObject *exc, int notify);
static void fail_errno(Stream *s, int error);
static int tls_send(Stream *s);
static void tls_shut(Stream *s);
static int tls_read_all(Stream *s);
static void tls_free(Stream *s);

/* ---- helpers ----------------------------------------------------------------------------- */

static size_t page_round(size_t size) { return (size + 4095) & ~(size_t)4095; }

static uint64_t monotonic_ns(void) {
    struct timespec now;
    clock_gettime(CLOCK_MONOTONIC, &now);
    return (uint64_t)now.tv_sec * 1000000000u + (uint64_t)now.tv_nsec;
}

static size_t buffered(Stream *s) { return s->pending ? s->pending->total : 0; }

/* ---- the write queue (Pending) ----------------------------------------------------------- */

static Pending *pending_new(size_t capacity) {
    Pending *q = PyMem_Malloc(sizeof(Pending) + capacity);
    if (!q) return NULL;
    q->total = q->start = q->end = 0;
    q->capacity = capacity;
    q->chunks = q->inline_chunks;
    q->head = q->count = 0;
    q->room = INLINE_CHUNKS;
    return q;
}

/* ``q`` moved to a block with a copy buffer of ``capacity`` (at least its unsent bytes), them
 * at its start; NULL (``q`` unchanged) without memory. */
static Pending *pending_move(Pending *q, size_t capacity) {
    size_t kept = q->end - q->start;
    Pending *moved = PyMem_Malloc(sizeof(Pending) + capacity);
    if (!moved) return NULL;
    memcpy(moved, q, sizeof(Pending));
    if (q->chunks == q->inline_chunks) moved->chunks = moved->inline_chunks;
    memcpy(moved->data, q->data + q->start, kept);
    moved->start = 0;
    moved->end = kept;
    moved->capacity = capacity;
    PyMem_Free(q);
    return moved;
}

/* The queue let go of: the objects it keeps released (bytes: no code runs). */
static void pending_free(Pending *q) {
    if (!q) return;
    for (uint32_t i = 0; i < q->count; i++)
        Py_XDECREF(q->chunks[(q->head + i) & (q->room - 1)].ref);
    if (q->chunks != q->inline_chunks) PyMem_Free(q->chunks);
    PyMem_Free(q);
}

static Chunk *chunk_at(Pending *q, uint32_t i) { return &q->chunks[(q->head + i) & (q->room - 1)]; }

/* A chunk at the queue's end (``ref`` a new reference taken); -1 without memory. */
static int push_chunk(Pending *q, PyObject *ref, size_t offset, size_t size) {
    if (q->count == q->room) {
        Chunk *grown = PyMem_Malloc(sizeof(Chunk) * 2 * (size_t)q->room);
        if (!grown) return -1;
        for (uint32_t i = 0; i < q->count; i++) grown[i] = *chunk_at(q, i);
        if (q->chunks != q->inline_chunks) PyMem_Free(q->chunks);
        q->chunks = grown;
        q->head = 0;
        q->room *= 2;
    }
    Chunk *c = &q->chunks[(q->head + q->count) & (q->room - 1)];
    c->ref = Py_XNewRef(ref);
    c->offset = offset;
    c->size = size;
    q->count++;
    return 0;
}

/* ``n`` bytes from the queue's front were sent: chunks done are let go. */
static void consume(Pending *q, size_t n) {
    while (n) {
        Chunk *c = chunk_at(q, 0);
        size_t taken = n < c->size ? n : c->size;
        if (c->ref) c->offset += taken;
        else q->start += taken;
        c->size -= taken;
        q->total -= taken;
        n -= taken;
        if (c->size) break;
        Py_CLEAR(c->ref);
        q->head = (q->head + 1) & (q->room - 1);
        q->count--;
        if (q->start == q->end) q->start = q->end = 0; /* the copy buffer from its start again */
    }
}

/* ``len`` bytes of ``data`` (``bytes`` its buffer, from ``offset``) at the queue's end: by
 * reference or copied (see Pending). -1 without memory, nothing queued. */
static int enqueue(Stream *s, PyObject *data, const char *bytes, size_t offset, size_t len) {
    Pending *q = s->pending;
    int by_ref = len >= REF_MIN && PyBytes_CheckExact(data) && Py_REFCNT(data) > 1;
    if (!q) {
        q = pending_new(by_ref ? 0 : page_round(len + len / 2));
        if (!q) return -1;
        s->pending = q;
    } else if (!by_ref && q->capacity - q->end < len) {
        size_t kept = q->end - q->start, need = kept + len;
        if (need <= q->capacity / 4 * 3) { /* room enough once what was sent is gone */
            memmove(q->data, q->data + q->start, kept);
            q->start = 0;
            q->end = kept;
        } else {
            Pending *grown = pending_move(q, page_round(need + need / 2));
            if (!grown) return -1;
            s->pending = q = grown;
        }
    }
    Chunk *last = q->count ? chunk_at(q, q->count - 1) : NULL;
    if (by_ref || !last || last->ref) {
        if (push_chunk(q, by_ref ? data : NULL, by_ref ? offset : 0, by_ref ? len : 0) < 0) {
            if (!q->total) {
                pending_free(q);
                s->pending = NULL;
            }
            return -1;
        }
        last = chunk_at(q, q->count - 1);
    }
    if (!by_ref) {
        memcpy(q->data + q->end, bytes + offset, len);
        q->end += len;
        last->size += len;
    }
    q->total += len;
    return 0;
}

static void drop_stale(Poller *p, int fd);

/* Put ``entry`` (a new reference is taken) at ``fd``; an entry already there is stale (see
 * drop_stale) and let go first. */
static int table_put(Poller *p, int fd, PyObject *entry) {
    if (fd < p->table_size && p->table[fd]) drop_stale(p, fd);
    if (fd >= p->table_size) {
        int size = p->table_size ? p->table_size : 1024;
        while (size <= fd) size *= 2;
        PyObject **table = PyMem_Realloc(p->table, sizeof(PyObject *) * (size_t)size);
        if (!table) {
            PyErr_NoMemory();
            return -1;
        }
        memset(table + p->table_size, 0, sizeof(PyObject *) * (size_t)(size - p->table_size));
        p->table = table;
        p->table_size = size;
    }
    Py_INCREF(entry);
    p->table[fd] = entry;
    return 0;
}

static int can_read(Stream *s) { return s->reading && !s->closing && !s->at_eof; }

static uint32_t wanted(Stream *s) {
    if (!s->tls) return (can_read(s) ? EPOLLIN : 0) | (buffered(s) ? EPOLLOUT : 0);
    if (s->draining) return EPOLLIN;
    if (s->handshaking) return s->hs_want_write ? EPOLLOUT : EPOLLIN;
    if (s->shut_want_write) return EPOLLOUT;
    /* SSL_write waiting for the peer's bytes (a TLS 1.2 renegotiation) reads, not writes; an
     * SSL_read waiting to write (its answer to a key update, say) waits for room. */
    uint32_t in = can_read(s) || (s->write_want_read && buffered(s)) ? EPOLLIN : 0;
    uint32_t out = (buffered(s) && !s->write_want_read) || s->read_want_write ? EPOLLOUT : 0;
    return in | out;
}

static int set_events(Stream *s, uint32_t want) {
    if (want == s->events && (want != 0) == s->registered) return 0;
    struct epoll_event ev = {.events = want, .data.fd = s->fd};
    int rc;
    if (!want) {
        rc = epoll_ctl(s->poller->epfd, EPOLL_CTL_DEL, s->fd, &ev);
        s->registered = 0;
    } else if (!s->registered) {
        rc = epoll_ctl(s->poller->epfd, EPOLL_CTL_ADD, s->fd, &ev);
        s->registered = 1;
    } else {
        rc = epoll_ctl(s->poller->epfd, EPOLL_CTL_MOD, s->fd, &ev);
    }
    s->events = want;
    return rc;
}

/* Register exactly the events the stream's state asks for (none: out of the set). */
static int update_events(Stream *s) { return s->fd < 0 ? 0 : set_events(s, wanted(s)); }

/* Register the events the stream now wants and does not have; keep those it no longer wants
 * until epoll reports one (poll() then drops them). As libuv does, lazily: a reading paused for
 * the input budget and resumed the next pass, or a write buffer drained and filled again, costs
 * no epoll_ctl at all. */
static int add_events(Stream *s) {
    if (s->fd < 0) return 0;
    uint32_t want = wanted(s);
    if (s->registered && !(want & ~s->events)) return 0;
    return set_events(s, want | s->events);
}

/* Report an exception the protocol raised (the current one) to the loop's handler. */
static void report(Stream *s, const char *message) {
    PyObject *type, *value, *tb;
    PyErr_Fetch(&type, &value, &tb);
    PyErr_NormalizeException(&type, &value, &tb);
    if (tb && value) PyException_SetTraceback(value, tb);
    PyObject *context = Py_BuildValue("{s:s,s:O,s:O,s:O}", "message", message, "exception",
                                      value ? value : Py_None, "transport", (PyObject *)s,
                                      "protocol", s->protocol ? s->protocol : Py_None);
    if (context && s->poller) {
        PyObject *r =
            PyObject_CallMethodOneArg(s->poller->loop, s_call_exception_handler, context);
        if (!r) PyErr_WriteUnraisable((PyObject *)s);
        Py_XDECREF(r);
        Py_DECREF(context);
        Py_XDECREF(type);
        Py_XDECREF(value);
        Py_XDECREF(tb);
        return;
    }
    /* No loop to tell (the callback had closed its stream already): as an unraisable. */
    Py_XDECREF(context);
    if (context) PyErr_Restore(type, value, tb);
    else {
        Py_XDECREF(type);
        Py_XDECREF(value);
        Py_XDECREF(tb);
    }
    PyErr_WriteUnraisable((PyObject *)s);
}

/* Let the stream go: out of the epoll set and the table, its socket closed when ``owned`` (not
 * when the descriptor was closed behind our back: its number may be another socket's now), and
 * connection_lost(exc) called soon (unless the loop is gone: `notify` 0, then the protocol is
 * only let go). The table's reference goes last. */
static void detach(Stream *s, PyObject *exc, int notify, int owned) {
    int fd = s->fd;
    if (fd < 0) return;
    Poller *p = s->poller;
    if (s->handshaking) notify = 0; /* the protocol never had the connection */
    s->closing = 1;
    if (s->tls) tls_free(s);
    if (s->registered && owned) {
        struct epoll_event ev = {0};
        epoll_ctl(p->epfd, EPOLL_CTL_DEL, fd, &ev);
    }
    s->registered = 0;
    s->fd = -1;
    s->events = 0;
    s->poller = NULL;
    PyObject *entry = p->table[fd]; /* this stream: its reference is dropped last */
    p->table[fd] = NULL;
    p->streams--;
    if (owned) close(fd);
    pending_free(s->pending);
    s->pending = NULL;
    if (notify) {
        PyObject *lost = PyObject_GetAttr((PyObject *)s, s_lost);
        PyObject *r = lost ? PyObject_CallFunctionObjArgs(p->call_soon, lost,
                                                          exc ? exc : Py_None, NULL)
                           : NULL;
        if (!r) notify = 0; /* the loop is closed, say: connection_lost will not come */
        if (!r) PyErr_WriteUnraisable((PyObject *)s);
        Py_XDECREF(r);
        Py_XDECREF(lost);
    }
    if (!notify) Py_CLEAR(s->protocol); /* no cycle left behind */
    if (owned && p->shutting_down && p->streams == 0) release(p); /* may free p */
    Py_XDECREF(entry);
}

/* Close the socket now, and have connection_lost(exc) called soon (see detach). */
static void finish(Stream *s, PyObject *exc, int notify) { detach(s, exc, notify, 1); }

/* Each errno's message, as PyErr_SetFromErrno would give it, made at its first use:
 * strerror() looks the message up in the locale's catalogue and PyErr_SetFromErrno decodes it
 * from the locale's encoding, each time (0.3 µs, per connection where clients end with a
 * reset, as openssl s_time's do). */
#define ERRNO_MESSAGES 256
static PyObject *errno_messages[ERRNO_MESSAGES];

/* The OSError of ``error`` (its subclass: ConnectionResetError...), a new reference, with no
 * exception left set; NULL only when even that failed. */
static PyObject *os_error(int error) {
    PyObject *message = NULL;
    if (error > 0 && error < ERRNO_MESSAGES) {
        message = errno_messages[error];
        if (!message) {
            message = errno_messages[error] = PyUnicode_DecodeLocale(strerror(error), "surrogateescape");
            if (!message) PyErr_Clear();
        }
    }
    if (message) {
        PyObject *exc = PyObject_CallFunction(PyExc_OSError, "iO", error, message);
        if (exc) return exc; /* OSError(errno, text) is of errno's subclass */
        PyErr_Clear();
    }
    errno = error;
    PyErr_SetFromErrno(PyExc_OSError);
    PyObject *type, *value, *tb;
    PyErr_Fetch(&type, &value, &tb);
    PyErr_NormalizeException(&type, &value, &tb);
    Py_XDECREF(type);
    Py_XDECREF(tb);
    return value;
}

/* The entry at ``fd`` when a new socket is given that number: its descriptor was closed
 * behind the poller's back (os.close on the number), so it is let go without closing anything
 * (the number is the new socket's); a stream's protocol hears connection_lost(OSError EBADF). */
static void drop_stale(Poller *p, int fd) {
    PyObject *entry = p->table[fd];
    if (Py_IS_TYPE(entry, &StreamType)) {
        PyObject *exc = os_error(EBADF);
        detach((Stream *)entry, exc, 1, 0);
        Py_XDECREF(exc);
    } else {
        p->table[fd] = NULL;
        p->acceptors--;
        Py_DECREF(entry);
    }
}

/* An error on the socket (errno): close it, connection_lost gets the OSError. */
static void fail_errno(Stream *s, int error) {
    PyObject *exc = os_error(error);
    finish(s, exc, 1);
    Py_XDECREF(exc);
}

/* The protocol raised (the current exception): report it and abort, as asyncio does. Returns
 * -1 when the exception must propagate (not an Exception: KeyboardInterrupt, SystemExit). */
static int fail_callback(Stream *s, const char *message) {
    if (!PyErr_ExceptionMatches(PyExc_Exception)) {
        Py_INCREF(s);
        PyObject *type, *value, *tb;
        PyErr_Fetch(&type, &value, &tb);
        finish(s, NULL, 1);
        PyErr_Restore(type, value, tb);
        Py_DECREF(s);
        return -1;
    }
    report(s, message);
    finish(s, NULL, 1);
    return 0;
}

static int call_protocol(Stream *s, PyObject *name, const char *message) {
    PyObject *r = PyObject_CallMethodNoArgs(s->protocol, name);
    if (!r) return fail_callback(s, message);
    Py_DECREF(r);
    return 0;
}

/* A closing stream has written all it had: TCP closes; TLS sends its close_notify first. */
static void written_out(Stream *s) {
    if (s->tls) tls_shut(s);
    else finish(s, NULL, 1);
}

/* Write what is buffered; the protocol hears resume_writing below the low mark; a closing
 * stream closes once it is all written. */
static int flush(Stream *s) {
    Pending *q = s->pending;
    if (s->tls) {
        if (tls_send(s) < 0) return 0; /* failed: closed */
        q = s->pending;
    }
    while (!s->tls && q && q->total) {
        struct iovec iov[IOV_BATCH];
        int count = 0;
        size_t at = q->start;
        for (uint32_t i = 0; i < q->count && count < IOV_BATCH; i++, count++) {
            Chunk *c = chunk_at(q, i);
            if (c->ref) {
                iov[count].iov_base = PyBytes_AS_STRING(c->ref) + c->offset;
            } else {
                iov[count].iov_base = q->data + at;
                at += c->size;
            }
            iov[count].iov_len = c->size;
        }
        struct msghdr msg = {.msg_iov = iov, .msg_iovlen = (size_t)count};
        ssize_t n = sendmsg(s->fd, &msg, MSG_NOSIGNAL);
        if (n < 0) {
            if (errno == EINTR) continue;
            if (errno == EAGAIN || errno == EWOULDBLOCK) break;
            fail_errno(s, errno);
            return 0;
        }
        consume(q, (size_t)n);
    }
    if (q && !q->total) {
        pending_free(q);
        s->pending = NULL;
    } else if (q && q->capacity > SHRINK_ABOVE && q->end - q->start < q->capacity / 4) {
        /* A large copy buffer mostly written: keep twice what is left, not the peak. */
        Pending *smaller = pending_move(q, page_round(2 * (q->end - q->start)));
        if (smaller) s->pending = smaller;
    }
    if (s->write_paused && buffered(s) <= s->low) {
        s->write_paused = 0;
        if (call_protocol(s, s_resume_writing, "protocol.resume_writing() failed") < 0)
            return -1;
        if (s->fd < 0) return 0;
    }
    if (!s->pending) {
        if (s->closing) {
            written_out(s);
        } else if (s->eof_pending && !s->eof_sent) {
            s->eof_sent = 1;
            shutdown(s->fd, SHUT_WR);
        }
    }
    return 0;
}

/* The first ``n`` bytes of the read buffer to the protocol. */
static int deliver(Stream *s, size_t n) {
    PyObject *data = PyBytes_FromStringAndSize(read_buffer, (Py_ssize_t)n);
    if (!data) return fail_callback(s, "reading failed");
    PyObject *r = PyObject_CallMethodOneArg(s->protocol, s_data_received, data);
    Py_DECREF(data);
    if (!r) return fail_callback(s, "Fatal error: protocol.data_received() call failed.");
    Py_DECREF(r);
    return 0;
}

static int peer_eof(Stream *s);

/* Read what the socket has: again while a read fills the whole buffer (as libuv, at most
 * READ_REPEAT times) and the protocol still reads. */
static int read_all(Stream *s) {
    ssize_t n;
    for (int repeat = 0;; repeat++) {
        do {
            n = recv(s->fd, read_buffer, READ_SIZE, 0);
        } while (n < 0 && errno == EINTR);
        if (n <= 0) break;
        int rc = deliver(s, (size_t)n);
        if (rc < 0) return rc;
        if (n < READ_SIZE || repeat + 1 >= READ_REPEAT || s->fd < 0 || !can_read(s)) return 0;
    }
    if (n < 0) {
        if (errno != EAGAIN && errno != EWOULDBLOCK) fail_errno(s, errno);
        return 0;
    }
    return peer_eof(s);
}

/* The peer shut its side (TLS: its close_notify, or the end of TCP without one): no more
 * reading; the protocol's eof_received() says whether to close. */
static int peer_eof(Stream *s) {
    s->at_eof = 1;
    if (update_events(s) < 0) {
        fail_errno(s, errno);
        return 0;
    }
    PyObject *r = PyObject_CallMethodNoArgs(s->protocol, s_eof_received);
    if (!r) return fail_callback(s, "Fatal error: protocol.eof_received() call failed.");
    int keep_open = PyObject_IsTrue(r);
    Py_DECREF(r);
    if (keep_open < 0) return fail_callback(s, "Fatal error: protocol.eof_received() call failed.");
    if (!keep_open && s->fd >= 0 && !s->closing) {
        s->closing = 1;
        if (!s->pending) written_out(s);
        else if (update_events(s) < 0) fail_errno(s, errno);
    }
    return 0;
}

/* Read, as read_all; with ``ack_after``, the TCP acknowledgement of what is read is sent after
 * the protocol has handled it, not by recv(). Once the kernel's quick acknowledgements are
 * spent, a recv() that empties the socket of a small segment sends the ACK itself (a
 * transmission, and on loopback the peer's processing of it, inline), before the broker has
 * forwarded anything. TCP_QUICKACK off ("ping-pong" mode: the ACK waits to ride on data)
 * holds it through the read; TCP_QUICKACK on sends it right after, and leaves the mode. */
static int read_ready(Stream *s, int ack_after) {
    /* (On an open TCP socket neither call fails; if one did, the read goes on as without.) */
    int fd = s->fd, off = 0, on = 1;
    if (ack_after) setsockopt(fd, IPPROTO_TCP, TCP_QUICKACK, &off, sizeof off);
    int rc = s->tls ? tls_read_all(s) : read_all(s);
    if (ack_after && s->fd == fd) setsockopt(fd, IPPROTO_TCP, TCP_QUICKACK, &on, sizeof on);
    return rc;
}

/* ---- TLS ---------------------------------------------------------------------------------
 *
 * A TLS listener's Stream (TLSStream) has an SSL object of the listener's SSL_CTX (the
 * ssl.SSLContext that security/tls.py built: its certificates, verification and tickets) on
 * the socket itself, as Mosquitto does: OpenSSL reads and writes the socket. The handshake runs
 * on readiness, what it waits for (SSL_ERROR_WANT_READ / WANT_WRITE) being the epoll interest,
 * and the protocol's connection_made comes once it is done; a handshake that fails, or is not
 * done within the poller's handshake_timeout, closes the socket (logged at debug level) and the
 * protocol hears nothing. Then SSL_read fills the read buffer for data_received, and the write
 * queue (Pending) holds the plain bytes SSL_write has not taken yet, one record at a time
 * (SSL_MODE_ENABLE_PARTIAL_WRITE: what it has taken has reached the socket): buffer sizes,
 * flow control and the queue's sharing are the plain stream's. OpenSSL reads ahead (a recv of
 * up to a buffer of records, not two per record), so what it holds may be more than epoll
 * announces: a read stopped by pause_reading or by READ_REPEAT, with bytes left in the SSL
 * object, is taken up again by a poll() scheduled for it (read_again). SSL_MODE_RELEASE_BUFFERS
 * frees OpenSSL's buffers while the connection is idle. close() sends a close_notify after what
 * is buffered, then the FIN, and reads and drops what the peer still sends until its FIN (the
 * MQTT protocol bounds that wait). */

static PyObject *logger; /* logging.getLogger("mqttbroker.tcp"), taken at first use */

/* "host:port" of the peer, into ``text``. */
static void peer_text(int fd, char *text, size_t size) {
    struct sockaddr_storage addr;
    socklen_t len = sizeof addr;
    char host[INET6_ADDRSTRLEN] = "?";
    int port = 0;
    if (fd >= 0 && getpeername(fd, (struct sockaddr *)&addr, &len) == 0) {
        if (addr.ss_family == AF_INET) {
            const struct sockaddr_in *in = (const struct sockaddr_in *)&addr;
            inet_ntop(AF_INET, &in->sin_addr, host, sizeof host);
            port = ntohs(in->sin_port);
        } else if (addr.ss_family == AF_INET6) {
            const struct sockaddr_in6 *in6 = (const struct sockaddr_in6 *)&addr;
            inet_ntop(AF_INET6, &in6->sin6_addr, host, sizeof host);
            port = ntohs(in6->sin6_port);
        }
    }
    snprintf(text, size, "%s:%d", host, port);
}

/* log.debug(format, peer, reason) on the "mqttbroker.tcp" logger, when it logs debug. */
static void log_debug(int fd, const char *format, const char *reason) {
    PyObject *type, *value, *tb;
    PyErr_Fetch(&type, &value, &tb);
    if (!logger) {
        PyObject *logging = PyImport_ImportModule("logging");
        logger = logging ? PyObject_CallMethod(logging, "getLogger", "s", "mqttbroker.tcp") : NULL;
        Py_XDECREF(logging);
    }
    PyObject *on = logger ? PyObject_CallMethod(logger, "isEnabledFor", "i", 10) : NULL;
    if (on && PyObject_IsTrue(on) == 1) {
        char peer[INET6_ADDRSTRLEN + 16];
        peer_text(fd, peer, sizeof peer);
        PyObject *r = PyObject_CallMethod(logger, "debug", "sss", format, peer, reason);
        Py_XDECREF(r);
    }
    Py_XDECREF(on);
    PyErr_Clear();
    PyErr_Restore(type, value, tb);
}

/* The handshake timer, to fire ``delay`` ns from now (and a millisecond). */
static int arm_expiry(Poller *p, uint64_t delay) {
    PyObject *expire = PyObject_GetAttrString((PyObject *)p, "_expire");
    p->hs_timer = expire ? PyObject_CallMethod(p->loop, "call_later", "dO", (double)delay / 1e9 + 1e-3,
                                               expire)
                         : NULL;
    Py_XDECREF(expire);
    return p->hs_timer ? 0 : -1;
}

#ifdef MQTTBROKER_TLS

/* SSL_get_error() reads the thread's error queue: it must be empty before each call. */
static void clear_errors(void) {
    if (ERR_peek_error()) ERR_clear_error();
}

/* Why an SSL call failed with ``error``, into ``text``; the error queue emptied. */
static void tls_reason(int error, int saved_errno, char *text, size_t size) {
    unsigned long e = ERR_peek_last_error();
    const char *reason = e ? ERR_reason_error_string(e) : NULL;
    if (reason) snprintf(text, size, "%s", reason);
    else if (e) ERR_error_string_n(e, text, size);
    else if (error == SSL_ERROR_SYSCALL && saved_errno) snprintf(text, size, "%s", strerror(saved_errno));
    else if (error == SSL_ERROR_SYSCALL) snprintf(text, size, "the peer closed the connection");
    else snprintf(text, size, "SSL error %d", error);
    ERR_clear_error();
}

/* A fatal TLS error (``error`` of SSL_get_error): logged (``format`` names it), the socket
 * closed; the protocol hears connection_lost(None) if it had the connection. */
static void tls_failed(Stream *s, int error, const char *format) {
    char reason[256];
    tls_reason(error, errno, reason, sizeof reason);
    s->tls_done = 1;
    log_debug(s->fd, format, reason);
    finish(s, NULL, 1);
}

static void tls_free(Stream *s) {
    SSL *ssl = SSL_OF(s);
    SSL_OF(s) = NULL;
    SSL_free(ssl);
}

/* Bytes the SSL object holds, read from the socket and not yet given to the protocol. */
static int tls_holds(Stream *s) { return SSL_OF(s) && (SSL_pending(SSL_OF(s)) || SSL_has_pending(SSL_OF(s))); }

/* Have poll() read ``s`` again soon: what its SSL object holds, no epoll event announces. */
static void read_again(Stream *s) {
    Poller *p = s->poller;
    if (s->again || !p) return;
    if (p->again_count == p->again_room) {
        size_t room = p->again_room ? 2 * p->again_room : 16;
        Stream **grown = PyMem_Realloc(p->again, sizeof(Stream *) * room);
        if (!grown) {
            PyErr_NoMemory();
            PyErr_WriteUnraisable((PyObject *)s);
            return;
        }
        p->again = grown;
        p->again_room = room;
    }
    Py_INCREF(s);
    s->again = 1;
    p->again[p->again_count++] = s;
    if (!p->again_scheduled) {
        PyObject *poll = PyObject_GetAttrString((PyObject *)p, "poll");
        PyObject *r = poll ? PyObject_CallOneArg(p->call_soon, poll) : NULL;
        Py_XDECREF(poll);
        if (r) p->again_scheduled = 1;
        else PyErr_WriteUnraisable((PyObject *)p);
        Py_XDECREF(r);
    }
}

/* What SSL_read's ``error`` means: wait, the peer's end, or a failure. */
static int tls_read_error(Stream *s, int error) {
    switch (error) {
    case SSL_ERROR_WANT_READ:
        return 0;
    case SSL_ERROR_WANT_WRITE:
        s->read_want_write = 1;
        if (add_events(s) < 0) fail_errno(s, errno);
        return 0;
    case SSL_ERROR_ZERO_RETURN: /* the peer's close_notify */
        return peer_eof(s);
    case SSL_ERROR_SYSCALL:
        if (errno && !ERR_peek_error()) {
            s->tls_done = 1;
            fail_errno(s, errno);
            return 0;
        }
        break;
    case SSL_ERROR_SSL:
        if (ERR_GET_REASON(ERR_peek_error()) == SSL_R_UNEXPECTED_EOF_WHILE_READING) {
            ERR_clear_error(); /* TCP's end without a close_notify: an EOF, as on TCP */
            s->tls_done = 1;
            return peer_eof(s);
        }
        break;
    }
    if (error == SSL_ERROR_SYSCALL && !ERR_peek_error()) { /* EOF (OpenSSL 1.1) */
        s->tls_done = 1;
        return peer_eof(s);
    }
    tls_failed(s, error, "TLS connection from %s failed: %s");
    return 0;
}

/* Read as read_all does, through the SSL object: records are decrypted into the read buffer
 * until it is full or OpenSSL has no more, then handed over in one data_received. */
static int tls_read_all(Stream *s) {
    s->read_want_write = 0;
    for (int repeat = 0;; repeat++) {
        size_t got = 0;
        int error = SSL_ERROR_NONE;
        while (got < READ_SIZE) {
            size_t n = 0;
            clear_errors();
            if (SSL_read_ex(SSL_OF(s), read_buffer + got, READ_SIZE - got, &n)) {
                got += n;
                continue;
            }
            error = SSL_get_error(SSL_OF(s), 0);
            break;
        }
        if (got) {
            int rc = deliver(s, got);
            if (rc < 0 || s->fd < 0) return rc;
            if (!can_read(s)) return 0; /* paused: resume_reading reads what is held */
        }
        if (error != SSL_ERROR_NONE) return tls_read_error(s, error);
        if (repeat + 1 >= READ_REPEAT) { /* the buffer filled each time: others' turn */
            if (tls_holds(s)) read_again(s);
            return 0;
        }
    }
}

/* What SSL_write's ``error`` means: 0 wait (for room, or for the peer's bytes), -1 failed
 * (the stream is closed). */
static int tls_write_error(Stream *s, int error) {
    if (error == SSL_ERROR_WANT_WRITE) return 0;
    if (error == SSL_ERROR_WANT_READ) {
        s->write_want_read = 1;
        return 0;
    }
    if (error == SSL_ERROR_SYSCALL && errno && !ERR_peek_error()) {
        s->tls_done = 1;
        fail_errno(s, errno);
        return -1;
    }
    tls_failed(s, error, "TLS connection from %s failed: %s");
    return -1;
}

/* Encrypt and send ``*len`` bytes from ``*bytes``, a record at a time, until the socket is
 * full; both advanced past what was taken. -1: failed, the stream is closed. */
static int tls_write_now(Stream *s, const char **bytes, size_t *len) {
    while (*len) {
        size_t n = 0;
        clear_errors();
        if (SSL_write_ex(SSL_OF(s), *bytes, *len, &n)) {
            *bytes += n;
            *len -= n;
            continue;
        }
        return tls_write_error(s, SSL_get_error(SSL_OF(s), 0));
    }
    return 0;
}

/* flush()'s writing, through the SSL object: the queue's chunks in order. A record that the
 * socket took in part stays OpenSSL's to finish: the next SSL_write is given the same bytes
 * (at the queue's front still; they may have moved: SSL_MODE_ACCEPT_MOVING_WRITE_BUFFER). */
static int tls_send(Stream *s) {
    Pending *q = s->pending;
    s->write_want_read = 0;
    while (q && q->total) {
        Chunk *c = chunk_at(q, 0);
        const char *bytes = c->ref ? PyBytes_AS_STRING(c->ref) + c->offset : q->data + q->start;
        size_t n = 0;
        clear_errors();
        if (SSL_write_ex(SSL_OF(s), bytes, c->size, &n)) {
            consume(q, n);
            continue;
        }
        return tls_write_error(s, SSL_get_error(SSL_OF(s), 0));
    }
    return 0;
}

/* Closing, all written: the close_notify (when the handshake is done and TLS still works),
 * then the FIN; the socket closes at the peer's FIN (at once if it came already). */
static void tls_shut(Stream *s) {
    if (s->handshaking) {
        finish(s, NULL, 0);
        return;
    }
    if (!s->tls_done) {
        clear_errors();
        int r = SSL_shutdown(SSL_OF(s));
        if (r < 0 && SSL_get_error(SSL_OF(s), r) == SSL_ERROR_WANT_WRITE) {
            s->shut_want_write = 1;
            if (update_events(s) < 0) fail_errno(s, errno);
            return;
        }
        ERR_clear_error();
    }
    s->tls_done = 1;
    s->shut_want_write = 0;
    if (s->at_eof) {
        finish(s, NULL, 1);
        return;
    }
    shutdown(s->fd, SHUT_WR);
    s->draining = 1;
    if (update_events(s) < 0) fail_errno(s, errno);
}

/* Closed, FIN sent: what the peer still sends is dropped; its FIN (or an error) closes. */
static void drain(Stream *s) {
    for (int i = 0; i < READ_REPEAT; i++) {
        ssize_t n = recv(s->fd, read_buffer, READ_SIZE, 0);
        if (n > 0 || (n < 0 && errno == EINTR)) continue;
        if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return;
        finish(s, NULL, 1);
        return;
    }
}

/* A step of the handshake; once done, the protocol's connection_made, and what OpenSSL read
 * ahead (the client's first packet may have come with its Finished) is read. */
static int tls_handshake(Stream *s) {
    clear_errors();
    int r = SSL_do_handshake(SSL_OF(s));
    if (r != 1) {
        int error = SSL_get_error(SSL_OF(s), r);
        if (error == SSL_ERROR_WANT_READ || error == SSL_ERROR_WANT_WRITE) {
            s->hs_want_write = error == SSL_ERROR_WANT_WRITE;
            if (update_events(s) < 0) fail_errno(s, errno);
            return 0;
        }
        tls_failed(s, error, "TLS handshake with %s failed: %s");
        return 0;
    }
    s->handshaking = s->hs_want_write = 0;
    PyObject *made = PyObject_CallMethodOneArg(s->protocol, s_connection_made, (PyObject *)s);
    if (!made) return fail_callback(s, "Fatal error: protocol.connection_made() call failed.");
    Py_DECREF(made);
    if (s->fd < 0) return 0;
    if (update_events(s) < 0) {
        fail_errno(s, errno);
        return 0;
    }
    return can_read(s) ? read_ready(s, 0) : 0;
}

/* What epoll reported ready for a TLS stream (see Poller_poll). */
static int tls_ready(Stream *s, uint32_t ready, int lone, int *answered) {
    int rc = 0;
    uint32_t in = ready & (EPOLLIN | EPOLLERR | EPOLLHUP), out = ready & (EPOLLOUT | EPOLLERR | EPOLLHUP);
    if (s->draining) {
        if (in) drain(s);
    } else if (s->handshaking) {
        rc = tls_handshake(s);
    } else if (s->shut_want_write) {
        if (out) tls_shut(s);
    } else {
        if (out && s->pending && !s->write_want_read) rc = flush(s);
        if (rc == 0 && out && s->fd >= 0 && s->read_want_write && can_read(s))
            rc = read_ready(s, 0);
        if (rc == 0 && in && s->fd >= 0 && s->write_want_read && s->pending) rc = flush(s);
        if (rc == 0 && in && s->fd >= 0 && !s->draining && can_read(s)) {
            *answered |= s->written;
            s->written = 0;
            rc = read_ready(s, lone);
        }
    }
    if (rc == 0 && s->fd >= 0 && (ready & ~wanted(s)) && update_events(s) < 0)
        fail_errno(s, errno);
    return rc;
}

/* A handshake's end of time, in the poller's queue; its timer armed if it was not. */
static int deadline_push(Poller *p, Stream *s) {
    if (!p->hs_timeout) return 0;
    if (p->hs_head + p->hs_count == p->hs_room) {
        if (p->hs_head && p->hs_head >= p->hs_room / 2) {
            memmove(p->hs_queue, p->hs_queue + p->hs_head, sizeof(Deadline) * p->hs_count);
            p->hs_head = 0;
        } else {
            size_t room = p->hs_room ? 2 * p->hs_room : 64;
            Deadline *grown = PyMem_Realloc(p->hs_queue, sizeof(Deadline) * room);
            if (!grown) {
                PyErr_NoMemory();
                return -1;
            }
            p->hs_queue = grown;
            p->hs_room = room;
        }
    }
    Py_INCREF(s);
    p->hs_queue[p->hs_head + p->hs_count++] = (Deadline){s, monotonic_ns() + p->hs_timeout};
    return p->hs_timer ? 0 : arm_expiry(p, p->hs_timeout);
}

/* The SSL object of a new connection: -1 (the stream closed) if none could be made. */
static int tls_begin(Poller *p, Acceptor *a, Stream *s) {
    s->handshaking = 1; /* from now on the protocol hears nothing until the handshake is done */
    SSL *ssl = SSL_new(a->ctx);
    SSL_OF(s) = ssl;
    if (!ssl || !SSL_set_fd(ssl, s->fd)) {
        tls_failed(s, SSL_ERROR_SSL, "TLS handshake with %s failed: %s");
        return -1;
    }
    SSL_set_accept_state(ssl);
    SSL_set_mode(ssl, SSL_MODE_ENABLE_PARTIAL_WRITE | SSL_MODE_ACCEPT_MOVING_WRITE_BUFFER |
                          SSL_MODE_RELEASE_BUFFERS);
    SSL_set_read_ahead(ssl, 1);
    if (deadline_push(p, s) < 0) {
        PyErr_WriteUnraisable((PyObject *)s);
        finish(s, NULL, 0);
        return -1;
    }
    return 0;
}

/* ---- the peer's certificate, as ssl.SSLSocket.getpeercert() gives it ---- */

/* (name, value) of an attribute: OpenSSL's long name (or the OID), the value in UTF-8. */
static PyObject *attribute(ASN1_OBJECT *object, ASN1_STRING *value) {
    char name[256];
    int len = OBJ_obj2txt(name, sizeof name, object, 0);
    if (len < 0) len = 0;
    if (len >= (int)sizeof name) len = (int)sizeof name - 1;
    unsigned char *utf8 = NULL;
    int size = ASN1_STRING_to_UTF8(&utf8, value);
    if (size < 0) {
        ERR_clear_error();
        PyErr_SetString(PyExc_ValueError, "a certificate name's value is not a string");
        return NULL;
    }
    PyObject *pair = Py_BuildValue("(s#s#)", name, (Py_ssize_t)len, utf8, (Py_ssize_t)size);
    OPENSSL_free(utf8);
    return pair;
}

/* A distinguished name: a tuple of RDNs, each a tuple of (name, value). */
static PyObject *name_tuple(const X509_NAME *name) {
    PyObject *dn = PyList_New(0), *rdn = PyList_New(0);
    int last = -1;
    for (int i = 0; dn && rdn && i < X509_NAME_entry_count(name); i++) {
        const X509_NAME_ENTRY *entry = X509_NAME_get_entry(name, i);
        int set = X509_NAME_ENTRY_set(entry);
        if (last >= 0 && set != last) {
            PyObject *done = PyList_AsTuple(rdn);
            Py_SETREF(rdn, PyList_New(0));
            if (!done || PyList_Append(dn, done) < 0) Py_CLEAR(dn);
            Py_XDECREF(done);
            if (!dn || !rdn) break;
        }
        last = set;
        PyObject *pair = attribute(X509_NAME_ENTRY_get_object(entry), X509_NAME_ENTRY_get_data(entry));
        if (!pair || PyList_Append(rdn, pair) < 0) Py_CLEAR(dn);
        Py_XDECREF(pair);
    }
    if (dn && rdn && PyList_GET_SIZE(rdn)) {
        PyObject *done = PyList_AsTuple(rdn);
        if (!done || PyList_Append(dn, done) < 0) Py_CLEAR(dn);
        Py_XDECREF(done);
    }
    Py_XDECREF(rdn);
    if (!dn) return NULL;
    PyObject *tuple = PyList_AsTuple(dn);
    Py_DECREF(dn);
    return tuple;
}

/* What a BIO holds, as a str; the BIO freed. */
static PyObject *bio_text(BIO *bio) {
    char *data;
    long len = BIO_get_mem_data(bio, &data);
    PyObject *text = PyUnicode_DecodeLatin1(data, len, "strict");
    BIO_free(bio);
    return text;
}

/* One subjectAltName entry: (kind, value) as CPython's _ssl names them. */
static PyObject *alt_name(const GENERAL_NAME *g) {
    switch (g->type) {
    case GEN_DIRNAME: {
        PyObject *dn = name_tuple(g->d.dirn);
        PyObject *pair = dn ? Py_BuildValue("(sN)", "DirName", dn) : NULL;
        return pair;
    }
    case GEN_EMAIL:
    case GEN_DNS:
    case GEN_URI: {
        const char *kind = g->type == GEN_EMAIL ? "email" : g->type == GEN_DNS ? "DNS" : "URI";
        const ASN1_STRING *text = g->d.ia5;
        return Py_BuildValue("(ss#)", kind, (const char *)ASN1_STRING_get0_data(text),
                             (Py_ssize_t)ASN1_STRING_length(text));
    }
    case GEN_RID: {
        char oid[256];
        int len = i2t_ASN1_OBJECT(oid, sizeof oid - 1, g->d.rid);
        if (len < 0) len = 0;
        if (len >= (int)sizeof oid) len = (int)sizeof oid - 1;
        return Py_BuildValue("(ss#)", "Registered ID", oid, (Py_ssize_t)len);
    }
    case GEN_IPADD: {
        const unsigned char *ip = ASN1_STRING_get0_data(g->d.ip);
        int len = ASN1_STRING_length(g->d.ip);
        char text[64];
        if (len == 4) {
            snprintf(text, sizeof text, "%d.%d.%d.%d", ip[0], ip[1], ip[2], ip[3]);
        } else if (len == 16) {
            snprintf(text, sizeof text, "%X:%X:%X:%X:%X:%X:%X:%X", ip[0] << 8 | ip[1],
                     ip[2] << 8 | ip[3], ip[4] << 8 | ip[5], ip[6] << 8 | ip[7], ip[8] << 8 | ip[9],
                     ip[10] << 8 | ip[11], ip[12] << 8 | ip[13], ip[14] << 8 | ip[15]);
        } else {
            snprintf(text, sizeof text, "<invalid>");
        }
        return Py_BuildValue("(ss)", "IP Address", text);
    }
    default: { /* OpenSSL's own print form, "kind:value" ("othername:<unsupported>") */
        BIO *bio = BIO_new(BIO_s_mem());
        if (!bio) return PyErr_NoMemory();
        GENERAL_NAME_print(bio, (GENERAL_NAME *)g);
        PyObject *text = bio_text(bio);
        if (!text) return NULL;
        Py_ssize_t colon = PyUnicode_FindChar(text, ':', 0, PyUnicode_GET_LENGTH(text), 1);
        PyObject *pair = NULL;
        if (colon >= 0) {
            PyObject *kind = PyUnicode_Substring(text, 0, colon);
            PyObject *value = PyUnicode_Substring(text, colon + 1, PyUnicode_GET_LENGTH(text));
            if (kind && value) pair = PyTuple_Pack(2, kind, value);
            Py_XDECREF(kind);
            Py_XDECREF(value);
        } else {
            PyErr_Format(PyExc_ValueError, "unexpected subjectAltName: %U", text);
        }
        Py_DECREF(text);
        return pair;
    }
    }
}

/* The certificate's subjectAltName entries, a tuple; None when it has none. */
static PyObject *alt_names(X509 *cert) {
    GENERAL_NAMES *names = X509_get_ext_d2i(cert, NID_subject_alt_name, NULL, NULL);
    if (!names) {
        ERR_clear_error();
        Py_RETURN_NONE;
    }
    int count = sk_GENERAL_NAME_num(names);
    PyObject *tuple = PyTuple_New(count);
    for (int i = 0; tuple && i < count; i++) {
        PyObject *pair = alt_name(sk_GENERAL_NAME_value(names, i));
        if (!pair) Py_CLEAR(tuple);
        else PyTuple_SET_ITEM(tuple, i, pair);
    }
    GENERAL_NAMES_free(names);
    return tuple;
}

static PyObject *time_text(const ASN1_TIME *when) {
    BIO *bio = BIO_new(BIO_s_mem());
    if (!bio) return PyErr_NoMemory();
    ASN1_TIME_print(bio, when);
    return bio_text(bio);
}

/* get_extra_info("peercert"): as ssl.SSLObject.getpeercert(): None without a certificate, {}
 * when the context does not verify one, else subject, issuer, version, serialNumber,
 * notBefore, notAfter and subjectAltName. */
static PyObject *peercert(Stream *s) {
    SSL *ssl = SSL_OF(s);
    X509 *cert = ssl && !s->handshaking ? SSL_get1_peer_certificate(ssl) : NULL;
    if (!cert) Py_RETURN_NONE;
    PyObject *dict = PyDict_New();
    if (!dict || !(SSL_get_verify_mode(ssl) & SSL_VERIFY_PEER)) {
        X509_free(cert);
        return dict;
    }
    PyObject *value;
    BIO *bio;
    int ok = (value = name_tuple(X509_get_subject_name(cert))) &&
             PyDict_SetItemString(dict, "subject", value) == 0;
    Py_XDECREF(value);
    ok = ok && (value = name_tuple(X509_get_issuer_name(cert))) &&
         PyDict_SetItemString(dict, "issuer", value) == 0;
    Py_XDECREF(value);
    value = NULL;
    ok = ok && (value = PyLong_FromLong(X509_get_version(cert) + 1)) &&
         PyDict_SetItemString(dict, "version", value) == 0;
    Py_XDECREF(value);
    value = NULL;
    if (ok && (bio = BIO_new(BIO_s_mem()))) {
        i2a_ASN1_INTEGER(bio, X509_get0_serialNumber(cert));
        ok = (value = bio_text(bio)) && PyDict_SetItemString(dict, "serialNumber", value) == 0;
        Py_XDECREF(value);
        value = NULL;
    }
    ok = ok && (value = time_text(X509_get0_notBefore(cert))) &&
         PyDict_SetItemString(dict, "notBefore", value) == 0;
    Py_XDECREF(value);
    value = NULL;
    ok = ok && (value = time_text(X509_get0_notAfter(cert))) &&
         PyDict_SetItemString(dict, "notAfter", value) == 0;
    Py_XDECREF(value);
    value = NULL;
    ok = ok && (value = alt_names(cert)) &&
         (value == Py_None || PyDict_SetItemString(dict, "subjectAltName", value) == 0);
    Py_XDECREF(value);
    X509_free(cert);
    if (!ok) Py_CLEAR(dict);
    return dict;
}

/* get_extra_info("cipher"): (name, protocol version, secret bits), as ssl's cipher(). */
static PyObject *cipher(Stream *s) {
    const SSL_CIPHER *c = SSL_OF(s) && !s->handshaking ? SSL_get_current_cipher(SSL_OF(s)) : NULL;
    if (!c) Py_RETURN_NONE;
    return Py_BuildValue("(ssi)", SSL_CIPHER_get_name(c), SSL_CIPHER_get_version(c),
                         SSL_CIPHER_get_bits(c, NULL));
}

/* The SSL_CTX of an ssl.SSLContext (a reference taken), or NULL and TypeError. CPython keeps
 * it right after the object's header (PySSLContext, Modules/_ssl.c) and has no accessor: used
 * only when the object is an _ssl._SSLContext, both run the same OpenSSL, and the context's
 * options read through the pointer are what the object reports. */
static SSL_CTX *context_of(PyObject *context) {
    PyTypeObject *type = Py_TYPE(context);
    while (type && strcmp(type->tp_name, "_ssl._SSLContext") != 0) type = type->tp_base;
    if (!type || type->tp_basicsize < (Py_ssize_t)(sizeof(PyObject) + sizeof(SSL_CTX *))) {
        PyErr_Format(PyExc_TypeError, "not an ssl.SSLContext: %R", Py_TYPE(context));
        return NULL;
    }
    PyObject *ssl_module = PyImport_ImportModule("ssl");
    PyObject *number = ssl_module ? PyObject_GetAttrString(ssl_module, "OPENSSL_VERSION_NUMBER") : NULL;
    Py_XDECREF(ssl_module);
    if (!number) return NULL;
    unsigned long theirs = PyLong_AsUnsignedLong(number);
    Py_DECREF(number);
    if (theirs == (unsigned long)-1 && PyErr_Occurred()) return NULL;
    if (theirs != OpenSSL_version_num()) {
        PyErr_Format(PyExc_TypeError,
                     "Python's ssl module runs OpenSSL %lx, the C transport %lx", theirs,
                     OpenSSL_version_num());
        return NULL;
    }
    SSL_CTX *ctx = *(SSL_CTX **)((char *)context + sizeof(PyObject));
    PyObject *options = PyObject_GetAttrString(context, "options");
    if (!options) return NULL;
    unsigned long long reported = PyLong_AsUnsignedLongLong(options);
    Py_DECREF(options);
    if (reported == (unsigned long long)-1 && PyErr_Occurred()) return NULL;
    if (!ctx || (unsigned long long)SSL_CTX_get_options(ctx) != reported) {
        PyErr_SetString(PyExc_TypeError, "this ssl.SSLContext's layout is not CPython 3.11's");
        return NULL;
    }
    SSL_CTX_up_ref(ctx);
    return ctx;
}

#else /* built without OpenSSL's headers: no TLSStream is ever made */

static void tls_free(Stream *s) { (void)s; }
static int tls_holds(Stream *s) { (void)s; return 0; }
static void read_again(Stream *s) { (void)s; }
static int tls_send(Stream *s) { (void)s; return 0; }
static void tls_shut(Stream *s) { finish(s, NULL, 1); }
static int tls_read_all(Stream *s) { return read_all(s); }
static int tls_handshake(Stream *s) { (void)s; return 0; }
static int tls_write_now(Stream *s, const char **bytes, size_t *len) { (void)s; (void)bytes; (void)len; return 0; }
static int tls_ready(Stream *s, uint32_t ready, int lone, int *answered) { (void)s; (void)ready; (void)lone; (void)answered; return 0; }
static int tls_begin(Poller *p, Acceptor *a, Stream *s) { (void)p; (void)a; (void)s; return -1; }
static PyObject *peercert(Stream *s) { (void)s; Py_RETURN_NONE; }
static PyObject *cipher(Stream *s) { (void)s; Py_RETURN_NONE; }
static SSL_CTX *context_of(PyObject *context) {
    (void)context;
    PyErr_SetString(PyExc_TypeError, "the C transport was built without OpenSSL's headers");
    return NULL;
}

#endif

/* ---- Stream: the transport --------------------------------------------------------------- */

static PyObject *Stream_write(Stream *s, PyObject *data) {
    Py_buffer view;
    if (PyObject_GetBuffer(data, &view, PyBUF_SIMPLE) < 0) return NULL;
    if (s->eof_pending) {
        PyBuffer_Release(&view);
        PyErr_SetString(PyExc_RuntimeError, "Cannot call write() after write_eof()");
        return NULL;
    }
    if (s->fd < 0 || view.len == 0 || s->tls_done || s->draining || s->shut_want_write) {
        PyBuffer_Release(&view); /* aborted or closed: dropped, as by asyncio */
        Py_RETURN_NONE;
    }
    s->written = 1;
    const char *bytes = view.buf;
    size_t len = (size_t)view.len;
    if (s->tls && !s->pending && !s->closing && !s->handshaking) {
        if (tls_write_now(s, &bytes, &len) < 0) {
            PyBuffer_Release(&view);
            Py_RETURN_NONE;
        }
        if (!len) {
            PyBuffer_Release(&view);
            Py_RETURN_NONE;
        }
    } else if (!s->tls && !s->pending && !s->closing) {
        for (;;) {
            ssize_t n = send(s->fd, bytes, len, MSG_NOSIGNAL);
            if (n >= 0) {
                bytes += n;
                len -= (size_t)n;
                break;
            }
            if (errno == EINTR) continue;
            if (errno != EAGAIN && errno != EWOULDBLOCK) {
                PyBuffer_Release(&view);
                fail_errno(s, errno);
                Py_RETURN_NONE;
            }
            break;
        }
        if (!len) {
            PyBuffer_Release(&view);
            Py_RETURN_NONE;
        }
    }
    int queued = enqueue(s, data, view.buf, (size_t)view.len - len, len);
    PyBuffer_Release(&view);
    if (queued < 0) return PyErr_NoMemory();
    if (add_events(s) < 0) {
        fail_errno(s, errno);
        Py_RETURN_NONE;
    }
    if (!s->write_paused && buffered(s) > s->high) {
        s->write_paused = 1;
        if (call_protocol(s, s_pause_writing, "protocol.pause_writing() failed") < 0)
            return NULL;
    }
    Py_RETURN_NONE;
}

static PyObject *Stream_close(Stream *s, PyObject *Py_UNUSED(unused)) {
    if (s->fd < 0 || s->closing) Py_RETURN_NONE;
    s->closing = 1;
    if (!s->pending) {
        written_out(s);
    } else if (update_events(s) < 0) {
        fail_errno(s, errno);
    }
    Py_RETURN_NONE;
}

static PyObject *Stream_abort(Stream *s, PyObject *Py_UNUSED(unused)) {
    finish(s, NULL, 1);
    Py_RETURN_NONE;
}

static PyObject *Stream_write_eof(Stream *s, PyObject *Py_UNUSED(unused)) {
    if (s->tls) {
        PyErr_SetString(PyExc_NotImplementedError, "TLS: close() sends the close_notify");
        return NULL;
    }
    if (s->fd < 0 || s->closing || s->eof_pending) Py_RETURN_NONE;
    s->eof_pending = 1;
    if (!s->pending) {
        s->eof_sent = 1;
        shutdown(s->fd, SHUT_WR);
    }
    Py_RETURN_NONE;
}

static PyObject *Stream_can_write_eof(Stream *s, PyObject *Py_UNUSED(unused)) {
    return PyBool_FromLong(!s->tls); /* TLS: close() is the close_notify, as asyncio's */
}

static PyObject *Stream_is_closing(Stream *s, PyObject *Py_UNUSED(unused)) {
    return PyBool_FromLong(s->fd < 0 || s->closing);
}

static PyObject *Stream_pause_reading(Stream *s, PyObject *Py_UNUSED(unused)) {
    if (s->fd >= 0 && !s->closing) s->reading = 0; /* EPOLLIN goes when next reported */
    Py_RETURN_NONE;
}

static PyObject *Stream_resume_reading(Stream *s, PyObject *Py_UNUSED(unused)) {
    if (s->fd >= 0 && !s->closing && !s->reading) {
        s->reading = 1;
        if (add_events(s) < 0) fail_errno(s, errno);
        else if (s->tls && !s->handshaking && tls_holds(s)) read_again(s);
    }
    Py_RETURN_NONE;
}

static PyObject *Stream_is_reading(Stream *s, PyObject *Py_UNUSED(unused)) {
    return PyBool_FromLong(s->fd >= 0 && !s->closing && s->reading);
}

static PyObject *Stream_get_write_buffer_size(Stream *s, PyObject *Py_UNUSED(unused)) {
    return PyLong_FromSize_t(buffered(s));
}

static PyObject *Stream_get_write_buffer_limits(Stream *s, PyObject *Py_UNUSED(unused)) {
    return Py_BuildValue("(II)", s->low, s->high);
}

/* The two arguments of a method called with the vectorcall's (args, nargs, kwnames), by
 * position or by ``names``, into ``given`` (NULL: not given); -1 with a TypeError as Python's
 * own. set_write_buffer_limits and get_extra_info are called once per connection, with a
 * keyword: the parser of a tuple and a dictionary would have them made for it, and cost more
 * than the rest. */
static int two_args(const char *method, const char *const names[2], PyObject *const *args,
                    Py_ssize_t nargs, PyObject *kwnames, PyObject *given[2]) {
    Py_ssize_t nkw = kwnames ? PyTuple_GET_SIZE(kwnames) : 0;
    given[0] = given[1] = NULL;
    if (nargs > 2) {
        PyErr_Format(PyExc_TypeError, "%s() takes at most 2 arguments (%zd given)", method,
                     nargs + nkw);
        return -1;
    }
    for (Py_ssize_t i = 0; i < nargs; i++) given[i] = args[i];
    for (Py_ssize_t i = 0; i < nkw; i++) {
        PyObject *key = PyTuple_GET_ITEM(kwnames, i);
        int at = PyUnicode_CompareWithASCIIString(key, names[0]) == 0   ? 0
                 : PyUnicode_CompareWithASCIIString(key, names[1]) == 0 ? 1
                                                                        : -1;
        if (at < 0) {
            PyErr_Format(PyExc_TypeError, "%s() got an unexpected keyword argument '%U'", method,
                         key);
            return -1;
        }
        if (given[at]) {
            PyErr_Format(PyExc_TypeError, "%s() got multiple values for argument '%U'", method,
                         key);
            return -1;
        }
        given[at] = args[nargs + i];
    }
    return 0;
}

/* set_write_buffer_limits(high=None, low=None) (see two_args). */
static PyObject *Stream_set_write_buffer_limits(Stream *s, PyObject *const *args, Py_ssize_t nargs,
                                                PyObject *kwnames) {
    static const char *const names[2] = {"high", "low"};
    PyObject *given[2];
    if (two_args("set_write_buffer_limits", names, args, nargs, kwnames, given) < 0) return NULL;
    PyObject *high_arg = given[0] ? given[0] : Py_None, *low_arg = given[1] ? given[1] : Py_None;
    long long high, low;
    if (high_arg == Py_None) {
        if (low_arg == Py_None) {
            high = DEFAULT_HIGH;
        } else {
            low = PyLong_AsLongLong(low_arg);
            if (low == -1 && PyErr_Occurred()) return NULL;
            high = 4 * low;
        }
    } else {
        high = PyLong_AsLongLong(high_arg);
        if (high == -1 && PyErr_Occurred()) return NULL;
    }
    if (low_arg == Py_None) {
        low = high / 4;
    } else {
        low = PyLong_AsLongLong(low_arg);
        if (low == -1 && PyErr_Occurred()) return NULL;
    }
    if (!(0 <= low && low <= high && high <= UINT32_MAX)) {
        PyErr_Format(PyExc_ValueError, "high (%lld) must be >= low (%lld) must be >= 0", high,
                     low);
        return NULL;
    }
    s->high = (uint32_t)high;
    s->low = (uint32_t)low;
    if (!s->write_paused && buffered(s) > s->high && s->fd >= 0) {
        s->write_paused = 1;
        if (call_protocol(s, s_pause_writing, "protocol.pause_writing() failed") < 0)
            return NULL;
    }
    Py_RETURN_NONE;
}

static PyObject *address(const struct sockaddr_storage *addr, socklen_t len) {
    char host[INET6_ADDRSTRLEN];
    if (addr->ss_family == AF_INET) {
        const struct sockaddr_in *in = (const struct sockaddr_in *)addr;
        inet_ntop(AF_INET, &in->sin_addr, host, sizeof host);
        return Py_BuildValue("(si)", host, ntohs(in->sin_port));
    }
    if (addr->ss_family == AF_INET6) {
        const struct sockaddr_in6 *in6 = (const struct sockaddr_in6 *)addr;
        inet_ntop(AF_INET6, &in6->sin6_addr, host, sizeof host);
        return Py_BuildValue("(siII)", host, ntohs(in6->sin6_port),
                             (unsigned)ntohl(in6->sin6_flowinfo), (unsigned)in6->sin6_scope_id);
    }
    if (addr->ss_family == AF_UNIX) {
        const struct sockaddr_un *un = (const struct sockaddr_un *)addr;
        Py_ssize_t size = (Py_ssize_t)len - (Py_ssize_t)offsetof(struct sockaddr_un, sun_path);
        if (size <= 0) return PyUnicode_FromString("");
        return PyUnicode_DecodeFSDefaultAndSize(un->sun_path, strnlen(un->sun_path, size));
    }
    Py_RETURN_NONE;
}

/* get_extra_info(name, default=None) (see two_args). */
static PyObject *Stream_get_extra_info(Stream *s, PyObject *const *args, Py_ssize_t nargs,
                                       PyObject *kwnames) {
    static const char *const names[2] = {"name", "default"};
    PyObject *given[2];
    if (two_args("get_extra_info", names, args, nargs, kwnames, given) < 0) return NULL;
    if (!given[0]) {
        PyErr_SetString(PyExc_TypeError, "get_extra_info() missing required argument 'name'");
        return NULL;
    }
    PyObject *name = given[0], *fallback = given[1] ? given[1] : Py_None;
    if (s->tls && PyUnicode_Check(name)) {
        if (PyUnicode_CompareWithASCIIString(name, "peercert") == 0) {
            if (s->fd < 0) return Py_NewRef(fallback);
            return peercert(s);
        }
        if (PyUnicode_CompareWithASCIIString(name, "cipher") == 0) {
            if (s->fd < 0) return Py_NewRef(fallback);
            return cipher(s);
        }
    }
    int peer = PyObject_RichCompareBool(name, s_peername, Py_EQ);
    if (peer < 0) return NULL;
    int own = peer ? 0 : PyObject_RichCompareBool(name, s_sockname, Py_EQ);
    if (own < 0) return NULL;
    if ((peer || own) && s->fd >= 0) {
        struct sockaddr_storage addr;
        socklen_t len = sizeof addr;
        int rc = peer ? getpeername(s->fd, (struct sockaddr *)&addr, &len)
                      : getsockname(s->fd, (struct sockaddr *)&addr, &len);
        if (rc == 0) return address(&addr, len);
    }
    Py_INCREF(fallback);
    return fallback;
}

static PyObject *Stream_get_protocol(Stream *s, PyObject *Py_UNUSED(unused)) {
    PyObject *protocol = s->protocol ? s->protocol : Py_None;
    Py_INCREF(protocol);
    return protocol;
}

static PyObject *Stream_set_protocol(Stream *s, PyObject *protocol) {
    Py_INCREF(protocol);
    Py_XSETREF(s->protocol, protocol);
    Py_RETURN_NONE;
}

/* Called by the loop, soon after the socket closed. */
static PyObject *Stream_connection_lost(Stream *s, PyObject *exc) {
    PyObject *protocol = s->protocol;
    s->protocol = NULL;
    if (!protocol) Py_RETURN_NONE;
    PyObject *r = PyObject_CallMethodOneArg(protocol, s_connection_lost, exc);
    Py_DECREF(protocol);
    return r;
}

static void Stream_dealloc(Stream *s) {
    if (s->fd >= 0) close(s->fd); /* not reached: the Poller's table holds an open one */
    if (s->tls) tls_free(s);
    pending_free(s->pending);
    Py_XDECREF(s->protocol);
    Py_TYPE(s)->tp_free((PyObject *)s);
}

static PyMethodDef Stream_methods[] = {
    {"write", (PyCFunction)Stream_write, METH_O, NULL},
    {"close", (PyCFunction)Stream_close, METH_NOARGS, NULL},
    {"abort", (PyCFunction)Stream_abort, METH_NOARGS, NULL},
    {"write_eof", (PyCFunction)Stream_write_eof, METH_NOARGS, NULL},
    {"can_write_eof", (PyCFunction)Stream_can_write_eof, METH_NOARGS, NULL},
    {"is_closing", (PyCFunction)Stream_is_closing, METH_NOARGS, NULL},
    {"pause_reading", (PyCFunction)Stream_pause_reading, METH_NOARGS, NULL},
    {"resume_reading", (PyCFunction)Stream_resume_reading, METH_NOARGS, NULL},
    {"is_reading", (PyCFunction)Stream_is_reading, METH_NOARGS, NULL},
    {"get_write_buffer_size", (PyCFunction)Stream_get_write_buffer_size, METH_NOARGS, NULL},
    {"get_write_buffer_limits", (PyCFunction)Stream_get_write_buffer_limits, METH_NOARGS,
     NULL},
    {"set_write_buffer_limits", (PyCFunction)(void (*)(void))Stream_set_write_buffer_limits,
     METH_FASTCALL | METH_KEYWORDS, NULL},
    {"get_extra_info", (PyCFunction)(void (*)(void))Stream_get_extra_info,
     METH_FASTCALL | METH_KEYWORDS, NULL},
    {"get_protocol", (PyCFunction)Stream_get_protocol, METH_NOARGS, NULL},
    {"set_protocol", (PyCFunction)Stream_set_protocol, METH_O, NULL},
    {"_connection_lost", (PyCFunction)Stream_connection_lost, METH_O, NULL},
    {NULL},
};

static PyTypeObject StreamType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "mqttbroker.server._streams.Stream",
    .tp_basicsize = sizeof(Stream),
    .tp_dealloc = (destructor)Stream_dealloc,
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "A TCP connection's transport (made by a Poller, for its protocol).",
    .tp_methods = Stream_methods,
};

#ifdef MQTTBROKER_TLS
static PyTypeObject TLSStreamType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "mqttbroker.server._streams.TLSStream",
    .tp_basicsize = sizeof(TLSStream),
    .tp_dealloc = (destructor)Stream_dealloc,
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "A TLS connection's transport: TLS in OpenSSL on the socket (see _streams.c).",
    .tp_base = &StreamType,
};
#endif

/* ---- Acceptor ---------------------------------------------------------------------------- */

static void Acceptor_dealloc(Acceptor *a) {
#ifdef MQTTBROKER_TLS
    SSL_CTX_free(a->ctx);
#endif
    Py_XDECREF(a->factory);
    Py_XDECREF(a->on_error);
    Py_TYPE(a)->tp_free((PyObject *)a);
}

static PyTypeObject AcceptorType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "mqttbroker.server._streams.Acceptor",
    .tp_basicsize = sizeof(Acceptor),
    .tp_dealloc = (destructor)Acceptor_dealloc,
    .tp_flags = Py_TPFLAGS_DEFAULT,
};

/* A new connection: its Stream, its protocol (the factory's), connection_made, reading. */
static int adopt(Poller *p, Acceptor *a, int fd) {
#ifdef MQTTBROKER_TLS
    Stream *s = a->ctx ? (Stream *)PyObject_New(TLSStream, &TLSStreamType)
                       : PyObject_New(Stream, &StreamType);
#else
    Stream *s = PyObject_New(Stream, &StreamType);
#endif
    if (!s) {
        close(fd);
        return -1;
    }
    s->fd = fd;
    s->closing = s->at_eof = s->eof_pending = s->eof_sent = s->write_paused = 0;
    s->registered = s->written = 0;
    s->handshaking = s->hs_want_write = s->read_want_write = s->write_want_read = 0;
    s->shut_want_write = s->tls_done = s->draining = s->again = 0;
    s->tls = a->ctx != NULL;
#ifdef MQTTBROKER_TLS
    if (s->tls) SSL_OF(s) = NULL;
#endif
    s->reading = 1;
    s->events = 0;
    s->high = DEFAULT_HIGH;
    s->low = DEFAULT_HIGH / 4;
    s->poller = p;
    s->protocol = NULL;
    s->pending = NULL;
    if (table_put(p, fd, (PyObject *)s) < 0) {
        s->fd = -1;
        close(fd);
        Py_DECREF(s);
        return -1;
    }
    Py_DECREF(s); /* the table's reference holds it */
    p->streams++;
    int rc = 0;
    Py_INCREF(s);
    s->protocol = PyObject_CallNoArgs(a->factory);
    if (!s->protocol) {
        rc = fail_callback(s, "protocol factory failed");
    } else if (s->tls) {
        /* The handshake first (the client's hello is there: TCP_DEFER_ACCEPT); the protocol
         * has the connection once it is done. */
        if (tls_begin(p, a, s) == 0) rc = tls_handshake(s);
    } else {
        PyObject *r = PyObject_CallMethodOneArg(s->protocol, s_connection_made, (PyObject *)s);
        if (!r) rc = fail_callback(s, "Fatal error: protocol.connection_made() call failed.");
        Py_XDECREF(r);
        if (s->fd >= 0 && update_events(s) < 0) fail_errno(s, errno);
        /* The client speaks first (and with TCP_DEFER_ACCEPT has already): read it now,
         * not one pass of the loop later. */
        if (rc == 0 && s->fd >= 0 && can_read(s)) rc = read_ready(s, 0);
    }
    Py_DECREF(s);
    return rc;
}

/* accept(2)'s errors that are the pending connection's own (Linux passes a new connection's
 * network errors up from accept(), to be treated as EAGAIN: man 2 accept), or an interrupted
 * call: the next one is tried. Any other is the listening socket's (out of descriptors or
 * memory, or the socket shut down under us: EINVAL) and would come back at every poll. */
static int accept_again(int error) {
    switch (error) {
    case EINTR:
    case ECONNABORTED:
    case EPERM: /* a firewall rule refused it */
    case EPROTO:
    case ENOPROTOOPT:
    case ENETDOWN:
    case ENETUNREACH:
    case EHOSTDOWN:
    case EHOSTUNREACH:
    case ENONET:
        return 1;
    default:
        return 0;
    }
}

static int accept_ready(Poller *p, Acceptor *a) {
    for (int i = 0; i < ACCEPT_BATCH && a->registered; i++) {
        int fd = accept4(a->fd, NULL, NULL, SOCK_NONBLOCK | SOCK_CLOEXEC);
        if (fd < 0) {
            if (errno == EAGAIN || errno == EWOULDBLOCK) return 0;
            int error = errno;
            if (accept_again(error)) continue; /* that connection's own trouble */
            /* Out of descriptors or memory, or any error of the listening socket itself: stop
             * accepting on it for accept_retry seconds (the loop's timer resumes it), and tell
             * on_error (it logs). Not again at once: the error would come back at every poll,
             * and the loop would spin. */
            struct epoll_event ev = {0};
            epoll_ctl(p->epfd, EPOLL_CTL_DEL, a->fd, &ev);
            a->registered = 0;
            PyObject *resume = PyObject_GetAttrString((PyObject *)p, "resume");
            PyObject *timer = resume ? PyObject_CallMethod(p->loop, "call_later", "dOi",
                                                           p->accept_retry, resume, a->fd)
                                     : NULL;
            Py_XDECREF(resume);
            if (!timer) PyErr_WriteUnraisable((PyObject *)p);
            Py_XDECREF(timer);
            PyObject *exc = os_error(error);
            PyObject *r = exc ? PyObject_CallFunction(a->on_error, "iO", a->fd, exc) : NULL;
            if (!r) PyErr_WriteUnraisable(a->on_error);
            Py_XDECREF(r);
            Py_XDECREF(exc);
            return 0;
        }
        if (a->nodelay != NODELAY_INHERITED) {
            int one = 1, got = 0;
            socklen_t len = sizeof got;
            if (a->nodelay == NODELAY_UNKNOWN) {
                a->nodelay = getsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &got, &len) == 0 && got
                                 ? NODELAY_INHERITED
                                 : NODELAY_EACH;
            }
            if (a->nodelay == NODELAY_EACH)
                setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one); /* fails on Unix sockets */
        }
        Py_INCREF(a);
        int rc = adopt(p, a, fd);
        Py_DECREF(a);
        if (rc < 0) return -1;
    }
    return 0;
}

/* ---- Poller ------------------------------------------------------------------------------ */

static PyObject *Poller_new(PyTypeObject *type, PyObject *args, PyObject *kwargs) {
    PyObject *loop;
    double accept_retry = 1.0, gather = 0.0, handshake_timeout = 0.0;
    static char *names[] = {"loop", "accept_retry", "gather", "handshake_timeout", NULL};
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "O|ddd:Poller", names, &loop, &accept_retry,
                                     &gather, &handshake_timeout))
        return NULL;
    if (!(handshake_timeout >= 0.0 && handshake_timeout < 1e6)) {
        PyErr_SetString(PyExc_ValueError, "Poller: handshake_timeout must be >= 0 (seconds)");
        return NULL;
    }
    if (!(gather >= 0.0 && gather <= 1.0)) {
        PyErr_SetString(PyExc_ValueError, "Poller: gather must be between 0 and 1 (seconds)");
        return NULL;
    }
    PyObject *call_soon = PyObject_GetAttrString(loop, "call_soon");
    if (!call_soon) return NULL;
    Poller *p = (Poller *)type->tp_alloc(type, 0);
    if (!p) {
        Py_DECREF(call_soon);
        return NULL;
    }
    p->epfd = epoll_create1(EPOLL_CLOEXEC);
    p->accept_retry = accept_retry;
    p->gather = (uint64_t)(gather * 1e9);
    p->hs_timeout = (uint64_t)(handshake_timeout * 1e9);
    Py_INCREF(loop);
    p->loop = loop;
    p->call_soon = call_soon;
    if (p->epfd < 0) {
        PyErr_SetFromErrno(PyExc_OSError);
        Py_DECREF(p);
        return NULL;
    }
    return (PyObject *)p;
}

static PyObject *Poller_poll(Poller *p, PyObject *Py_UNUSED(unused)) {
    if (p->epfd < 0) Py_RETURN_NONE;
    uint64_t begin = p->gather ? monotonic_ns() : 0;
    int n = epoll_wait(p->epfd, p->events, MAX_EVENTS, 0);
    if (n < 0) {
        if (errno == EINTR) Py_RETURN_NONE;
        return PyErr_SetFromErrno(PyExc_OSError);
    }
    /* One socket ready after a quiet spell: the loop has just woken for it, and what it
     * forwards is what a waiting subscriber waits for. Its ACK comes after (read_ready); in
     * a busy pass the two system calls would only add up. */
    int lone = n == 1 && monotonic_ns() - p->last_end >= QUIET_NS;
    if (p->gather && n > 0) {
        p->rate_ready += (uint64_t)n;
        if (begin - p->rate_begin >= RATE_WINDOW_NS) {
            /* ready * gather / elapsed: the sockets one sleep would be expected to gather */
            p->dense = p->rate_ready * p->gather >= GATHER_MIN * (begin - p->rate_begin);
            p->rate_begin = begin;
            p->rate_ready = 0;
        }
    }
    int rc = 0;
    int answered = 0; /* a socket read in this pass was written to since its last read */
    /* Both hooks are held through the pass, taken before begin() runs: a callback, begin()
     * included, may change or clear them (hooks(None, None)); this pass ends with the end()
     * it began with. */
    PyObject *end = NULL;
    /* TLS streams whose SSL object holds bytes no event announces (read_again) */
    Stream **again = p->again;
    size_t again_count = p->again_count;
    p->again = NULL;
    p->again_count = p->again_room = 0;
    p->again_scheduled = 0;
    if ((n > 0 || again_count) && p->pass_begin) {
        PyObject *begin = Py_NewRef(p->pass_begin);
        end = Py_NewRef(p->pass_end);
        PyObject *r = PyObject_CallNoArgs(begin);
        Py_DECREF(begin);
        if (!r) {
            Py_DECREF(end);
            end = NULL;
            rc = -1;
        } else {
            Py_DECREF(r);
        }
    }
    for (size_t i = 0; i < again_count; i++) {
        Stream *s = again[i];
        s->again = 0;
        if (rc == 0 && s->fd >= 0 && !s->handshaking && can_read(s)) rc = read_ready(s, 0);
        Py_DECREF(s);
    }
    PyMem_Free(again);
    if (rc < 0 && !end) return NULL;
    for (int i = 0; i < n && rc == 0; i++) {
        int fd = p->events[i].data.fd;
        uint32_t ready = p->events[i].events;
        if (fd >= p->table_size || !p->table[fd]) continue; /* closed earlier in this pass */
        PyObject *entry = p->table[fd];
        Py_INCREF(entry);
        if (Py_IS_TYPE(entry, &AcceptorType)) {
            rc = accept_ready(p, (Acceptor *)entry);
        } else {
            /* The events may be an earlier socket's with the same number, closed and
             * replaced in this pass: harmless, the calls below find nothing to do. */
            Stream *s = (Stream *)entry;
            if (s->tls) {
                rc = tls_ready(s, ready, lone, &answered);
                Py_DECREF(entry);
                continue;
            }
            if (ready & (EPOLLOUT | EPOLLERR | EPOLLHUP) && s->pending) rc = flush(s);
            if (rc == 0 && s->fd >= 0 && ready & (EPOLLIN | EPOLLERR | EPOLLHUP) && can_read(s)) {
                answered |= s->written;
                s->written = 0;
                rc = read_ready(s, lone);
            }
            /* Reported, and no longer wanted (reading paused, nothing left to write; or an
             * error or hang-up with neither): out of the mask, or out of the set. */
            if (rc == 0 && s->fd >= 0 && (ready & ~wanted(s)) && update_events(s) < 0)
                fail_errno(s, errno);
        }
        Py_DECREF(entry);
    }
    if (end) {
        /* Always called, after a callback that failed too (its error is kept and raised). */
        PyObject *type, *value, *traceback;
        PyErr_Fetch(&type, &value, &traceback);
        PyObject *r = PyObject_CallNoArgs(end);
        if (r) {
            Py_DECREF(r);
        } else if (type) {
            PyErr_WriteUnraisable(end);
        } else {
            rc = -1;
        }
        Py_DECREF(end);
        if (type) PyErr_Restore(type, value, traceback);
    }
    p->last_end = monotonic_ns();
    if (rc < 0) return NULL;
    if (p->gather && p->dense && n >= 2 && !answered && p->last_end - begin < p->gather) {
        /* Busy, at a high rate, and done early: what arrives meanwhile waits for the next
         * pass. */
        uint64_t wait = p->gather - (p->last_end - begin);
        struct timespec hold = {(time_t)(wait / 1000000000u), (long)(wait % 1000000000u)};
        p->holds++;
        Py_BEGIN_ALLOW_THREADS
        nanosleep(&hold, NULL);
        Py_END_ALLOW_THREADS
    }
    Py_RETURN_NONE;
}

static PyObject *Poller_fileno(Poller *p, PyObject *Py_UNUSED(unused)) { return PyLong_FromLong(p->epfd); }

static PyObject *Poller_listen(Poller *p, PyObject *args) {
    int fd;
    PyObject *factory, *on_error, *context = Py_None;
    if (!PyArg_ParseTuple(args, "iOO|O:listen", &fd, &factory, &on_error, &context)) return NULL;
    if (p->epfd < 0 || p->shutting_down) {
        PyErr_SetString(PyExc_RuntimeError, "the poller is shut down");
        return NULL;
    }
    if (fd < 0 || (fd < p->table_size && p->table[fd])) {
        PyErr_Format(PyExc_ValueError, "descriptor %d is already polled", fd);
        return NULL;
    }
    SSL_CTX *ctx = NULL;
    if (context != Py_None && !(ctx = context_of(context))) return NULL;
    Acceptor *a = PyObject_New(Acceptor, &AcceptorType);
    if (!a) {
#ifdef MQTTBROKER_TLS
        SSL_CTX_free(ctx);
#endif
        return NULL;
    }
    a->ctx = ctx;
    a->fd = fd;
    a->registered = 0;
    int one = 1; /* for the sockets accepted (see NODELAY_INHERITED); fails on Unix sockets */
    a->nodelay = setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one) == 0 ? NODELAY_UNKNOWN
                                                                            : NODELAY_EACH;
    Py_INCREF(factory);
    a->factory = factory;
    Py_INCREF(on_error);
    a->on_error = on_error;
    if (table_put(p, fd, (PyObject *)a) < 0) {
        Py_DECREF(a);
        return NULL;
    }
    Py_DECREF(a);
    struct epoll_event ev = {.events = EPOLLIN, .data.fd = fd};
    if (epoll_ctl(p->epfd, EPOLL_CTL_ADD, fd, &ev) < 0) {
        PyErr_SetFromErrno(PyExc_OSError);
        p->table[fd] = NULL;
        Py_DECREF(a);
        return NULL;
    }
    a->registered = 1;
    p->acceptors++;
    Py_RETURN_NONE;
}

static Acceptor *acceptor_at(Poller *p, int fd) {
    if (fd < 0 || fd >= p->table_size || !p->table[fd] ||
        !Py_IS_TYPE(p->table[fd], &AcceptorType))
        return NULL;
    return (Acceptor *)p->table[fd];
}

static PyObject *Poller_resume(Poller *p, PyObject *arg) {
    int fd = PyLong_AsLong(arg);
    if (fd == -1 && PyErr_Occurred()) return NULL;
    Acceptor *a = acceptor_at(p, fd);
    if (!a || a->registered) Py_RETURN_NONE;
    struct epoll_event ev = {.events = EPOLLIN, .data.fd = fd};
    if (epoll_ctl(p->epfd, EPOLL_CTL_ADD, fd, &ev) < 0) return PyErr_SetFromErrno(PyExc_OSError);
    a->registered = 1;
    Py_RETURN_NONE;
}

/* The loop no longer watches us, the epoll instance is closed. */
static int release(Poller *p) {
    int epfd = p->epfd;
    if (epfd < 0) return 0;
    p->epfd = -1;
    Py_INCREF(p); /* the loop's reader may hold the last reference: it goes below */
    PyObject *fd = PyLong_FromLong(epfd);
    PyObject *r = fd ? PyObject_CallMethodOneArg(p->loop, s_remove_reader, fd) : NULL;
    Py_XDECREF(fd);
    close(epfd);
    int rc = 0;
    if (r) Py_DECREF(r);
    else {
        PyErr_WriteUnraisable((PyObject *)p);
        rc = -1;
    }
    Py_DECREF(p);
    return rc;
}

/* Stop accepting on every listening socket (they stay open: their owner closes them); the
 * epoll instance is released once the last connection has closed. */
static PyObject *Poller_shutdown(Poller *p, PyObject *Py_UNUSED(unused)) {
    p->shutting_down = 1;
    for (int fd = 0; fd < p->table_size; fd++) {
        PyObject *entry = p->table[fd];
        if (!entry || !Py_IS_TYPE(entry, &AcceptorType)) continue;
        Acceptor *a = (Acceptor *)entry;
        if (a->registered && p->epfd >= 0) {
            struct epoll_event ev = {0};
            epoll_ctl(p->epfd, EPOLL_CTL_DEL, fd, &ev);
        }
        a->registered = 0;
        p->table[fd] = NULL;
        p->acceptors--;
        Py_DECREF(entry);
    }
    if (p->streams == 0) release(p);
    Py_RETURN_NONE;
}

/* The handshake timer: streams still in their handshake at their end of time are closed
 * (logged at debug level); the timer is armed again for the next. */
static PyObject *Poller_expire(Poller *p, PyObject *Py_UNUSED(unused)) {
    Py_CLEAR(p->hs_timer);
    uint64_t now = monotonic_ns();
    while (p->hs_count) {
        Deadline *d = &p->hs_queue[p->hs_head];
        Stream *s = d->stream;
        if (s->fd >= 0 && s->handshaking) {
            if (d->at > now) {
                if (arm_expiry(p, d->at - now) < 0) return NULL;
                break;
            }
            char reason[64];
            snprintf(reason, sizeof reason, "none within %g s", (double)p->hs_timeout / 1e9);
            log_debug(s->fd, "TLS handshake with %s: %s", reason);
            finish(s, NULL, 0);
        }
        p->hs_head++;
        p->hs_count--;
        Py_DECREF(s);
    }
    if (!p->hs_count) p->hs_head = 0;
    Py_RETURN_NONE;
}

static PyObject *Poller_hooks(Poller *p, PyObject *args) {
    PyObject *begin, *end;
    if (!PyArg_ParseTuple(args, "OO:hooks", &begin, &end)) return NULL;
    if (begin == Py_None && end == Py_None) {
        begin = end = NULL;
    } else if (!PyCallable_Check(begin) || !PyCallable_Check(end)) {
        PyErr_SetString(PyExc_TypeError, "hooks(begin, end): two callables, or None and None");
        return NULL;
    }
    /* Both set before either old one goes (its release may run code that polls). */
    PyObject *old_begin = p->pass_begin, *old_end = p->pass_end;
    p->pass_begin = Py_XNewRef(begin);
    p->pass_end = Py_XNewRef(end);
    Py_XDECREF(old_begin);
    Py_XDECREF(old_end);
    Py_RETURN_NONE;
}

static PyObject *Poller_get_streams(Poller *p, void *Py_UNUSED(closure)) {
    return PyLong_FromSsize_t(p->streams);
}

static PyObject *Poller_get_holds(Poller *p, void *Py_UNUSED(closure)) {
    return PyLong_FromUnsignedLongLong(p->holds);
}

static PyObject *Poller_get_closed(Poller *p, void *Py_UNUSED(closure)) {
    return PyBool_FromLong(p->epfd < 0);
}

/* Close what is left, without callbacks: the loop that would run them is gone. */
static void Poller_dealloc(Poller *p) {
    /* (After shutdown(), the last stream's finish() would release() the instance, and its
     * reference to it, taken and dropped, would deallocate it a second time.) */
    p->shutting_down = 0;
    for (int fd = 0; fd < p->table_size; fd++) {
        PyObject *entry = p->table[fd];
        if (!entry) continue;
        if (Py_IS_TYPE(entry, &StreamType)) {
            finish((Stream *)entry, NULL, 0);
        } else {
            p->table[fd] = NULL;
            Py_DECREF(entry);
        }
    }
    PyMem_Free(p->table);
    for (size_t i = 0; i < p->hs_count; i++) Py_DECREF(p->hs_queue[p->hs_head + i].stream);
    PyMem_Free(p->hs_queue);
    for (size_t i = 0; i < p->again_count; i++) Py_DECREF(p->again[i]);
    PyMem_Free(p->again);
    Py_XDECREF(p->hs_timer);
    if (p->epfd >= 0) close(p->epfd);
    Py_XDECREF(p->loop);
    Py_XDECREF(p->call_soon);
    Py_XDECREF(p->pass_begin);
    Py_XDECREF(p->pass_end);
    Py_TYPE(p)->tp_free((PyObject *)p);
}

static PyMethodDef Poller_methods[] = {
    {"poll", (PyCFunction)Poller_poll, METH_NOARGS,
     "Serve what is ready, without waiting (the loop's reader callback)."},
    {"fileno", (PyCFunction)Poller_fileno, METH_NOARGS, "The epoll instance's descriptor."},
    {"listen", (PyCFunction)Poller_listen, METH_VARARGS,
     "listen(fd, factory, on_error, context=None): accept on a listening, non-blocking "
     "socket; on_error(fd, OSError) hears when accepting pauses (out of descriptors); with an "
     "ssl.SSLContext, TLS in OpenSSL on each socket (check_context says whether it can)."},
    {"resume", (PyCFunction)Poller_resume, METH_O,
     "resume(fd): accept again on a socket whose accepting failed."},
    {"hooks", (PyCFunction)Poller_hooks, METH_VARARGS,
     "hooks(begin, end): call begin() before and end() after each poll() that finds sockets "
     "ready (end() also after a callback that raised); hooks(None, None): none."},
    {"shutdown", (PyCFunction)Poller_shutdown, METH_NOARGS,
     "Stop accepting; release the epoll instance once no connection is left."},
    {"_expire", (PyCFunction)Poller_expire, METH_NOARGS,
     "Close the connections whose TLS handshake is past handshake_timeout (the loop's timer)."},
    {NULL},
};

static PyGetSetDef Poller_getset[] = {
    {"streams", (getter)Poller_get_streams, NULL, "Connections open.", NULL},
    {"closed", (getter)Poller_get_closed, NULL, "Whether the epoll instance is released.",
     NULL},
    {"holds", (getter)Poller_get_holds, NULL, "Sleeps after a busy pass, for gather.", NULL},
    {NULL},
};

static PyTypeObject PollerType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "mqttbroker.server._streams.Poller",
    .tp_basicsize = sizeof(Poller),
    .tp_dealloc = (destructor)Poller_dealloc,
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "Poller(loop, accept_retry=1.0, gather=0.0, handshake_timeout=0.0): TCP "
              "connections on one epoll instance the loop watches.",
    .tp_methods = Poller_methods,
    .tp_getset = Poller_getset,
    .tp_new = Poller_new,
};

static PyObject *check_context(PyObject *Py_UNUSED(module), PyObject *context) {
    SSL_CTX *ctx = context_of(context);
    if (!ctx) return NULL;
#ifdef MQTTBROKER_TLS
    SSL_CTX_free(ctx);
#endif
    Py_RETURN_NONE;
}

static PyMethodDef module_methods[] = {
    {"check_context", (PyCFunction)check_context, METH_O,
     "check_context(context): None when listen() can run TLS with this ssl.SSLContext in C; "
     "TypeError saying why not otherwise."},
    {NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT,
    .m_name = "mqttbroker.server._streams",
    .m_doc = "The broker's own TCP transport on epoll (see streams.py).",
    .m_size = -1,
    .m_methods = module_methods,
};

PyMODINIT_FUNC PyInit__streams(void) {
#define NAME(var, text)                                                                        \
    if (!(var = PyUnicode_InternFromString(text))) return NULL
    NAME(s_data_received, "data_received");
    NAME(s_eof_received, "eof_received");
    NAME(s_connection_made, "connection_made");
    NAME(s_connection_lost, "connection_lost");
    NAME(s_pause_writing, "pause_writing");
    NAME(s_resume_writing, "resume_writing");
    NAME(s_call_exception_handler, "call_exception_handler");
    NAME(s_remove_reader, "remove_reader");
    NAME(s_peername, "peername");
    NAME(s_sockname, "sockname");
    NAME(s_lost, "_connection_lost");
#undef NAME
    if (PyType_Ready(&StreamType) < 0 || PyType_Ready(&AcceptorType) < 0 ||
        PyType_Ready(&PollerType) < 0)
        return NULL;
#ifdef MQTTBROKER_TLS
    if (PyType_Ready(&TLSStreamType) < 0) return NULL;
#endif
    PyObject *m = PyModule_Create(&module);
    if (!m) return NULL;
    Py_INCREF(&PollerType);
    if (PyModule_AddObject(m, "Poller", (PyObject *)&PollerType) < 0) {
        Py_DECREF(&PollerType);
        Py_DECREF(m);
        return NULL;
    }
    Py_INCREF(&StreamType);
    PyModule_AddObject(m, "Stream", (PyObject *)&StreamType);
#ifdef MQTTBROKER_TLS
    Py_INCREF(&TLSStreamType);
    PyModule_AddObject(m, "TLSStream", (PyObject *)&TLSStreamType);
    PyModule_AddIntConstant(m, "TLS", 1);
#else
    PyModule_AddIntConstant(m, "TLS", 0);
#endif
    return m;
}
