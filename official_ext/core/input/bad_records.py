"""Bad input in TFRecord readers: fail naming it, or skip and count it
(docs/bad_input.md)."""
import dataclasses
import threading
from typing import Any, Callable, List, Optional, Sequence, Tuple

from absl import logging
import numpy as np
import tensorflow as tf, tf_keras

from official_ext.core.input import eval_padding
from official_ext.core.input import graph_checks
from official_ext.core.input import tfrecord_recovery


# ---------------------------------------------------------------------------
# The log.
# ---------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class BadFileEvent:
  """One damaged file met in skip mode: the records and bytes read before the
  damage (`valid_bytes`: its offset), the file's size, and the records and bytes
  recovered after it."""
  filename: str
  good_records: int
  valid_bytes: int
  file_size: int
  recovered_records: int = 0
  recovered_bytes: int = 0


@dataclasses.dataclass(frozen=True)
class BadRecordEvent:
  """An invalid record skipped: its `filename` and the `reason`."""
  filename: str
  reason: str


# Skips in a row, without one example between them, that stop a reader: its
# input cannot yield an example (e.g. every record of another format), and a
# repeated training input would skip for ever.
MAX_SKIPPED_IN_A_ROW = 1000


class NoGoodRecordError(ValueError):
  """`MAX_SKIPPED_IN_A_ROW` records were skipped without one example."""


class BadRecordLog:
  """Thread-safe count of data skipped with `skip_bad_records=True`.

  `max_in_a_row` skips without an example raise `NoGoodRecordError`.
  """

  def __init__(self, max_in_a_row: int = MAX_SKIPPED_IN_A_ROW):
    self._lock = threading.Lock()
    self._events: List[BadFileEvent] = []
    self._record_events: List[BadRecordEvent] = []
    self._max_in_a_row = max_in_a_row
    self._in_a_row: List[str] = []  # The files of the current run of skips.
    # This pass (`begin_pass`): its examples, and the files of its skips.
    self._pass_examples = 0
    self._pass_skipped: List[str] = []

  def _skipped(self, filename: str, reason: str) -> None:
    self._in_a_row.append(filename)
    self._pass_skipped.append(filename)
    if len(self._in_a_row) >= self._max_in_a_row:
      files = sorted(set(self._in_a_row))
      raise NoGoodRecordError(
          f'skip_bad_records: {self._max_in_a_row} records in a row were '
          'skipped without one example (bad_records.MAX_SKIPPED_IN_A_ROW), '
          f'from {len(files)} file(s): {", ".join(files)}. The last: '
          f'{reason}. The input yields no example; check its path and '
          'format (the family, the features), or regenerate the files.')

  def add(self, event: BadFileEvent) -> None:
    with self._lock:
      self._events.append(event)
      self._skipped(event.filename, f'{event.filename} is damaged at byte '
                    f'{event.valid_bytes} of {event.file_size}')

  def add_record(self, event: BadRecordEvent) -> None:
    with self._lock:
      self._record_events.append(event)
      self._skipped(event.filename, event.reason)

  def example_passed(self) -> None:
    """A record became an example: the run of skips ends."""
    with self._lock:
      self._in_a_row = []
      self._pass_examples += 1

  def begin_pass(self) -> None:
    """A pass over the input starts (see `end_pass`)."""
    with self._lock:
      self._pass_examples = 0
      self._pass_skipped = []

  def end_pass(self) -> None:
    """A pass over the input ended: raises `NoGoodRecordError` naming the
    files when it skipped records and yielded no example."""
    with self._lock:
      if self._pass_examples or not self._pass_skipped:
        return
      files = sorted(set(self._pass_skipped))
      raise NoGoodRecordError(
          'skip_bad_records: a pass over the input ended with no example: '
          f'it skipped {len(self._pass_skipped)} record(s) or damaged '
          'file(s) and kept none (fewer than bad_records.'
          f'MAX_SKIPPED_IN_A_ROW = {self._max_in_a_row} in a row), from '
          f'{len(files)} file(s): {", ".join(files)}. They hold no readable '
          'or valid record; check the path and format (the family, the '
          'features), or regenerate the files.')

  def reset(self) -> None:
    with self._lock:
      self._events = []
      self._record_events = []
      self._in_a_row = []
      self._pass_examples = 0
      self._pass_skipped = []

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
    """Records skipped: one per damaged file pass, one per invalid record."""
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
  """Metric `bad_records_skipped`: the run's `log.num_bad_records` so far."""

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
# Files: detect damage; fail naming the file, or skip only the damaged bytes.
# ---------------------------------------------------------------------------


def make_file_reader(
    files: Sequence[str],
    sizes: Sequence[int],
    skip_bad_records: bool,
    log: Optional[BadRecordLog] = None,
) -> Callable[[Any], tf.data.Dataset]:
  """`dataset_fn(file or files)` -> Dataset of (file name, record).

  A damaged file fails naming it (strict), or its intact records are kept and it
  is reported to `log` (skip mode); `sizes` are the `files`' sizes.
  """
  log = log or bad_record_log()
  files_t = tf.constant(list(files), tf.string)
  sizes_t = tf.constant(list(sizes), tf.int64)

  def read_one(filename: tf.Tensor) -> tf.data.Dataset:
    file_size = tf.reduce_sum(
        tf.where(tf.equal(files_t, filename), sizes_t, 0))
    if skip_bad_records:
      return _read_skipping_damage(filename, file_size, log)
    return _read_failing_on_damage(filename, file_size)

  def dataset_fn(file_or_files) -> tf.data.Dataset:
    if isinstance(file_or_files, (list, tuple)):
      return tf.data.Dataset.from_tensor_slices(list(file_or_files)).flat_map(
          read_one)
    return read_one(file_or_files)

  return dataset_fn


def _records_then_end(filename: tf.Tensor) -> tf.data.Dataset:
  records = tf.data.TFRecordDataset(filename).ignore_errors(log_warning=True)
  records = records.map(lambda r: (r, tf.constant(False)))
  end = tf.data.Dataset.from_tensors((tf.constant(''), tf.constant(True)))
  return records.concatenate(end)


def _initial_counts() -> Tuple[tf.Tensor, tf.Tensor]:
  return tf.constant(0, tf.int64), tf.constant(0, tf.int64)


def _count_record(state: Tuple[tf.Tensor, tf.Tensor], record: tf.Tensor,
                  is_end: tf.Tensor, file_size: tf.Tensor
                  ) -> Tuple[Tuple[tf.Tensor, tf.Tensor], tf.Tensor]:
  """A `scan` step: ((valid bytes, records), damaged at the end)."""
  valid_bytes, count = state
  record_bytes = tf.cast(tf.strings.length(record), tf.int64) + (
      tfrecord_recovery.TFRECORD_FRAMING_BYTES)
  zero = tf.constant(0, tf.int64)
  valid_bytes += tf.where(is_end, zero, record_bytes)
  count += tf.where(is_end, zero, tf.constant(1, tf.int64))
  damaged = tf.logical_and(is_end, tf.not_equal(valid_bytes, file_size))
  return (valid_bytes, count), damaged


def _read_failing_on_damage(filename: tf.Tensor,
                            file_size: tf.Tensor) -> tf.data.Dataset:
  """Strict mode: the pairs; a damaged file fails naming it."""

  def scan_fn(state, element):
    record, is_end = element
    (valid_bytes, count), damaged = _count_record(state, record, is_end,
                                                  file_size)
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

  ds = _records_then_end(filename).scan(_initial_counts(), scan_fn)
  ds = ds.filter(lambda record, is_end: tf.logical_not(is_end))
  return ds.map(lambda record, is_end: (filename, record))


def _report_damaged_file(log: BadRecordLog, filename: tf.Tensor,
                         good: tf.Tensor, valid: tf.Tensor,
                         size: tf.Tensor) -> np.ndarray:
  """Skip mode (`py_function`): reports the file; the recovered payloads."""
  name = filename.numpy().decode('utf-8', 'replace')
  recovered = tfrecord_recovery.recover_records(name, int(valid))
  event = BadFileEvent(
      name, int(good), int(valid), int(size), len(recovered),
      sum(len(r) + tfrecord_recovery.TFRECORD_FRAMING_BYTES
          for r in recovered))
  log.add(event)  # Raises NoGoodRecordError at the limit.
  logging.warning(
      'skip_bad_records: TFRecord file %s is corrupted or truncated at byte '
      '%d of %d; kept the %d records before it and the %d intact records '
      'after it, and skipped %d bytes.', event.filename, event.valid_bytes,
      event.file_size, event.good_records, event.recovered_records,
      event.file_size - event.valid_bytes - event.recovered_bytes)
  return np.asarray(recovered, dtype=object).reshape([-1])


def _read_skipping_damage(filename: tf.Tensor, file_size: tf.Tensor,
                          log: BadRecordLog) -> tf.data.Dataset:
  """Skip mode: the pairs of every intact record."""

  def recovered(count, valid_bytes):
    out = tf.py_function(
        lambda *args: _report_damaged_file(log, *args),
        [filename, count, valid_bytes, file_size], tf.string)
    out.set_shape([None])
    return out

  def scan_fn(state, element):
    record, is_end = element
    (valid_bytes, count), damaged = _count_record(state, record, is_end,
                                                  file_size)
    # At the end of a damaged file: the intact records after the damage.
    extra = tf.cond(damaged, lambda: recovered(count, valid_bytes),
                    lambda: tf.zeros([0], tf.string))
    return (valid_bytes, count), (record, is_end, extra)

  ds = _records_then_end(filename).scan(_initial_counts(), scan_fn)
  # One record per element, or at the end the recovered ones (one small
  # dataset per record: skip mode only; strict mode stays filter + map).
  ds = ds.flat_map(lambda record, is_end, extra: (
      tf.data.Dataset.from_tensor_slices(tf.cond(
          is_end, lambda: extra, lambda: tf.reshape(record, [1])))))
  return ds.map(lambda record: (filename, record))


# ---------------------------------------------------------------------------
# Records: skip one invalid record, keep the rest.
# ---------------------------------------------------------------------------


def _error_text(e: Exception) -> str:
  text = getattr(e, 'message', None) or str(e)
  # Keep TensorFlow's message, not the traceback of where the op was built.
  lines = [l for l in text.splitlines() if l.strip() and not l.startswith(
      ('  File ', '\t [[', 'Detected at node', 'Graph execution error'))]
  return ' '.join(lines).strip()


def wrap_stage(fn: Callable[..., Any], source_fn: Callable[..., tf.Tensor],
               log: BadRecordLog, stage: str,
               last: bool = True) -> Callable[..., Any]:
  """Skip mode: `fn` -> element -> (output, ok); drop the failed with
  `filter_ok`.

  A failure is logged (its file from `source_fn`, `stage`, the error) and
  counted in `log`; `last`: passing makes an example. Raises `NoGoodRecordError`
  at `MAX_SKIPPED_IN_A_ROW` skips in a row.
  """

  def wrapped(*args):
    inner = tf.data.Dataset.from_tensors(args).map(lambda *a: fn(*a))
    inner = inner.ignore_errors()
    empty = tf.nest.map_structure(
        lambda spec: eval_padding.empty_like(spec, 'skip_bad_records'),
        inner.element_spec)
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
      logging.warning('skip_bad_records: skipped a record of file %s (%s): %s',
                      filename, stage, reason)
      log.add_record(BadRecordEvent(filename, reason))  # May raise.
      return np.int64(0)

    def passed():
      log.example_passed()
      return np.int64(0)

    done = tf.cond(
        ok, lambda: (tf.py_function(passed, [], tf.int64) if last else
                     tf.constant(0, tf.int64)),
        lambda: tf.py_function(report, [source_fn(*args)] + flat_args,
                               tf.int64))
    with tf.control_dependencies([done]):
      ok = tf.identity(ok)
    return out, ok

  return wrapped


def filter_ok(ds: tf.data.Dataset) -> tf.data.Dataset:
  """Drops the elements `wrap_stage` marked failed and unwraps the rest."""
  return ds.filter(lambda out, ok: ok).map(lambda out, ok: out)


def fail_on_a_pass_without_example(ds: tf.data.Dataset,
                                   log: BadRecordLog) -> tf.data.Dataset:
  """Skip mode: `ds` (the examples after the last `wrap_stage`, failed ones
  dropped) between `log.begin_pass` and `log.end_pass`, so a pass that
  skipped records and yielded no example raises `NoGoodRecordError` (a
  TensorFlow error carrying its message) instead of ending empty. A repeated
  input whose passes never end meets `MAX_SKIPPED_IN_A_ROW` instead."""

  def call(fn):
    def marker(unused):
      done = tf.py_function(lambda: (fn(), np.int64(0))[1], [], tf.int64)
      with tf.control_dependencies([done]):
        return ds.take(0)  # Nothing: only the call.
    return tf.data.Dataset.range(1).flat_map(marker)

  return call(log.begin_pass).concatenate(ds).concatenate(call(log.end_pass))


# ---------------------------------------------------------------------------
# Per task.
# ---------------------------------------------------------------------------


def log_for_split(task: Any, is_training: bool) -> BadRecordLog:
  """The `BadRecordLog` of a task's train or validation reader."""
  logs = task.__dict__.setdefault('_bad_record_logs', {})
  return logs.setdefault(bool(is_training), BadRecordLog())


def task_metrics(task: Any, data_config: Any, training: bool) -> List[Any]:
  """`[BadRecordsSkipped]` when the split skips bad records, else `[]`."""
  if data_config is None or not getattr(data_config, 'skip_bad_records',
                                        False):
    return []
  return [BadRecordsSkipped(log_for_split(task, training))]
