# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True
# cython: initializedcheck=False
"""The kernels compiled (Cython): twins of `pure.py`, which is their specification; read
each function's contract there. Where the pure loop costs a Python object, a struct call
and a buffer append per event, these read the header fields from the buffer, size the
output once and copy each event with memcpy. Bounds: every read is inside `n` (checked
before the header is read), every write inside the size given to the output first.
"""

from cpython.bytearray cimport PyByteArray_AS_STRING, PyByteArray_GET_SIZE, PyByteArray_Resize
from libc.stdint cimport int64_t, uint8_t, uint32_t, uint64_t
from libc.string cimport memcpy, memset

from relay.errors import MalformedEvent
from relay.kernels.pure import frame_large, impossible_size

cdef enum:
    HEADER_LEN = 19
    MAX_PACKET = 0xFFFFFF

cdef int64_t MAX_EVENT_SIZE = 1 << 31
_OK = b"\0"


cdef inline check_seq(int seq):
    if not 0 <= seq <= 255:
        raise ValueError(f"sequence id {seq} is not a byte")


cdef inline check_pos(Py_ssize_t pos):
    if pos < 0:
        raise ValueError(f"negative offset {pos}")


cdef inline uint32_t u32(const uint8_t* p) noexcept nogil:
    return p[0] | (<uint32_t>p[1] << 8) | (<uint32_t>p[2] << 16) | (<uint32_t>p[3] << 24)


cdef inline void put_head(char* dst, uint32_t length, int seq) noexcept nogil:
    dst[0] = <char>(length & 0xFF)
    dst[1] = <char>((length >> 8) & 0xFF)
    dst[2] = <char>((length >> 16) & 0xFF)
    dst[3] = <char>seq
    dst[4] = 0


def frame_stored(bytearray out not None, buf, int seq):
    check_seq(seq)
    cdef const uint8_t[::1] view = buf
    cdef Py_ssize_t n = view.shape[0]
    cdef Py_ssize_t pos = 0, start, p, total, w, last = -1
    cdef int64_t size = 0, each
    cdef const uint8_t* src
    cdef char* dst
    cdef bint big, bad
    if n < HEADER_LEN:
        return seq, 0, -1
    src = &view[0]
    while True:
        # A run of whole events under 16 MiB: measured first, so `out` grows once.
        start = pos
        total = 0
        big = bad = False
        while n - pos >= HEADER_LEN:
            size = u32(src + pos + 9)
            if size < HEADER_LEN or size > MAX_EVENT_SIZE:
                bad = True
                break
            if pos + size > n:
                break
            if size + 1 >= MAX_PACKET:
                big = True
                break
            total += size + 5
            pos += size
        if total:
            w = PyByteArray_GET_SIZE(out)
            PyByteArray_Resize(out, w + total)
            dst = PyByteArray_AS_STRING(out) + w
            p = start
            while p < pos:
                each = u32(src + p + 9)
                put_head(dst, <uint32_t>(each + 1), seq)
                memcpy(dst + 5, src + p, each)
                dst += each + 5
                seq = (seq + 1) & 0xFF
                last = p
                p += each
        if bad:
            raise impossible_size(size, pos)
        if not big:
            return seq, pos, last
        seq = frame_large(out, _OK, memoryview(buf)[pos : pos + size], seq)
        last = pos
        pos += size


def read_dump(buf, Py_ssize_t pos, int seq, int64_t last_pos, const uint8_t[::1] plain,
              list tally not None, bytearray out not None, list marks not None):
    cdef const uint8_t[::1] view = buf
    cdef Py_ssize_t n = view.shape[0]
    cdef Py_ssize_t w0, w, end
    cdef const uint8_t* src
    cdef const uint8_t* at
    cdef char* dst
    cdef uint32_t seqbits = (<uint32_t>seq) << 24
    cdef uint32_t lenseq
    cdef int64_t size, log_pos
    cdef uint8_t typ
    cdef uint64_t events[256]
    cdef uint64_t nbytes[256]
    cdef int t
    check_seq(seq)
    check_pos(pos)
    if plain.shape[0] != 256:
        raise ValueError("plain: one byte per event type (256)")
    if len(tally) != 256:
        raise ValueError("tally: one entry per event type (256)")
    if n - pos < 22:
        return pos, seq, last_pos
    src = &view[0]
    at = src + pos
    size = u32(at + 14)
    if size < HEADER_LEN or size >= MAX_PACKET - 1 or at[4] != 0 or size > n - pos - 5 \
            or u32(at) != (seqbits | <uint32_t>(size + 1)):
        return pos, seq, last_pos  # (not even one: `out` is left alone)
    memset(events, 0, sizeof(events))
    memset(nbytes, 0, sizeof(nbytes))
    # The events take less room than their packets: `out` grows once, by what is left of
    # `buf`, and is cut to what was written at the end.
    w0 = w = PyByteArray_GET_SIZE(out)
    PyByteArray_Resize(out, w0 + (n - pos))
    dst = PyByteArray_AS_STRING(out)
    try:
        while n - pos >= 22:
            at = src + pos
            lenseq = u32(at)
            typ = at[9]
            size = u32(at + 14)
            log_pos = u32(at + 18)
            end = pos + 5 + size
            if size < HEADER_LEN or size >= MAX_PACKET - 1 or at[4] != 0 or end > n \
                    or lenseq != (seqbits | <uint32_t>(size + 1)):
                break
            seqbits = seqbits + 0x1000000
            if not plain[typ] or log_pos != last_pos + size:
                marks.append(w)
            last_pos = log_pos
            events[typ] += 1
            nbytes[typ] += <uint64_t>size
            memcpy(dst + w, at + 5, size)
            w += size
            pos = end
    finally:
        PyByteArray_Resize(out, w)
        for t in range(256):
            if events[t]:
                tally[t] += (int(events[t]) << 64) + int(nbytes[t])
    return pos, seqbits >> 24, last_pos


cdef enum:
    K_PLAIN = 1
    K_GTID = 2
    K_XID = 3
    OP_BEGIN = 0
    OP_REWRITE = 1
    OP_COMMIT = 2


def scan_ingest(data, Py_ssize_t pos, list marks, Py_ssize_t mi, const uint8_t[::1] kinds,
                int64_t wend, bint in_group, bint inline_gtid, int64_t segment_size,
                list plan not None):
    cdef const uint8_t[::1] view = data
    cdef Py_ssize_t n = view.shape[0], end, mark, nmarks
    cdef const uint8_t* src
    cdef const uint8_t* at
    cdef int64_t size, log_pos
    cdef uint8_t kind
    cdef bint closes
    cdef uint64_t seq_no
    check_pos(pos)
    check_pos(mi)
    if kinds.shape[0] != 256:
        raise ValueError("kinds: one byte per event type (256)")
    if n == 0:
        return pos, mi, wend, in_group
    src = &view[0]
    nmarks = len(marks) if marks is not None else 0
    while n - pos >= HEADER_LEN:
        at = src + pos
        size = u32(at + 9)
        log_pos = u32(at + 13)
        if size < HEADER_LEN or size > n - pos:  # (before pos + size: no wrap on 32 bits)
            break
        end = pos + size
        kind = kinds[at[4]]
        closes = False
        if kind == K_PLAIN:
            if not in_group:
                break
        elif kind == K_GTID and not in_group and inline_gtid and size >= 32:
            seq_no = <uint64_t>u32(at + 19) | (<uint64_t>u32(at + 23) << 32)
            plan.append((OP_BEGIN, pos, u32(at + 27), u32(at + 5), seq_no, at[31], wend,
                         u32(at)))
            in_group = True
        elif kind == K_XID and in_group:
            in_group = False
            closes = True
        else:
            break
        wend += size
        if log_pos != wend:
            plan.append((OP_REWRITE, pos, end, wend))
        elif marks is not None and in_group:
            while mi < nmarks and <Py_ssize_t>marks[mi] <= pos:
                mi += 1
            if mi < nmarks:
                mark = marks[mi]
                if end <= mark <= n:
                    wend += mark - end
                    end = mark
        pos = end
        if closes:
            plan.append((OP_COMMIT, pos, wend))
            if wend >= segment_size:
                break
    return pos, mi, wend, in_group


cdef enum:
    C_GTID = 1
    C_TABLE_MAP = 2
    C_ROWS = 3
    C_ANNOTATION = 4
    C_XID = 5
    C_MYSQL_GTID = 6
    C_QUERY = 7
    QUERY_POST_HEADER = 13
    FL_STANDALONE = 0x01
    MAX_CLEAN_TABLES = 16


cdef inline bint is_begin(const uint8_t* src, Py_ssize_t pos, Py_ssize_t size,
                          int crc_len) noexcept nogil:
    cdef Py_ssize_t body = pos + HEADER_LEN, start, end
    if size < HEADER_LEN + QUERY_POST_HEADER + 1 + crc_len:
        return False
    start = body + QUERY_POST_HEADER + (src[body + 11] | (<Py_ssize_t>src[body + 12] << 8)) \
        + src[body + 8] + 1
    end = pos + size - crc_len
    return end - start == 5 and src[start] == b'B' and src[start + 1] == b'E' \
        and src[start + 2] == b'G' and src[start + 3] == b'I' and src[start + 4] == b'N'


def scan_clean(chunk, Py_ssize_t pos, const uint8_t[::1] kinds, int id_size, int crc_len,
               table_map, bint drop_annotations, list cuts not None):
    cdef const uint8_t[::1] view = chunk
    cdef Py_ssize_t n = view.shape[0], p, end, mark
    cdef const uint8_t* src
    cdef int64_t size
    cdef uint8_t kind, opener
    cdef uint64_t tid
    cdef uint64_t tables[MAX_CLEAN_TABLES]
    cdef int ntables, i, b
    cdef Py_ssize_t entered = 0, seen
    cdef bint closed, found
    cdef object got
    check_pos(pos)
    if kinds.shape[0] != 256:
        raise ValueError("kinds: one byte per event type (256)")
    if not 4 <= id_size <= 6 or crc_len not in (0, 4):
        raise ValueError(f"table id size {id_size}, checksum length {crc_len}")
    if n == 0:
        return pos, 0
    src = &view[0]
    while n - pos >= HEADER_LEN:
        size = u32(src + pos + 9)
        opener = kinds[src[pos + 4]]
        if size < HEADER_LEN or size > n - pos:
            break
        p = pos + size
        if opener == C_GTID:
            if size < HEADER_LEN + 13 or src[pos + HEADER_LEN + 12] & FL_STANDALONE:
                break
        elif opener == C_MYSQL_GTID:
            if n - p < HEADER_LEN or kinds[src[p + 4]] != C_QUERY:
                break
            size = u32(src + p + 9)
            if size < HEADER_LEN or size > n - p or not is_begin(src, p, size, crc_len):
                break
            p += size
        else:
            break
        ntables = 0
        seen = 0
        mark = len(cuts)
        closed = False
        while n - p >= HEADER_LEN:
            size = u32(src + p + 9)
            if size < HEADER_LEN or size > n - p:
                break
            kind = kinds[src[p + 4]]
            end = p + size
            if kind == C_ROWS:
                if size < HEADER_LEN + id_size:
                    break
                tid = 0
                for b in range(id_size):
                    tid |= (<uint64_t>src[p + HEADER_LEN + b]) << (8 * b)
                found = False
                for i in range(ntables):
                    if tables[i] == tid:
                        found = True
                        break
                if not found:
                    break
                seen += 1
            elif kind == C_TABLE_MAP:
                if ntables == MAX_CLEAN_TABLES:
                    break
                got = table_map(p, end)
                if got < 0:
                    break
                tables[ntables] = <uint64_t>got
                ntables += 1
            elif kind == C_ANNOTATION:
                seen += 1
                if drop_annotations:
                    cuts.append(p)
                    cuts.append(end)
            elif kind == C_XID:
                closed = True
                p = end
                break
            else:
                break
            p = end
        if not closed:
            del cuts[mark:]
            break
        entered += seen
        pos = p
    return pos, entered


cdef enum:
    PREFIXED = 0x80


cdef inline void append_raw(bytearray out, const uint8_t* src, Py_ssize_t size):
    cdef Py_ssize_t w = PyByteArray_GET_SIZE(out)
    if size <= 0:
        return
    PyByteArray_Resize(out, w + size)
    memcpy(PyByteArray_AS_STRING(out) + w, src, size)


def splice_rows(rows, list images not None, replace):
    cdef const uint8_t[::1] view = rows
    cdef Py_ssize_t n = view.shape[0], pos = 0, start, width, plen, nb, cols, i, b, run
    cdef Py_ssize_t bitmap_src, bitmap_out
    cdef uint64_t ulen
    cdef const uint8_t* src
    cdef const uint8_t[::1] layout
    cdef const uint8_t[::1] masked
    cdef int k, nimages
    cdef bint changed = False
    cdef bytearray out = bytearray()
    cdef object new, raw
    cdef list prepared = []
    for layout_obj, masked_obj in images:
        if len(masked_obj) != len(layout_obj):
            raise ValueError("images: one masked byte per column")
        prepared.append((layout_obj, masked_obj))
    if not any(len(p[0]) for p in prepared):
        raise ValueError("images: at least one column")
    for p in prepared:
        layout = p[0]
        for i in range(layout.shape[0]):
            if layout[i] & PREFIXED and layout[i] & 0x7F > 4:
                raise ValueError("images: a length prefix is of 1 to 4 bytes")
    nimages = len(prepared)
    if n == 0:
        return b"", False
    src = &view[0]
    while pos < n:
        for k in range(nimages):
            layout = prepared[k][0]
            masked = prepared[k][1]
            cols = layout.shape[0]
            nb = (cols + 7) >> 3
            if nb > n - pos:
                raise MalformedEvent("a row's NULL bitmap runs past the event", offset=pos)
            bitmap_src = pos
            bitmap_out = PyByteArray_GET_SIZE(out)
            run = pos  # bytes from `run` on go as they are, up to the next masked value
            pos += nb
            for i in range(cols):
                if src[bitmap_src + (i >> 3)] >> (i & 7) & 1:
                    continue
                width = layout[i]
                start = pos
                if width & PREFIXED:
                    plen = width & 0x7F
                    if plen > n - pos:
                        raise MalformedEvent("a value's length runs past the event",
                                             offset=pos)
                    ulen = 0  # (at most 4 bytes, checked above: no sign, no overflow)
                    for b in range(plen):
                        ulen |= (<uint64_t>src[pos + b]) << (8 * b)
                    width = <Py_ssize_t>ulen + plen
                if width > n - pos:
                    raise MalformedEvent("a value runs past the event", offset=pos)
                pos += width
                if not masked[i]:
                    continue
                append_raw(out, src + run, start - run)
                run = pos
                raw = src[start:pos]
                new = replace(k, i, raw)
                if new is None:
                    (<uint8_t*>PyByteArray_AS_STRING(out))[bitmap_out + (i >> 3)] |= \
                        <uint8_t>(1 << (i & 7))
                    changed = True
                else:
                    out.extend(new)
                    if not changed and new != raw:
                        changed = True
            append_raw(out, src + run, pos - run)
    return bytes(out), changed
