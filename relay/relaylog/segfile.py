"""A segment's bytes, stored plain or compressed, behind one read interface.

`compress_after = N` ([relaylog]) compresses sealed segments older than the newest N with
zstd, as MaxScale's binlog router does, to keep more history on the same disk. Readers
must still start anywhere (a dump at a GTID's offset, a tap range), so a compressed
segment is not one zstd stream: it is the segment cut into blocks of BLOCK bytes, each an
independent zstd frame, followed by a table of where each frame starts and a footer. A
read at any offset decompresses the block(s) it touches (the last block stays cached per
open file, so a reader walking forward decompresses each block once).

    relay-bin.000123.zst = MAGIC | frame 0 | frame 1 | ... | u64 offsets[n] | u64 n |
                           u64 block | u64 size | MAGIC

Hand-written: zstd's own seekable format has no Python binding (python-zstandard reads
and writes plain frames only); this layout is that format's idea in 40 lines, and the
frames themselves are made and read by python-zstandard.

The index (`relay-bin.index`) keeps naming the segment `relay-bin.000123`; the file is
`relay-bin.000123.zst` once compressed. `open_segment` finds whichever exists (a reader
racing the compressor finds one or the other: the plain file goes only after the
compressed one is durable).
"""

from __future__ import annotations

import contextlib
import io
import os
import struct
from typing import Protocol

from relay.errors import CorruptLog
from relay.relaylog import gtid_index
from relay.relaylog.atomic import fsync_dir

SUFFIX = ".zst"
MAGIC = b"RLYZSEG1"
BLOCK = 1 << 20
LEVEL = 3
_FOOTER = struct.Struct("<QQQ8s")  # frames, block size, uncompressed size, magic


class SegmentFile(Protocol):
    path: str
    size: int           # uncompressed bytes

    def pread(self, n: int, offset: int) -> bytes: ...

    def fileno(self) -> int: ...   # -1 when the bytes are not the file's (compressed)

    def close(self) -> None: ...


class PlainSegment:
    def __init__(self, path: str) -> None:
        self.path = path
        self._fd = os.open(path, os.O_RDONLY)
        self.size = os.fstat(self._fd).st_size

    def pread(self, n: int, offset: int) -> bytes:
        return os.pread(self._fd, n, offset)

    def fileno(self) -> int:
        return self._fd

    def close(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1


class CompressedSegment:
    def __init__(self, path: str) -> None:
        self.path = path
        self._fd = os.open(path, os.O_RDONLY)
        try:
            self._read_table()
        except BaseException:
            os.close(self._fd)
            raise
        import zstandard  # loaded once a compressed segment is read, not at every start

        self._dctx = zstandard.ZstdDecompressor()
        self._zstd_error = zstandard.ZstdError
        self._cached = -1
        self._block = b""

    def _read_table(self) -> None:
        end = os.fstat(self._fd).st_size
        if end < len(MAGIC) + _FOOTER.size:
            raise CorruptLog(self.path, 0, "compressed segment shorter than its footer")
        frames, self.block, self.size, magic = _FOOTER.unpack(
            os.pread(self._fd, _FOOTER.size, end - _FOOTER.size))
        table_at = end - _FOOTER.size - 8 * frames
        if magic != MAGIC or table_at < len(MAGIC) or self.block <= 0:
            raise CorruptLog(self.path, end - _FOOTER.size, "not a compressed segment footer")
        offsets = list(struct.unpack(f"<{frames}Q", os.pread(self._fd, 8 * frames, table_at)))
        self._starts = [*offsets, table_at]
        if frames != (self.size + self.block - 1) // self.block or any(
                a > b for a, b in zip(self._starts, self._starts[1:], strict=False)):
            raise CorruptLog(self.path, table_at, "compressed segment's frame table")

    def _load(self, i: int) -> bytes:
        if i != self._cached:
            start, stop = self._starts[i], self._starts[i + 1]
            want = min(self.block, self.size - i * self.block)
            try:
                self._block = self._dctx.decompress(os.pread(self._fd, stop - start, start),
                                                    max_output_size=want)
            except self._zstd_error as exc:
                raise CorruptLog(self.path, start, f"frame {i}: {exc}") from None
            if len(self._block) != want:
                raise CorruptLog(self.path, start, f"frame {i} holds {len(self._block)} "
                                                   f"bytes, not {want}")
            self._cached = i
        return self._block

    def pread(self, n: int, offset: int) -> bytes:
        end = min(offset + n, self.size)
        out = []
        while offset < end:
            i, within = divmod(offset, self.block)
            block = self._load(i)
            piece = block[within : within + end - offset]
            out.append(piece)
            offset += len(piece)
        return b"".join(out) if len(out) != 1 else out[0]

    def fileno(self) -> int:
        return -1

    def close(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1


def open_segment(path: str) -> SegmentFile:
    """The segment at `path` (its logical name's path), plain or compressed."""
    try:
        return PlainSegment(path)
    except FileNotFoundError:
        return CompressedSegment(path + SUFFIX)


def stored_path(path: str) -> str:
    """Where the segment's bytes are now (plain, else compressed)."""
    return path if os.path.exists(path) else path + SUFFIX


def exists(path: str) -> bool:
    return os.path.exists(path) or os.path.exists(path + SUFFIX)


def remove(path: str) -> None:
    """Remove a segment in whichever form it is stored, and its GTID index."""
    for p in (path, path + SUFFIX, gtid_index.index_file(path)):
        with contextlib.suppress(FileNotFoundError):
            os.unlink(p)


def compress(path: str, *, sync: bool) -> int:
    """Write `path` + SUFFIX from the sealed segment at `path` (durably when `sync`), then
    remove the plain file. Blocking. Returns the compressed size."""
    import zstandard

    cctx = zstandard.ZstdCompressor(level=LEVEL, write_checksum=True)  # a flipped bit shows
    tmp = path + SUFFIX + ".tmp"
    offsets = []
    size = 0
    st = os.stat(path)
    try:
        with open(path, "rb") as src, open(tmp, "wb") as out:
            out.write(MAGIC)
            while block := src.read(BLOCK):
                offsets.append(out.tell())
                out.write(cctx.compress(block))
                size += len(block)
            out.write(struct.pack(f"<{len(offsets)}Q", *offsets))
            out.write(_FOOTER.pack(len(offsets), BLOCK, size, MAGIC))
            out.flush()
            stored = out.tell()
            # Still sealed when it was (age retention reads it), before the fsync that
            # makes it durable.
            os.utime(out.fileno(), ns=(st.st_atime_ns, st.st_mtime_ns))
            if sync:
                os.fsync(out.fileno())
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)  # a full disk: leave nothing half-written behind
        raise
    os.replace(tmp, path + SUFFIX)
    if sync:
        fsync_dir(os.path.dirname(os.path.abspath(path)))
    os.unlink(path)  # readers that have it open keep reading it
    return stored


class SegmentStream(io.RawIOBase):
    """A segment as a file object, for the readers that walk files (recovery's
    verification, `relay changes`)."""

    def __init__(self, segment: SegmentFile) -> None:
        self._segment = segment
        self._pos = 0

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        base = {io.SEEK_SET: 0, io.SEEK_CUR: self._pos, io.SEEK_END: self._segment.size}
        self._pos = max(0, base[whence] + offset)
        return self._pos

    def tell(self) -> int:
        return self._pos

    def readinto(self, buffer: memoryview | bytearray) -> int:  # type: ignore[override]
        data = self._segment.pread(len(buffer), self._pos)
        buffer[: len(data)] = data
        self._pos += len(data)
        return len(data)

    def fileno(self) -> int:
        fd = self._segment.fileno()
        if fd < 0:
            raise OSError("a compressed segment has no file descriptor of its bytes")
        return fd

    def close(self) -> None:
        self._segment.close()
        super().close()


def open_stream(path: str, buffering: int = 1 << 20) -> io.BufferedReader:
    """The segment at `path` (plain or compressed) as a buffered binary file."""
    return io.BufferedReader(SegmentStream(open_segment(path)), buffer_size=buffering)
