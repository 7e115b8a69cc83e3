"""Images crafted to cost serving_bytes' decoders the most, for a few bytes.

The serving benchmark (--costs) times them, and the tests of the bounds send
them; none is in the tree, each is made as it is needed.
"""

import io
import math
import re
import struct
import zlib

from PIL import Image
from serving import signatures

SIDE = math.isqrt(signatures.MAX_PIXELS)
# Adam7's passes: the first column and row of each, and their steps.
ADAM7 = [(0, 0, 8, 8), (4, 0, 8, 8), (0, 4, 4, 8), (2, 0, 4, 4)]
ADAM7 += [(0, 2, 2, 4), (1, 0, 2, 2), (0, 1, 1, 2)]


def encoded(image: Image.Image, image_format: str, **options) -> bytes:
  """`image` saved by Pillow as `image_format`, with its `options`."""
  buffer = io.BytesIO()
  image.save(buffer, image_format, **options)
  return buffer.getvalue()


def costly_png(width: int, height: int) -> bytes:
  """An 8-bit RGB PNG of zeros, interlaced, every row Paeth-filtered.

  The most a PNG decoder does per pixel of the bound, from a file of a few
  dozen KB. Written here: Pillow chooses neither filters nor interlacing.
  """
  rows = b''
  for x, y, step_x, step_y in ADAM7:
    pass_width = max(0, -(-(width - x) // step_x))
    pass_height = max(0, -(-(height - y) // step_y)) if pass_width else 0
    rows += (b'\x04' + bytes(3 * pass_width)) * pass_height

  def chunk(kind: bytes, body: bytes) -> bytes:
    crc = struct.pack('>I', zlib.crc32(kind + body))
    return struct.pack('>I', len(body)) + kind + body + crc

  header = struct.pack('>IIBBBBB', width, height, 8, 2, 0, 0, 1)
  return (
      signatures.BYTES_FORMATS['PNG']
      + chunk(b'IHDR', header)
      + chunk(b'IDAT', zlib.compress(rows, 9))
      + chunk(b'IEND', b'')
  )


def progressive_jpeg(mode: str, side: int) -> bytes:
  """A flat grey image of `side` pixels a side, as Pillow's progressive JPEG
  (libjpeg's script), in 'L' or 'RGB' with full-size chroma (4:4:4)."""
  image = Image.new(mode, (side, side), 128 if mode == 'L' else (128,) * 3)
  return encoded(image, 'JPEG', progressive=True, subsampling=0)


# A marker that ends a scan's entropy-coded data: FF, then neither a
# stuffed 00 nor a restart marker.
_END_OF_SCAN = re.compile(b'\xff[^\x00\xd0-\xd7]')


def scan_spans(jpeg: bytes) -> list[tuple[int, int]]:
  """Where each scan of a JPEG lies: its SOS segment and entropy-coded data."""
  spans, at = [], 2
  while jpeg[at + 1] != 0xD9:  # EOI.
    end = at + 2 + int.from_bytes(jpeg[at + 2 : at + 4], 'big')
    if jpeg[at + 1] == 0xDA:
      end = _END_OF_SCAN.search(jpeg, end).start()
      spans.append((at, end))
    at = end
  return spans


def with_scans(jpeg: bytes, scans: int, repeated: int) -> bytes:
  """`jpeg` with its scan of index `repeated` written again before EOI, to
  `scans` scans in all: libjpeg warns, and decodes each."""
  spans = scan_spans(jpeg)
  start, end = spans[repeated]
  extra = jpeg[start:end] * (scans - len(spans))
  return jpeg[:-2] + extra + jpeg[-2:]
