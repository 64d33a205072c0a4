"""Collation ids of MariaDB and MySQL -> character set -> Python codec.

The table maps ids to character sets the way the servers number them. It was generated from
`information_schema.COLLATIONS` of MariaDB 10.11 and extended with MySQL 8's own ids
(248-250 gb18030, 255-323 the utf8mb4 0900 collations, 76 utf8mb3_tolower_ci). Client
libraries carry similar tables only for the character sets a client may use (no ucs2,
utf16, utf32), which row images can hold, so the table is kept here.

MySQL's `latin1` is Windows-1252 with the five bytes that cp1252 leaves undefined mapped
to the same code points; the `mysql_latin1` error handlers below make Python agree, both
ways. Character sets with no Python codec (dec8, hp8, swe7, keybcs2, armscii8, geostd8)
decode to bytes.
"""

from __future__ import annotations

import codecs
import functools

_RANGES: dict[str, tuple[tuple[int, int], ...]] = {
    "big5": ((1, 1), (84, 84), (1025, 1025), (1108, 1108)),
    "latin2": ((2, 2), (9, 9), (21, 21), (27, 27), (77, 77), (1033, 1033), (1101, 1101)),
    "dec8": ((3, 3), (69, 69), (1027, 1027), (1093, 1093)),
    "cp850": ((4, 4), (80, 80), (1028, 1028), (1104, 1104)),
    "latin1": ((5, 5), (8, 8), (15, 15), (31, 31), (47, 49), (94, 94), (1032, 1032),
               (1071, 1071)),
    "hp8": ((6, 6), (72, 72), (1030, 1030), (1096, 1096)),
    "koi8r": ((7, 7), (74, 74), (1031, 1031), (1098, 1098)),
    "swe7": ((10, 10), (82, 82), (1034, 1034), (1106, 1106)),
    "ascii": ((11, 11), (65, 65), (1035, 1035), (1089, 1089)),
    "ujis": ((12, 12), (91, 91), (1036, 1036), (1115, 1115)),
    "sjis": ((13, 13), (88, 88), (1037, 1037), (1112, 1112)),
    "cp1251": ((14, 14), (23, 23), (50, 52), (1074, 1075)),
    "hebrew": ((16, 16), (71, 71), (1040, 1040), (1095, 1095)),
    "tis620": ((18, 18), (89, 89), (1042, 1042), (1113, 1113)),
    "euckr": ((19, 19), (85, 85), (1043, 1043), (1109, 1109)),
    "latin7": ((20, 20), (41, 42), (79, 79), (1065, 1065), (1103, 1103)),
    "koi8u": ((22, 22), (75, 75), (1046, 1046), (1099, 1099)),
    "gb2312": ((24, 24), (86, 86), (1048, 1048), (1110, 1110)),
    "greek": ((25, 25), (70, 70), (1049, 1049), (1094, 1094)),
    "cp1250": ((26, 26), (34, 34), (44, 44), (66, 66), (99, 99), (1050, 1050), (1090, 1090)),
    "gbk": ((28, 28), (87, 87), (1052, 1052), (1111, 1111)),
    "cp1257": ((29, 29), (58, 59), (1082, 1083)),
    "latin5": ((30, 30), (78, 78), (1054, 1054), (1102, 1102)),
    "armscii8": ((32, 32), (64, 64), (1056, 1056), (1088, 1088)),
    "utf8mb3": ((33, 33), (76, 76), (83, 83), (192, 215), (223, 223), (576, 578),
                (1057, 1057), (1107, 1107), (1216, 1216), (1238, 1238)),
    "ucs2": ((35, 35), (90, 90), (128, 151), (159, 159), (640, 642), (1059, 1059),
             (1114, 1114), (1152, 1152), (1174, 1174)),
    "cp866": ((36, 36), (68, 68), (1060, 1060), (1092, 1092)),
    "keybcs2": ((37, 37), (73, 73), (1061, 1061), (1097, 1097)),
    "macce": ((38, 38), (43, 43), (1062, 1062), (1067, 1067)),
    "macroman": ((39, 39), (53, 53), (1063, 1063), (1077, 1077)),
    "cp852": ((40, 40), (81, 81), (1064, 1064), (1105, 1105)),
    "utf8mb4": ((45, 46), (224, 247), (255, 323), (608, 610), (1069, 1070), (1248, 1248),
                (1270, 1270)),
    "utf16": ((54, 55), (101, 124), (672, 674), (1078, 1079), (1125, 1125), (1147, 1147)),
    "utf16le": ((56, 56), (62, 62), (1080, 1080), (1086, 1086)),
    "cp1256": ((57, 57), (67, 67), (1081, 1081), (1091, 1091)),
    "utf32": ((60, 61), (160, 183), (736, 738), (1084, 1085), (1184, 1184), (1206, 1206)),
    "binary": ((63, 63),),
    "geostd8": ((92, 93), (1116, 1117)),
    "cp932": ((95, 96), (1119, 1120)),
    "eucjpms": ((97, 98), (1121, 1122)),
    "gb18030": ((248, 250),),
}

_CODECS: dict[str, str | None] = {
    "big5": "big5", "latin2": "iso8859_2", "cp850": "cp850", "latin1": "cp1252",
    "koi8r": "koi8_r", "ascii": "ascii", "ujis": "euc_jp", "sjis": "shift_jis",
    "cp1251": "cp1251", "hebrew": "iso8859_8", "tis620": "tis_620", "euckr": "euc_kr",
    "latin7": "iso8859_13", "koi8u": "koi8_u", "gb2312": "gb2312", "greek": "iso8859_7",
    "cp1250": "cp1250", "gbk": "gbk", "cp1257": "cp1257", "latin5": "iso8859_9",
    "utf8mb3": "utf-8", "ucs2": "utf-16-be", "cp866": "cp866", "macce": "mac_latin2",
    "macroman": "mac_roman", "cp852": "cp852", "utf8mb4": "utf-8", "utf16": "utf-16-be",
    "utf16le": "utf-16-le", "cp1256": "cp1256", "utf32": "utf-32-be", "cp932": "cp932",
    "eucjpms": "euc_jp", "gb18030": "gb18030", "binary": None, "dec8": None, "hp8": None,
    "swe7": None, "keybcs2": None, "armscii8": None, "geostd8": None,
}

BINARY = 63

_MBMAXLEN = {"utf8mb4": 4, "utf8mb3": 3, "ucs2": 2, "utf16": 4, "utf16le": 4, "utf32": 4,
             "big5": 2, "sjis": 2, "ujis": 3, "euckr": 2, "gb2312": 2, "gbk": 2, "cp932": 2,
             "eucjpms": 3, "gb18030": 4}

_BY_ID: dict[int, str] = {}
for _name, _ranges in _RANGES.items():
    for _lo, _hi in _ranges:
        for _i in range(_lo, _hi + 1):
            _BY_ID[_i] = _name
# MariaDB 10.10+'s UCA 14.0.0 collations (11.8's default, utf8mb4_uca1400_ai_ci, is 2304):
# 2048 + (character set << 8) + (tailoring << 3) + pad, accent and case bits, for the
# character sets utf8mb3, utf8mb4, ucs2, utf16, utf32 in that order
# (my_uca1400_make_builtin_collation_id; checked against all 920 ids of MariaDB 11.8).
UCA1400_FIRST = 2048
for _n, _name in enumerate(("utf8mb3", "utf8mb4", "ucs2", "utf16", "utf32")):
    for _i in range(UCA1400_FIRST + (_n << 8), UCA1400_FIRST + ((_n + 1) << 8)):
        _BY_ID[_i] = _name
_FIRST_ID = {name: min(lo for lo, _ in ranges) for name, ranges in _RANGES.items()}
_UCA1400_CHARSETS = ("utf8mb3", "utf8mb4", "ucs2", "utf16", "utf32")
_UCA1400_TAILORINGS = {
    "": 0, "icelandic": 1, "latvian": 2, "romanian": 3, "slovenian": 4, "polish": 5,
    "estonian": 6, "spanish": 7, "swedish": 8, "turkish": 9, "czech": 10, "danish": 11,
    "lithuanian": 12, "slovak": 13, "spanish2": 14, "roman": 15, "persian": 16,
    "esperanto": 17, "hungarian": 18, "sinhala": 19, "german2": 20, "vietnamese": 23,
    "croatian": 24}


def uca1400_collation_id(full_name: str) -> int | None:
    """The id of a MariaDB UCA 14.0.0 collation by its full name
    (`utf8mb4_uca1400_swedish_nopad_as_cs`), which information_schema.COLLATIONS lists
    without an id; None for another name."""
    parts = full_name.lower().split("_")
    if len(parts) < 4 or parts[1] != "uca1400" or parts[0] not in _UCA1400_CHARSETS \
            or parts[-2] not in ("ai", "as") or parts[-1] not in ("ci", "cs"):
        return None
    middle = parts[2:-2]
    nopad = bool(middle) and middle[-1] == "nopad"
    if nopad:
        middle = middle[:-1]
    tailoring = _UCA1400_TAILORINGS.get("_".join(middle))
    if tailoring is None:
        return None
    return (UCA1400_FIRST + (_UCA1400_CHARSETS.index(parts[0]) << 8) + (tailoring << 3)
            + (4 if nopad else 0) + (2 if parts[-2] == "as" else 0)
            + (1 if parts[-1] == "cs" else 0))


def charset_name(collation_id: int) -> str | None:
    """The character set of a collation id, None when the id is unknown."""
    return _BY_ID.get(collation_id)


def collation_of_charset(name: str) -> int | None:
    """A collation id of the character set `name` (its lowest): for decoding, where only
    the character set matters."""
    return _FIRST_ID.get(name.lower())


def mbmaxlen(collation_id: int) -> int:
    """The most bytes one character takes in this collation's character set."""
    return _MBMAXLEN.get(_BY_ID.get(collation_id, ""), 1)


def codec_of(collation_id: int) -> tuple[str, str] | None:
    """(codec, errors) to decode values of this collation to str; None for bytes (binary,
    unknown ids, and character sets Python has no codec for)."""
    name = _BY_ID.get(collation_id)
    if name is None:
        return None
    codec = _CODECS.get(name)
    if codec is None:
        return None
    return codec, ("mysql_latin1" if name == "latin1" else "strict")


_SINGLE_BYTE = frozenset({"cp1252", "iso8859_2", "cp850", "koi8_r", "ascii", "cp1251",
                          "iso8859_8", "tis_620", "iso8859_13", "koi8_u", "iso8859_7", "cp1250",
                          "cp1257", "iso8859_9", "cp866", "mac_latin2", "mac_roman", "cp852",
                          "cp1256"})


@functools.lru_cache(maxsize=64)
def decoding_table(codec: str, errors: str) -> str | None:
    """For a single-byte character set with every byte defined: the 256-character table
    that codecs.charmap_decode takes (one C call per value); None otherwise."""
    if codec not in _SINGLE_BYTE:
        return None
    try:
        table = bytes(range(256)).decode(codec, errors)
    except UnicodeDecodeError:
        return None  # bytes with no character: decode the slow way, to get the error
    return table if len(table) == 256 else None


def _latin1_decode(exc: UnicodeError) -> tuple[str, int]:
    if not isinstance(exc, UnicodeDecodeError):
        raise exc
    bad = exc.object[exc.start : exc.end]
    return "".join(chr(b) for b in bad), exc.end


def _latin1_encode(exc: UnicodeError) -> tuple[bytes, int]:
    if not isinstance(exc, UnicodeEncodeError):
        raise exc
    chunk = exc.object[exc.start : exc.end]
    if all(ord(c) in (0x81, 0x8D, 0x8F, 0x90, 0x9D) for c in chunk):
        return bytes(ord(c) for c in chunk), exc.end
    raise exc


def _latin1(exc: UnicodeError) -> tuple[str | bytes, int]:
    if isinstance(exc, UnicodeDecodeError):
        return _latin1_decode(exc)
    return _latin1_encode(exc)


codecs.register_error("mysql_latin1", _latin1)
