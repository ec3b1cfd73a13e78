"""Image width and height from the file header, without decoding a pixel.

A small file can declare an enormous picture (a 2.6 MB PNG of 30000x30000 decodes to 2.7 GB); the size
is read here first, so utils/data/datasets.load_image_file can refuse it before a decoder allocates anything.
Formats: PNG (IHDR), JPEG (the SOFn frame header), BMP (BITMAPINFOHEADER and later), WebP (VP8, VP8L,
VP8X) and TIFF (IFD0 ImageWidth/ImageLength). Anything else, or a header that does not parse, is
ValueError: it is not an image this project reads.
"""
from __future__ import annotations

import struct

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
# JPEG start-of-frame markers (baseline, extended, progressive, lossless; huffman and arithmetic). C4
# (DHT), C8 (reserved) and CC (DAC) share the range but are no frame headers.
_SOF = {0xC0, 0xC1, 0xC2, 0xC3, 0xC5, 0xC6, 0xC7, 0xC9, 0xCA, 0xCB, 0xCD, 0xCE, 0xCF}


def image_size(buf: bytes | memoryview) -> tuple[int, int]:
    """(width, height) declared by the header of an encoded image; ValueError if there is none."""
    b = memoryview(buf)
    try:
        if bytes(b[:8]) == PNG_MAGIC:
            return _png(b)
        if bytes(b[:2]) == b"\xff\xd8":
            return _jpeg(b)
        if bytes(b[:2]) == b"BM":
            return _bmp(b)
        if bytes(b[:4]) == b"RIFF" and bytes(b[8:12]) == b"WEBP":
            return _webp(b)
        if bytes(b[:4]) in (b"II*\x00", b"MM\x00*"):
            return _tiff(b)
    except (struct.error, IndexError) as e:
        raise ValueError(f"image header cut short or malformed ({e})") from None
    raise ValueError("not a BMP, JPEG, PNG, TIFF or WebP file (unknown header)")


def _checked(w: int, h: int) -> tuple[int, int]:
    if w < 1 or h < 1:
        raise ValueError(f"image header declares no pixels ({w}x{h})")
    return w, h


def _png(b: memoryview) -> tuple[int, int]:
    if bytes(b[12:16]) != b"IHDR":  # the first chunk must be the header
        raise ValueError("PNG without an IHDR header chunk")
    w, h = struct.unpack(">II", b[16:24])
    return _checked(w, h)


def _jpeg(b: memoryview) -> tuple[int, int]:
    i = 2
    while i + 4 <= len(b):
        if b[i] != 0xFF:
            raise ValueError(f"JPEG marker expected at byte {i}")
        marker = b[i + 1]
        if marker == 0xFF:  # fill byte before a marker
            i += 1
            continue
        if marker == 0x01 or 0xD0 <= marker <= 0xD8:  # markers without a length field
            i += 2
            continue
        if marker in (0xD9, 0xDA):  # end of image, start of scan: the frame header should have come
            break
        (length,) = struct.unpack(">H", b[i + 2 : i + 4])
        if marker in _SOF:
            h, w = struct.unpack(">HH", b[i + 5 : i + 9])
            if h == 0:  # the height follows the scan in a DNL segment: rare, and nothing can bound it
                raise ValueError("JPEG whose height is only given after the image data (DNL)")
            return _checked(w, h)
        if length < 2:
            raise ValueError("JPEG segment with a length below 2")
        i += 2 + length
    raise ValueError("JPEG without a frame header (SOF)")


def _bmp(b: memoryview) -> tuple[int, int]:
    (header,) = struct.unpack("<I", b[14:18])
    if header == 12:  # OS/2 BITMAPCOREHEADER: 16-bit sizes
        w, h = struct.unpack("<HH", b[18:22])
    else:
        w, h = struct.unpack("<ii", b[18:26])
    return _checked(abs(w), abs(h))  # a negative height means top-down rows


def _webp(b: memoryview) -> tuple[int, int]:
    kind = bytes(b[12:16])
    if kind == b"VP8 ":  # lossy: after a 3-byte frame tag and the 9d 01 2a start code, 14-bit sizes
        if bytes(b[23:26]) != b"\x9d\x01\x2a":
            raise ValueError("WebP VP8 frame without its start code")
        w, h = struct.unpack("<HH", b[26:30])
        return _checked(w & 0x3FFF, h & 0x3FFF)
    if kind == b"VP8L":  # lossless: a signature byte, then 14 bits each of width-1 and height-1
        if b[20] != 0x2F:
            raise ValueError("WebP VP8L frame without its signature")
        (bits,) = struct.unpack("<I", b[21:25])
        return _checked((bits & 0x3FFF) + 1, ((bits >> 14) & 0x3FFF) + 1)
    if kind == b"VP8X":  # extended: 24-bit canvas width-1 and height-1
        w = int.from_bytes(b[24:27], "little") + 1
        h = int.from_bytes(b[27:30], "little") + 1
        return _checked(w, h)
    raise ValueError(f"WebP with an unknown first chunk {kind!r}")


def _tiff(b: memoryview) -> tuple[int, int]:
    order = "<" if bytes(b[:2]) == b"II" else ">"
    (ifd,) = struct.unpack(order + "I", b[4:8])
    (count,) = struct.unpack(order + "H", b[ifd : ifd + 2])
    found: dict[int, int] = {}
    for k in range(count):
        e = ifd + 2 + 12 * k
        tag, typ = struct.unpack(order + "HH", b[e : e + 4])
        if tag in (256, 257):  # ImageWidth, ImageLength: SHORT (3) or LONG (4)
            fmt = "H" if typ == 3 else "I" if typ == 4 else None
            if fmt is None:
                raise ValueError(f"TIFF size tag {tag} of unexpected type {typ}")
            (found[tag],) = struct.unpack(order + fmt, b[e + 8 : e + 8 + struct.calcsize(fmt)])
    if 256 not in found or 257 not in found:
        raise ValueError("TIFF without ImageWidth/ImageLength in its first directory")
    return _checked(found[256], found[257])
