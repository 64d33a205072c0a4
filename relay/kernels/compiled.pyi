# The compiled twins (compiled.pyx): the signatures of pure.py.
from collections.abc import Callable

Buffer = bytes | bytearray | memoryview

def frame_stored(out: bytearray, buf: Buffer, seq: int) -> tuple[int, int, int]: ...
def read_dump(buf: Buffer, pos: int, seq: int, last_pos: int, plain: bytes,
              tally: list[int], out: bytearray, marks: list[int]) -> tuple[int, int, int]: ...
def scan_ingest(data: Buffer, pos: int, marks: list[int] | None, mi: int, kinds: bytes,
                wend: int, in_group: bool, inline_gtid: bool, segment_size: int,
                plan: list[tuple[int, ...]]) -> tuple[int, int, int, bool]: ...
def scan_clean(chunk: Buffer, pos: int, kinds: bytes, id_size: int,
               table_map: Callable[[int, int], int], drop_annotations: bool,
               cuts: list[int]) -> tuple[int, int]: ...
