"""The bad-input catalogue (docs/bad_input.md), for every family's reader.

Each bad input either fails with an error naming the file (and the feature /
record), or, with `DataConfig.skip_bad_records=True`, is skipped, logged and
counted in a `BadRecordLog` (the task reports it as `bad_records_skipped`),
and the examples read are counted against the good records written: no good
record is lost, except what TFRecord framing cannot reach (the rest of a file
after a damaged record), which is asserted exactly.

NaN: only the readout records (float tokens and targets) and YT8M float32
features can hold a NaN. YT8M's default features are quantized uint8 bytes and
AssembleNet's frames are JPEG strings: neither can encode a NaN, so there is
no NaN case for them.
"""
import os
import re
import threading
import types

import numpy as np
import pytest
import tensorflow as tf

from official.modeling import hyperparams
from official_ext.assemblenet import configs as anet_configs
from official_ext.assemblenet import dataloader as anet_dataloader
from official_ext.core.input import bad_records
from official_ext.readout import configs as readout_configs
from official_ext.readout import dataloader as readout_dataloader
from official_ext import train
from official_ext.yt8m import configs as yt8m_configs
from official_ext.yt8m import dataloader as yt8m_dataloader
from official_ext.yt8m import demo_data as yt8m_demo

GARBAGE = b'\x0a\xff\xff this is not a protocol buffer'
UNDECODABLE = r'Invalid protocol message input, example id: {file}'


class Yt8m:
  """Quantized uint8 rgb (8) / audio (4) bytes, 5 classes."""
  kinds = {
      'undecodable': UNDECODABLE,
      'wrong_width': r'Feature `audio` of video `bad` in file `{file}`: frame '
                     r'0 has 5 bytes, expected 4',
      'wrong_dtype': r'Name: {file}, Context feature: labels\.\s+Data types '
                     r"don't match",
      'label': r'Label id 9 in context feature `labels` of video `bad` in '
               r'file `{file}`.*num_classes = 5',
  }

  def _record(self, vid, label=(1,), audio_width=4):
    rgb = np.full([2, 8], 7, np.uint8)
    audio = np.full([2, audio_width], 9, np.uint8)
    return yt8m_demo.make_sequence_example(vid, list(label), rgb, audio)

  def good(self, i):
    return self._record(f'g{i}', label=(i % 5,)).SerializeToString()

  def bad(self, kind):
    if kind == 'wrong_width':
      return self._record('bad', audio_width=5).SerializeToString()
    if kind == 'label':
      return self._record('bad', label=(0, 9)).SerializeToString()
    if kind == 'wrong_dtype':
      ex = self._record('bad')
      del ex.context.feature['labels'].int64_list.value[:]
      ex.context.feature['labels'].float_list.value.append(1.0)
      return ex.SerializeToString()
    return GARBAGE

  def build(self, pattern, skip, log, is_training=False):
    params = yt8m_configs.DataConfig(
        input_path=pattern, is_training=is_training, drop_remainder=False,
        global_batch_size=2, feature_sizes=(8, 4), num_classes=5,
        max_frames=4, skip_bad_records=skip)
    return yt8m_dataloader.build_dataset(params, bad_records=log)

  def count(self, ds):
    return sum(b['labels'].shape[0] for b in ds.as_numpy_iterator())


class Yt8mFloat(Yt8m):
  """YT8M with a float32 feature stored as float lists: NaN is possible."""
  kinds = {
      'nan': r'Feature `emb` of video `bad` in file `{file}`: frame 1 has a '
             r'NaN or infinite value \(nan\)',
  }

  def _float_record(self, vid, frames):
    ex = tf.train.SequenceExample()
    ex.context.feature['id'].bytes_list.value.append(vid.encode())
    ex.context.feature['labels'].int64_list.value.append(1)
    for row in frames:
      ex.feature_lists.feature_list['emb'].feature.add().float_list.value.extend(
          row)
    return ex.SerializeToString()

  def good(self, i):
    return self._float_record(f'g{i}', np.full([2, 3], 0.5, np.float32))

  def bad(self, kind):
    assert kind == 'nan'
    return self._float_record('bad', [[0.0, 1.0, 2.0], [0.0, np.nan, 1.0]])

  def build(self, pattern, skip, log, is_training=False):
    params = yt8m_configs.DataConfig(
        input_path=pattern, is_training=is_training, drop_remainder=False,
        global_batch_size=2, feature_names=('emb',), feature_sizes=(3,),
        feature_dtypes=('float32',), feature_from_bytes=(False,),
        num_classes=5, max_frames=4, skip_bad_records=skip)
    return yt8m_dataloader.build_dataset(params, bad_records=log)


class AssembleNet:
  """2 JPEG frames of 16 x 16 per record, 8 classes, middle clip."""
  kinds = {
      'undecodable': UNDECODABLE,
      # The image analogue of a wrong feature width: frames of one record
      # must share a size.
      'wrong_width': r'Frames of a record of file `{file}` differ in size: '
                     r'sampled frame 1 is \(20, 20, 3\)',
      'wrong_dtype': r'Name: {file}, Context feature: clip/label/index\.\s+'
                     r"Data types don't match",
      'label': r'Record of file `{file}` has label\(s\) \[99\] outside '
               r'\[0, 8\)',
  }

  def _frames(self, sizes=(16, 16)):
    return [tf.io.encode_jpeg(np.full([s, s, 3], 100, np.uint8)).numpy()
            for s in sizes]

  def good(self, i):
    return anet_dataloader.make_sequence_example(self._frames(),
                                           [i % 8]).SerializeToString()

  def bad(self, kind):
    if kind == 'wrong_width':
      return anet_dataloader.make_sequence_example(self._frames((16, 20)),
                                             [1]).SerializeToString()
    if kind == 'label':
      return anet_dataloader.make_sequence_example(self._frames(),
                                             [99]).SerializeToString()
    if kind == 'wrong_dtype':
      ex = anet_dataloader.make_sequence_example(self._frames(), [1])
      del ex.context.feature['clip/label/index'].int64_list.value[:]
      ex.context.feature['clip/label/index'].float_list.value.append(1.0)
      return ex.SerializeToString()
    return GARBAGE

  def build(self, pattern, skip, log, is_training=False):
    params = anet_configs.DataConfig(
        input_path=pattern, feature_shape=(2, 16, 16, 3), num_classes=8,
        global_batch_size=2, is_training=is_training, drop_remainder=False,
        min_image_size=16, skip_bad_records=skip)
    return anet_dataloader.build_dataset(params, bad_records=log)

  def count(self, ds):
    return sum(int(y.shape[0]) for _, y in ds)


READOUTS = (
    readout_configs.ReadoutSpec(name='speed', dim=2, type='continuous'),
    readout_configs.ReadoutSpec(name='stim', dim=3, type='multinomial'),
)
VOCAB = ('speed', 'stim')


class Readout:
  """Readout records: 2 tokens of width 3, a continuous and a 3-way query."""
  kinds = {
      'undecodable': UNDECODABLE,
      'wrong_width': r'Record `bad` in file `{file}`: input_values has 5 '
                     r'values for 2 input tokens; expected',
      'wrong_dtype': r'Name: {file}, Context feature: output_task_ids\.\s+'
                     r"Data types don't match",
      'label': r'Record `bad` in file `{file}`: query 1 of task `stim` has a '
               r'class id that is not an integer in \[0, dim\): 3',
      'nan': r'Record `bad` in file `{file}`: input_values has a NaN or '
             r'infinite value',
  }

  def _example(self, rid, values=None, stim=1.0):
    values = (np.arange(6, dtype=np.float32).reshape([2, 3])
              if values is None else values)
    return readout_dataloader.make_example(
        rid, values, [0.0, 0.1], output_task_ids=[1, 2],
        output_timestamps=[0.0, 0.1], output_targets=[[1.0, 2.0], [stim]])

  def good(self, i):
    return self._example(f'g{i}').SerializeToString()

  def bad(self, kind):
    if kind == 'wrong_width':
      ex = self._example('bad')
      ex.features.feature['input_values'].float_list.value.pop()
      return ex.SerializeToString()
    if kind == 'label':
      return self._example('bad', stim=3.0).SerializeToString()
    if kind == 'nan':
      values = np.arange(6, dtype=np.float32).reshape([2, 3])
      values[1, 2] = np.nan
      return self._example('bad', values=values).SerializeToString()
    if kind == 'wrong_dtype':
      ex = self._example('bad')
      ids = list(ex.features.feature['output_task_ids'].int64_list.value)
      del ex.features.feature['output_task_ids'].int64_list.value[:]
      ex.features.feature['output_task_ids'].float_list.value.extend(ids)
      return ex.SerializeToString()
    return GARBAGE

  def build(self, pattern, skip, log, is_training=False):
    params = readout_configs.DataConfig(
        input_path=pattern, global_batch_size=2, is_training=is_training,
        drop_remainder=False, input_dim=3, skip_bad_records=skip)
    return readout_dataloader.build_dataset(params, READOUTS, VOCAB,
                                            bad_records=log)

  def count(self, ds):
    return sum(int(b['input_mask'].shape[0]) for b in ds)


FAMILIES = {'yt8m': Yt8m(), 'yt8m_float': Yt8mFloat(),
            'assemblenet': AssembleNet(), 'readout': Readout()}
MAIN = ('yt8m', 'assemblenet', 'readout')
RECORD_CASES = [(f, k) for f, fam in FAMILIES.items() for k in fam.kinds]


def _write(path, records):
  with tf.io.TFRecordWriter(str(path)) as w:
    for r in records:
      w.write(r)
  return str(path)


def _offset(records, k):
  """Byte offset of record k in a file of `records` (16 framing bytes)."""
  return sum(16 + len(r) for r in records[:k])


def _run(fam, pattern, skip):
  log = bad_records.BadRecordLog()
  return fam.count(fam.build(pattern, skip, log)), log


def _fails(fam, pattern, match):
  log = bad_records.BadRecordLog()
  with pytest.raises(tf.errors.OpError, match=match):
    fam.count(fam.build(pattern, False, log))
  assert log.num_bad_records == 0


# Strict mode: each bad input fails, naming it ---------------------------------


@pytest.mark.parametrize('family, kind', RECORD_CASES)
def test_invalid_record_fails_naming_it(tmp_path, family, kind):
  """Undecodable record, wrong width, wrong dtype, label out of range, NaN:
  an error naming the file and the feature / record."""
  fam = FAMILIES[family]
  a = _write(tmp_path / 'a.tfrecord', [fam.good(0), fam.bad(kind),
                                       fam.good(1)])
  _fails(fam, a, fam.kinds[kind].format(file=re.escape(a)))


def _truncate(path, records):
  """Cuts the last 5 bytes (inside the last record); returns the new size."""
  with open(path, 'rb') as f:
    data = f.read()
  with open(path, 'wb') as f:
    f.write(data[:-5])
  return len(data) - 5


def _flip(path, records, k):
  """Flips a payload byte of record k (its CRC then fails); returns size."""
  data = bytearray(open(path, 'rb').read())
  data[_offset(records, k) + 12 + len(records[k]) // 2] ^= 0xFF
  with open(path, 'wb') as f:
    f.write(bytes(data))
  return len(data)


@pytest.mark.parametrize('family', MAIN)
def test_damaged_file_fails_naming_it(tmp_path, family):
  """Truncated file; corrupt record (bad CRC) in the middle of a file."""
  fam = FAMILIES[family]
  records = [fam.good(i) for i in range(5)]
  a = _write(tmp_path / 'a.tfrecord', records)
  size = _truncate(a, records)
  _fails(fam, a, re.escape(
      f'Corrupted or truncated TFRecord file `{a}`: its records are readable '
      f'only up to byte {_offset(records, 4)} of {size} (4 good records '
      'before it)'))
  b = _write(tmp_path / 'b.tfrecord', records)
  size = _flip(b, records, 2)
  _fails(fam, b, re.escape(
      f'Corrupted or truncated TFRecord file `{b}`: its records are readable '
      f'only up to byte {_offset(records, 2)} of {size} (2 good records '
      'before it)'))


@pytest.mark.parametrize('family', MAIN)
def test_empty_file_is_legal_in_evaluation(tmp_path, family):
  """A zero-byte file among good evaluation files contributes nothing, no
  error (skip mode: see test_skip_mode_keeps_every_good_record)."""
  fam = FAMILIES[family]
  _write(tmp_path / 'a.tfrecord', [fam.good(0), fam.good(1), fam.good(2)])
  open(tmp_path / 'b.tfrecord', 'wb').close()
  _write(tmp_path / 'c.tfrecord', [fam.good(3)])
  seen, log = _run(fam, str(tmp_path / '*.tfrecord'), skip=False)
  assert seen == 4
  assert log.num_bad_records == 0


@pytest.mark.parametrize('family', MAIN)
def test_empty_file_in_training_input_fails_naming_it(tmp_path, family):
  """A zero-byte training file (what an interrupted converter or copy
  leaves) is an error naming it, in both modes, when the input is built."""
  fam = FAMILIES[family]
  _write(tmp_path / 'a.tfrecord', [fam.good(0), fam.good(1)])
  empty = tmp_path / 'b.tfrecord'
  open(empty, 'wb').close()
  pattern = str(tmp_path / '*.tfrecord')
  for skip in (False, True):
    with pytest.raises(ValueError, match=re.escape(
        f"DataConfig.input_path='{pattern}' (training): 1 of its 2 files "
        f'is empty (0 bytes, no record): {empty}; expected TFRecord files '
        'holding records')):
      fam.build(pattern, skip, None, is_training=True)


def test_training_input_of_only_empty_files_is_named_before_training(
    tmp_path):
  """`official_ext.train` on a pattern matching files with no record: an
  error naming the pattern before the first step (with one such file it was
  tf.data's OutOfRangeError 'End of sequence' at the first batch; with
  several, the repeated training input never ended)."""
  from tests.yt8m.test_train import _params  # pylint: disable=g-import-not-at-top
  open(tmp_path / 'train-0.tfrecord', 'wb').close()
  pattern = str(tmp_path / 'train-*.tfrecord')
  params = _params(tmp_path / 'cache', train_steps=1)
  params.override({'task': {'demo_data': {'enabled': False},
                            'train_data': {'input_path': pattern},
                            'validation_data': {'input_path': pattern}}})
  with pytest.raises(ValueError, match=re.escape(
      f"DataConfig.input_path='{pattern}' (training) matches only empty "
      'files (0 bytes, no record)')):
    train.run(params, 'train', str(tmp_path / 'model'))
  assert not tf.train.latest_checkpoint(str(tmp_path / 'model'))


# Skip mode: every bad input at once, every good record read ------------------


@pytest.mark.parametrize('family', list(FAMILIES))
def test_skip_mode_keeps_every_good_record(tmp_path, family):
  """One pass over: a file with each invalid record kind between good ones
  (each dropped alone), a truncated file (its cut last record lost), a file
  with a corrupt payload in record 2 of 5 and one with a corrupt *length* of
  record 2 of 5 (TensorFlow's reader stops there; skip mode reads on past
  the damaged record, by its CRC-checked length or by scanning for the next
  valid header, so only record 2 is lost), an empty file and a good file.
  Examples seen = every good record written."""
  fam = FAMILIES[family]
  kinds = sorted(fam.kinds)
  a_records = [fam.good(0)]
  for i, kind in enumerate(kinds):
    a_records += [fam.bad(kind), fam.good(10 + i)]
  a = _write(tmp_path / 'a.tfrecord', a_records)
  five = [fam.good(20 + i) for i in range(5)]
  b = _write(tmp_path / 'b.tfrecord', five)
  b_size = _truncate(b, five)
  c = _write(tmp_path / 'c.tfrecord', five)
  c_size = _flip(c, five, 2)
  open(tmp_path / 'd.tfrecord', 'wb').close()
  _write(tmp_path / 'e.tfrecord', [fam.good(30), fam.good(31)])
  f = _write(tmp_path / 'f.tfrecord', five)
  data = bytearray(open(f, 'rb').read())
  data[_offset(five, 2) + 1] ^= 0xFF  # Record 2's length: its CRC fails.
  with open(f, 'wb') as out:
    out.write(bytes(data))

  seen, log = _run(fam, str(tmp_path / '*.tfrecord'), skip=True)
  assert seen == (1 + len(kinds)) + 4 + 4 + 0 + 2 + 4
  assert log.num_bad_records == len(kinds) + 3
  assert log.bad_files == [a, b, c, f]
  events = {e.filename: e for e in log.events}
  assert set(events) == {b, c, f}
  assert (events[b].good_records, events[b].valid_bytes,
          events[b].file_size, events[b].recovered_records) == (
              4, _offset(five, 4), b_size, 0)
  record_2 = _offset(five, 3) - _offset(five, 2)
  for damaged, size in ((c, c_size), (f, len(data))):
    assert (events[damaged].good_records, events[damaged].valid_bytes,
            events[damaged].file_size, events[damaged].recovered_records,
            events[damaged].recovered_bytes) == (
                2, _offset(five, 2), size, 2, size - _offset(five, 3))
  assert log.skipped_bytes == (b_size - _offset(five, 4)) + 2 * record_2
  reasons = [e.reason for e in log.record_events]
  assert [e.filename for e in log.record_events] == [a] * len(kinds)
  for kind in kinds:  # Each skip is logged with the error naming it.
    match = fam.kinds[kind].format(file=re.escape(a))
    assert sum(bool(re.search(match, r, re.S)) for r in reasons) == 1, (
        kind, reasons)


def _first_batch_or_error(ds, timeout_s=60):
  """The error that iterating `ds` for one batch raises; fails the test if
  a batch comes, or nothing within `timeout_s` (a reader looping for ever:
  the thread is left spinning, the test fails)."""
  result = {}

  def first():
    try:
      result['batch'] = next(iter(ds))
    except Exception as e:  # pylint: disable=broad-except
      result['error'] = e

  thread = threading.Thread(target=first, daemon=True)
  thread.start()
  thread.join(timeout_s)
  assert not thread.is_alive(), f'no batch and no error in {timeout_s} s'
  assert 'error' in result, 'a batch came from input without a good record'
  return result['error']


@pytest.mark.parametrize('family', MAIN)
def test_skip_mode_stops_when_no_record_is_good(tmp_path, family):
  """Skip mode on a repeated training input whose every record is bad (not
  a proto): an error naming the files once `MAX_SKIPPED_IN_A_ROW` records in a row were skipped without
  one example, instead of a reader that skips for ever."""
  fam = FAMILIES[family]
  a = _write(tmp_path / 'a.tfrecord', [fam.bad('undecodable')] * 3)
  b = _write(tmp_path / 'b.tfrecord', [fam.bad('undecodable')] * 2)
  assert bad_records.MAX_SKIPPED_IN_A_ROW == 1000
  limit = 40  # The reader's default, 1,000, reads 1,000 records per family.
  log = bad_records.BadRecordLog(max_in_a_row=limit)
  error = _first_batch_or_error(
      fam.build(str(tmp_path / '*.tfrecord'), True, log, is_training=True))
  message = str(error)
  assert f'{limit} records in a row were skipped' in message, message
  assert a in message and b in message, message
  # Parallel map calls may have skipped a few more records meanwhile.
  assert limit <= log.num_bad_records < limit + 100, log.num_bad_records


@pytest.mark.parametrize('family', MAIN)
def test_skip_mode_fails_when_the_input_holds_no_good_record(tmp_path, family):
  """Skip mode on files holding no readable record (bytes that are not
  TFRecord framing) or only invalid ones, fewer skips than
  `MAX_SKIPPED_IN_A_ROW`: an error naming the files when the pass ends, not
  an empty input (OutOfRange). One pass of evaluation, and (one family: the
  check is the shared reader's) a training input of one file, whose repeat
  ends after a pass that yields nothing."""
  fam = FAMILIES[family]
  a = str(tmp_path / 'a.tfrecord')
  with open(a, 'wb') as f:
    f.write(b'not a TFRecord file at all, only text\n' * 3)
  b = _write(tmp_path / 'b.tfrecord', [fam.bad('undecodable')] * 2)
  cases = ((str(tmp_path / '*.tfrecord'), False, [a, b]),) + (
      ((a, True, [a]),) if family == 'yt8m' else ())
  for pattern, is_training, files in cases:
    log = bad_records.BadRecordLog()
    error = _first_batch_or_error(
        fam.build(pattern, True, log, is_training=is_training))
    message = str(error)
    assert 'no example' in message and 'skipped' in message, message
    for name in files:
      assert name in message, message
    assert log.num_bad_records == (3 if b in files else 1)  # a: 1, b: 2.


# Paths -----------------------------------------------------------------------


@pytest.mark.parametrize('family', MAIN)
def test_missing_path_names_the_pattern(tmp_path, family):
  fam = FAMILIES[family]
  for skip in (False, True):
    pattern = str(tmp_path / 'nothing-*.tfrecord')
    with pytest.raises(ValueError, match=re.escape(
        f"'{pattern}' does not match any file")):
      fam.build(pattern, skip, None)


@pytest.mark.parametrize('family', MAIN)
def test_unreadable_paths_are_named(tmp_path, family):
  """Tests run as root (chmod 000 still reads), so the unreadable cases are
  a directory and a broken symlink matched by the glob: errors in both
  modes (a mistake in input_path, not damaged data)."""
  fam = FAMILIES[family]
  _write(tmp_path / 'a.tfrecord', [fam.good(0)])
  directory = tmp_path / 'dir.tfrecord'
  directory.mkdir()
  for skip in (False, True):
    with pytest.raises(ValueError, match=re.escape(
        f"'{directory}' is a directory; expected TFRecord files")):
      fam.build(str(tmp_path / '*.tfrecord'), skip, None)
  os.rmdir(directory)
  link = tmp_path / 'link.tfrecord'
  os.symlink(tmp_path / 'gone.tfrecord', link)
  for skip in (False, True):
    with pytest.raises(ValueError, match=re.escape(
        f"file '{link}' does not exist (a broken symlink to "
        f"'{tmp_path / 'gone.tfrecord'}')")):
      fam.build(str(tmp_path / '*.tfrecord'), skip, None)


# The count in the task's logs ------------------------------------------------


def _task(family, data):
  from official.core import exp_factory  # pylint: disable=g-import-not-at-top
  from official.core import task_factory  # pylint: disable=g-import-not-at-top
  from official_ext import registry_imports  # pylint: disable=g-import-not-at-top,unused-import
  name = {'yt8m': 'yt8m_demo', 'assemblenet': 'assemblenet_plus_lite_demo',
          'readout': 'readout_demo'}[family]
  task_config = exp_factory.get_exp_config(name).task
  task_config = task_config.replace(validation_data=data.as_dict())
  if family == 'readout':
    task_config = task_config.replace(
        readouts=[r.as_dict() for r in READOUTS], task_vocabulary=VOCAB)
  return task_factory.get_task(task_config)


@pytest.mark.parametrize('family', MAIN)
def test_task_reports_bad_records_skipped(tmp_path, family):
  """`bad_records_skipped` is a metric of the task (so in the validation /
  train logs that Orbit writes to TensorBoard) and counts the skips of the
  split's reader; off in strict mode."""
  fam = FAMILIES[family]
  a = _write(tmp_path / 'a.tfrecord',
             [fam.good(0), fam.bad('undecodable'), fam.good(1)])
  params = {
      'yt8m': lambda: yt8m_configs.DataConfig(
          input_path=a, is_training=False, drop_remainder=False,
          global_batch_size=2, feature_sizes=(8, 4), num_classes=5,
          max_frames=4, skip_bad_records=True),
      'assemblenet': lambda: anet_configs.DataConfig(
          input_path=a, feature_shape=(2, 16, 16, 3), num_classes=8,
          global_batch_size=2, is_training=False, drop_remainder=False,
          min_image_size=16, skip_bad_records=True),
      'readout': lambda: readout_configs.DataConfig(
          input_path=a, global_batch_size=2, is_training=False,
          drop_remainder=False, input_dim=3, skip_bad_records=True),
  }[family]()
  task = _task(family, params)
  (metric,) = [m for m in task.build_metrics(training=False)
               if m.name == 'bad_records_skipped']
  assert float(metric.result()) == 0.0
  assert fam.count(task.build_inputs(params)) == 2
  assert float(metric.result()) == 1.0
  metric.reset_states()  # As Orbit does after each loop: the count stays.
  assert float(metric.result()) == 1.0
  strict = _task(family, params.replace(skip_bad_records=False))
  assert 'bad_records_skipped' not in [
      m.name for m in strict.build_metrics(training=False)]


# Config errors ---------------------------------------------------------------


class _Flags(types.SimpleNamespace):
  """The absl flags `train.parse_configuration` reads (FlagValues supports
  `in`)."""

  def __contains__(self, name):
    return hasattr(self, name)


def _flags(override):
  return _Flags(
      experiment='yt8m_demo', config_file=None, params_override=override,
      tpu=None, tf_data_service=None, mode='train', model_dir='/tmp/unused')


def test_unknown_override_key_is_named():
  with pytest.raises(KeyError, match=re.escape(
      "--params_override: The key 'global_batch_sizee' does not exist")):
    train.parse_configuration(_flags('task.train_data.global_batch_sizee=3'))


def test_unknown_config_file_key_names_the_key_and_the_file(tmp_path):
  """The second of two --config_file's has a misspelled key: the error names
  the key and that file (not the first one)."""
  good = tmp_path / 'good.yaml'
  good.write_text('trainer:\n  train_steps: 3\n')
  bad = tmp_path / 'bad.yaml'
  bad.write_text('task:\n  train_data:\n    global_batch_sizee: 3\n')
  flags = _flags('')
  flags.config_file = [str(good), str(bad)]
  with pytest.raises(KeyError) as raised:
    train.parse_configuration(flags)
  message = str(raised.value)
  assert (f'--config_file {bad}: task.train_data.global_batch_sizee: The '
          "key 'global_batch_sizee' does not exist") in message, message
  assert str(good) not in message


@pytest.mark.parametrize('override, message', [
    ('task.train_data.global_batch_size=abc',
     "task.train_data.global_batch_size: expected int, got 'abc' (str)"),
    ('task.train_data.skip_bad_records=maybe',
     "task.train_data.skip_bad_records: expected bool, got 'maybe' (str)"),
    ('task.train_data.feature_sizes=[1024,x]',
     "task.train_data.feature_sizes[1]: expected int, got 'x' (str)"),
    ('trainer.train_steps=2.5',
     'trainer.train_steps: expected int, got 2.5 (float)'),
])
def test_wrong_override_type_names_key_and_type(override, message):
  with pytest.raises(ValueError, match=re.escape(message)):
    train.parse_configuration(_flags(override))


def test_good_override_parses():
  params = train.parse_configuration(_flags(
      'task.train_data.global_batch_size=8,task.train_data.skip_bad_records='
      'true,task.validation_data.feature_sizes=[1024,128]'))
  assert params.task.train_data.global_batch_size == 8
  assert params.task.train_data.skip_bad_records is True
  assert isinstance(params, hyperparams.Config)
