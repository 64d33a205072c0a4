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
from libc.string cimport memcmp, memcpy, memset, strlen
from cpython.bytes cimport PyBytes_AS_STRING, PyBytes_FromStringAndSize

from relay.errors import MalformedEvent
from relay.kernels.pure import check_plan, check_splice, frame_large, impossible_size

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


cdef extern from "zlib.h":
    unsigned long zlib_crc32 "crc32"(unsigned long crc, const unsigned char* buf,
                                     unsigned int len) nogil


def checked_events(buf, Py_ssize_t start, Py_ssize_t end, int crc_len):
    cdef const uint8_t[::1] view = buf
    cdef Py_ssize_t pos = start
    cdef int64_t size
    cdef const uint8_t* src
    check_pos(start)
    if end > view.shape[0]:
        raise ValueError(f"end {end} is past the buffer ({view.shape[0]} bytes)")
    if crc_len != 0 and crc_len != 4:
        raise ValueError(f"crc_len {crc_len}: 0 or 4")
    if end - pos < HEADER_LEN:
        return pos, -1
    src = &view[0]
    while end - pos >= HEADER_LEN:
        size = u32(src + pos + 9)
        if size < HEADER_LEN + crc_len or size > MAX_EVENT_SIZE:
            raise impossible_size(size, pos)
        if pos + size > end:
            break
        if crc_len and zlib_crc32(0, src + pos, <unsigned int>(size - 4)) \
                != u32(src + pos + size - 4):
            return pos, pos
        pos += size
    return pos, -1


def whole_events(buf, Py_ssize_t start, Py_ssize_t end):
    return checked_events(buf, start, end, 0)[0]


def frame_stored(bytearray out not None, buf, int seq, int omit=-1):
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
            if src[pos + 4] != omit:
                total += size + 5
            pos += size
        if total:
            w = PyByteArray_GET_SIZE(out)
            PyByteArray_Resize(out, w + total)
            dst = PyByteArray_AS_STRING(out) + w
            p = start
            while p < pos:
                each = u32(src + p + 9)
                if src[p + 4] != omit:
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
        if src[pos + 4] != omit:
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
               table_map, dict known not None, bint drop_annotations, list cuts not None):
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
    cdef object got, body
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
                body = PyBytes_FromStringAndSize(<const char*>src + p + HEADER_LEN,
                                                 max(<int64_t>0, size - HEADER_LEN - crc_len))
                got = known.get(body)
                if got is None or got < 0:
                    got = table_map(p, end)
                    if got < 0:
                        break
                    known[body] = got
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


cdef _refuse_splice(list images, list replace):
    check_splice(images, replace)  # (raises what the twin raises)
    raise ValueError("images: arguments no table has")


def splice_rows(rows, list images not None, list replace not None):
    cdef const uint8_t[::1] view = rows
    cdef Py_ssize_t n = view.shape[0], pos = 0, start, width, plen, nb, cols, i, b, run
    cdef Py_ssize_t bitmap_src, bitmap_out, size
    cdef uint64_t ulen
    cdef const uint8_t* src
    cdef const uint8_t[::1] layout
    cdef const uint8_t[::1] masked
    cdef uint8_t mode
    cdef uint8_t prefix[4]
    cdef int k, nimages
    cdef bint changed = False
    cdef bytearray out = bytearray()
    cdef object new, raw
    cdef tuple calls
    cdef list prepared = []
    cdef bint any_column = False
    if len(replace) != len(images):
        _refuse_splice(images, replace)
    for (layout_obj, masked_obj), calls_obj in zip(images, replace):
        # (copies: a replacer cannot change what was checked)
        calls = tuple(calls_obj)
        layout_obj = bytes(layout_obj)
        masked_obj = bytes(masked_obj)
        layout = layout_obj
        masked = masked_obj
        cols = layout.shape[0]
        if masked.shape[0] != cols or len(calls) != cols:
            _refuse_splice(images, replace)
        for i in range(cols):
            mode = masked[i]
            if (layout[i] & PREFIXED and layout[i] & 0x7F > 4) or mode > 2 \
                    or (mode and calls[i] is None) or (mode == 2 and not layout[i] & PREFIXED):
                _refuse_splice(images, replace)
        any_column = any_column or cols > 0
        prepared.append((layout_obj, masked_obj, calls))
    if not any_column:
        _refuse_splice(images, replace)
    nimages = len(prepared)
    if n == 0:
        return b"", False
    src = &view[0]
    while pos < n:
        for k in range(nimages):
            layout = prepared[k][0]
            masked = prepared[k][1]
            calls = prepared[k][2]
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
                plen = 0
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
                mode = masked[i]
                if not mode:
                    continue
                append_raw(out, src + run, start - run)
                run = pos
                if mode == 2:  # SpliceMode.VALUE
                    start += plen
                raw = src[start:pos]
                new = calls[i](raw)
                if new is None:
                    (<uint8_t*>PyByteArray_AS_STRING(out))[bitmap_out + (i >> 3)] |= \
                        <uint8_t>(1 << (i & 7))
                    changed = True
                    continue
                if mode == 2:
                    size = len(new)
                    if size >> (8 * plen):
                        raise OverflowError(f"a masked value of {size} bytes is longer "
                                            f"than its {plen}-byte length prefix holds")
                    for b in range(plen):
                        prefix[b] = <uint8_t>(size >> (8 * b))
                    append_raw(out, prefix, plen)
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
    S_TIME2 = 10
    S_ENUM = 11
    S_BIT = 12
    S_SET = 13
    S_CALL = 14
    S_JSON = 15
    S_GEOMETRY = 16
    MAX_DECIMAL_BYTES = 40
    DECIMAL_TEXT = 100       # a DECIMAL's text: sign, 65 digits, point, exponent

COLUMN_STEPS = S_GEOMETRY  # the last ColumnStep this build decodes (a build before it is refused)
cdef int64_t MAX_TEXT = 2147483647
cdef int64_t DATETIME2_BIAS = 0x8000000000  # the sign bit of DATETIME2's 40-bit value
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


cdef inline int decimal_groups(const uint8_t* src, int precision, int scale, int size,
                               int64_t* groups, int* digits, bint* negative) noexcept nogil:
    """MySQL's binary DECIMAL (base-10^9 groups, big-endian, the top bit set for a
    positive value, every bit inverted for a negative one) -> its groups, most
    significant first, with their digit counts; -1 for a group no server writes."""
    cdef uint8_t raw[MAX_DECIMAL_BYTES]
    cdef int i, p = 0, nbytes, intg = precision - scale, count, g
    cdef int64_t group
    memcpy(raw, src, size)
    negative[0] = not (raw[0] & 0x80)
    raw[0] ^= 0x80
    if negative[0]:
        for i in range(size):
            raw[i] ^= 0xFF
    count = (1 if intg % 9 else 0) + intg // 9 + scale // 9 + (1 if scale % 9 else 0)
    for g in range(count):
        if g == 0 and intg % 9:
            digits[g] = intg % 9
        elif g == count - 1 and scale % 9:
            digits[g] = scale % 9
        else:
            digits[g] = 9
        nbytes = DIG2BYTES[digits[g]]
        group = 0
        for i in range(nbytes):
            group = (group << 8) | raw[p + i]
        if group >= POW10[digits[g]]:
            return -1
        groups[g] = group
        p += nbytes
    return count


cdef inline int decimal_value(const uint8_t* src, int precision, int scale, int size,
                              int128* out) noexcept nogil:
    """MySQL's binary DECIMAL -> its unscaled value; -1 for a group no server writes."""
    cdef int64_t groups[MAX_DECIMAL_BYTES]
    cdef int digits[MAX_DECIMAL_BYTES]
    cdef bint negative
    cdef int g, count = decimal_groups(src, precision, scale, size, groups, digits, &negative)
    cdef int128 value = 0
    if count < 0:
        return -1
    for g in range(count):
        value = value * POW10[digits[g]] + groups[g]
    out[0] = -value if negative else value
    return 0


cdef inline uint64_t int_bits(const uint8_t* p, int a, bint signed_) noexcept nogil:
    """A little-endian integer of `a` bytes, sign-extended when signed."""
    cdef uint64_t bits = 0
    cdef int i
    for i in range(a):
        bits |= (<uint64_t>p[i]) << (8 * i)
    if signed_ and a < 8 and bits >> (8 * a - 1):
        bits |= ~((<uint64_t>1 << (8 * a)) - 1)
    return bits


cdef inline bint float_ok(const uint8_t* p, int step) noexcept nogil:
    """Not a NaN or an infinity (no server stores one)."""
    cdef uint64_t bits = 0
    if step == S_FLOAT:
        memcpy(&bits, p, 4)
        return ((bits >> 23) & 0xFF) != 0xFF
    memcpy(&bits, p, 8)
    return ((bits >> 52) & 0x7FF) != 0x7FF


cdef inline bint date_parts(const uint8_t* p, int64_t* f) noexcept nogil:
    """DATE -> f[0..2] (year, month, day); False for a date Python's date() refuses."""
    cdef int64_t v = p[0] | (p[1] << 8) | (p[2] << 16)
    f[0], f[1], f[2] = v >> 9, (v >> 5) & 15, v & 31
    return date_ok(f[0], f[1], f[2])


cdef inline bint datetime2_parts(const uint8_t* p, int fsp, int64_t* f) noexcept nogil:
    """DATETIME2 -> f[0..6] (year .. microsecond); False for one datetime() refuses."""
    cdef int64_t v = 0, ymd, ym, hms
    cdef int i
    for i in range(5):
        v = (v << 8) | p[i]
    v -= DATETIME2_BIAS
    if v < 0:
        return False
    ymd, hms = v >> 17, v & 0x1FFFF
    ym = ymd >> 5
    f[0], f[1], f[2] = ym // 13, ym % 13, ymd & 31
    f[3], f[4], f[5] = hms >> 12, (hms >> 6) & 63, hms & 63
    f[6] = frac_us(p + 5, fsp)
    return date_ok(f[0], f[1], f[2]) and f[3] <= 23 and f[4] <= 59 and f[5] <= 59 and \
        f[6] <= 999999


cdef inline bint timestamp2_us(const uint8_t* p, int fsp, int64_t* us) noexcept nogil:
    """TIMESTAMP2 -> microseconds since the epoch; False for the zero timestamp."""
    cdef int64_t sec = (<int64_t>p[0] << 24) | (p[1] << 16) | (p[2] << 8) | p[3]
    cdef int64_t frac = frac_us(p + 4, fsp)
    us[0] = sec * 1000000 + frac
    return sec != 0 or frac != 0


cdef inline Py_ssize_t stored_size(int step, int a, int c) noexcept nogil:
    """The bytes a non-NULL value of a fixed-size step takes in the row image."""
    if step == S_INT:
        return a
    if step == S_YEAR:
        return 1
    if step == S_FLOAT:
        return 4
    if step == S_DOUBLE:
        return 8
    if step == S_DECIMAL:
        return c
    if step == S_DATE:
        return 3
    if step == S_DATETIME2:
        return 5 + (a + 1) // 2
    if step == S_TIME2:
        return 3 + (a + 1) // 2
    if step == S_ENUM or step == S_BIT or step == S_SET:
        return a
    return 4 + (a + 1) // 2  # S_TIMESTAMP2


cdef inline Py_ssize_t text_at(const uint8_t* src, Py_ssize_t p, Py_ssize_t end, int a,
                               int mode) noexcept nogil:
    """The length of the TEXT value whose `a`-byte length is at p, or -1 when it runs
    past `end` or (mode 1) is not UTF-8."""
    cdef Py_ssize_t n = 0
    cdef int i
    if a > end - p:
        return -1
    for i in range(a):
        n |= (<Py_ssize_t>src[p + i]) << (8 * i)
    if n > end - p - a or (mode == 1 and not utf8_ok(src + p + a, n)):
        return -1
    return n


cdef class _Call:
    """What the row-image kernels hold during a call: the plan's ints, the charmaps, and
    the sinks' buffers with their sizes and the validity bytes shared with earlier rows,
    so that a -1 leaves the sinks as they were."""

    cdef int* steps
    cdef const uint8_t** maps
    cdef PyObject** bufs
    cdef Py_ssize_t* saved
    cdef int* shared
    cdef int64_t* starts
    cdef Py_ssize_t ncols, nimg, per_sink

    def __dealloc__(self):
        free(self.steps)
        free(self.maps)
        free(self.bufs)
        free(self.saved)
        free(self.shared)
        free(self.starts)

    cdef setup(self, tuple plan, tuple charmaps, list sinks, list rows, Py_ssize_t per_sink,
               str name):
        """`per_sink` buffers in each sink, validity bitmaps every third from the first."""
        cdef Py_ssize_t i, k, n
        cdef list sink
        self.ncols = len(plan) // 4
        self.nimg = len(sinks)
        self.per_sink = per_sink
        if self.nimg == 0 or len(rows) != self.nimg or any(r < 0 for r in rows):
            raise ValueError(f"{name}: one row count (not negative) per sink")
        n = self.nimg * per_sink
        self.steps = <int*>malloc(len(plan) * sizeof(int))
        self.maps = <const uint8_t**>malloc((len(charmaps) + 1) * sizeof(uint8_t*))
        self.bufs = <PyObject**>malloc(n * sizeof(PyObject*))
        self.saved = <Py_ssize_t*>malloc(n * sizeof(Py_ssize_t))
        self.shared = <int*>malloc(n * sizeof(int))
        self.starts = <int64_t*>malloc(self.nimg * sizeof(int64_t))
        if self.steps == NULL or self.maps == NULL or self.bufs == NULL or \
                self.saved == NULL or self.shared == NULL or self.starts == NULL:
            raise MemoryError()
        for i in range(len(plan)):
            self.steps[i] = plan[i]
        for i in range(len(charmaps)):  # (bytes objects the caller's tuple holds)
            self.maps[i] = <const uint8_t*><const char*>charmaps[i]
        for k in range(self.nimg):
            sink = sinks[k]
            if len(sink) != per_sink:
                raise ValueError(f"{name}: {per_sink} buffers in each sink")
            self.starts[k] = rows[k]
            for i in range(per_sink):
                if type(sink[i]) is not bytearray:
                    raise TypeError(f"{name}: the sinks hold bytearrays")
                self.bufs[k * per_sink + i] = <PyObject*>sink[i]
                self.saved[k * per_sink + i] = PyByteArray_GET_SIZE(sink[i])
                self.shared[k * per_sink + i] = -1
                if i % 3 == 0 and PyByteArray_GET_SIZE(sink[i]) > (rows[k] >> 3):
                    self.shared[k * per_sink + i] = \
                        (<uint8_t*>PyByteArray_AS_STRING(sink[i]))[rows[k] >> 3]

    cdef restore(self):
        cdef Py_ssize_t i
        for i in range(self.nimg * self.per_sink):
            PyByteArray_Resize(<object>self.bufs[i], self.saved[i])
            if self.shared[i] >= 0:
                (<uint8_t*>PyByteArray_AS_STRING(<object>self.bufs[i]))[
                    self.starts[i // self.per_sink] >> 3] = <uint8_t>self.shared[i]


cdef inline void set_bit(PyObject* validity, Py_ssize_t row, bint valid) except *:
    cdef uint8_t* vbits
    while PyByteArray_GET_SIZE(<object>validity) <= (row >> 3):
        grow(validity, 1)[0] = 0
    vbits = <uint8_t*>PyByteArray_AS_STRING(<object>validity)
    if valid:
        vbits[row >> 3] |= <uint8_t>(1 << (row & 7))
    else:
        vbits[row >> 3] &= <uint8_t>~(1 << (row & 7))


cdef inline Py_ssize_t recode(const uint8_t* cm, const uint8_t* src, Py_ssize_t n,
                              char* dst) noexcept nogil:
    """A single-byte character set's bytes as UTF-8 by its charmap (dst: 3n bytes)."""
    cdef Py_ssize_t x, width = 0
    for x in range(n):
        memcpy(dst + width, cm + 4 * src[x] + 1, 3)
        width += cm[4 * src[x]]
    return width


def decode_columns(data, Py_ssize_t pos, Py_ssize_t end, tuple plan not None,
                   tuple charmaps not None, list sinks not None, list rows not None):
    cdef const uint8_t[::1] view = data
    cdef _Call call = _Call()
    cdef Py_ssize_t ncols, nulls_len, i, j, k, p, row, done = 0, width, tlen, size
    cdef const uint8_t* src
    cdef const uint8_t* nulls
    cdef char* dst
    cdef int step, a, b, c
    cdef bint null, failed = False
    cdef int64_t v
    cdef int64_t f[7]
    cdef int128 dec
    check_plan(plan, charmaps)
    if end > view.shape[0] or pos < 0 or pos > end:
        raise ValueError("decode_columns: pos and end must lie within the data")
    ncols = len(plan) // 4
    call.setup(plan, charmaps, sinks, rows, ncols * 3, "decode_columns")
    nulls_len = (ncols + 7) >> 3
    src = &view[0] if view.shape[0] else NULL
    while pos < end and not failed:
        for k in range(call.nimg):
            row = call.starts[k] + done
            if nulls_len > end - pos:
                failed = True
                break
            nulls = src + pos
            p = pos + nulls_len
            for j in range(ncols):
                step, a, b, c = call.steps[4 * j], call.steps[4 * j + 1], \
                    call.steps[4 * j + 2], call.steps[4 * j + 3]
                i = (k * ncols + j) * 3
                null = (nulls[j >> 3] >> (j & 7)) & 1
                set_bit(call.bufs[i], row, not null)
                if step == S_TEXT:
                    if not null:
                        tlen = text_at(src, p, end, a, b)
                        if tlen < 0:
                            failed = True
                            break
                        p += a
                        width = 3 * tlen if b == 2 else tlen if b or tlen >= c else c
                        if PyByteArray_GET_SIZE(<object>call.bufs[i + 2]) + width > MAX_TEXT:
                            failed = True
                            break
                        dst = grow(call.bufs[i + 2], width)
                        if b == 2:  # recoded: give back what the charmap did not use
                            width = recode(call.maps[c], src + p, tlen, dst)
                            PyByteArray_Resize(<object>call.bufs[i + 2],
                                               PyByteArray_GET_SIZE(<object>call.bufs[i + 2])
                                               - 3 * tlen + width)
                        else:
                            memcpy(dst, src + p, tlen)
                            if width > tlen:
                                memset(dst + tlen, 0, width - tlen)
                        p += tlen
                    v = PyByteArray_GET_SIZE(<object>call.bufs[i + 2])
                    memcpy(grow(call.bufs[i + 1], 4), &v, 4)  # (little-endian int32)
                    continue
                width = c if step == S_INT else 2 if step == S_YEAR else \
                    4 if step == S_FLOAT or step == S_DATE else 16 if step == S_DECIMAL else 8
                dst = grow(call.bufs[i + 1], width)
                if null:
                    memset(dst, 0, width)
                    continue
                size = stored_size(step, a, c)
                if size > end - p:
                    failed = True
                    break
                if step == S_INT:
                    v = <int64_t>int_bits(src + p, a, b)
                    if c == 16:
                        dec = <int128>v if b else <int128><uint64_t>v
                        memcpy(dst, &dec, 16)
                    else:
                        memcpy(dst, &v, c)  # little-endian: the low bytes
                elif step == S_YEAR:
                    v = 1900 + src[p] if src[p] else 0
                    memcpy(dst, &v, 2)
                elif step == S_FLOAT or step == S_DOUBLE:
                    if not float_ok(src + p, step):
                        failed = True
                        break
                    memcpy(dst, src + p, width)
                elif step == S_DECIMAL:
                    if c > MAX_DECIMAL_BYTES or decimal_value(src + p, a, b, c, &dec) < 0:
                        failed = True
                        break
                    memcpy(dst, &dec, 16)
                elif step == S_DATE:
                    if not date_parts(src + p, f):
                        failed = True
                        break
                    v = days_from_civil(f[0], f[1], f[2])
                    memcpy(dst, &v, 4)
                elif step == S_DATETIME2:
                    if not datetime2_parts(src + p, a, f):
                        failed = True
                        break
                    v = days_from_civil(f[0], f[1], f[2]) * 86400000000 + \
                        ((f[3] * 60 + f[4]) * 60 + f[5]) * 1000000 + f[6]
                    memcpy(dst, &v, 8)
                else:  # S_TIMESTAMP2
                    if not timestamp2_us(src + p, a, &v):
                        failed = True
                        break
                    memcpy(dst, &v, 8)
                p += size
            if failed:
                break
            pos = p
        if not failed:
            done += 1
    if failed:
        call.restore()
        return -1
    return done


# --- row images as JSON objects (the tap's JSON form) ------------------------------------------

from cpython.mem cimport PyMem_Free

cdef extern from "Python.h":
    char* PyOS_double_to_string(double val, char format_code, int precision, int flags,
                                int* ptype) except NULL
    int Py_DTSF_ADD_DOT_0

cdef const char* HEX = b"0123456789abcdef"
cdef const char* B64 = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/"


cdef inline void put(PyObject* buf, const char* s, Py_ssize_t n) except *:
    if n > 0:
        memcpy(grow(buf, n), s, n)


cdef inline Py_ssize_t put_uint(char* out, uint64_t v) noexcept nogil:
    """Decimal digits of v into out (up to 20); returns their count."""
    cdef char tmp[24]
    cdef Py_ssize_t n = 0, i
    while True:
        tmp[n] = <char>(48 + v % 10)
        n += 1
        v //= 10
        if v == 0:
            break
    for i in range(n):
        out[i] = tmp[n - 1 - i]
    return n


cdef inline Py_ssize_t put_padded(char* out, int64_t v, int width) noexcept nogil:
    cdef int i
    for i in range(width - 1, -1, -1):
        out[i] = <char>(48 + v % 10)
        v //= 10
    return width


cdef inline Py_ssize_t put_datetime(char* out, int64_t y, int64_t mo, int64_t d, int64_t h,
                                    int64_t mi, int64_t s, int64_t us, int fsp) noexcept nogil:
    """'YYYY-MM-DDTHH:MM:SS' and the first `fsp` digits of the microseconds."""
    cdef Py_ssize_t n = 0
    cdef char frac[6]
    n += put_padded(out + n, y, 4)
    out[n] = 45
    n += 1
    n += put_padded(out + n, mo, 2)
    out[n] = 45
    n += 1
    n += put_padded(out + n, d, 2)
    out[n] = 84  # T
    n += 1
    n += put_padded(out + n, h, 2)
    out[n] = 58
    n += 1
    n += put_padded(out + n, mi, 2)
    out[n] = 58
    n += 1
    n += put_padded(out + n, s, 2)
    if fsp:
        out[n] = 46
        n += 1
        put_padded(frac, us, 6)
        memcpy(out + n, frac, fsp)
        n += fsp
    return n


cdef inline void civil_from_days(int64_t z, int64_t* y, int64_t* m, int64_t* d) noexcept nogil:
    """Howard Hinnant's civil_from_days (z >= 0 here: days since 1970-01-01)."""
    cdef int64_t era, doe, yoe, doy, mp
    z += 719468
    era = z // 146097
    doe = z - era * 146097
    yoe = (doe - doe // 1460 + doe // 36524 - doe // 146096) // 365
    doy = doe - (365 * yoe + yoe // 4 - yoe // 100)
    mp = (5 * doy + 2) // 153
    d[0] = doy - (153 * mp + 2) // 5 + 1
    m[0] = mp + 3 if mp < 10 else mp - 9
    y[0] = yoe + era * 400 + (1 if m[0] <= 2 else 0)


cdef int put_decimal(PyObject* buf, const uint8_t* src, int precision, int scale,
                     int size) except -2:
    """str(Decimal) of MySQL's binary DECIMAL, quoted; -1 for a group no server writes."""
    cdef char out[DECIMAL_TEXT]
    cdef Py_ssize_t n
    out[0] = 34
    n = decimal_text(out + 1, src, precision, scale, size)
    if n < 0:
        return -1
    out[n + 1] = 34
    put(buf, out, n + 2)
    return 0


cdef Py_ssize_t decimal_text(char* out, const uint8_t* src, int precision, int scale,
                             int size) noexcept:
    """str(Decimal) of MySQL's binary DECIMAL into `out` (DECIMAL_TEXT bytes), its length;
    -1 for a group no server writes. Python's to-sci-string: plain unless the adjusted
    exponent is below -6."""
    cdef int64_t groups[MAX_DECIMAL_BYTES]
    cdef int gdigits[MAX_DECIMAL_BYTES]
    cdef char digits[80]
    cdef bint negative
    cdef int i, nd = 0, g, count, start, ncoef, adjusted, n = 0, dot
    count = decimal_groups(src, precision, scale, size, groups, gdigits, &negative)
    if count < 0:
        return -1
    for g in range(count):
        put_padded(digits + nd, groups[g], gdigits[g])
        nd += gdigits[g]
    start = 0  # the coefficient: the digits without leading zeros ("0" for zero)
    while start < nd - 1 and digits[start] == 48:
        start += 1
    if nd == 0:
        digits[0] = 48
        nd = 1
    ncoef = nd - start
    adjusted = -scale + ncoef - 1
    if negative and not (ncoef == 1 and digits[start] == 48):  # (no "-0": the codec's 0)
        out[n] = 45
        n += 1
    if adjusted >= -6:
        dot = ncoef - scale  # digits before the point
        if scale == 0:
            memcpy(out + n, digits + start, ncoef)
            n += ncoef
        elif dot > 0:
            memcpy(out + n, digits + start, dot)
            n += dot
            out[n] = 46
            n += 1
            memcpy(out + n, digits + start + dot, scale)
            n += scale
        else:
            out[n] = 48
            out[n + 1] = 46
            n += 2
            for i in range(-dot):
                out[n] = 48
                n += 1
            memcpy(out + n, digits + start, ncoef)
            n += ncoef
    else:
        out[n] = digits[start]
        n += 1
        if ncoef > 1:
            out[n] = 46
            n += 1
            memcpy(out + n, digits + start + 1, ncoef - 1)
            n += ncoef - 1
        out[n] = 69  # E
        out[n + 1] = 45
        n += 2
        n += put_uint(out + n, <uint64_t>(-adjusted))
    return n


cdef void put_escaped(PyObject* buf, const uint8_t* s, Py_ssize_t n) except *:
    """json.encoder.encode_basestring of UTF-8 text: quoted, with '"', backslash and the
    control characters escaped (\\n, \\r, \\t, \\b, \\f, else \\u00xx), the rest as it is."""
    cdef Py_ssize_t i, run = 0
    cdef uint8_t c
    cdef char esc[6]
    put(buf, b'"', 1)
    for i in range(n):
        c = s[i]
        if c >= 0x20 and c != 34 and c != 92:
            continue
        put(buf, <const char*>s + run, i - run)
        run = i + 1
        esc[0] = 92
        if c == 34 or c == 92:
            esc[1] = c
            put(buf, esc, 2)
        elif c == 10 or c == 13 or c == 9 or c == 8 or c == 12:
            esc[1] = b"n"[0] if c == 10 else b"r"[0] if c == 13 else b"t"[0] if c == 9 \
                else b"b"[0] if c == 8 else b"f"[0]
            put(buf, esc, 2)
        else:
            esc[1] = 117  # u
            esc[2] = 48
            esc[3] = 48
            esc[4] = HEX[c >> 4]
            esc[5] = HEX[c & 15]
            put(buf, esc, 6)
    put(buf, <const char*>s + run, n - run)
    put(buf, b'"', 1)


cdef void put_base64(PyObject* buf, const uint8_t* s, Py_ssize_t n, Py_ssize_t pad) except *:
    """Quoted base64 of the n bytes at s followed by `pad` zero bytes."""
    cdef Py_ssize_t total = n + pad, i, k = 0
    cdef uint32_t v
    cdef uint8_t b0, b1, b2
    cdef char* dst = grow(buf, 2 + (total + 2) // 3 * 4)
    dst[k] = 34
    k += 1
    i = 0
    while i < total:
        b0 = s[i] if i < n else 0
        b1 = (s[i + 1] if i + 1 < n else 0) if i + 1 < total else 0
        b2 = (s[i + 2] if i + 2 < n else 0) if i + 2 < total else 0
        v = (<uint32_t>b0 << 16) | (<uint32_t>b1 << 8) | b2
        dst[k] = B64[(v >> 18) & 63]
        dst[k + 1] = B64[(v >> 12) & 63]
        dst[k + 2] = B64[(v >> 6) & 63] if i + 1 < total else 61
        dst[k + 3] = B64[v & 63] if i + 2 < total else 61
        k += 4
        i += 3
    dst[k] = 34


cdef void put_float(PyObject* text, double d) except *:
    """repr(d), as json.dumps writes a finite float."""
    cdef char* repr_text = PyOS_double_to_string(d, b"r"[0], 0, Py_DTSF_ADD_DOT_0, NULL)
    try:
        put(text, repr_text, strlen(repr_text))
    finally:
        PyMem_Free(repr_text)


cdef Py_ssize_t json_row(PyObject* text, const uint8_t* src, Py_ssize_t pos, Py_ssize_t end,
                         const int* steps, const uint8_t** maps, Py_ssize_t ncols,
                         const char** keyp, const Py_ssize_t* keyn) except -2:
    """One row image at `pos` (NULL bitmap, values) as a JSON object appended to `text`;
    the offset after it, or -1 for what the plan does not write (`text` then holds part
    of the object: the caller cuts it)."""
    cdef Py_ssize_t nulls_len = (ncols + 7) >> 3, j, p, tlen, width, size
    cdef const uint8_t* nulls
    cdef char num[64]
    cdef int step, a, b, c
    cdef int64_t v
    cdef int64_t f[7]
    cdef uint64_t bits
    cdef float f32
    cdef double f64
    cdef bytes recoded
    if nulls_len > end - pos:
        return -1
    nulls = src + pos
    p = pos + nulls_len
    for j in range(ncols):
        step, a, b, c = steps[4 * j], steps[4 * j + 1], steps[4 * j + 2], steps[4 * j + 3]
        put(text, keyp[j], keyn[j])
        if (nulls[j >> 3] >> (j & 7)) & 1:
            put(text, b"null", 4)
            continue
        if step == S_TEXT:
            tlen = text_at(src, p, end, a, b)
            if tlen < 0:
                return -1
            p += a
            if b == 0:
                put_base64(text, src + p, tlen, c - tlen if c > tlen else 0)
            elif b == 1:
                put_escaped(text, src + p, tlen)
            else:  # recoded, then escaped as any UTF-8 text
                recoded = PyBytes_FromStringAndSize(NULL, 3 * tlen)
                width = recode(maps[c], src + p, tlen, PyBytes_AS_STRING(recoded))
                put_escaped(text, <const uint8_t*>PyBytes_AS_STRING(recoded), width)
            p += tlen
            continue
        if step == S_JSON:
            tlen = text_at(src, p, end, a, 0)
            if tlen < 0 or put_document(text, src + p + a, tlen) < 0:
                return -1
            p += a + tlen
            continue
        if step == S_GEOMETRY:   # the SRID, then the WKB
            tlen = text_at(src, p, end, a, 0)
            if tlen < 4:
                return -1
            put(text, b'{"srid":', 8)
            put(text, num, put_uint(num, u32(src + p + a)))
            put(text, b',"wkb":', 7)
            put_base64(text, src + p + a + 4, tlen - 4, 0)
            put(text, b"}", 1)
            p += a + tlen
            continue
        size = stored_size(step, a, c)
        if size > end - p:
            return -1
        if step == S_INT:
            bits = int_bits(src + p, a, b)
            if b and <int64_t>bits < 0:
                num[0] = 45
                width = 1 + put_uint(num + 1, <uint64_t>(-(<int64_t>bits + 1)) + 1)
            else:
                width = put_uint(num, bits)
            put(text, num, width)
        elif step == S_YEAR:
            put(text, num, put_uint(num, 1900 + src[p] if src[p] else 0))
        elif step == S_BIT:   # big-endian
            bits = 0
            for width in range(a):
                bits = (bits << 8) | src[p + width]
            put(text, num, put_uint(num, bits))
        elif step == S_TIME2:
            put_time2(text, src + p, a)
        elif step == S_FLOAT or step == S_DOUBLE:
            if not float_ok(src + p, step):
                return -1
            if step == S_FLOAT:
                memcpy(&f32, src + p, 4)
                f64 = f32
            else:
                memcpy(&f64, src + p, 8)
            put_float(text, f64)
        elif step == S_DECIMAL:
            if c > MAX_DECIMAL_BYTES or put_decimal(text, src + p, a, b, c) < 0:
                return -1
        elif step == S_DATE:
            if not date_parts(src + p, f):
                return -1
            num[0] = 34
            put_padded(num + 1, f[0], 4)
            num[5] = 45
            put_padded(num + 6, f[1], 2)
            num[8] = 45
            put_padded(num + 9, f[2], 2)
            num[11] = 34
            put(text, num, 12)
        elif step == S_DATETIME2:
            if not datetime2_parts(src + p, a, f):
                return -1
            num[0] = 34
            width = 1 + put_datetime(num + 1, f[0], f[1], f[2], f[3], f[4], f[5], f[6], a)
            num[width] = 34
            put(text, num, width + 1)
        else:  # S_TIMESTAMP2: UTC, "+00:00"
            if not timestamp2_us(src + p, a, &v):
                return -1
            civil_from_days(v // 86400000000, &f[0], &f[1], &f[2])
            v = v % 86400000000
            num[0] = 34
            width = 1 + put_datetime(num + 1, f[0], f[1], f[2], v // 3600000000,
                                     (v // 60000000) % 60, (v // 1000000) % 60,
                                     v % 1000000, a)
            memcpy(num + width, b'+00:00"', 7)
            put(text, num, width + 7)
        p += size
    put(text, b"}", 1)
    return p


cdef class _Keys:
    """A plan's column keys as C pointers (into the caller's bytes objects)."""

    cdef const char** keyp
    cdef Py_ssize_t* keyn
    cdef tuple keys

    def __dealloc__(self):
        free(self.keyp)
        free(self.keyn)

    cdef setup(self, tuple keys, Py_ssize_t ncols, str name):
        cdef Py_ssize_t i
        if len(keys) != ncols:
            raise ValueError(f"{name}: one key per column")
        self.keys = keys
        self.keyp = <const char**>malloc((ncols + 1) * sizeof(char*))
        self.keyn = <Py_ssize_t*>malloc((ncols + 1) * sizeof(Py_ssize_t))
        if self.keyp == NULL or self.keyn == NULL:
            raise MemoryError()
        for i in range(ncols):
            if type(keys[i]) is not bytes:
                raise TypeError(f"{name}: the keys are bytes")
            self.keyp[i] = <const char*>keys[i]
            self.keyn[i] = len(keys[i])


def json_images(data, Py_ssize_t pos, Py_ssize_t end, tuple plan not None,
                tuple charmaps not None, tuple keys not None, list sinks not None,
                list rows not None):
    cdef const uint8_t[::1] view = data
    cdef _Call call = _Call()
    cdef _Keys k_ = _Keys()
    cdef Py_ssize_t ncols, k, p, row, done = 0, total
    cdef const uint8_t* src
    cdef PyObject* text
    cdef bint failed = False
    cdef int32_t off
    check_plan(plan, charmaps, 65, None, (), True)
    ncols = len(plan) // 4
    if len(keys) != ncols:
        raise ValueError("json_images: one key per column")
    if end > view.shape[0] or pos < 0 or pos > end:
        raise ValueError("json_images: pos and end must lie within the data")
    call.setup(plan, charmaps, sinks, rows, 3, "json_images")
    k_.setup(keys, ncols, "json_images")
    src = &view[0] if view.shape[0] else NULL
    while pos < end and not failed:
        for k in range(call.nimg):
            row = call.starts[k] + done
            text = call.bufs[3 * k + 2]
            p = json_row(text, src, pos, end, call.steps, call.maps, ncols, k_.keyp, k_.keyn)
            if p < 0:
                failed = True
                break
            total = PyByteArray_GET_SIZE(<object>text)
            if total > MAX_TEXT:
                failed = True
                break
            off = <int32_t>total
            memcpy(grow(call.bufs[3 * k + 1], 4), &off, 4)
            set_bit(call.bufs[3 * k], row, True)
            pos = p
        if not failed:
            done += 1
    if failed:
        call.restore()
        return -1
    return done


# --- text result sets (the snapshot's reads): see pure.py's section --------------------------

from cpython.ref cimport Py_INCREF
from cpython.tuple cimport PyTuple_New, PyTuple_SET_ITEM

cdef enum:
    T_INT = 1
    T_TEXT = 2
    T_BASE64 = 3
    T_DECIMAL = 4
    T_DATE = 5
    T_DATETIME = 6
    T_TIMESTAMP = 7


cdef inline Py_ssize_t row_packet(const uint8_t* src, Py_ssize_t pos,
                                  Py_ssize_t end) noexcept nogil:
    """The payload end of the row packet at pos, or -1 (pure._row_packet's None)."""
    cdef Py_ssize_t n
    if end - pos < 4:
        return -1
    n = src[pos] | (<Py_ssize_t>src[pos + 1] << 8) | (<Py_ssize_t>src[pos + 2] << 16)
    if n == MAX_PACKET or end - pos - 4 < n:
        return -1
    if n and (src[pos + 4] == 0xFF or (src[pos + 4] == 0xFE and n < 9)):
        return -1
    return pos + 4 + n


cdef inline Py_ssize_t text_value(const uint8_t* src, Py_ssize_t* p,
                                  Py_ssize_t stop) noexcept nogil:
    """The length of the value at p[0] (p[0] moved past its length prefix), -1 for NULL
    (moved past it), -2 for bytes that are not a value before `stop`."""
    cdef uint8_t first
    cdef int width, i
    cdef uint64_t n
    if p[0] >= stop:
        return -2
    first = src[p[0]]
    if first == 0xFB:
        p[0] += 1
        return -1
    if first < 0xFB:
        n = first
        p[0] += 1
    elif first == 0xFF:
        return -2
    else:
        width = 2 if first == 0xFC else 3 if first == 0xFD else 8
        if stop - p[0] - 1 < width:
            return -2
        n = 0
        for i in range(width):
            n |= (<uint64_t>src[p[0] + 1 + i]) << (8 * i)
        p[0] += 1 + width
    if n > <uint64_t>(stop - p[0]):
        return -2
    return <Py_ssize_t>n


def text_rows(data, Py_ssize_t pos, Py_ssize_t end, Py_ssize_t ncols, list out not None,
              Py_ssize_t limit):
    cdef const uint8_t[::1] view = data
    cdef const uint8_t* src
    cdef Py_ssize_t* spans = NULL
    cdef Py_ssize_t taken = 0, stop, p, j, n
    cdef bint whole
    cdef object row, value
    check_pos(pos)
    if end > view.shape[0] or pos > end:
        raise ValueError("text_rows: pos and end must lie within the data")
    if ncols < 1:
        raise ValueError("text_rows: a row has columns")
    src = &view[0] if view.shape[0] else NULL
    spans = <Py_ssize_t*>malloc(2 * ncols * sizeof(Py_ssize_t))
    if spans == NULL:
        raise MemoryError()
    try:
        while taken < limit:
            stop = row_packet(src, pos, end)
            if stop < 0:
                break
            p = pos + 4
            whole = True
            for j in range(ncols):
                n = text_value(src, &p, stop)
                if n == -2:
                    whole = False
                    break
                spans[2 * j] = p
                spans[2 * j + 1] = n
                if n > 0:
                    p += n
            if not whole or p != stop:
                break
            row = PyTuple_New(ncols)
            for j in range(ncols):
                if spans[2 * j + 1] < 0:
                    value = None
                else:
                    value = PyBytes_FromStringAndSize(<const char*>src + spans[2 * j],
                                                      spans[2 * j + 1])
                Py_INCREF(value)  # (PyTuple_SET_ITEM takes the reference)
                PyTuple_SET_ITEM(row, j, value)
            out.append(row)
            pos = stop
            taken += 1
        return pos
    finally:
        free(spans)


cdef inline bint digits(const uint8_t* s, Py_ssize_t a, Py_ssize_t b) noexcept nogil:
    """s[a:b] is ASCII digits (and not empty)."""
    cdef Py_ssize_t i
    if a >= b:
        return False
    for i in range(a, b):
        if s[i] < 48 or s[i] > 57:
            return False
    return True


cdef inline bint plain_day(const uint8_t* s) noexcept nogil:
    """pure._plain_day of 'YYYY-MM-DD...' (digits checked)."""
    if s[0] == 48 and s[1] == 48 and s[2] == 48 and s[3] == 48:
        return False
    if (s[5] == 48 and s[6] == 48) or (s[8] == 48 and s[9] == 48):
        return False
    return (s[8] - 48) * 10 + (s[9] - 48) <= 28


cdef inline bint day_text(const uint8_t* s, Py_ssize_t n) noexcept nogil:
    return n >= 10 and digits(s, 0, 4) and s[4] == 45 and digits(s, 5, 7) and \
        s[7] == 45 and digits(s, 8, 10) and plain_day(s)


cdef bint json_text_value(PyObject* text, int step, const uint8_t* s,
                          Py_ssize_t n) except -1:
    """One value's text written as pure._json_text writes it; False: not written (the
    caller drops what this row wrote)."""
    cdef Py_ssize_t i, first
    cdef bint negative
    if step == T_INT:
        negative = n > 0 and s[0] == 45
        first = 1 if negative else 0
        if not digits(s, first, n):
            return False
        while first < n - 1 and s[first] == 48:
            first += 1
        if negative and not (n - first == 1 and s[first] == 48):
            put(text, b"-", 1)
        put(text, <const char*>s + first, n - first)
    elif step == T_TEXT:
        if not utf8_ok(s, n):
            return False
        put_escaped(text, s, n)
    elif step == T_BASE64:
        put_base64(text, s, n, 0)
    elif step == T_DECIMAL:
        first = 1 if n > 0 and s[0] == 45 else 0
        i = first
        while i < n and 48 <= s[i] <= 57:
            i += 1
        if i == first or (i < n and (s[i] != 46 or not digits(s, i + 1, n))):
            return False
        if n - first >= 8 and memcmp(s + first, b"0.000000", 8) == 0:
            return False
        put(text, b'"', 1)
        put(text, <const char*>s, n)
        put(text, b'"', 1)
    elif step == T_DATE:
        if n != 10 or not day_text(s, n):
            return False
        put(text, b'"', 1)
        put(text, <const char*>s, n)
        put(text, b'"', 1)
    else:  # T_DATETIME, T_TIMESTAMP
        if not (n == 19 or (21 <= n <= 26 and s[19] == 46 and digits(s, 20, n))):
            return False
        if not day_text(s, n) or s[10] != 32 or not digits(s, 11, 13) or s[13] != 58 or \
                not digits(s, 14, 16) or s[16] != 58 or not digits(s, 17, 19):
            return False
        put(text, b'"', 1)
        put(text, <const char*>s, 10)
        put(text, b"T", 1)
        put(text, <const char*>s + 11, n - 11)
        if step == T_TIMESTAMP:
            put(text, b'+00:00"', 7)
        else:
            put(text, b'"', 1)
    return True


def json_text_rows(data, Py_ssize_t pos, Py_ssize_t end, tuple plan not None,
                   tuple keys not None, list sink not None, Py_ssize_t row,
                   Py_ssize_t limit):
    cdef const uint8_t[::1] view = data
    cdef const uint8_t* src
    cdef Py_ssize_t ncols = len(plan), taken = 0, stop, p, j, n, saved, total
    cdef int* steps = NULL
    cdef const char** keyp = NULL
    cdef Py_ssize_t* keyn = NULL
    cdef PyObject* text
    cdef bint whole
    cdef int32_t off
    check_pos(pos)
    if end > view.shape[0] or pos > end:
        raise ValueError("json_text_rows: pos and end must lie within the data")
    if not ncols or len(keys) != ncols or any(
            not isinstance(s, int) or not T_INT <= s <= T_TIMESTAMP for s in plan):
        raise ValueError("json_text_rows: a step of TextStep and a key for each column")
    if len(sink) != 3 or row < 0:
        raise ValueError("json_text_rows: a sink of three buffers and its row count")
    for j in range(3):
        if type(sink[j]) is not bytearray:
            raise TypeError("json_text_rows: the sink holds bytearrays")
    text = <PyObject*>sink[2]
    src = &view[0] if view.shape[0] else NULL
    steps = <int*>malloc(ncols * sizeof(int))
    keyp = <const char**>malloc(ncols * sizeof(char*))
    keyn = <Py_ssize_t*>malloc(ncols * sizeof(Py_ssize_t))
    try:
        if steps == NULL or keyp == NULL or keyn == NULL:
            raise MemoryError()
        for j in range(ncols):
            if type(keys[j]) is not bytes:
                raise TypeError("json_text_rows: the keys are bytes")
            steps[j] = plan[j]
            keyp[j] = <const char*>keys[j]
            keyn[j] = len(keys[j])
        while taken < limit:
            stop = row_packet(src, pos, end)
            if stop < 0:
                break
            saved = PyByteArray_GET_SIZE(<object>text)
            p = pos + 4
            whole = True
            for j in range(ncols):
                put(text, keyp[j], keyn[j])
                n = text_value(src, &p, stop)
                if n == -2:
                    whole = False
                    break
                if n == -1:
                    put(text, b"null", 4)
                    continue
                if not json_text_value(text, steps[j], src + p, n):
                    whole = False
                    break
                p += n
            if whole and p == stop:
                put(text, b"}", 1)
            total = PyByteArray_GET_SIZE(<object>text)
            if not whole or p != stop or total > MAX_TEXT:
                PyByteArray_Resize(<object>text, saved)
                break
            off = <int32_t>total
            memcpy(grow(<PyObject*>sink[1], 4), &off, 4)
            set_bit(<PyObject*>sink[0], row + taken, True)
            pos = stop
            taken += 1
        return pos, taken
    finally:
        free(steps)
        free(keyp)
        free(keyn)


# --- relay changes' lines: see pure.py's section ---------------------------------------------

cdef enum:
    L_QUERY = 2
    L_XID = 16
    L_TABLE_MAP = 19
    L_MYSQL_GTID = 33
    L_ANONYMOUS_GTID = 34
    L_GTID = 162
    L_ID_SIZE = 6
    L_MAX_TABLES = 64
    # a rows event's shape: its kind (0 insert, 1 update, 2 delete), then flags
    L_V2 = 4
    L_PLAIN = 8

cdef const char* L_OPS[3]
L_OPS[:] = [b',"op":"insert"', b',"op":"update"', b',"op":"delete"']
cdef Py_ssize_t L_OPS_LEN[3]
L_OPS_LEN[:] = [14, 14, 14]


cdef inline int rows_shape(int typ) noexcept nogil:
    """-1 for an event that is not a rows event, else its kind | L_V2 | L_PLAIN."""
    if typ == 23 or typ == 24 or typ == 25:
        return (typ - 23) | L_PLAIN
    if typ == 30 or typ == 31 or typ == 32:
        return (typ - 30) | L_V2 | L_PLAIN
    if typ == 39:
        return 1 | L_V2
    if 166 <= typ <= 168:  # MariaDB's compressed ones
        return typ - 166
    if 169 <= typ <= 171:
        return (typ - 169) | L_V2
    return -1


cdef inline bint between_transactions(int typ) noexcept nogil:
    return typ == 3 or typ == 4 or typ == 27 or typ == 35 or typ == 41 or typ == 161 \
        or typ == 163


cdef inline Py_ssize_t event_at(const uint8_t* src, Py_ssize_t p, Py_ssize_t end,
                                int crc_len) noexcept nogil:
    """The size of the whole event at p with its checksum right, else -1."""
    cdef Py_ssize_t size
    if end - p < HEADER_LEN:
        return -1
    size = u32(src + p + 9)
    if size < HEADER_LEN + crc_len or size > end - p:
        return -1
    if crc_len and zlib_crc32(0, src + p, <unsigned int>(size - 4)) != u32(src + p + size - 4):
        return -1
    return size


cdef inline uint64_t table_id_at(const uint8_t* src, Py_ssize_t p) noexcept nogil:
    cdef uint64_t tid = 0
    cdef int b
    for b in range(L_ID_SIZE):
        tid |= (<uint64_t>src[p + HEADER_LEN + b]) << (8 * b)
    return tid


cdef Py_ssize_t query_start(const uint8_t* src, Py_ssize_t p, Py_ssize_t size,
                            int crc_len) noexcept nogil:
    """Where a QUERY event's statement starts (-1: it runs past the event)."""
    cdef Py_ssize_t body = p + HEADER_LEN, start
    if size < HEADER_LEN + QUERY_POST_HEADER + 1 + crc_len:
        return -1
    start = body + QUERY_POST_HEADER + (src[body + 11] | (<Py_ssize_t>src[body + 12] << 8)) \
        + src[body + 8] + 1
    return start if start <= p + size - crc_len else -1


cdef inline bint query_is_commit(const uint8_t* src, Py_ssize_t p, Py_ssize_t size,
                                 int crc_len) noexcept nogil:
    cdef Py_ssize_t start = query_start(src, p, size, crc_len)
    return start >= 0 and p + size - crc_len - start == 6 and \
        memcmp(src + start, b"COMMIT", 6) == 0


cdef object line_head(const uint8_t* src, Py_ssize_t p, Py_ssize_t size, int typ,
                      int crc_len):
    """A transaction's '{"gtid":..,"server_id":..,"timestamp":..' (None: not taken)."""
    cdef char buf[160]
    cdef Py_ssize_t n = 0, body = p + HEADER_LEN, body_end = p + size - crc_len, i
    cdef uint64_t seq, gno, commit
    cdef uint32_t domain, server_id = u32(src + p + 5)
    cdef int64_t us, y, mo, d, day_us
    memcpy(buf, b'{"gtid":', 8)
    n = 8
    us = <int64_t>u32(src + p) * 1000000
    if typ == L_GTID:
        if body_end - body < 13 or src[body + 12] & FL_STANDALONE:
            return None
        memcpy(&seq, src + body, 8)
        domain = u32(src + body + 8)
        buf[n] = 34
        n += 1
        n += put_uint(buf + n, domain)
        buf[n] = 45
        n += 1
        n += put_uint(buf + n, server_id)
        buf[n] = 45
        n += 1
        n += put_uint(buf + n, seq)
        buf[n] = 34
        n += 1
    else:
        if body_end - body < 25:
            return None
        if typ == L_MYSQL_GTID:
            buf[n] = 34
            n += 1
            for i in range(16):
                if i == 4 or i == 6 or i == 8 or i == 10:
                    buf[n] = 45
                    n += 1
                buf[n] = HEX[src[body + 1 + i] >> 4]
                buf[n + 1] = HEX[src[body + 1 + i] & 15]
                n += 2
            buf[n] = 58
            n += 1
            memcpy(&gno, src + body + 17, 8)
            n += put_uint(buf + n, gno)
            buf[n] = 34
            n += 1
        else:
            memcpy(buf + n, b"null", 4)
            n += 4
        if body_end - (body + 42) >= 7:
            commit = 0
            for i in range(7):
                commit |= (<uint64_t>src[body + 42 + i]) << (8 * i)
            commit &= (<uint64_t>1 << 55) - 1
            if commit:
                us = <int64_t>commit
    civil_from_days(us // 86400000000, &y, &mo, &d)
    if y > 9999:
        return None
    memcpy(buf + n, b',"server_id":', 13)
    n += 13
    n += put_uint(buf + n, server_id)
    memcpy(buf + n, b',"timestamp":"', 14)
    n += 14
    day_us = us % 86400000000
    n += put_datetime(buf + n, y, mo, d, day_us // 3600000000, (day_us // 60000000) % 60,
                      (day_us // 1000000) % 60, day_us % 1000000,
                      6 if day_us % 1000000 else 0)
    memcpy(buf + n, b'+00:00"', 7)
    n += 7
    return PyBytes_FromStringAndSize(buf, n)


cdef class _Steps:
    """A checked plan's ints and charmaps as C arrays (the plan's tuples kept alive)."""

    cdef int* steps
    cdef const uint8_t** maps
    cdef tuple charmaps

    def __dealloc__(self):
        free(self.steps)
        free(self.maps)

    cdef setup(self, tuple plan, tuple charmaps, tuple members=None, object calls=(),
               bint documents=False):
        cdef Py_ssize_t i
        check_plan(plan, charmaps, 65, members, calls, documents)
        self.charmaps = charmaps
        self.steps = <int*>malloc(len(plan) * sizeof(int))
        self.maps = <const uint8_t**>malloc((len(charmaps) + 1) * sizeof(uint8_t*))
        if self.steps == NULL or self.maps == NULL:
            raise MemoryError()
        for i in range(len(plan)):
            self.steps[i] = plan[i]
        for i in range(len(charmaps)):
            self.maps[i] = <const uint8_t*><const char*>charmaps[i]


cdef class _LineTable:
    """An entry's plan as C arrays, kept while its entry lives."""

    cdef tuple entry
    cdef _Steps plan
    cdef _Keys keys
    cdef Py_ssize_t ncols
    cdef bint has_plan

    cdef setup(self, tuple entry):
        cdef tuple plan, charmaps
        cdef Py_ssize_t i
        if len(entry) < 7 or type(entry[6]) is not bytes or \
                (entry[5] is not None and type(entry[5]) is not bytes):
            raise ValueError("change_lines: an entry of (table id, columns, plan, charmaps, "
                             "keys, names, body, ...)")
        self.entry = entry
        self.ncols = entry[1]
        self.has_plan = entry[2] is not None
        if not self.has_plan:
            return
        plan, charmaps = entry[2], entry[3]
        self.plan = _Steps()
        self.plan.setup(plan, charmaps, None, (), True)
        self.keys = _Keys()
        self.keys.setup(entry[4], len(plan) // 4, "change_lines")
        if len(plan) // 4 != self.ncols:
            self.has_plan = False


cdef dict _LINE_TABLES = {}


cdef _LineTable line_table(tuple entry):
    cdef _LineTable known = _LINE_TABLES.get(id(entry))
    if known is not None and known.entry is entry:
        return known
    if len(_LINE_TABLES) >= 1024:
        _LINE_TABLES.clear()
    known = _LineTable()
    known.setup(entry)
    _LINE_TABLES[id(entry)] = known
    return known


cdef check_entry(object entry):
    if type(entry) is not tuple or len(entry) < 7 or type(entry[6]) is not bytes or \
            (entry[5] is not None and type(entry[5]) is not bytes):
        raise ValueError("change_lines: an entry of (table id, columns, plan, charmaps, "
                         "keys, names, body, ...)")


cdef bint resumable(const uint8_t* src, Py_ssize_t p, Py_ssize_t tx_end, dict tables):
    """Whether the events from p to tx_end are whole and their rows events' tables known
    (what the first call checked, held again: the state is the caller's)."""
    cdef Py_ssize_t size
    while p < tx_end:
        if tx_end - p < HEADER_LEN:
            return False
        size = u32(src + p + 9)
        if size < HEADER_LEN or size > tx_end - p:
            return False
        if rows_shape(src[p + 4]) >= 0 and (size < HEADER_LEN + L_ID_SIZE or
                                            table_id_at(src, p) not in tables):
            return False
        p += size
    return True


cdef Py_ssize_t takes(const uint8_t* src, Py_ssize_t pos, Py_ssize_t end, int crc_len,
                      int typ, Py_ssize_t size, dict tables, object table_map) except -2:
    """The end of the transaction opened at pos when the kernel takes it whole, else -1."""
    cdef Py_ssize_t p = pos + size, n, nbody, body_len
    cdef uint64_t mapped[L_MAX_TABLES]
    cdef int nmapped = 0, i
    cdef bint found, seen
    cdef uint64_t tid
    cdef object entry
    cdef bytes known_body
    if typ == L_MYSQL_GTID or typ == L_ANONYMOUS_GTID:
        n = event_at(src, p, end, crc_len)
        if n < 0 or src[p + 4] != L_QUERY or not is_begin(src, p, n, crc_len):
            return -1
        p += n
    while True:
        n = event_at(src, p, end, crc_len)
        if n < 0:
            return -1
        typ = src[p + 4]
        if typ == L_XID:
            return p + n
        if typ == L_QUERY:
            return p + n if query_is_commit(src, p, n, crc_len) else -1
        if typ == L_TABLE_MAP:
            if n < HEADER_LEN + L_ID_SIZE + crc_len:
                return -1
            tid = table_id_at(src, p)
            body_len = n - HEADER_LEN - crc_len
            entry = tables.get(tid)
            found = False
            if entry is not None:
                known_body = (<tuple>entry)[6]
                found = len(known_body) == body_len and \
                    memcmp(<const char*>known_body, src + p + HEADER_LEN, body_len) == 0
            seen = False
            for i in range(nmapped):
                if mapped[i] == tid:
                    seen = True
                    break
            if seen:  # mapped again: the same table, or the general path's
                if not found:
                    return -1
            else:
                if nmapped == L_MAX_TABLES:
                    return -1
                if not found:
                    entry = table_map(p, n)
                    if entry is None:
                        return -1
                    check_entry(entry)
                    if (<tuple>entry)[0] != tid:
                        return -1
                    tables[tid] = entry
                mapped[nmapped] = tid
                nmapped += 1
        elif rows_shape(typ) >= 0:
            if n < HEADER_LEN + L_ID_SIZE + crc_len:
                return -1
            tid = table_id_at(src, p)
            found = False
            for i in range(nmapped):
                if mapped[i] == tid:
                    found = True
                    break
            if not found:
                return -1
        elif typ != 29 and typ != 160:  # ROWS_QUERY, ANNOTATE_ROWS
            return -1
        p += n


cdef Py_ssize_t rows_header(const uint8_t* src, Py_ssize_t p, Py_ssize_t size, int crc_len,
                            int shape, Py_ssize_t* ncols_out) noexcept nogil:
    """Where a rows event's rows start when every image holds all its columns (their
    count in ncols_out), else -1."""
    cdef Py_ssize_t end = p + size - crc_len, q = p + HEADER_LEN + L_ID_SIZE + 2, extra
    cdef Py_ssize_t ncols, nb, i, k, width = 0
    cdef int first
    if q > end:
        return -1
    if shape & L_V2:
        if end - q < 2:
            return -1
        extra = src[q] | (<Py_ssize_t>src[q + 1] << 8)
        if extra < 2 or extra > end - q:
            return -1
        q += extra
    if q >= end:
        return -1
    first = src[q]
    if first == 0xFC:
        width = 2
    elif first == 0xFD:
        width = 3
    elif first == 0xFE:
        width = 8
    elif first == 0xFB or first == 0xFF:
        return -1
    if end - q < 1 + width:
        return -1
    if width:
        if width == 8 and src[q + 8] != 0:
            return -1
        ncols = 0
        for i in range(width):
            ncols |= (<Py_ssize_t>src[q + 1 + i]) << (8 * i)
    else:
        ncols = first
    q += 1 + width
    if ncols <= 0 or ncols > 8 * (end - q):
        return -1
    nb = (ncols + 7) >> 3
    for k in range(2 if (shape & 3) == 1 else 1):
        if end - q < nb:
            return -1
        for i in range(ncols):
            if not (src[q + (i >> 3)] >> (i & 7)) & 1:
                return -1
        q += nb
    ncols_out[0] = ncols
    return q


cdef inline void put_bytes(PyObject* out, bytes b) except *:
    put(out, PyBytes_AS_STRING(b), len(b))


cdef inline void line_start(PyObject* o, bytes head, bytes at, Py_ssize_t p, Py_ssize_t row,
                            int kind, bytes names) except *:
    """A line up to its before-image: the transaction's fields, file, pos, row, op, names."""
    cdef char num[24]
    put_bytes(o, head)
    put_bytes(o, at)
    put(o, num, put_uint(num, p))
    put(o, b',"row":', 7)
    put(o, num, put_uint(num, row))
    put(o, L_OPS[kind], L_OPS_LEN[kind])
    put_bytes(o, names)


cdef void event_lines(const uint8_t* src, Py_ssize_t p, Py_ssize_t size, int crc_len,
                      int shape, bytes head, tuple entry, object images, bytearray out,
                      bytes at) except *:
    cdef PyObject* o = <PyObject*>out
    cdef _LineTable lt
    cdef Py_ssize_t mark = PyByteArray_GET_SIZE(out), q, end = p + size - crc_len, ncols = 0
    cdef Py_ssize_t row = 0, width
    cdef int kind = shape & 3, side
    cdef bytes names = entry[5]
    cdef bint done = False
    cdef object before, after
    if shape & L_PLAIN and entry[2] is not None:
        lt = line_table(entry)
        q = rows_header(src, p, size, crc_len, shape, &ncols)
        if lt.has_plan and q >= 0 and ncols == lt.ncols:
            done = True
            while done and q < end:
                line_start(o, head, at, p, row, kind, names)
                for side in range(2):  # before, after: an insert has no before, a delete
                    if side:           # no after
                        put(o, b',"after":', 9)
                    if (side == 0 and kind == 0) or (side == 1 and kind == 2):
                        put(o, b"null", 4)
                        continue
                    q = json_row(o, src, q, end, lt.plan.steps, lt.plan.maps, lt.ncols,
                                 lt.keys.keyp, lt.keys.keyn)
                    if q < 0:
                        done = False
                        break
                put(o, b"}\n", 2)
                row += 1
            if not done:
                PyByteArray_Resize(out, mark)
    if done:
        return
    for row, (before, after) in enumerate(images(p, size, entry)):
        line_start(o, head, at, p, row, kind, names)
        if before is None:
            put(o, b"null", 4)
        else:
            put_bytes(o, before)
        put(o, b',"after":', 9)
        if after is None:
            put(o, b"null", 4)
        else:
            put_bytes(o, after)
        put(o, b"}\n", 2)


cdef Py_ssize_t write_lines(const uint8_t* src, Py_ssize_t p, Py_ssize_t tx_end, int crc_len,
                            bytes head, dict tables, object images, bytearray out,
                            bytes at, Py_ssize_t limit, list state) except -2:
    cdef Py_ssize_t size
    cdef int shape
    cdef tuple entry
    state[0] = 0
    while p < tx_end:
        size = u32(src + p + 9)
        shape = rows_shape(src[p + 4])
        if shape >= 0:
            entry = tables[table_id_at(src, p)]
            if entry[5] is not None:
                event_lines(src, p, size, crc_len, shape, head, entry, images, out, at)
        p += size
        if PyByteArray_GET_SIZE(out) >= limit and p < tx_end:
            state[0] = p
            state[1] = tx_end
            state[2] = head
            return p
    return p


def change_lines(data, Py_ssize_t pos, Py_ssize_t end, int crc_len, list state not None,
                 table_map, images, out, at, Py_ssize_t limit):
    cdef const uint8_t[::1] view = data
    cdef const uint8_t* src
    cdef Py_ssize_t size, tx_end
    cdef int typ
    cdef dict tables
    cdef object head
    check_pos(pos)
    if end > view.shape[0] or pos > end:
        raise ValueError("change_lines: pos and end must lie within the data")
    if crc_len not in (0, 4) or len(state) != 5 or type(state[3]) is not dict:
        raise ValueError("change_lines: a checksum length of 0 or 4 and a state of five")
    if type(out) is not bytearray or type(at) is not bytes:
        raise TypeError("change_lines: out is a bytearray, at bytes")
    tables = state[3]
    src = &view[0] if view.shape[0] else NULL
    if state[0]:
        if state[0] != pos or not pos < state[1] <= end or \
                not resumable(src, pos, state[1], tables):
            raise ValueError("change_lines: resume where the last call stopped")
        state[4] = 0
        pos = write_lines(src, pos, state[1], crc_len, state[2], tables, images, out, at,
                          limit, state)
        if state[0]:
            return pos
    while pos < end:
        size = event_at(src, pos, end, crc_len)
        if size < 0:
            return pos
        typ = src[pos + 4]
        if between_transactions(typ):
            pos += size
            continue
        if typ != L_GTID and typ != L_MYSQL_GTID and typ != L_ANONYMOUS_GTID:
            return pos
        head = line_head(src, pos, size, typ, crc_len)
        if head is None:
            return pos
        state[4] = PyByteArray_GET_SIZE(out)
        tx_end = takes(src, pos, end, crc_len, typ, size, tables, table_map)
        if tx_end < 0:
            return pos
        pos = write_lines(src, pos + size, tx_end, crc_len, head, tables, images, out, at,
                          limit, state)
        if state[0]:
            return pos
    return pos


# --- row images as Python values: see pure.py's section --------------------------------------

from cpython.datetime cimport date_new, datetime_new, import_datetime, timedelta_new
from cpython.unicode cimport PyUnicode_DecodeASCII, PyUnicode_DecodeUTF8
from cpython.float cimport PyFloat_FromDouble
from decimal import Decimal as _Decimal
from datetime import timezone as _timezone

import_datetime()
cdef object _UTC = _timezone.utc


cdef object time2_value(const uint8_t* s, int fsp):
    """TIME(fsp) in MySQL 5.6's packed form, as the row codec's time2: negative values
    with a fraction borrow one from the integer part, as the server writes them."""
    cdef int64_t total = time2_us(s, fsp), days
    days = total // 86400000000  # (C's division: the floor taken below, as timedelta keeps)
    total -= days * 86400000000
    if total < 0:
        days -= 1
        total += 86400000000
    return timedelta_new(<int>days, <int>(total // 1000000), <int>(total % 1000000))


cdef void put_time2(PyObject* text, const uint8_t* s, int fsp) except *:
    """The server's text of a TIME(fsp), quoted: jsonvalue.time_text with fsp digits."""
    cdef int64_t total = time2_us(s, fsp), secs, us
    cdef char out[48]
    cdef char digits[8]
    cdef Py_ssize_t n = 1, k
    out[0] = 34
    if total < 0:
        out[n] = 45
        n += 1
        total = -total
    secs, us = total // 1000000, total % 1000000
    n += put_uint(out + n, <uint64_t>(secs // 3600)) if secs // 3600 >= 10 else \
        put_padded(out + n, secs // 3600, 2)
    out[n] = 58
    put_padded(out + n + 1, (secs % 3600) // 60, 2)
    out[n + 3] = 58
    put_padded(out + n + 4, secs % 60, 2)
    n += 6
    if fsp:
        out[n] = 46
        put_padded(digits, us, 6)
        for k in range(fsp):
            out[n + 1 + k] = digits[k]
        n += 1 + fsp
    out[n] = 34
    put(text, out, n + 1)


cdef int64_t time2_us(const uint8_t* s, int fsp) except? -1:
    """A TIME(fsp)'s signed microseconds (see time2_value)."""
    cdef int64_t packed, intpart, frac, size, hms, total
    if fsp >= 5:
        packed = <int64_t>(((<uint64_t>s[0]) << 40) | ((<uint64_t>s[1]) << 32) |
                           ((<uint64_t>s[2]) << 24) | ((<uint64_t>s[3]) << 16) |
                           ((<uint64_t>s[4]) << 8) | s[5]) - 0x800000000000
    else:
        intpart = <int64_t>((s[0] << 16) | (s[1] << 8) | s[2]) - 0x800000
        frac = 0
        if fsp >= 3:
            frac = (s[3] << 8) | s[4]
            if intpart < 0 and frac:
                intpart += 1
                frac -= 0x10000
            frac *= 100
        elif fsp >= 1:
            frac = s[3]
            if intpart < 0 and frac:
                intpart += 1
                frac -= 0x100
            frac *= 10000
        packed = intpart * 16777216 + frac  # (intpart << 24: negative, so multiplied)
    size = -packed if packed < 0 else packed
    hms = size >> 24
    total = ((((hms >> 12) & 0x3FF) * 3600 + ((hms >> 6) & 63) * 60 + (hms & 63))
             * 1000000 + (size & 0xFFFFFF))
    return -total if packed < 0 else total


cdef object python_value(const uint8_t* src, Py_ssize_t* at, Py_ssize_t end, int step, int a,
                         int b, int c, const uint8_t** maps, tuple members, tuple calls):
    """One non-NULL value as the row codec decodes it (at: advanced past it), or None
    for what the kernel leaves to the codec."""
    cdef Py_ssize_t p = at[0], tlen, size, width, k
    cdef int64_t f[7]
    cdef int64_t v
    cdef uint64_t bits
    cdef float f32
    cdef double f64
    cdef bytes raw
    cdef char dtext[DECIMAL_TEXT]
    cdef tuple names
    cdef object value
    if step == S_TEXT:
        tlen = text_at(src, p, end, a, b)
        if tlen < 0:
            return None
        p += a
        if b == 0:
            if c > tlen:
                raw = PyBytes_FromStringAndSize(NULL, c)
                memcpy(PyBytes_AS_STRING(raw), src + p, tlen)
                memset(PyBytes_AS_STRING(raw) + tlen, 0, c - tlen)
                value = raw
            else:
                value = PyBytes_FromStringAndSize(<const char*>src + p, tlen)
        elif b == 1:
            value = PyUnicode_DecodeUTF8(<const char*>src + p, tlen, NULL)
        else:
            raw = PyBytes_FromStringAndSize(NULL, 3 * tlen)
            width = recode(maps[c], src + p, tlen, PyBytes_AS_STRING(raw))
            value = PyUnicode_DecodeUTF8(PyBytes_AS_STRING(raw), width, NULL)
        at[0] = p + tlen
        return value
    if step == S_CALL:   # its bytes, to calls[c] (the codec raises what the call raises)
        tlen = text_at(src, p, end, a, 0)
        if tlen < 0:
            return None
        p += a
        try:
            value = calls[c](PyBytes_FromStringAndSize(<const char*>src + p, tlen))
        except Exception:
            return None
        at[0] = p + tlen
        return value
    size = stored_size(step, a, c)
    if size > end - p:
        return None
    if step == S_INT:
        bits = int_bits(src + p, a, b)
        value = <int64_t>bits if b else bits
    elif step == S_YEAR:
        value = 1900 + src[p] if src[p] else 0
    elif step == S_FLOAT or step == S_DOUBLE:
        if not float_ok(src + p, step):
            return None
        if step == S_FLOAT:
            memcpy(&f32, src + p, 4)
            f64 = f32
        else:
            memcpy(&f64, src + p, 8)
        value = PyFloat_FromDouble(f64)
    elif step == S_DECIMAL:
        if c > MAX_DECIMAL_BYTES:
            return None
        tlen = decimal_text(dtext, src + p, a, b, c)
        if tlen < 0:
            return None
        value = _Decimal(PyUnicode_DecodeASCII(dtext, tlen, NULL))
    elif step == S_DATE:
        if not date_parts(src + p, f):
            return None
        value = date_new(f[0], f[1], f[2])
    elif step == S_DATETIME2:
        if not datetime2_parts(src + p, a, f):
            return None
        value = datetime_new(f[0], f[1], f[2], f[3], f[4], f[5], f[6], None)
    elif step == S_TIME2:
        value = time2_value(src + p, a)
    elif step == S_ENUM:
        v = src[p] if a == 1 else src[p] | (src[p + 1] << 8)
        if not b:
            value = v
        else:
            names = <tuple>members[c]
            if v > len(names):
                return None  # (the codec's IndexError: a malformed event)
            value = names[v - 1] if v else ""
    elif step == S_BIT:   # big-endian
        bits = 0
        for k in range(a):
            bits = (bits << 8) | src[p + k]
        value = bits
    elif step == S_SET:   # little-endian, a bit per name
        bits = 0
        for k in range(a):
            bits |= (<uint64_t>src[p + k]) << (8 * k)
        if not b:
            value = bits
        else:
            names = <tuple>members[c]
            if len(names) < 64 and bits >> len(names):
                return None  # (the codec's MalformedEvent: bits past the names)
            value = frozenset([names[k] for k in range(min(len(names), 64))
                               if (bits >> k) & 1])   # (a shift past 63 is C's UB)
    else:  # S_TIMESTAMP2: UTC
        if not timestamp2_us(src + p, a, &v):
            return None
        civil_from_days(v // 86400000000, &f[0], &f[1], &f[2])
        v = v % 86400000000
        value = datetime_new(f[0], f[1], f[2], v // 3600000000, (v // 60000000) % 60,
                             (v // 1000000) % 60, v % 1000000, _UTC)
    at[0] = p + size
    return value


from cpython.object cimport PyTypeObject


cdef extern from "Python.h":
    # a tuple subclass's instance, its items NULL (PyTuple_SET_ITEM fills them): what
    # tuple.__new__(image, values) makes, without the tuple it copies from
    object PyType_GenericAlloc(PyTypeObject* tp, Py_ssize_t nitems)
    int PY_VERSION_HEX

_HEAPTYPE = 1 << 9  # Py_TPFLAGS_HEAPTYPE
# tuple.__new__ as Python calls it, with its checks (Cython would call tp_new directly)
_tuple_new = getattr(tuple, "__new__")


cdef bint allocated_as_tuple(type image):
    """Whether an instance of `image` is a tuple's memory and nothing else the type needs
    filled: a class made in Python (a table's RowImage) over tuple that makes its
    instances with tuple.__new__, before Python 3.14 (whose tuples cache their hash in a
    field the allocation leaves 0). Another subclass (time.struct_time: its own __new__
    and more fields than items) goes through tuple.__new__, which refuses it, as in the
    pure twin."""
    if PY_VERSION_HEX >= 0x030E0000 or image.__new__ is not _tuple_new:
        return False
    for base in image.__mro__:
        if not (base.__flags__ & _HEAPTYPE):
            return base is tuple
    return False


def row_values(data, Py_ssize_t pos, Py_ssize_t end, tuple plan not None,
               tuple charmaps not None, tuple members not None, int images,
               list out not None, object image=tuple, object calls=()):
    cdef const uint8_t[::1] view = data
    cdef const uint8_t* src
    cdef _Steps at = _Steps()
    cdef const uint8_t** maps
    cdef int* steps
    cdef Py_ssize_t ncols, nulls_len, j, k, p, mark = len(out), done = 0
    cdef const uint8_t* nulls
    cdef object values  # a tuple or an instance of `image`
    cdef bint exact, direct
    cdef object value
    at.setup(plan, charmaps, members, calls)
    steps, maps = at.steps, at.maps
    if end > view.shape[0] or pos < 0 or pos > end:
        raise ValueError("row_values: pos and end must lie within the data")
    if images != 1 and images != 2:
        raise ValueError("row_values: one or two images a row")
    if not (isinstance(image, type) and issubclass(image, tuple)):
        raise ValueError("row_values: image is a tuple or a subclass of tuple")
    exact = image is tuple
    direct = not exact and allocated_as_tuple(image)
    ncols = len(plan) // 4
    nulls_len = (ncols + 7) >> 3
    src = &view[0] if view.shape[0] else NULL
    while pos < end:
        for k in range(images):
            if nulls_len > end - pos:
                del out[mark:]
                return -1
            nulls = src + pos
            p = pos + nulls_len
            values = PyType_GenericAlloc(<PyTypeObject*>image, ncols) if direct else \
                PyTuple_New(ncols)
            for j in range(ncols):
                if (nulls[j >> 3] >> (j & 7)) & 1:
                    value = None
                else:
                    value = python_value(src, &p, end, steps[4 * j], steps[4 * j + 1],
                                         steps[4 * j + 2], steps[4 * j + 3], maps, members,
                                         <tuple>calls)
                    if value is None:
                        del out[mark:]
                        return -1
                Py_INCREF(value)
                PyTuple_SET_ITEM(values, j, value)
            if not (exact or direct):
                values = _tuple_new(image, values)  # (what the pure twin does)
            out.append(values)
            pos = p
        done += 1
    return done


# --- MySQL's binary JSON documents ----------------------------------------------------------
# A document the fast path below does not take whole (bad bytes, deeper than any server
# writes) is decoded by the pure twin, which gives the value or the error the reference
# gives: the two cannot differ on what is bad.

from cpython.long cimport PyLong_FromLongLong, PyLong_FromUnsignedLongLong
from libc.stdint cimport int16_t
from relay.kernels.pure import json_document as _pure_json_document

cdef enum:
    J_SMALL_OBJECT = 0
    J_LARGE_OBJECT = 1
    J_SMALL_ARRAY = 2
    J_LARGE_ARRAY = 3
    J_LITERAL = 4
    J_INT16 = 5
    J_UINT16 = 6
    J_INT32 = 7
    J_UINT32 = 8
    J_INT64 = 9
    J_UINT64 = 10
    J_DOUBLE = 11
    J_STRING = 12
    J_OPAQUE = 15
    J_NEWDECIMAL = 246  # an opaque scalar's field type
    J_MAX_DEPTH = 100   # MySQL's own limit (JSON_DOCUMENT_MAX_DEPTH)


class _JsonAside(Exception):
    """What the fast path leaves to the pure twin."""


cdef inline uint64_t j_uint(const uint8_t* s, int size) noexcept nogil:
    cdef uint64_t v = 0
    cdef int k
    for k in range(size):
        v |= (<uint64_t>s[k]) << (8 * k)
    return v


cdef inline Py_ssize_t j_varlen(const uint8_t* s, Py_ssize_t* pos, Py_ssize_t end) noexcept nogil:
    """The variable-length size at pos (pos: moved past it), or -1."""
    cdef Py_ssize_t n = 0, p = pos[0]
    cdef int k
    for k in range(5):
        if p + k >= end:
            return -1
        n |= (<Py_ssize_t>(s[p + k] & 0x7F)) << (7 * k)
        if not s[p + k] & 0x80:
            pos[0] = p + k + 1
            return n
    return -1


cdef object j_value(const uint8_t* s, int typ, Py_ssize_t pos, Py_ssize_t end, int depth,
                    Py_ssize_t* left, object uint, object opaque, object decimal):
    cdef Py_ssize_t n, p, tlen
    cdef uint64_t u
    cdef double d
    cdef int ftype, precision, scale, intg
    cdef char dtext[DECIMAL_TEXT]
    if typ <= J_LARGE_ARRAY:
        return j_container(s, typ, pos, end, depth + 1, left, uint, opaque, decimal)
    if typ == J_LITERAL:
        if pos >= end or s[pos] > 2:
            raise _JsonAside
        return (None, True, False)[s[pos]]
    if typ == J_INT16 or typ == J_UINT16:
        if end - pos < 2:
            raise _JsonAside
        u = j_uint(s + pos, 2)
        return uint(PyLong_FromUnsignedLongLong(u)) if typ == J_UINT16 else <int16_t>u
    if typ == J_INT32 or typ == J_UINT32:
        if end - pos < 4:
            raise _JsonAside
        u = j_uint(s + pos, 4)
        return uint(PyLong_FromUnsignedLongLong(u)) if typ == J_UINT32 else <int32_t>u
    if typ == J_INT64 or typ == J_UINT64:
        if end - pos < 8:
            raise _JsonAside
        u = j_uint(s + pos, 8)
        return uint(PyLong_FromUnsignedLongLong(u)) if typ == J_UINT64 else \
            PyLong_FromLongLong(<int64_t>u)
    if typ == J_DOUBLE:
        if end - pos < 8:
            raise _JsonAside
        memcpy(&d, s + pos, 8)
        return PyFloat_FromDouble(d)
    if typ == J_STRING:
        p = pos
        n = j_varlen(s, &p, end)
        if n < 0 or n > end - p:
            raise _JsonAside
        left[0] -= n   # (the bytes of strings, keys and opaques count too: none shared)
        if left[0] < 0:
            raise _JsonAside
        return PyUnicode_DecodeUTF8(<const char*>s + p, n, NULL)
    if typ == J_OPAQUE:
        if pos >= end:
            raise _JsonAside
        ftype = s[pos]
        p = pos + 1
        n = j_varlen(s, &p, end)
        if n < 0 or n > end - p:
            raise _JsonAside
        left[0] -= n
        if left[0] < 0:
            raise _JsonAside
        if ftype == J_NEWDECIMAL and n >= 2:   # (precision, scale, binary DECIMAL)
            precision, scale = s[p], s[p + 1]
            intg = precision - scale
            if 0 < precision <= 65 and scale <= precision and n - 2 == (
                    (intg // 9) * 4 + DIG2BYTES[intg % 9] + (scale // 9) * 4
                    + DIG2BYTES[scale % 9]):
                tlen = decimal_text(dtext, s + p + 2, precision, scale, n - 2)
                if tlen >= 0:
                    return decimal(PyUnicode_DecodeASCII(dtext, tlen, NULL), precision)
        return opaque(ftype, PyBytes_FromStringAndSize(<const char*>s + p, n))
    raise _JsonAside


cdef object j_container(const uint8_t* s, int typ, Py_ssize_t base, Py_ssize_t end,
                        int depth, Py_ssize_t* left, object uint, object opaque,
                        object decimal):
    cdef bint large = typ == J_LARGE_OBJECT or typ == J_LARGE_ARRAY
    cdef bint is_object = typ == J_SMALL_OBJECT or typ == J_LARGE_OBJECT
    cdef int osz = 4 if large else 2
    cdef Py_ssize_t count, size, obj_end, pos, i, koff, klen, voff
    cdef int vtype
    cdef list keys = None, items = None
    cdef dict result = None
    cdef object value
    if depth > J_MAX_DEPTH or end - base < 2 * osz:
        raise _JsonAside
    count = <Py_ssize_t>j_uint(s + base, osz)
    size = <Py_ssize_t>j_uint(s + base + osz, osz)
    if size > end - base:
        raise _JsonAside
    left[0] -= count   # (values never share bytes: no more values than bytes)
    if left[0] < 0:
        raise _JsonAside
    obj_end = base + size
    pos = base + 2 * osz
    # every entry within the container (the pure twin reads past it: an error there too)
    if count * ((osz + 2 if is_object else 0) + 1 + osz) > obj_end - pos:
        raise _JsonAside
    if is_object:
        keys = [None] * count
        for i in range(count):
            koff = <Py_ssize_t>j_uint(s + pos, osz)
            klen = <Py_ssize_t>j_uint(s + pos + osz, 2)
            if koff + klen > size:
                raise _JsonAside
            left[0] -= klen
            if left[0] < 0:
                raise _JsonAside
            keys[i] = PyUnicode_DecodeUTF8(<const char*>s + base + koff, klen, NULL)
            pos += osz + 2
        result = {}
    else:
        items = []
    for i in range(count):
        vtype = s[pos]
        if vtype == J_LITERAL or vtype == J_INT16 or vtype == J_UINT16 or \
                (large and (vtype == J_INT32 or vtype == J_UINT32)):  # inlined
            value = j_value(s, vtype, pos + 1, obj_end, depth, left, uint, opaque, decimal)
        else:
            voff = <Py_ssize_t>j_uint(s + pos + 1, osz)
            if voff >= size:
                raise _JsonAside
            value = j_value(s, vtype, base + voff, obj_end, depth, left, uint, opaque,
                            decimal)
        if is_object:
            result[keys[i]] = value
        else:
            items.append(value)
        pos += 1 + osz
    return result if is_object else items


def json_document(data, object uint, object opaque, object decimal):
    cdef const uint8_t[::1] view = data
    cdef Py_ssize_t left = view.shape[0]
    if view.shape[0] == 0:
        return _pure_json_document(data, uint, opaque, decimal)  # (its error: no type byte)
    try:
        return j_value(&view[0], view[0], 1, view.shape[0], 0, &left, uint, opaque, decimal)
    except Exception:
        return _pure_json_document(data, uint, opaque, decimal)


# --- a binary JSON document as its JSON text (json_images and change_lines: S_JSON) ----------

from relay.kernels.pure import document_text as _pure_document_text


cdef int put_document(PyObject* text, const uint8_t* s, Py_ssize_t n) except -2:
    """The JSON text of the document s[:n] appended to `text` (pure.document_text's);
    -1 for what that does not write. A document the fast path does not take whole goes to
    the pure twin, so the two cannot differ."""
    cdef Py_ssize_t left = n, mark = PyByteArray_GET_SIZE(<object>text)
    cdef int done
    cdef str made
    cdef bytes encoded
    if n == 0:
        put(text, b'""', 2)
        return 0
    done = jt_value(text, s, s[0], 1, n, 0, &left)
    if done == 0:
        return 0
    PyByteArray_Resize(<object>text, mark)
    made = _pure_document_text(PyBytes_FromStringAndSize(<const char*>s, n))
    if made is None:
        return -1
    encoded = made.encode("utf-8")
    put(text, PyBytes_AS_STRING(encoded), len(encoded))
    return 0


cdef int jt_value(PyObject* text, const uint8_t* s, int typ, Py_ssize_t pos, Py_ssize_t end,
                  int depth, Py_ssize_t* left) except -2:
    """One value of a document written as JSON text: 0, or -1 for what the fast path
    leaves (`text` then holds part of it: the caller cuts it)."""
    cdef Py_ssize_t n, p
    cdef uint64_t u
    cdef int64_t v
    cdef double d
    cdef char num[24]
    cdef int precision, scale, intg
    if typ <= J_LARGE_ARRAY:
        return jt_container(text, s, typ, pos, end, depth + 1, left)
    if typ == J_LITERAL:
        if pos >= end or s[pos] > 2:
            return -1
        if s[pos] == 0:
            put(text, b"null", 4)
        elif s[pos] == 1:
            put(text, b"true", 4)
        else:
            put(text, b"false", 5)
        return 0
    if J_INT16 <= typ <= J_UINT64:
        n = 2 if typ <= J_UINT16 else 4 if typ <= J_UINT32 else 8
        if end - pos < n:
            return -1
        u = j_uint(s + pos, <int>n)
        if typ == J_INT16:
            v = <int16_t>u
        elif typ == J_INT32:
            v = <int32_t>u
        elif typ == J_INT64:
            v = <int64_t>u
        else:
            put(text, num, put_uint(num, u))
            return 0
        if v < 0:
            num[0] = 45
            put(text, num, 1 + put_uint(num + 1, <uint64_t>(-(v + 1)) + 1))
        else:
            put(text, num, put_uint(num, <uint64_t>v))
        return 0
    if typ == J_DOUBLE:
        if end - pos < 8 or not float_ok(s + pos, S_DOUBLE):
            return -1
        memcpy(&d, s + pos, 8)
        put_float(text, d)
        return 0
    if typ == J_STRING:
        p = pos
        n = j_varlen(s, &p, end)
        if n < 0 or n > end - p or not utf8_ok(s + p, n):
            return -1
        left[0] -= n
        if left[0] < 0:
            return -1
        put_escaped(text, s + p, n)
        return 0
    if typ == J_OPAQUE:   # a DECIMAL only
        if pos >= end or s[pos] != J_NEWDECIMAL:
            return -1
        p = pos + 1
        n = j_varlen(s, &p, end)
        if n < 2 or n > end - p:
            return -1
        left[0] -= n
        if left[0] < 0:
            return -1
        precision, scale = s[p], s[p + 1]
        intg = precision - scale
        if not (0 < precision <= 65 and scale <= precision) or n - 2 != (
                (intg // 9) * 4 + DIG2BYTES[intg % 9] + (scale // 9) * 4 + DIG2BYTES[scale % 9]):
            return -1
        return put_decimal(text, s + p + 2, precision, scale, <int>(n - 2))
    return -1


cdef int jt_container(PyObject* text, const uint8_t* s, int typ, Py_ssize_t base,
                      Py_ssize_t end, int depth, Py_ssize_t* left) except -2:
    cdef bint large = typ == J_LARGE_OBJECT or typ == J_LARGE_ARRAY
    cdef bint is_object = typ == J_SMALL_OBJECT or typ == J_LARGE_OBJECT
    cdef int osz = 4 if large else 2
    cdef Py_ssize_t count, size, obj_end, keys_at, pos, i, koff, klen, voff
    cdef Py_ssize_t last_off = 0, last_len = -1
    cdef int vtype
    if depth > J_MAX_DEPTH or end - base < 2 * osz:
        return -1
    count = <Py_ssize_t>j_uint(s + base, osz)
    size = <Py_ssize_t>j_uint(s + base + osz, osz)
    if size > end - base:
        return -1
    left[0] -= count   # (values never share bytes: no more values than bytes)
    if left[0] < 0:
        return -1
    obj_end = base + size
    keys_at = base + 2 * osz
    if count * ((osz + 2 if is_object else 0) + 1 + osz) > obj_end - keys_at:
        return -1
    pos = keys_at + (count * (osz + 2) if is_object else 0)   # the value entries
    put(text, b"{" if is_object else b"[", 1)
    for i in range(count):
        if i:
            put(text, b",", 1)
        if is_object:
            koff = <Py_ssize_t>j_uint(s + keys_at + i * (osz + 2), osz)
            klen = <Py_ssize_t>j_uint(s + keys_at + i * (osz + 2) + osz, 2)
            if koff + klen > size or not utf8_ok(s + base + koff, klen):
                return -1
            left[0] -= klen
            if left[0] < 0:
                return -1
            # a server writes keys once each, by length then bytes: a key out of that
            # order (a key twice, which a dict keeps once) is the pure twin's
            if klen < last_len or (klen == last_len and memcmp(
                    s + base + last_off, s + base + koff, klen) >= 0):
                return -1
            last_off, last_len = koff, klen
            put_escaped(text, s + base + koff, klen)
            put(text, b":", 1)
        vtype = s[pos]
        if vtype == J_LITERAL or vtype == J_INT16 or vtype == J_UINT16 or \
                (large and (vtype == J_INT32 or vtype == J_UINT32)):  # inlined
            if jt_value(text, s, vtype, pos + 1, obj_end, depth, left) < 0:
                return -1
        else:
            voff = <Py_ssize_t>j_uint(s + pos + 1, osz)
            if voff >= size or jt_value(text, s, vtype, base + voff, obj_end, depth,
                                        left) < 0:
                return -1
        pos += 1 + osz
    put(text, b"}" if is_object else b"]", 1)
    return 0

