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
 * before it sends more. Each connection is a Stream: an asyncio transport (write, close,
 * abort, write_eof, pause_reading...) of 64 bytes, where uvloop's transport and libuv's
 * handle hold about 1,250 bytes per socket. What a write leaves unsent waits in the stream's
 * queue (Pending), copied or, a bytes object of REF_MIN bytes or more, by reference (the
 * broker writes one encoding of a message to all its subscribers: shared, not copied for each
 * client that does not read), and goes out with sendmsg() over the queue, in order.
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

#define READ_SIZE (256 * 1024) /* as uvloop's */
#define MAX_EVENTS 1024        /* per poll(), as libuv's */
#define ACCEPT_BATCH 100       /* accepts per listening socket and poll() */
#define READ_REPEAT 32         /* reads per socket and poll() while each fills the buffer */
#define DEFAULT_HIGH (64 * 1024)
#define SHRINK_ABOVE (256 * 1024) /* a write buffer larger shrinks once mostly written */
#define QUIET_NS 100000           /* this long after poll() last ended: the loop was idle */
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
    uint32_t events;           /* the epoll mask registered */
    uint32_t high, low;        /* write buffer limits */
    Poller *poller;            /* borrowed, while fd >= 0 */
    PyObject *protocol;
    Pending *pending;
} Stream;

typedef struct {
    PyObject_HEAD
    int fd;
    int registered;
    PyObject *factory;  /* () -> protocol */
    PyObject *on_error; /* (fd, OSError): accepting failed and is paused */
} Acceptor;

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
    uint64_t gather;   /* ns from a busy pass's start to the next pass's, at least (0: off) */
    uint64_t holds;    /* sleeps for it */
    struct epoll_event events[MAX_EVENTS];
};

static PyTypeObject StreamType, AcceptorType, PollerType;
static int release(Poller *p);

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
    return (can_read(s) ? EPOLLIN : 0) | (buffered(s) ? EPOLLOUT : 0);
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
    s->closing = 1;
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

/* The OSError of ``error`` (its subclass: ConnectionResetError...), a new reference, with no
 * exception left set; NULL only when even that failed. */
static PyObject *os_error(int error) {
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

/* Write what is buffered; the protocol hears resume_writing below the low mark; a closing
 * stream closes once it is all written. */
static int flush(Stream *s) {
    Pending *q = s->pending;
    while (q && q->total) {
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
            finish(s, NULL, 1);
        } else if (s->eof_pending && !s->eof_sent) {
            s->eof_sent = 1;
            shutdown(s->fd, SHUT_WR);
        }
    }
    return 0;
}

/* Read what the socket has: again while a read fills the whole buffer (as libuv, at most
 * READ_REPEAT times) and the protocol still reads. */
static int read_all(Stream *s) {
    ssize_t n;
    for (int repeat = 0;; repeat++) {
        do {
            n = recv(s->fd, read_buffer, READ_SIZE, 0);
        } while (n < 0 && errno == EINTR);
        if (n <= 0) break;
        PyObject *data = PyBytes_FromStringAndSize(read_buffer, n);
        if (!data) return fail_callback(s, "reading failed");
        PyObject *r = PyObject_CallMethodOneArg(s->protocol, s_data_received, data);
        Py_DECREF(data);
        if (!r) return fail_callback(s, "Fatal error: protocol.data_received() call failed.");
        Py_DECREF(r);
        if (n < READ_SIZE || repeat + 1 >= READ_REPEAT || s->fd < 0 || !can_read(s)) return 0;
    }
    if (n < 0) {
        if (errno != EAGAIN && errno != EWOULDBLOCK) fail_errno(s, errno);
        return 0;
    }
    s->at_eof = 1; /* the peer shut its side: no more reading */
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
        if (!s->pending) finish(s, NULL, 1);
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
    int rc = read_all(s);
    if (ack_after && s->fd == fd) setsockopt(fd, IPPROTO_TCP, TCP_QUICKACK, &on, sizeof on);
    return rc;
}

/* ---- Stream: the transport --------------------------------------------------------------- */

static PyObject *Stream_write(Stream *s, PyObject *data) {
    Py_buffer view;
    if (PyObject_GetBuffer(data, &view, PyBUF_SIMPLE) < 0) return NULL;
    if (s->eof_pending) {
        PyBuffer_Release(&view);
        PyErr_SetString(PyExc_RuntimeError, "Cannot call write() after write_eof()");
        return NULL;
    }
    if (s->fd < 0 || view.len == 0) { /* aborted or closed: dropped, as by asyncio */
        PyBuffer_Release(&view);
        Py_RETURN_NONE;
    }
    s->written = 1;
    const char *bytes = view.buf;
    size_t len = (size_t)view.len;
    if (!s->pending && !s->closing) {
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
        finish(s, NULL, 1);
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
    if (s->fd < 0 || s->closing || s->eof_pending) Py_RETURN_NONE;
    s->eof_pending = 1;
    if (!s->pending) {
        s->eof_sent = 1;
        shutdown(s->fd, SHUT_WR);
    }
    Py_RETURN_NONE;
}

static PyObject *Stream_can_write_eof(Stream *Py_UNUSED(s), PyObject *Py_UNUSED(unused)) { Py_RETURN_TRUE; }

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

static PyObject *Stream_set_write_buffer_limits(Stream *s, PyObject *args, PyObject *kwargs) {
    static char *names[] = {"high", "low", NULL};
    PyObject *high_arg = Py_None, *low_arg = Py_None;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "|OO:set_write_buffer_limits", names,
                                     &high_arg, &low_arg))
        return NULL;
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

static PyObject *Stream_get_extra_info(Stream *s, PyObject *args, PyObject *kwargs) {
    static char *names[] = {"name", "default", NULL};
    PyObject *name, *fallback = Py_None;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "O|O:get_extra_info", names, &name,
                                     &fallback))
        return NULL;
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
     METH_VARARGS | METH_KEYWORDS, NULL},
    {"get_extra_info", (PyCFunction)(void (*)(void))Stream_get_extra_info,
     METH_VARARGS | METH_KEYWORDS, NULL},
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

/* ---- Acceptor ---------------------------------------------------------------------------- */

static void Acceptor_dealloc(Acceptor *a) {
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
    Stream *s = PyObject_New(Stream, &StreamType);
    if (!s) {
        close(fd);
        return -1;
    }
    s->fd = fd;
    s->closing = s->at_eof = s->eof_pending = s->eof_sent = s->write_paused = 0;
    s->registered = s->written = 0;
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
        int one = 1;
        setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one); /* fails on Unix sockets */
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
    double accept_retry = 1.0, gather = 0.0;
    static char *names[] = {"loop", "accept_retry", "gather", NULL};
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "O|dd:Poller", names, &loop, &accept_retry,
                                     &gather))
        return NULL;
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
    int rc = 0;
    int answered = 0; /* a socket read in this pass was written to since its last read */
    /* Both hooks are held through the pass, taken before begin() runs: a callback, begin()
     * included, may change or clear them (hooks(None, None)); this pass ends with the end()
     * it began with. */
    PyObject *end = NULL;
    if (n > 0 && p->pass_begin) {
        PyObject *begin = Py_NewRef(p->pass_begin);
        end = Py_NewRef(p->pass_end);
        PyObject *r = PyObject_CallNoArgs(begin);
        Py_DECREF(begin);
        if (!r) {
            Py_DECREF(end);
            return NULL;
        }
        Py_DECREF(r);
    }
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
    if (p->gather && n >= 2 && !answered && p->last_end - begin < p->gather) {
        /* Busy, and done early: what arrives meanwhile waits for the next pass. */
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
    PyObject *factory, *on_error;
    if (!PyArg_ParseTuple(args, "iOO:listen", &fd, &factory, &on_error)) return NULL;
    if (p->epfd < 0 || p->shutting_down) {
        PyErr_SetString(PyExc_RuntimeError, "the poller is shut down");
        return NULL;
    }
    if (fd < 0 || (fd < p->table_size && p->table[fd])) {
        PyErr_Format(PyExc_ValueError, "descriptor %d is already polled", fd);
        return NULL;
    }
    Acceptor *a = PyObject_New(Acceptor, &AcceptorType);
    if (!a) return NULL;
    a->fd = fd;
    a->registered = 0;
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
     "listen(fd, factory, on_error): accept on a listening, non-blocking socket; "
     "on_error(fd, OSError) hears when accepting pauses (out of descriptors)."},
    {"resume", (PyCFunction)Poller_resume, METH_O,
     "resume(fd): accept again on a socket whose accepting failed."},
    {"hooks", (PyCFunction)Poller_hooks, METH_VARARGS,
     "hooks(begin, end): call begin() before and end() after each poll() that finds sockets "
     "ready (end() also after a callback that raised); hooks(None, None): none."},
    {"shutdown", (PyCFunction)Poller_shutdown, METH_NOARGS,
     "Stop accepting; release the epoll instance once no connection is left."},
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
    .tp_doc = "Poller(loop, accept_retry=1.0, gather=0.0): TCP connections on one epoll instance "
              "the loop watches.",
    .tp_methods = Poller_methods,
    .tp_getset = Poller_getset,
    .tp_new = Poller_new,
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT,
    .m_name = "mqttbroker.server._streams",
    .m_doc = "The broker's own TCP transport on epoll (see streams.py).",
    .m_size = -1,
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
    return m;
}
