"""Unit-token records: parsing against the unit vocabulary, batching, and
session-balanced sampling."""
import collections

import numpy as np
import pytest
import tensorflow as tf

from official_ext.readout import configs
from official_ext.readout import dataloader
from official_ext.readout import unit_vocabulary

READOUTS = (configs.ReadoutSpec(name='speed', dim=1, type='continuous'),)
VOCAB = ('speed',)
UNITS = unit_vocabulary.from_names(['a', 'b'], ['a/0', 'a/1', 'a/2', 'b/0'])


def _record(rid, unit_ids, session='a', times=None):
  n = len(unit_ids)
  return dataloader.make_example(
      rid, np.ones([n, 1], np.float32),
      np.arange(n) * 0.01 if times is None else times,
      output_task_ids=[1], output_timestamps=[0.5], output_targets=[[1.0]],
      session_id=session, input_unit_ids=unit_ids).SerializeToString()


def _params(**kwargs):
  return configs.DataConfig(**dict(dict(input_dim=1, global_batch_size=2),
                                   **kwargs))


@pytest.fixture(scope='module')
def parse():
  return tf.function(dataloader.Parser(_params(), READOUTS, VOCAB,
                                       units=UNITS).parse)


def test_parse_unit_tokens(parse):
  out = parse(tf.constant(_record('r0', [3, 1, 1])), tf.constant('f.rec'))
  np.testing.assert_array_equal(out['input_unit_ids'], [3, 1, 1])
  assert int(out['session_ids']) == 1
  out = parse(tf.constant(_record('r1', [4], session='b')))
  assert int(out['session_ids']) == 2
  assert out['input_values'].shape == (1, 1)


@pytest.mark.parametrize('unit_ids,session,message', [
    ([1, 7], 'a', r'Record `bad` in file `f.rec`: input token 1 has unit id '
                  r'7, which is not in the unit vocabulary'),
    ([1, 0], 'a', r'input token 1 has unit id 0, which is not'),
    ([1, 4], 'a', r'input token 1 has unit id 4 \(`b/0`\), a unit of '
                  r'session `b`, in a record of session `a`'),
    ([1], 'zz', r'Record `bad`.*session_id `zz` is not in the unit '
                r'vocabulary'),
])
def test_unknown_ids_are_named(parse, unit_ids, session, message):
  with pytest.raises(tf.errors.InvalidArgumentError, match=message):
    parse(tf.constant(_record('bad', unit_ids, session=session)),
          tf.constant('f.rec'))


def test_writer_and_config_refuse_mismatches():
  with pytest.raises(ValueError, match='need a session_id'):
    dataloader.make_example('x', np.ones([1, 1]), [0.0], [], [], [],
                            input_unit_ids=[1])
  with pytest.raises(ValueError, match='2 input_unit_ids'):
    dataloader.make_example('x', np.ones([1, 1]), [0.0], [], [], [],
                            session_id='a', input_unit_ids=[1, 2])
  with pytest.raises(ValueError, match='input_dim is 3.*set it to 1'):
    dataloader.Parser(configs.DataConfig(input_dim=3), READOUTS, VOCAB,
                      units=UNITS)


def _write(path, records):
  dataloader.write_records(path, records)
  return path


def test_batches_carry_unit_and_session_ids(tmp_path):
  path = _write(str(tmp_path / 'r.tfrecord'),
                [_record('r0', [1, 2]), _record('r1', [4, 4, 4], 'b')])
  for batching in ('padded', 'varlen'):
    params = _params(input_path=path, is_training=False, batching=batching)
    batch = next(iter(dataloader.build_dataset(params, READOUTS, VOCAB,
                                               units=UNITS)))
    np.testing.assert_array_equal(batch['input_unit_ids'],
                                  [[1, 2] + [0] * 6, [4, 4, 4] + [0] * 5])
    np.testing.assert_array_equal(batch['session_ids'], [1, 2])
    assert batch['input_values'].shape == (2, 8, 1)


def test_balance_sessions(tmp_path):
  # Session a has three times as many records as session b.
  records = [_record(f'a{i}', [1]) for i in range(30)]
  records += [_record(f'b{i}', [4], 'b') for i in range(10)]
  path = _write(str(tmp_path / 'r.tfrecord'), records)
  drawn = collections.Counter()
  for balanced in (False, True):
    params = _params(input_path=path, is_training=True,
                     balance_sessions=balanced, shuffle_buffer_size=40,
                     global_batch_size=20, seed=1)
    ds = dataloader.build_dataset(params, READOUTS, VOCAB, units=UNITS)
    ids = np.concatenate([b['session_ids'].numpy()
                          for b in ds.take(8)])
    drawn[balanced] = np.mean(ids == 2)
  assert abs(drawn[False] - 0.25) < 0.1
  assert abs(drawn[True] - 0.5) < 0.1
  with pytest.raises(ValueError, match='balance_sessions.*binned'):
    dataloader.build_dataset(_params(input_path=path, is_training=True,
                                     balance_sessions=True),
                             READOUTS, VOCAB)
