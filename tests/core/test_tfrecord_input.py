"""official_ext.core.input.tfrecord_input.build_dataset, checked directly with a
tiny decoder and parser of its own (records: `tf.train.Example`s holding one
int64 `x`), and core.input.tfrecord_recovery's CRC against TensorFlow's writer."""
import dataclasses
import os

import numpy as np
import pytest
import tensorflow as tf, tf_keras  # pylint: disable=unused-import

from official.core import config_definitions as cfg
from official_ext.core.input import bad_records
from official_ext.core.input import eval_padding
from official_ext.core.input import graph_checks
from official_ext.core.input import tfrecord_input
from official_ext.core.input import tfrecord_recovery


@dataclasses.dataclass
class _DataConfig(cfg.DataConfig):
  skip_bad_records: bool = False


def _write(path, xs):
  with tf.io.TFRecordWriter(str(path)) as writer:
    for x in xs:
      writer.write(tf.train.Example(features=tf.train.Features(feature={
          'x': tf.train.Feature(int64_list=tf.train.Int64List(value=[x]))
      })).SerializeToString())
  return str(path)


def _decode(filename, record):
  """(file name, record) -> {'x': int64 scalar, 'source': file name}."""
  x = tf.io.parse_single_example(
      record, {'x': tf.io.FixedLenFeature([], tf.int64)})['x']
  return {'x': x, tfrecord_input.SOURCE_KEY: filename}


def _parse(decoded):
  """Rejects a negative `x`, naming its file; keeps `x` only."""
  x = decoded['x']
  check = graph_checks.require(x >= 0, lambda: graph_checks.join(
      'Record of file `', decoded[tfrecord_input.SOURCE_KEY], '` has x = ',
      x, '; expected x >= 0.'))
  with tf.control_dependencies([check]):
    return {'x': tf.identity(x)}


def _stages(params):
  del params
  return tfrecord_input.Stages(decoder_fn=_decode, parser_fn=_parse)


def _params(input_path, **kwargs):
  kwargs.setdefault('global_batch_size', 2)
  kwargs.setdefault('is_training', False)
  kwargs.setdefault('drop_remainder', False)
  return _DataConfig(input_path=input_path, **kwargs)


def _xs(ds):
  return [int(x) for batch in ds.as_numpy_iterator() for x in batch['x']]


def test_reads_every_record_once(tmp_path):
  a = _write(tmp_path / 'a.tfrecord', [1, 2, 3])
  _write(tmp_path / 'b.tfrecord', [4, 5])
  # `a` matched twice (two patterns) is read once.
  ds = tfrecord_input.build_dataset(
      _params(f'{tmp_path}/*.tfrecord,{a}'), None, None, _stages)
  batches = list(ds.as_numpy_iterator())
  assert [len(b['x']) for b in batches] == [2, 2, 1]
  assert set(batches[0]) == {'x'}  # The parser's output, batched.
  assert sorted(_xs(ds)) == [1, 2, 3, 4, 5]


def test_a_bad_record_fails_strict_and_is_skipped_and_counted(tmp_path):
  path = _write(tmp_path / 'a.tfrecord', [1, -7, 3])
  ds = tfrecord_input.build_dataset(_params(path), None, None, _stages)
  with pytest.raises(tf.errors.InvalidArgumentError,
                     match=f'Record of file `{path}` has x = -7'):
    _xs(ds)
  log = bad_records.BadRecordLog()
  ds = tfrecord_input.build_dataset(
      _params(path, skip_bad_records=True), None, log, _stages)
  assert _xs(ds) == [1, 3]
  assert log.num_bad_records == 1
  assert log.bad_files == [path]
  assert 'has x = -7' in log.record_events[0].reason


def test_a_corrupted_file_fails_strict_and_is_skipped_and_counted(tmp_path):
  path = _write(tmp_path / 'a.tfrecord', [1, 2, 3, 4])
  good = _write(tmp_path / 'b.tfrecord', [5])
  size = os.path.getsize(path)
  record = size // 4
  with open(path, 'r+b') as f:  # Flip a payload byte of the second record.
    f.seek(record + 14)
    byte = f.read(1)
    f.seek(record + 14)
    f.write(bytes([byte[0] ^ 0xFF]))
  ds = tfrecord_input.build_dataset(_params(f'{path},{good}'), None, None,
                                    _stages)
  with pytest.raises(tf.errors.InvalidArgumentError,
                     match=f'Corrupted or truncated TFRecord file `{path}`: '
                     f'its records are readable only up to byte {record} '
                     f'of {size}'):
    _xs(ds)
  log = bad_records.BadRecordLog()
  ds = tfrecord_input.build_dataset(
      _params(f'{path},{good}', skip_bad_records=True), None, log, _stages)
  assert sorted(_xs(ds)) == [1, 3, 4, 5]  # Only the damaged record is lost.
  assert log.num_bad_records == 1
  event = log.events[0]
  assert (event.filename, event.good_records, event.recovered_records) == (
      path, 1, 2)
  assert log.skipped_bytes == record


def _contexts(n=2):
  return [tf.distribute.InputContext(num_input_pipelines=n, input_pipeline_id=i,
                                     num_replicas_in_sync=n)
          for i in range(n)]


def test_two_input_contexts_read_disjoint_files(tmp_path):
  for i in range(4):
    _write(tmp_path / f'{i}.tfrecord', [10 * i, 10 * i + 1])
  per_pipeline = [
      _xs(tfrecord_input.build_dataset(
          _params(f'{tmp_path}/*.tfrecord', global_batch_size=4), context,
          None, _stages))
      for context in _contexts()]
  assert [len(xs) for xs in per_pipeline] == [4, 4]  # Two files each.
  assert sorted(per_pipeline[0] + per_pipeline[1]) == [
      0, 1, 10, 11, 20, 21, 30, 31]


def test_stages_get_the_file_shuffle_seed_every_pipeline_shares(tmp_path):
  for i in range(4):
    _write(tmp_path / f'{i}.tfrecord', [i])
  seeds = []

  def stages(params):
    seeds.append(params.seed)
    return _stages(params)

  for context in _contexts():
    tfrecord_input.build_dataset(
        _params(f'{tmp_path}/*.tfrecord', is_training=True,
                global_batch_size=4), context, None, stages)
  assert seeds[0] is not None and seeds[0] == seeds[1]
  # A configured seed is kept.
  tfrecord_input.build_dataset(
      _params(f'{tmp_path}/*.tfrecord', is_training=True, seed=5,
              global_batch_size=4), _contexts()[0], None, stages)
  assert seeds[2] == 5


def test_evaluation_with_drop_remainder_pads_and_masks(tmp_path):
  path = _write(tmp_path / 'a.tfrecord', [1, 2, 3])
  ds = tfrecord_input.build_dataset(
      _params(path, drop_remainder=True), None, None, _stages)
  batches = list(ds.as_numpy_iterator())
  assert len(batches) == 2
  xs = np.concatenate([b['x'] for b in batches])
  mask = np.concatenate([b[eval_padding.MASK_KEY] for b in batches])
  np.testing.assert_array_equal(xs[mask], [1, 2, 3])
  np.testing.assert_array_equal(mask, [True, True, True, False])


def test_batch_transform_and_postprocess_stages_are_applied(tmp_path):
  path = _write(tmp_path / 'a.tfrecord', [1, 2, 3])

  def stages(params):
    del params
    return tfrecord_input.Stages(
        decoder_fn=_decode, parser_fn=_parse,
        transform_fn=lambda ds: ds.map(lambda e: {'x': e['x'] * 10}),
        batch_fn=lambda ds, size: ds.batch(size + 1),
        postprocess_fn=lambda batch: {'x': batch['x'] + 1})

  ds = tfrecord_input.build_dataset(_params(path), None, None, stages)
  assert [list(b['x']) for b in ds.as_numpy_iterator()] == [[11, 21, 31]]


def test_config_errors_name_the_key(tmp_path):
  path = _write(tmp_path / 'a.tfrecord', [1])
  with pytest.raises(ValueError, match='DataConfig.global_batch_size is 0'):
    tfrecord_input.build_dataset(_params(path, global_batch_size=0), None,
                                 None, _stages)
  with pytest.raises(ValueError, match="'.*nothing' does not match any file"):
    tfrecord_input.build_dataset(_params(str(tmp_path / 'nothing')), None,
                                 None, _stages)
  with pytest.raises(ValueError, match="DataConfig.tfds_name is 'mnist' but "
                     'this reader reads TFRecord files only'):
    tfrecord_input.build_dataset(
        _params('', tfds_name='mnist', tfds_split='train'), None, None,
        _stages)


def test_masked_crc32c_matches_tensorflow_writer(tmp_path):
  path = _write(tmp_path / 'a.tfrecord', [12345])
  data = open(path, 'rb').read()
  length = int.from_bytes(data[:8], 'little')
  payload = data[12:12 + length]
  assert tfrecord_recovery.masked_crc32c(data[:8]) == int.from_bytes(
      data[8:12], 'little')
  assert tfrecord_recovery.masked_crc32c(payload) == int.from_bytes(
      data[12 + length:16 + length], 'little')
  assert len(data) == length + tfrecord_recovery.TFRECORD_FRAMING_BYTES
