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
from relay.kernels.pure import check_plan, frame_large, impossible_size

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


# --- row images into Arrow column buffers (the typed tap) -------------------------------------

from cpython.ref cimport PyObject
from libc.stdint cimport int32_t
from libc.stdlib cimport free, malloc

cdef extern from *:
    ctypedef long long int128 "__int128"   # gcc and clang: the decimal128 values

cdef enum:
    S_INT = 1
    S_YEAR = 2
    S_FLOAT = 3
    S_DOUBLE = 4
    S_DECIMAL = 5
    S_DATE = 6
    S_DATETIME2 = 7
    S_TIMESTAMP2 = 8
    S_TEXT = 9
    MAX_DECIMAL_BYTES = 40

cdef int64_t MAX_TEXT = 2147483647
cdef int DIG2BYTES[10]
DIG2BYTES[:] = [0, 1, 1, 2, 2, 3, 3, 4, 4, 4]
cdef int64_t POW10[10]
POW10[:] = [1, 10, 100, 1000, 10000, 100000, 1000000, 10000000, 100000000, 1000000000]
cdef int DAYS_IN_MONTH[16]
DAYS_IN_MONTH[:] = [0, 31, 28, 31, 30, 31, 30, 31, 31, 30, 31, 30, 31, 0, 0, 0]


cdef inline bint utf8_ok(const uint8_t* s, Py_ssize_t n) noexcept nogil:
    """What Python's strict UTF-8 decoder accepts (no overlong forms, no surrogates,
    nothing past U+10FFFF)."""
    cdef Py_ssize_t i = 0
    cdef uint64_t word
    cdef uint8_t c, c1
    while i < n:
        if i + 8 <= n:
            memcpy(&word, s + i, 8)
            if not (word & 0x8080808080808080ULL):
                i += 8
                continue
        c = s[i]
        if c < 0x80:
            i += 1
        elif c < 0xC2:
            return False
        elif c < 0xE0:
            if i + 1 >= n or (s[i + 1] & 0xC0) != 0x80:
                return False
            i += 2
        elif c < 0xF0:
            if i + 2 >= n:
                return False
            c1 = s[i + 1]
            if (c1 & 0xC0) != 0x80 or (s[i + 2] & 0xC0) != 0x80 or \
                    (c == 0xE0 and c1 < 0xA0) or (c == 0xED and c1 > 0x9F):
                return False
            i += 3
        elif c < 0xF5:
            if i + 3 >= n:
                return False
            c1 = s[i + 1]
            if (c1 & 0xC0) != 0x80 or (s[i + 2] & 0xC0) != 0x80 or \
                    (s[i + 3] & 0xC0) != 0x80 or (c == 0xF0 and c1 < 0x90) or \
                    (c == 0xF4 and c1 > 0x8F):
                return False
            i += 4
        else:
            return False
    return True


cdef inline bint date_ok(int64_t y, int64_t m, int64_t d) noexcept nogil:
    """What Python's date() accepts."""
    cdef int64_t dim
    if y < 1 or y > 9999 or m < 1 or m > 12 or d < 1:
        return False
    dim = DAYS_IN_MONTH[m]
    if m == 2 and (y % 4 == 0 and (y % 100 != 0 or y % 400 == 0)):
        dim = 29
    return d <= dim


cdef inline int64_t days_from_civil(int64_t y, int64_t m, int64_t d) noexcept nogil:
    """Days since 1970-01-01 (Howard Hinnant's algorithm; y >= 1 here)."""
    cdef int64_t era, yoe, doy, doe
    if m <= 2:
        y -= 1
    era = y // 400
    yoe = y - era * 400
    doy = (153 * (m - 3 if m > 2 else m + 9) + 2) // 5 + d - 1
    doe = yoe * 365 + yoe // 4 - yoe // 100 + doy
    return era * 146097 + doe - 719468


cdef inline int64_t frac_us(const uint8_t* p, int fsp) noexcept nogil:
    if fsp == 0:
        return 0
    if fsp <= 2:
        return p[0] * 10000
    if fsp <= 4:
        return ((p[0] << 8) | p[1]) * 100
    return (p[0] << 16) | (p[1] << 8) | p[2]


cdef inline char* grow(PyObject* buf, Py_ssize_t n) except NULL:
    """Room for `n` more bytes at the end of a bytearray (CPython over-allocates)."""
    cdef object b = <object>buf
    cdef Py_ssize_t size = PyByteArray_GET_SIZE(b)
    PyByteArray_Resize(b, size + n)
    return PyByteArray_AS_STRING(b) + size


cdef inline int decimal_value(const uint8_t* src, int precision, int scale, int size,
                              int128* out) noexcept nogil:
    """MySQL's binary DECIMAL -> its unscaled value; -1 for a group no server writes."""
    cdef uint8_t raw[MAX_DECIMAL_BYTES]
    cdef bint negative
    cdef int i, p = 0, digits, nbytes, intg = precision - scale, groups, g
    cdef int64_t group
    cdef int128 value = 0
    memcpy(raw, src, size)
    negative = not (raw[0] & 0x80)
    raw[0] ^= 0x80
    if negative:
        for i in range(size):
            raw[i] ^= 0xFF
    groups = (1 if intg % 9 else 0) + intg // 9 + scale // 9 + (1 if scale % 9 else 0)
    for g in range(groups):
        if g == 0 and intg % 9:
            digits = intg % 9
        elif g == groups - 1 and scale % 9:
            digits = scale % 9
        else:
            digits = 9
        nbytes = DIG2BYTES[digits]
        group = 0
        for i in range(nbytes):
            group = (group << 8) | raw[p + i]
        if group >= POW10[digits]:
            return -1
        value = value * POW10[digits] + group
        p += nbytes
    out[0] = -value if negative else value
    return 0


def decode_columns(data, Py_ssize_t pos, Py_ssize_t end, tuple plan not None,
                   tuple charmaps not None, list sinks not None, list rows not None):
    cdef const uint8_t[::1] view = data
    cdef Py_ssize_t ncols = len(plan) // 4, nimg = len(sinks), nulls_len, nbufs, i, j, k
    cdef Py_ssize_t p, row, done = 0, width, tlen
    cdef int* steps = NULL
    cdef PyObject** bufs = NULL
    cdef Py_ssize_t* saved = NULL
    cdef int* shared = NULL
    cdef int64_t* starts = NULL
    cdef const uint8_t* src
    cdef const uint8_t* nulls
    cdef uint8_t* vbits
    cdef char* dst
    cdef int step, a, b, c
    cdef bint null, failed = False
    cdef int64_t v, y, mo, d, h, mi, s, us, ymd, ym, hms
    cdef uint64_t bits
    cdef int32_t off
    cdef int128 dec
    cdef list sink
    cdef const uint8_t** maps = NULL
    cdef const uint8_t* cm
    cdef Py_ssize_t x
    check_plan(plan, charmaps)
    if end > view.shape[0] or pos < 0 or pos > end:
        raise ValueError("decode_columns: pos and end must lie within the data")
    if nimg == 0 or len(rows) != nimg:
        raise ValueError("decode_columns: one row count per sink")
    nulls_len = (ncols + 7) >> 3
    nbufs = nimg * ncols * 3
    steps = <int*>malloc(ncols * 4 * sizeof(int))
    bufs = <PyObject**>malloc(nbufs * sizeof(PyObject*))
    saved = <Py_ssize_t*>malloc(nbufs * sizeof(Py_ssize_t))
    shared = <int*>malloc(nbufs * sizeof(int))
    starts = <int64_t*>malloc(nimg * sizeof(int64_t))
    maps = <const uint8_t**>malloc((len(charmaps) + 1) * sizeof(uint8_t*))
    try:
        if steps == NULL or bufs == NULL or saved == NULL or starts == NULL or \
                shared == NULL or maps == NULL:
            raise MemoryError()
        for i in range(len(charmaps)):  # (bytes objects the caller's tuple holds)
            maps[i] = <const uint8_t*><const char*>charmaps[i]
        for i in range(ncols * 4):
            steps[i] = plan[i]
        for k in range(nimg):
            sink = sinks[k]
            if len(sink) != ncols * 3:
                raise ValueError("decode_columns: three buffers per column in each sink")
            starts[k] = rows[k]
            for i in range(ncols * 3):
                if type(sink[i]) is not bytearray:
                    raise TypeError("decode_columns: the sinks hold bytearrays")
                bufs[k * ncols * 3 + i] = <PyObject*>sink[i]
                saved[k * ncols * 3 + i] = PyByteArray_GET_SIZE(sink[i])
                # The one byte of a validity bitmap rows before starts[k] share with new ones.
                shared[k * ncols * 3 + i] = -1
                if i % 3 == 0 and PyByteArray_GET_SIZE(sink[i]) > (starts[k] >> 3):
                    shared[k * ncols * 3 + i] = \
                        (<uint8_t*>PyByteArray_AS_STRING(sink[i]))[starts[k] >> 3]
        src = &view[0] if view.shape[0] else NULL
        while pos < end and not failed:
            for k in range(nimg):
                row = starts[k] + done
                if nulls_len > end - pos:
                    failed = True
                    break
                nulls = src + pos
                p = pos + nulls_len
                for j in range(ncols):
                    step, a, b, c = steps[4 * j], steps[4 * j + 1], steps[4 * j + 2], \
                        steps[4 * j + 3]
                    i = (k * ncols + j) * 3
                    while PyByteArray_GET_SIZE(<object>bufs[i]) <= (row >> 3):
                        grow(bufs[i], 1)[0] = 0
                    vbits = <uint8_t*>PyByteArray_AS_STRING(<object>bufs[i])
                    null = (nulls[j >> 3] >> (j & 7)) & 1
                    if null:
                        vbits[row >> 3] &= <uint8_t>~(1 << (row & 7))
                    else:
                        vbits[row >> 3] |= <uint8_t>(1 << (row & 7))
                    if step == S_TEXT:
                        if not null:
                            if a > end - p:
                                failed = True
                                break
                            tlen = 0
                            for width in range(a):
                                tlen |= (<Py_ssize_t>src[p + width]) << (8 * width)
                            p += a
                            if tlen > end - p or (b == 1 and not utf8_ok(src + p, tlen)):
                                failed = True
                                break
                            width = 3 * tlen if b == 2 else tlen if b or tlen >= c else c
                            if PyByteArray_GET_SIZE(<object>bufs[i + 2]) + width > MAX_TEXT:
                                failed = True
                                break
                            dst = grow(bufs[i + 2], width)
                            if b == 2:  # recoded: each byte's UTF-8 bytes from the charmap
                                cm = maps[c]
                                width = 0
                                for x in range(tlen):
                                    memcpy(dst + width, cm + 4 * src[p + x] + 1, 3)
                                    width += cm[4 * src[p + x]]
                                PyByteArray_Resize(<object>bufs[i + 2],
                                                   PyByteArray_GET_SIZE(<object>bufs[i + 2]) -
                                                   3 * tlen + width)
                            else:
                                memcpy(dst, src + p, tlen)
                                if width > tlen:
                                    memset(dst + tlen, 0, width - tlen)
                            p += tlen
                        off = <int32_t>PyByteArray_GET_SIZE(<object>bufs[i + 2])
                        memcpy(grow(bufs[i + 1], 4), &off, 4)
                        continue
                    if step == S_INT:
                        width = c
                    elif step == S_YEAR:
                        width = 2
                    elif step == S_FLOAT or step == S_DATE:
                        width = 4
                    elif step == S_DECIMAL:
                        width = 16
                    else:
                        width = 8
                    dst = grow(bufs[i + 1], width)
                    if null:
                        memset(dst, 0, width)
                        continue
                    if step == S_INT:
                        if a > end - p:
                            failed = True
                            break
                        bits = 0
                        for width in range(a):
                            bits |= (<uint64_t>src[p + width]) << (8 * width)
                        if b and a < 8 and bits >> (8 * a - 1):
                            bits |= ~((<uint64_t>1 << (8 * a)) - 1)  # sign-extend
                        v = <int64_t>bits
                        if c == 16:
                            dec = <int128>bits if not b else <int128>v
                            memcpy(dst, &dec, 16)
                        else:
                            memcpy(dst, &v, c)  # little-endian: the low bytes
                        p += a
                    elif step == S_YEAR:
                        if 1 > end - p:
                            failed = True
                            break
                        v = 1900 + src[p] if src[p] else 0
                        memcpy(dst, &v, 2)
                        p += 1
                    elif step == S_FLOAT or step == S_DOUBLE:
                        if width > end - p:
                            failed = True
                            break
                        bits = 0
                        memcpy(&bits, src + p, width)
                        if (step == S_FLOAT and ((bits >> 23) & 0xFF) == 0xFF) or \
                                (step == S_DOUBLE and ((bits >> 52) & 0x7FF) == 0x7FF):
                            failed = True
                            break
                        memcpy(dst, src + p, width)
                        p += width
                    elif step == S_DECIMAL:
                        if c > end - p or c > MAX_DECIMAL_BYTES or \
                                decimal_value(src + p, a, b, c, &dec) < 0:
                            failed = True
                            break
                        memcpy(dst, &dec, 16)
                        p += c
                    elif step == S_DATE:
                        if 3 > end - p:
                            failed = True
                            break
                        v = src[p] | (src[p + 1] << 8) | (src[p + 2] << 16)
                        y, mo, d = v >> 9, (v >> 5) & 15, v & 31
                        if not date_ok(y, mo, d):
                            failed = True
                            break
                        v = days_from_civil(y, mo, d)
                        memcpy(dst, &v, 4)
                        p += 3
                    elif step == S_DATETIME2:
                        if 5 + (a + 1) // 2 > end - p:
                            failed = True
                            break
                        v = 0
                        for width in range(5):
                            v = (v << 8) | src[p + width]
                        v -= 0x8000000000
                        us = frac_us(src + p + 5, a)
                        if v < 0:
                            failed = True
                            break
                        ymd, hms = v >> 17, v & 0x1FFFF
                        ym = ymd >> 5
                        y, mo, d = ym // 13, ym % 13, ymd & 31
                        h, mi, s = hms >> 12, (hms >> 6) & 63, hms & 63
                        if not date_ok(y, mo, d) or h > 23 or mi > 59 or s > 59 or \
                                us > 999999:
                            failed = True
                            break
                        v = days_from_civil(y, mo, d) * 86400000000 + \
                            ((h * 60 + mi) * 60 + s) * 1000000 + us
                        memcpy(dst, &v, 8)
                        p += 5 + (a + 1) // 2
                    else:  # S_TIMESTAMP2
                        if 4 + (a + 1) // 2 > end - p:
                            failed = True
                            break
                        v = (<int64_t>src[p] << 24) | (src[p + 1] << 16) | \
                            (src[p + 2] << 8) | src[p + 3]
                        us = frac_us(src + p + 4, a)
                        if v == 0 and us == 0:
                            failed = True
                            break
                        v = v * 1000000 + us
                        memcpy(dst, &v, 8)
                        p += 4 + (a + 1) // 2
                if failed:
                    break
                pos = p
            if not failed:
                done += 1
        if failed:
            for i in range(nbufs):
                PyByteArray_Resize(<object>bufs[i], saved[i])
                if shared[i] >= 0:
                    (<uint8_t*>PyByteArray_AS_STRING(<object>bufs[i]))[
                        starts[i // (ncols * 3)] >> 3] = <uint8_t>shared[i]
            return -1
        return done
    finally:
        free(steps)
        free(bufs)
        free(saved)
        free(shared)
        free(starts)
        free(maps)
