"""Damaged video files for the video commands' tests.

`truncated_mp4` writes what an interrupted download of a streaming-ready
MP4 leaves: the index (moov box) in front of the frames, so the file opens
and states every frame, but only the first part of the frame data.
"""
import struct
from typing import Tuple

import numpy as np


def _boxes(data: bytes):
  """(type, bytes) of an MP4's top-level boxes (32-bit sizes)."""
  out, i = [], 0
  while i < len(data):
    size, kind = struct.unpack('>I4s', data[i:i + 8])
    out.append((kind, data[i:i + size]))
    i += size
  return out


def move_index_to_front(data: bytes) -> bytes:
  """The MP4 `data` with its moov box before its mdat box and the chunk
  offsets (stco) moved by the moov's size (what `ffmpeg -movflags
  faststart` and `qt-faststart` do)."""
  boxes = _boxes(data)
  moov = bytearray(dict(boxes)[b'moov'])
  at = moov.find(b'stco')
  while at >= 0:
    count = struct.unpack('>I', moov[at + 8:at + 12])[0]
    for k in range(count):
      entry = at + 12 + 4 * k
      offset = struct.unpack('>I', moov[entry:entry + 4])[0]
      struct.pack_into('>I', moov, entry, offset + len(moov))
    at = moov.find(b'stco', at + 4)
  out = b''
  for kind, box in boxes:
    if kind == b'mdat':
      out += bytes(moov)
    if kind != b'moov':
      out += box
  return out


def decodable_frames(path: str) -> Tuple[int, int]:
  """(frames the container states, frames OpenCV decodes) of a file."""
  import cv2  # pylint: disable=g-import-not-at-top
  capture = cv2.VideoCapture(path)
  stated = int(capture.get(cv2.CAP_PROP_FRAME_COUNT))
  decoded = 0
  while capture.read()[0]:
    decoded += 1
  capture.release()
  return stated, decoded


def truncated_mp4(path: str, num_frames: int = 40, size: int = 32,
                  fps: float = 8.0, keep: float = 0.5, seed: int = 0
                  ) -> Tuple[int, int]:
  """Writes a truncated MP4 at `path` (.mp4); returns (stated, decoded).

  `num_frames` frames of noise (mp4v, `size` x `size` at `fps`), the index
  moved to the front, then cut to the first `keep` of its bytes: OpenCV
  opens it and states `num_frames` frames but decodes fewer.
  """
  from official_ext.assemblenet import videos  # pylint: disable=g-import-not-at-top
  rng = np.random.default_rng(seed)
  videos.write_video(path, rng.integers(0, 256, [num_frames, size, size, 3],
                                        dtype=np.uint8), fps)
  with open(path, 'rb') as f:
    data = move_index_to_front(f.read())
  with open(path, 'wb') as f:
    f.write(data[:int(len(data) * keep)])
  stated, decoded = decodable_frames(path)
  assert stated == num_frames and 0 < decoded < stated, (stated, decoded)
  return stated, decoded
