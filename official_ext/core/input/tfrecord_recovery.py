"""Reading the intact records of a damaged TFRecord file past its damage (pure
python, CRC-32C checked; skip mode only)."""
from typing import List

import tensorflow as tf

# On-disk bytes around each TFRecord payload: uint64 length, uint32 masked CRC
# of the length, payload, uint32 masked CRC of the payload.
TFRECORD_FRAMING_BYTES = 16

# Bytes of a record header: the uint64 length and its uint32 masked CRC.
_HEADER_BYTES = 12


def _crc32c_table() -> List[int]:
  """The 256-entry table of the reflected CRC-32C (Castagnoli) polynomial."""
  table = []
  for byte in range(256):
    crc = byte
    for _ in range(8):
      crc = (crc >> 1) ^ (0x82F63B78 if crc & 1 else 0)
    table.append(crc)
  return table


_CRC32C_TABLE = _crc32c_table()


def masked_crc32c(data: bytes) -> int:
  """The masked CRC-32C (uint32 int) TFRecord framing stores for `data`."""
  crc = 0xFFFFFFFF
  table = _CRC32C_TABLE
  for byte in data:
    crc = table[(crc ^ byte) & 0xFF] ^ (crc >> 8)
  crc ^= 0xFFFFFFFF
  return ((((crc >> 15) | (crc << 17)) & 0xFFFFFFFF) + 0xA282EAD8) & 0xFFFFFFFF


def _stored_crc(buf: bytes, offset: int) -> int:
  """The uint32 (little-endian) CRC stored at `buf[offset:offset + 4]`."""
  return int.from_bytes(buf[offset:offset + 4], 'little')


def recover_records(path: str, offset: int) -> List[bytes]:
  """The intact records of `path` after byte `offset`, in order.

  A bad payload is skipped by its checked length; a bad length by scanning to
  the next valid header.
  """
  with tf.io.gfile.GFile(path, 'rb') as f:
    f.seek(offset)
    buf = f.read()
  n, o, out = len(buf), 0, []
  while o + _HEADER_BYTES <= n:
    header = buf[o:o + 8]
    if masked_crc32c(header) != _stored_crc(buf, o + 8):
      o += 1  # Not a record start: resynchronise.
      continue
    length = int.from_bytes(header, 'little')
    end = o + _HEADER_BYTES + length + 4
    if end > n:
      break  # The truncated last record.
    payload = buf[o + _HEADER_BYTES:end - 4]
    if masked_crc32c(payload) == _stored_crc(buf, end - 4):
      out.append(payload)
    o = end
  return out
