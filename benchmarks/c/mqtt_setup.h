/* What the C openers (open_many.c, open_many_tls.c) share: reading the CONNACK and SUBACK that
 * set a connection up, from whatever the connection has read so far. */
#ifndef BENCHMARKS_MQTT_SETUP_H
#define BENCHMARKS_MQTT_SETUP_H

#include <stdint.h>
#include <string.h>

#include "report.h"

#define IN_MAX 1024 /* a CONNACK and a SUBACK with their properties, and what follows */

enum phase { IDLE, CONNECTING, HANDSHAKE, SENDING, AWAIT_CONNACK, AWAIT_SUBACK, DONE };

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

/* What a connection being set up has read, and where it is. */
struct setup {
    uint8_t subscribing;
    uint8_t phase;
    uint16_t receive_max;
    uint32_t in_len;
    uint8_t in[IN_MAX];
};

/* Handle the complete packets in s->in (the rest is kept for the next read): 1 when the
 * connection is set up (its CONNACK has reason code 0 and, when subscribing, its SUBACK only
 * codes below 0x80); *connack set when a CONNACK was among them. A refusal, an unexpected or
 * malformed packet, or IN_MAX bytes without the packet awaited, fail. */
static int setup_received(struct setup *s, long index, int version, int *connack) {
    uint32_t pos = 0;
    while (s->phase == AWAIT_CONNACK || s->phase == AWAIT_SUBACK) {
        uint32_t body = pos + 1;
        long len = varint(s->in, &body, s->in_len);
        if (len == -2)
            fail("connection %ld: malformed remaining length", index);
        if (len < 0 || body + (uint32_t)len > s->in_len)
            break;
        uint8_t first = s->in[pos];
        uint32_t end = body + (uint32_t)len;
        const uint8_t *b = s->in + body;
        if (s->phase == AWAIT_CONNACK && first >> 4 == 2 && len >= 2) {
            if (b[1] != 0)
                fail("CONNACK refused connection %ld: reason 0x%02X", index, b[1]);
            if (version == 5)
                s->receive_max = receive_maximum(s->in, body + 2, end);
            s->phase = s->subscribing ? AWAIT_SUBACK : DONE;
            *connack = 1;
        } else if (s->phase == AWAIT_SUBACK && first >> 4 == 9 && len >= 3) {
            uint32_t at = body + 2;
            if (version == 5) {
                long props = varint(s->in, &at, end);
                if (props < 0)
                    fail("connection %ld: malformed SUBACK", index);
                at += (uint32_t)props;
            }
            if (at >= end)
                fail("SUBACK without reason codes for connection %ld", index);
            for (; at < end; at++)
                if (s->in[at] >= 0x80)
                    fail("SUBACK refused for connection %ld: code 0x%02X", index, s->in[at]);
            s->phase = DONE;
        } else {
            fail("connection %ld: unexpected packet 0x%02X during setup", index, first);
        }
        pos = end;
    }
    memmove(s->in, s->in + pos, s->in_len - pos);
    s->in_len -= pos;
    if (s->phase != DONE && s->in_len == IN_MAX)
        fail("connection %ld: more than %d bytes without the packet awaited", index, IN_MAX);
    return s->phase == DONE;
}

/* The length of the first packet of a request (its CONNECT), for "split". */
static uint32_t first_packet_len(const uint8_t *out, uint32_t out_len, long index) {
    uint32_t pos = 1;
    long len = varint(out, &pos, out_len);
    if (len < 0 || pos + (uint32_t)len > out_len)
        fail("request %ld: malformed CONNECT", index);
    return pos + (uint32_t)len;
}

#endif
