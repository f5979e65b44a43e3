"""Stored predictions: every video's (or segment's) scores, for ensembles.

The format: docs/yt8m.md#ensembles.
"""
import dataclasses
import io
import json
import os
import re
from typing import (Callable, Dict, Iterable, Iterator, List, Optional,
                    Sequence, Tuple, TypeVar)
import zipfile

import numpy as np
import tensorflow as tf

from official_ext.core import output_files

FORMAT = 'official_ext.yt8m.stored_predictions'
VERSION = 1
INDEX = 'index.json'
SHARD_PATTERN = re.compile(r'scores-[0-9]{5}\.npz')
DEFAULT_SHARD_ROWS = 16384
LEVELS = ('video', 'segment')

_T = TypeVar('_T')


def shard_name(index: int) -> str:
  return f'scores-{index:05d}.npz'


class Recorder:
  """Writes the rows of prediction batches into shards of a directory."""

  def __init__(self, directory: str, level: str, num_classes: int,
               class_ids: Sequence[int], segment_size: Optional[int] = None,
               shard_rows: int = DEFAULT_SHARD_ROWS,
               source: Optional[Dict[str, str]] = None):
    """A recorder writing into the existing `directory`: the `class_ids`
    columns of `level` ('video' or 'segment') predictions, `shard_rows` rows
    a shard; `source` (model, input) goes into the index.
    """
    if level not in LEVELS:
      raise ValueError(f'level={level!r}; expected one of {LEVELS}.')
    if shard_rows <= 0:
      raise ValueError(f'--probabilities_shard_rows={shard_rows}; expected '
                       '> 0.')
    self._directory = directory
    self._level = level
    self._num_classes = int(num_classes)
    self._class_ids = np.asarray(class_ids, np.int64)
    self._segment_size = segment_size
    self._shard_rows = int(shard_rows)
    self._source = dict(source or {})
    self._pending: List[Dict[str, np.ndarray]] = []
    self._pending_rows = 0
    self._shards: List[Dict[str, object]] = []
    self._num_rows = 0
    self._num_labels = 0

  def add(self, batch: Dict[str, np.ndarray]) -> None:
    """Adds a batch (`video_ids`, `probabilities`, `segment_start_times` or
    `labels`).
    """
    rows = {'video_ids': np.asarray([v if isinstance(v, bytes) else
                                     str(v).encode() for v in
                                     batch['video_ids']], dtype=bytes),
            'probabilities': np.asarray(batch['probabilities'])[
                :, self._class_ids].astype(np.float16)}
    if self._level == 'segment':
      rows['segment_start_times'] = np.asarray(batch['segment_start_times'],
                                               np.int32)
    elif 'labels' in batch:
      rows['labels'] = np.asarray(batch['labels']) > 0
    self._pending.append(rows)
    self._pending_rows += len(rows['video_ids'])
    while self._pending_rows >= self._shard_rows:
      self._flush(self._shard_rows)

  def record(self, batches: Iterable[Dict[str, np.ndarray]]
             ) -> Iterator[Dict[str, np.ndarray]]:
    """Yields `batches` unchanged, adding each first."""
    for batch in batches:
      self.add(batch)
      yield batch

  def _flush(self, rows: int) -> None:
    joined = {k: np.concatenate([p[k] for p in self._pending])
              for k in self._pending[0]}
    shard = {k: v[:rows] for k, v in joined.items()}
    rest = {k: v[rows:] for k, v in joined.items()}
    self._pending = [rest] if len(rest['video_ids']) else []
    self._pending_rows = len(rest['video_ids'])
    if 'labels' in shard:
      labels = shard.pop('labels')
      counts = labels.sum(axis=1)
      shard['label_offsets'] = np.concatenate([[0], np.cumsum(counts)])
      shard['label_ids'] = np.nonzero(labels)[1].astype(np.int32)
      self._num_labels += int(counts.sum())
    name = shard_name(len(self._shards))
    buffer = io.BytesIO()  # zipfile needs a seekable stream.
    np.savez(buffer, **shard)
    with tf.io.gfile.GFile(os.path.join(self._directory, name), 'wb') as f:
      f.write(buffer.getvalue())
    n = len(shard['video_ids'])
    self._shards.append({'file': name, 'rows': n})
    self._num_rows += n

  def close(self) -> Dict[str, object]:
    """Writes the last shard and `index.json`; returns the index."""
    if self._pending_rows:
      self._flush(self._pending_rows)
    index = {
        'format': FORMAT, 'version': VERSION, 'level': self._level,
        'num_classes': self._num_classes,
        'class_ids': self._class_ids.tolist(),
        'segment_size': self._segment_size,
        'has_labels': self._num_labels > 0, 'num_rows': self._num_rows,
        'shards': self._shards, 'source': self._source,
    }
    with tf.io.gfile.GFile(os.path.join(self._directory, INDEX), 'w') as f:
      json.dump(index, f, indent=1)
    return index


def _is_stored_set(directory: str) -> bool:
  entries = [e.rstrip('/') for e in tf.io.gfile.listdir(directory)
             if not e.startswith(output_files.STAGING_PREFIX)]
  return all(e == INDEX or SHARD_PATTERN.fullmatch(e) for e in entries)


def check_output(directory: str, flag: str,
                 inputs: Iterable[Tuple[str, Optional[str]]] = (),
                 models: Iterable[Tuple[str, Optional[str]]] = ()) -> None:
  """Refuses `directory` before anything is read: a missing folder, a file,
  an input, inside a model, or holding files other than a stored set's.
  """
  directory = directory.rstrip('/')
  if tf.io.gfile.isdir(directory):
    if not _is_stored_set(directory):
      raise ValueError(
          f'{flag}={directory} holds files that are not stored predictions '
          f'({INDEX}, scores-NNNNN.npz); nothing was written. Choose a new '
          'or empty directory, or one of an earlier --output_probabilities.')
    output_files.check_output_file(os.path.join(directory, INDEX), flag,
                                   inputs, list(models))
  else:
    output_files.check_output_file(directory, flag, inputs, list(models))


def write(directory: str, batches: Iterable[Dict[str, np.ndarray]],
          consume: Callable[[Iterator[Dict[str, np.ndarray]]], _T],
          **recorder_args) -> _T:
  """Stores the rows of `batches` in `directory` while `consume` reads them.

  The directory is moved into place, whole, once `consume` returned; what it
  returns is returned. `recorder_args`: `Recorder`'s but `directory`.
  """
  directory = directory.rstrip('/')
  holds_set = tf.io.gfile.isdir(directory) and _is_stored_set(directory)

  def stage(staging):
    recorder = Recorder(staging, **recorder_args)
    result = consume(recorder.record(batches))
    return result, recorder.close()

  result, index = output_files.write_directory(
      directory, stage, overwrite=holds_set, flag='--output_probabilities',
      last=(INDEX,))
  kept = {s['file'] for s in index['shards']}
  for name in tf.io.gfile.listdir(directory):
    if SHARD_PATTERN.fullmatch(name) and name not in kept:
      tf.io.gfile.remove(os.path.join(directory, name))
  return result


@dataclasses.dataclass
class StoredPredictions:
  """A stored set, read whole (its fields: docs/yt8m.md#ensembles).

  `probabilities` float16 [N, C] hold the `class_ids` columns; the
  segment-level fields and the labels are None where the level has none.
  """
  path: str
  level: str
  num_classes: int
  class_ids: np.ndarray
  segment_size: Optional[int]
  video_ids: np.ndarray
  segment_start_times: Optional[np.ndarray]
  probabilities: np.ndarray
  label_offsets: Optional[np.ndarray]
  label_ids: Optional[np.ndarray]
  has_labels: bool
  source: Dict[str, str]

  def keys(self) -> np.ndarray:
    """str [N]: the row ids: video ids, or `<video>:<start>` segments."""
    ids = np.char.decode(self.video_ids.astype(bytes), 'utf-8')
    if self.level == 'video':
      return ids.astype(object)
    return np.asarray([f'{v}:{s}' for v, s in
                       zip(ids, self.segment_start_times)], dtype=object)

  def labels(self, rows: np.ndarray) -> np.ndarray:
    """float32 [len(rows), num_classes] multi-hot labels of `rows`."""
    if self.label_offsets is None:
      raise ValueError(f'{self.path} holds no labels ({self.level} level).')
    out = np.zeros([len(rows), self.num_classes], np.float32)
    starts = self.label_offsets[rows]
    counts = self.label_offsets[np.asarray(rows) + 1] - starts
    row_of = np.repeat(np.arange(len(rows)), counts)
    within = np.arange(counts.sum()) - np.repeat(np.cumsum(counts) - counts,
                                                 counts)
    out[row_of, self.label_ids[np.repeat(starts, counts) + within]] = 1.0
    return out


def load(path: str, flag: str = '--predictions') -> StoredPredictions:
  """Reads the stored set in directory `path`.

  Raises:
    ValueError: naming the directory or shard: no `index.json`, another
      format, a shard missing, of other rows or columns than the index
      says, or a score that is not finite.
  """
  path = path.rstrip('/')
  index_path = os.path.join(path, INDEX)
  if not tf.io.gfile.exists(index_path):
    raise ValueError(f'{flag}: {path} is not a stored-predictions directory '
                     f'({index_path} does not exist; `predict '
                     '--output_probabilities` writes one).')
  with tf.io.gfile.GFile(index_path) as f:
    try:
      index = json.load(f)
    except json.JSONDecodeError as e:
      raise ValueError(f'{flag}: {index_path} is not JSON: {e}') from e
  if index.get('format') != FORMAT or index.get('version') != VERSION:
    raise ValueError(f'{flag}: {index_path} holds format '
                     f'{index.get("format")!r} version '
                     f'{index.get("version")!r}; expected {FORMAT!r} '
                     f'version {VERSION}.')
  level = index['level']
  class_ids = np.asarray(index['class_ids'], np.int64)
  parts: Dict[str, List[np.ndarray]] = {}
  offset = 0
  for shard in index['shards']:
    shard_path = os.path.join(path, shard['file'])
    if not tf.io.gfile.exists(shard_path):
      raise ValueError(f'{flag}: {shard_path} is missing ({index_path} '
                       'lists it).')
    with tf.io.gfile.GFile(shard_path, 'rb') as f:
      buffer = io.BytesIO(f.read())
    try:
      with np.load(buffer) as data:
        arrays = {k: data[k] for k in data.files}
    except (ValueError, OSError, EOFError, zipfile.BadZipFile) as e:
      raise ValueError(f'{flag}: {shard_path} cannot be read: {e}') from e
    probabilities = arrays.get('probabilities')
    expected = (shard['rows'], class_ids.size)
    if probabilities is None or probabilities.shape != expected:
      raise ValueError(
          f'{flag}: {shard_path}: probabilities of shape '
          f'{None if probabilities is None else probabilities.shape}; '
          f'{index_path} says {expected}.')
    if not np.isfinite(probabilities).all():
      row = int(np.flatnonzero(~np.isfinite(probabilities).all(axis=1))[0])
      raise ValueError(f'{flag}: {shard_path}: a score of row {row} (video '
                       f'{arrays["video_ids"][row]!r}) is not finite.')
    if 'label_offsets' in arrays:
      arrays['label_offsets'] = arrays['label_offsets'][:-1] + offset
      offset += len(arrays['label_ids'])
    for key, value in arrays.items():
      parts.setdefault(key, []).append(value)
  if not parts:
    raise ValueError(f'{flag}: {path} holds no rows.')
  joined = {k: np.concatenate(v) for k, v in parts.items()}
  offsets = None
  if 'label_offsets' in joined:
    offsets = np.concatenate([joined['label_offsets'], [offset]])
  return StoredPredictions(
      path=path, level=level, num_classes=int(index['num_classes']),
      class_ids=class_ids, segment_size=index.get('segment_size'),
      video_ids=joined['video_ids'],
      segment_start_times=joined.get('segment_start_times'),
      probabilities=joined['probabilities'], label_offsets=offsets,
      label_ids=joined.get('label_ids'),
      has_labels=bool(index['has_labels']), source=index.get('source', {}))
