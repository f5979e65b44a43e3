"""Bad input in TFRecord readers: detect, fail naming it, or skip and count.

Shared by the families' readers (YT8M, AssembleNet, readout). Three layers:

* `file_sizes` (when the dataset is built): one `tf.io.gfile.stat` per
  matched file, in a thread pool. A path that cannot be a TFRecord file (a
  broken symlink, a directory matched by the glob) is a ValueError naming it,
  in both modes: it is a mistake in `input_path`, not damaged data. A
  zero-byte file is legal (an empty shard): it contributes no records, and is
  logged (absl INFO) by name.
* `make_file_reader` (per file): detects truncated or corrupted TFRecord
  files. TensorFlow's reader reports `DataLossError: corrupted record at 140`
  without the file's name, and silently treats a tail shorter than a record
  header as the end of the file. Each file is therefore read through
  `ignore_errors()` (TF's reader then stops at the first unreadable record of
  that file), the bytes of the records it did read are counted (a record takes
  `16 + len(data)` bytes on disk) and, at the end of the file, compared with
  its size. A mismatch means the file is damaged: strict mode fails with an
  error naming the file and the byte offset where its readable records end;
  skip mode keeps every record before the damage, reads on past it with
  `recover_records` (a record whose payload CRC fails is skipped by its
  CRC-checked length; after a damaged length the next valid header is found
  by scanning), so only the damaged bytes are lost, and logs and counts it
  (`BadFileEvent`). Any read error of a file (not only
  a bad CRC: also a permission or network error) ends in this check.
* `wrap_stage` (per record, skip mode only): a decode/parse function whose
  checks fail for one record (a record that is not a valid proto, a feature
  of the wrong width or dtype, a label out of range, a NaN) drops that record
  only: every other record of the file is kept. The record's file and the
  error text (which names the feature/record, re-computed for the log) are
  logged and counted (`BadRecordEvent`). In strict mode the same checks fail
  the pipeline with that error text.

Counting: every skip is added to a `BadRecordLog`; `BadRecordsSkipped` is a
tf_keras metric whose value is that count, so a task that adds it to its
`build_metrics` reports `bad_records_skipped` in its train and validation
logs, which Orbit writes to the TensorBoard summaries. Skip mode reports
through `tf.py_function`, so a skip-mode pipeline cannot be serialized (tf.data
service); strict mode is pure graph.
"""
import concurrent.futures
import dataclasses
import os
import threading
from typing import Any, Callable, Dict, List, Optional, Sequence

from absl import logging
import numpy as np
import tensorflow as tf, tf_keras

from official_ext.core import graph_checks

# On-disk bytes around each TFRecord payload: uint64 length, uint32 masked CRC
# of the length, payload, uint32 masked CRC of the payload.
TFRECORD_FRAMING_BYTES = 16


# ---------------------------------------------------------------------------
# The log.
# ---------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class BadFileEvent:
  """One damaged file met in skip mode.

  Attributes:
    filename: the TFRecord file.
    good_records: records read before the damage.
    valid_bytes: bytes of those records; the damage starts at this offset.
    file_size: the file's size in bytes.
    recovered_records: good records found after the damage (skip mode reads
      on past it, see `recover_records`).
    recovered_bytes: their bytes on disk; `file_size - valid_bytes -
      recovered_bytes` were skipped (at least the damaged record).
  """
  filename: str
  good_records: int
  valid_bytes: int
  file_size: int
  recovered_records: int = 0
  recovered_bytes: int = 0


@dataclasses.dataclass(frozen=True)
class BadRecordEvent:
  """One readable but invalid record skipped in skip mode.

  Attributes:
    filename: its TFRecord file.
    reason: the error its decoding/validation raised (names the feature,
      record id or label at fault).
  """
  filename: str
  reason: str


class BadRecordLog:
  """Thread-safe count of data skipped with `skip_bad_records=True`.

  A damaged file counts once per pass over it, a bad record once per pass (a
  repeated training dataset counts them every epoch).
  """

  def __init__(self):
    self._lock = threading.Lock()
    self._events: List[BadFileEvent] = []
    self._record_events: List[BadRecordEvent] = []

  def add(self, event: BadFileEvent) -> None:
    with self._lock:
      self._events.append(event)

  def add_record(self, event: BadRecordEvent) -> None:
    with self._lock:
      self._record_events.append(event)

  def reset(self) -> None:
    with self._lock:
      self._events = []
      self._record_events = []

  @property
  def events(self) -> List[BadFileEvent]:
    """Damaged files (their damaged bytes were skipped)."""
    with self._lock:
      return list(self._events)

  @property
  def record_events(self) -> List[BadRecordEvent]:
    """Invalid records skipped one by one."""
    with self._lock:
      return list(self._record_events)

  @property
  def num_bad_records(self) -> int:
    """Records skipped: one per damaged file pass (its damaged bytes are
    skipped with it, see `skipped_bytes`) plus each invalid record."""
    with self._lock:
      return len(self._events) + len(self._record_events)

  @property
  def skipped_bytes(self) -> int:
    """Bytes of damaged files that could not be read."""
    return sum(e.file_size - e.valid_bytes - e.recovered_bytes
               for e in self.events)

  @property
  def bad_files(self) -> List[str]:
    """Files with a damaged tail or an invalid record, sorted."""
    return sorted({e.filename for e in self.events} |
                  {e.filename for e in self.record_events})


_DEFAULT_BAD_RECORD_LOG = BadRecordLog()


def bad_record_log() -> BadRecordLog:
  """The process-wide log used when a reader gets none."""
  return _DEFAULT_BAD_RECORD_LOG


class BadRecordsSkipped(tf_keras.metrics.Metric):
  """A metric whose value is `log.num_bad_records` (float32 scalar).

  Named `bad_records_skipped`: in a task's `build_metrics` it puts the count of
  records skipped so far by this process's reader of the split into the train
  / validation logs and their TensorBoard summaries. It counts over the whole
  run (resetting the metric does not reset the count); under several workers
  each worker counts its own reader (the chief writes the summaries).
  `update_state` ignores its arguments. The value is read from python: Model
  Garden's trainer reads it eagerly at the end of each train / eval loop (the
  summaries); a `result()` inside a traced step holds the count at tracing.
  """

  def __init__(self, log: BadRecordLog, name: str = 'bad_records_skipped'):
    super().__init__(name=name, dtype=tf.float32)
    self._log = log

  def update_state(self, *args, **kwargs):
    del args, kwargs
    return tf.no_op()

  def result(self):
    return tf.constant(float(self._log.num_bad_records), tf.float32)

  def reset_state(self):
    pass


# ---------------------------------------------------------------------------
# Files.
# ---------------------------------------------------------------------------


def file_sizes(files: Sequence[str]) -> List[int]:
  """Sizes in bytes of `files` (threaded stat calls).

  Raises:
    ValueError: naming a path that does not exist (e.g. a broken symlink
      matched by a glob) or is a directory.
  """

  def stat(path):
    try:
      info = tf.io.gfile.stat(path)
    except tf.errors.NotFoundError as e:
      link = ''
      if os.path.islink(path):
        link = f' (a broken symlink to {os.readlink(path)!r})'
      raise ValueError(f"DataConfig.input_path: file '{path}' does not exist"
                       f'{link}; expected a readable TFRecord file.') from e
    if info.is_directory:
      raise ValueError(f"DataConfig.input_path: '{path}' is a directory; "
                       'expected TFRecord files.')
    return int(info.length)

  if len(files) <= 1:
    sizes = [stat(f) for f in files]
  else:
    with concurrent.futures.ThreadPoolExecutor(min(32, len(files))) as pool:
      sizes = list(pool.map(stat, files))
  empty = [f for f, s in zip(files, sizes) if s == 0]
  if empty:
    logging.info('DataConfig.input_path: %d empty (zero-byte) file(s) '
                 'contribute no records: %s', len(empty), ', '.join(empty))
  return sizes


def _crc32c_table() -> List[int]:
  table = []
  for byte in range(256):
    crc = byte
    for _ in range(8):
      crc = (crc >> 1) ^ (0x82F63B78 if crc & 1 else 0)
    table.append(crc)
  return table


_CRC32C_TABLE = _crc32c_table()


def masked_crc32c(data: bytes) -> int:
  """The masked CRC-32C that TFRecord framing stores (pure python)."""
  crc = 0xFFFFFFFF
  table = _CRC32C_TABLE
  for byte in data:
    crc = table[(crc ^ byte) & 0xFF] ^ (crc >> 8)
  crc ^= 0xFFFFFFFF
  return ((((crc >> 15) | (crc << 17)) & 0xFFFFFFFF) + 0xA282EAD8) & 0xFFFFFFFF


def recover_records(path: str, offset: int) -> List[bytes]:
  """The intact records of a damaged TFRecord file after byte `offset`.

  TensorFlow's reader stops at the first record it cannot read. From there,
  this walks the framing itself (uint64 length, masked CRC of the length,
  payload, masked CRC of the payload): a record whose payload CRC fails is
  skipped using its (CRC-checked) length; where the length itself is damaged
  it scans forward byte by byte to the next offset whose 8 bytes match the
  CRC that follows them (a false match has probability 2^-32). A tail too
  short for its record is the truncated end. Pure python: about 10 MB/s of
  payload, paid only for damaged files in skip mode.

  Args:
    path: the file.
    offset: where TensorFlow's reader stopped (its readable records' bytes).

  Returns:
    The payloads of the intact records after `offset`, in file order.
  """
  with tf.io.gfile.GFile(path, 'rb') as f:
    f.seek(offset)
    buf = f.read()
  n, o, out = len(buf), 0, []
  while o + 12 <= n:
    header = buf[o:o + 8]
    if masked_crc32c(header) != int.from_bytes(buf[o + 8:o + 12], 'little'):
      o += 1  # Not a record start: resynchronise.
      continue
    length = int.from_bytes(header, 'little')
    end = o + 12 + length + 4
    if end > n:
      break  # The truncated last record.
    payload = buf[o + 12:o + 12 + length]
    if masked_crc32c(payload) == int.from_bytes(buf[end - 4:end], 'little'):
      out.append(payload)
    o = end
  return out


def make_file_reader(
    files: Sequence[str],
    sizes: Sequence[int],
    skip_bad_records: bool,
    log: Optional[BadRecordLog] = None,
) -> Callable[[Any], tf.data.Dataset]:
  """Returns `dataset_fn(file or files) -> Dataset of (file name, record)`.

  See the module docstring. Strict mode fails with an InvalidArgumentError
  whose text starts "Corrupted or truncated TFRecord file `<file>`"; skip mode
  keeps the records before the damage and reports a `BadFileEvent` to `log`.

  Args:
    files: every file the reader may be given.
    sizes: their sizes in bytes (`file_sizes`).
    skip_bad_records: skip (True) or fail on (False) damaged files.
    log: where skip mode reports (default: `bad_record_log()`).

  Returns:
    A function of a string scalar tensor (one file) or a python list of files
    (InputReader passes both) returning a Dataset of (string scalar file name,
    string scalar serialized record) pairs.
  """
  log = log or bad_record_log()
  files_t = tf.constant(list(files), tf.string)
  sizes_t = tf.constant(list(sizes), tf.int64)

  def report(filename, good, valid, size):
    name = filename.numpy().decode('utf-8', 'replace')
    recovered = recover_records(name, int(valid))
    event = BadFileEvent(
        name, int(good), int(valid), int(size), len(recovered),
        sum(len(r) + TFRECORD_FRAMING_BYTES for r in recovered))
    log.add(event)
    logging.warning(
        'skip_bad_records: TFRecord file %s is corrupted or truncated at byte '
        '%d of %d; kept the %d records before it and the %d intact records '
        'after it, and skipped %d bytes.', event.filename, event.valid_bytes,
        event.file_size, event.good_records, event.recovered_records,
        event.file_size - event.valid_bytes - event.recovered_bytes)
    return np.asarray(recovered, dtype=object).reshape([-1])

  def read_one(filename: tf.Tensor) -> tf.data.Dataset:
    match = tf.equal(files_t, filename)
    file_size = tf.reduce_sum(tf.where(match, sizes_t, 0))
    records = tf.data.TFRecordDataset(filename).ignore_errors(log_warning=True)
    records = records.map(lambda r: (r, tf.constant(False)))
    end = tf.data.Dataset.from_tensors((tf.constant(''), tf.constant(True)))

    def scan_fn(state, element):
      valid_bytes, count = state
      record, is_end = element
      record_bytes = tf.cast(tf.strings.length(record),
                             tf.int64) + TFRECORD_FRAMING_BYTES
      valid_bytes += tf.where(is_end, tf.constant(0, tf.int64), record_bytes)
      count += tf.where(is_end, tf.constant(0, tf.int64), 1)
      damaged = tf.logical_and(is_end, tf.not_equal(valid_bytes, file_size))
      if skip_bad_records:
        # At the end of a damaged file: the intact records after the damage.
        def recovered():
          out = tf.py_function(
              report, [filename, count, valid_bytes, file_size], tf.string)
          out.set_shape([None])
          return out

        extra = tf.cond(damaged, recovered, lambda: tf.zeros([0], tf.string))
        return (valid_bytes, count), (record, is_end, extra)
      check = graph_checks.require(
          tf.logical_not(damaged), lambda: graph_checks.join(
              'Corrupted or truncated TFRecord file `', filename,
              '`: its records are readable only up to byte ', valid_bytes,
              ' of ', file_size, ' (', count, ' good records before it). '
              'Re-copy or regenerate the file, or set '
              'DataConfig.skip_bad_records=True to skip only the damaged '
              'records.'))
      with tf.control_dependencies([check]):
        is_end = tf.identity(is_end)
      return (valid_bytes, count), (record, is_end)

    initial = (tf.constant(0, tf.int64), tf.constant(0, tf.int64))
    ds = records.concatenate(end).scan(initial, scan_fn)
    if skip_bad_records:
      # One record per element, or at the end the recovered ones (one small
      # dataset per record: skip mode only; strict mode stays filter + map).
      ds = ds.flat_map(lambda record, is_end, extra: (
          tf.data.Dataset.from_tensor_slices(tf.cond(
              is_end, lambda: extra, lambda: tf.reshape(record, [1])))))
      return ds.map(lambda record: (filename, record))
    ds = ds.filter(lambda record, is_end: tf.logical_not(is_end))
    return ds.map(lambda record, is_end: (filename, record))

  def dataset_fn(file_or_files) -> tf.data.Dataset:
    if isinstance(file_or_files, (list, tuple)):
      return tf.data.Dataset.from_tensor_slices(list(file_or_files)).flat_map(
          read_one)
    return read_one(file_or_files)

  return dataset_fn


# ---------------------------------------------------------------------------
# Records: skip one invalid record, keep the rest.
# ---------------------------------------------------------------------------


def _empty_like(spec) -> Any:
  if not isinstance(spec, tf.TensorSpec):
    raise TypeError(f'skip_bad_records needs dense tensors; got {spec}.')
  return tf.zeros([0 if d is None else d for d in spec.shape], spec.dtype)


def _error_text(e: Exception) -> str:
  text = getattr(e, 'message', None) or str(e)
  # Keep TensorFlow's message, not the traceback of where the op was built.
  lines = [l for l in text.splitlines() if l.strip() and not l.startswith(
      ('  File ', '\t [[', 'Detected at node', 'Graph execution error'))]
  return ' '.join(lines).strip()


def wrap_stage(fn: Callable[..., Any], source_fn: Callable[..., tf.Tensor],
               log: BadRecordLog, stage: str) -> Callable[..., Any]:
  """Skip mode: `fn` (one element -> one output) -> element -> (output, ok).

  `ok` is False when `fn` failed for this element; the output is then empty
  (zero-size tensors of the output's structure) and must be dropped with
  `filter_ok`. The failure is logged (absl WARNING: file, stage, error text)
  and added to `log` as a `BadRecordEvent`. To get the error text the failing
  element is run through `fn` once more, eagerly (a failure that depends on
  randomness, e.g. a corrupt frame that a random window met, may not repeat:
  it is then logged as such).

  Args:
    fn: the stage's map function (decoder or parser); its outputs must be
      dense tensors.
    source_fn: maps the stage's arguments to its file name (string scalar).
    log: where skips are counted.
    stage: 'decode' or 'parse', for the log.
  """

  def wrapped(*args):
    inner = tf.data.Dataset.from_tensors(args).map(lambda *a: fn(*a))
    inner = inner.ignore_errors()
    empty = tf.nest.map_structure(_empty_like, inner.element_spec)
    inner = inner.map(lambda *out: (out[0] if len(out) == 1 else out,
                                    tf.constant(True)))
    fallback = tf.data.Dataset.from_tensors((empty, tf.constant(False)))
    out, ok = inner.concatenate(fallback).take(1).get_single_element()
    flat_args = tf.nest.flatten(args)
    structure = args

    def report(source, *flat):
      filename = source.numpy().decode('utf-8', 'replace')
      try:
        fn(*tf.nest.pack_sequence_as(structure, list(flat)))
        reason = ('failed in the pipeline but not when repeated (a check that '
                  'depends on random sampling)')
      except Exception as e:  # pylint: disable=broad-except
        reason = _error_text(e)
      log.add_record(BadRecordEvent(filename, reason))
      logging.warning('skip_bad_records: skipped a record of file %s (%s): %s',
                      filename, stage, reason)
      return np.int64(0)

    done = tf.cond(
        ok, lambda: tf.constant(0, tf.int64),
        lambda: tf.py_function(report, [source_fn(*args)] + flat_args,
                               tf.int64))
    with tf.control_dependencies([done]):
      ok = tf.identity(ok)
    return out, ok

  return wrapped


def filter_ok(ds: tf.data.Dataset) -> tf.data.Dataset:
  """Drops the elements `wrap_stage` marked failed and unwraps the rest."""
  return ds.filter(lambda out, ok: ok).map(lambda out, ok: out)


def reader_kwargs(skip_bad_records: bool,
                  log: Optional[BadRecordLog],
                  decoder_fn: Callable[..., Any],
                  parser_fn: Optional[Callable[..., Any]] = None,
                  sample_fn: Optional[Callable[[tf.data.Dataset],
                                               tf.data.Dataset]] = None,
                  transform_and_batch_fn: Optional[Callable[..., Any]] = None,
                  global_batch_size: Optional[int] = None,
                  drop_remainder: bool = False,
                  decoder_source_fn: Optional[Callable[..., tf.Tensor]] = None,
                  parser_source_fn: Optional[Callable[..., tf.Tensor]] = None,
                  ) -> Dict[str, Any]:
  """The `InputReader` stage functions, wrapped for skip mode.

  Strict mode returns them unchanged. Skip mode wraps `decoder_fn` (and
  `parser_fn`) with `wrap_stage`, drops the failed elements after each stage
  (before `sample_fn`; in `transform_and_batch_fn` before batching) and
  passes everything else through. The decoder's arguments are InputReader's
  elements (file name, record); the parser's, the decoded element.

  Args:
    skip_bad_records: the DataConfig field.
    log: where skips are counted (default `bad_record_log()`).
    decoder_fn, parser_fn, sample_fn, transform_and_batch_fn: as for
      `official.core.input_reader.InputReader`.
    global_batch_size, drop_remainder: used when `transform_and_batch_fn` is
      None (InputReader's default batching).
    decoder_source_fn: decoder arguments -> file name (default: the first).
    parser_source_fn: parser arguments -> file name (default: the first
      argument's `source` entry).

  Returns:
    kwargs for `InputReader`: decoder_fn, parser_fn, sample_fn,
    transform_and_batch_fn.
  """
  if not skip_bad_records:
    return dict(decoder_fn=decoder_fn, parser_fn=parser_fn,
                sample_fn=sample_fn,
                transform_and_batch_fn=transform_and_batch_fn)
  log = log or bad_record_log()
  decoder_source_fn = decoder_source_fn or (lambda *a: a[0])
  parser_source_fn = parser_source_fn or (lambda *a: a[0]['source'])

  def new_sample_fn(ds):
    ds = filter_ok(ds)
    return sample_fn(ds) if sample_fn is not None else ds

  def new_transform_and_batch_fn(ds, context):
    if parser_fn is not None:
      ds = filter_ok(ds)
    if transform_and_batch_fn is not None:
      return transform_and_batch_fn(ds, context)
    batch_size = (context.get_per_replica_batch_size(global_batch_size)
                  if context else global_batch_size)
    return ds.batch(batch_size, drop_remainder=drop_remainder)

  return dict(
      decoder_fn=wrap_stage(decoder_fn, decoder_source_fn, log, 'decode'),
      parser_fn=(wrap_stage(parser_fn, parser_source_fn, log, 'parse')
                 if parser_fn is not None else None),
      sample_fn=new_sample_fn,
      transform_and_batch_fn=new_transform_and_batch_fn)


def task_log(task: Any, is_training: bool) -> BadRecordLog:
  """The `BadRecordLog` of a task's train or validation reader (one each per
  task object, created on first use)."""
  logs = task.__dict__.setdefault('_bad_record_logs', {})
  return logs.setdefault(bool(is_training), BadRecordLog())


def task_metrics(task: Any, data_config: Any, training: bool) -> List[Any]:
  """`[BadRecordsSkipped]` for a task's `build_metrics` when the split's
  `data_config.skip_bad_records` is on, else `[]`."""
  if data_config is None or not getattr(data_config, 'skip_bad_records',
                                        False):
    return []
  return [BadRecordsSkipped(task_log(task, training))]
