"""Readout records: writer, padded and chained batches, bad input."""
import numpy as np
import pytest
import tensorflow as tf

from official_ext.readout import configs
from official_ext.readout import dataloader

READOUTS = (
    configs.ReadoutSpec(name='speed', dim=2, type='continuous'),
    configs.ReadoutSpec(name='choice', dim=1, type='binary'),
    configs.ReadoutSpec(name='stim', dim=3, type='multinomial'),
    configs.ReadoutSpec(name='licks', dim=1, type='event_rate'),
)
# 'other' (id 5) is in the vocabulary but has no spec.
VOCAB = ('speed', 'choice', 'stim', 'licks', 'other')
INPUT_DIM = 3


def _record(rid, n_in, queries):
  """queries: [(task id, time, target list, weight)]."""
  return dataloader.make_example(
      rid, np.arange(n_in * INPUT_DIM, dtype=np.float32).reshape(
          [n_in, INPUT_DIM]), np.arange(n_in) * 0.1,
      output_task_ids=[q[0] for q in queries],
      output_timestamps=[q[1] for q in queries],
      output_targets=[q[2] for q in queries],
      output_weights=[q[3] for q in queries])


GOOD = [
    _record('r0', 3, [(1, 0.1, [1.0, 2.0], 1.0), (2, 0.2, [1.0], 0.0),
                      (1, 0.3, [3.0, 4.0], 1.0)]),
    _record('r1', 5, [(3, 0.0, [2.0], 1.0), (4, 0.1, [3.0], 0.5)]),
    _record('r2', 2, []),  # No queries: legal.
]


@pytest.fixture(scope='module')
def parse():
  """The record parser, traced once for every bad-input case."""
  parser = dataloader.Parser(configs.DataConfig(input_dim=INPUT_DIM),
                             READOUTS, VOCAB)
  return tf.function(parser.parse, input_signature=[
      tf.TensorSpec([], tf.string), tf.TensorSpec([], tf.string)])


def _params(path, batching='padded', **kwargs):
  return configs.DataConfig(input_path=path, global_batch_size=3,
                            is_training=False, input_dim=INPUT_DIM,
                            batching=batching, **kwargs)


def _batches(tmp_path, records, batching='padded', **kwargs):
  path = str(tmp_path / 'data.tfrecord')
  dataloader.write_records(path, records)
  ds = dataloader.build_dataset(_params(path, batching, **kwargs), READOUTS,
                                VOCAB)
  return [tf.nest.map_structure(np.asarray, b) for b in ds]


def test_padded_batch_layout(tmp_path):
  (batch,) = _batches(tmp_path, GOOD)
  assert batch['input_values'].shape == (3, 8, INPUT_DIM)  # 5 -> 8.
  np.testing.assert_array_equal(batch['input_mask'].sum(1), [3, 5, 2])
  np.testing.assert_allclose(batch['input_values'][1, :5].reshape([-1]),
                             np.arange(15))
  assert batch['output_readout_index'].shape == (3, 8)  # 3 -> 8.
  np.testing.assert_array_equal(batch['output_readout_index'][:, :3],
                                [[1, 2, 1], [3, 4, 0], [0, 0, 0]])
  assert not batch['output_readout_index'][:, 3:].any()
  np.testing.assert_allclose(batch['output_weights'][0, :3], [1, 0, 1])
  assert batch['output_targets'].shape == (3, 8, 2)  # Widest target: 2.
  np.testing.assert_allclose(batch['output_targets'][0, :3],
                             [[1, 2], [1, 0], [3, 4]])
  np.testing.assert_allclose(batch['output_targets'][1, :2], [[2, 0], [3, 0]])


def test_varlen_batch_layout(tmp_path):
  (batch,) = _batches(tmp_path, GOOD, batching='varlen')
  np.testing.assert_array_equal(batch['output_readout_index'],
                                [1, 2, 1, 3, 4])
  np.testing.assert_array_equal(batch['output_batch_index'], [0, 0, 0, 1, 1])
  np.testing.assert_allclose(batch['output_timestamps'],
                             [0.1, 0.2, 0.3, 0.0, 0.1])
  assert batch['output_targets'].shape == (5, 2)
  assert batch['input_values'].shape == (3, 8, INPUT_DIM)


def test_static_shapes(tmp_path):
  """Fixed sizes give static shapes; a record over a limit is an error.

  One pipeline (each costs seconds to build): `r0` has 3 queries, over
  max_queries; no record has more than max_input_tokens tokens.
  """
  path = str(tmp_path / 'data.tfrecord')
  dataloader.write_records(path, GOOD)
  ds = dataloader.build_dataset(
      _params(path, max_input_tokens=6, max_queries=2), READOUTS, VOCAB)
  assert ds.element_spec['output_targets'].shape.as_list()[1:] == [2, 2]
  assert ds.element_spec['output_readout_index'].shape.as_list()[1:] == [2]
  assert ds.element_spec['input_values'].shape.as_list()[1:] == [6, INPUT_DIM]
  assert ds.element_spec['input_mask'].shape.as_list()[1:] == [6]
  with pytest.raises(tf.errors.InvalidArgumentError,
                     match=r'Record `r0`.*has 3 queries; .*max_queries is 2'):
    list(ds)


@pytest.mark.parametrize('query, match', [
    ((5, 0.0, [1.0], 1.0),
     r'Record `bad`.*query 1 has task id 5 \(other\), which has no '
     r'ReadoutSpec'),
    ((9, 0.0, [1.0], 1.0), r'task id 9 \(<not in task.task_vocabulary>\)'),
    ((0, 0.0, [1.0], 1.0), r'task id 0 .*padding'),
    ((1, 0.0, [1.0, 2.0, 3.0], 1.0),
     r'Record `bad`.*query 1 of task `speed` has a target of 3 values; '
     r'expected 2'),
    ((3, 0.0, [1.0, 0.0, 0.0], 1.0), r'task `stim` has a target of 3 values'),
    ((4, 0.0, [-1.0], 1.0),
     r'query 1 of task `licks` has a negative count'),
    ((1, 0.0, [float('nan'), 1.0], 1.0),
     r'Record `bad`.*query 1 of task `speed` has a NaN or infinite target'),
    ((2, 0.0, [0.5 + 1.0], 1.0), r'task `choice` has a label outside'),
    ((3, 0.0, [3.0], 1.0), r'task `stim` has a class id that is not an int'),
    ((1, 0.0, [1.0, 2.0], -1.0), r'task `speed` has weight -1'),
])
def test_bad_queries_name_task_and_record(parse, query, match):
  bad = _record('bad', 2, [(1, 0.0, [0.0, 0.0], 1.0), query])
  with pytest.raises(tf.errors.InvalidArgumentError, match=match) as e:
    parse(bad.SerializeToString(), 'f.rec')
  assert 'Record `bad` in file `f.rec`' in str(e.value)


def test_bad_record_names_its_file(tmp_path):
  bad = _record('bad', 2, [(4, 0.0, [-2.0], 1.0)])
  with pytest.raises(tf.errors.InvalidArgumentError,
                     match=r'Record `bad` in file `[^`]*data.tfrecord`: query '
                     '0 of task `licks` has a negative count'):
    _batches(tmp_path, [GOOD[0], bad])


def test_bad_record_structure(parse):
  ex = _record('short', 2, [(1, 0.0, [0.0, 0.0], 1.0)])
  ex.features.feature['input_values'].float_list.value.pop()
  with pytest.raises(tf.errors.InvalidArgumentError,
                     match=r'Record `short`.*input_values has 5 values for 2 '
                     'input tokens'):
    parse(ex.SerializeToString(), 'f.rec')
  ex = _record('weights', 2, [(1, 0.0, [0.0, 0.0], 1.0)])
  ex.features.feature['output_weights'].float_list.value.append(1.0)
  with pytest.raises(tf.errors.InvalidArgumentError,
                     match='output_weights has 2 entries for 1'):
    parse(ex.SerializeToString(), 'f.rec')


def test_good_records_parse(parse):
  out = parse(GOOD[0].SerializeToString(), 'f.rec')
  np.testing.assert_array_equal(out['output_readout_index'], [1, 2, 1])


def test_config_errors_name_the_key(tmp_path):
  with pytest.raises(ValueError, match='DataConfig.batching'):
    dataloader.build_dataset(_params('x', batching='ragged'), READOUTS, VOCAB)
  with pytest.raises(ValueError, match=r"No routing index for readouts "
                     r"\['stim', 'licks'\]"):
    dataloader.build_dataset(_params('x'), READOUTS, ('speed', 'choice'))
  with pytest.raises(ValueError, match='DataConfig.input_path is empty'):
    dataloader.build_dataset(_params(''), READOUTS, VOCAB)


def test_writer_rejects_mismatched_lengths():
  with pytest.raises(ValueError, match='2 output_timestamps for 1'):
    dataloader.make_example('x', np.zeros([1, 2]), [0.0], [1], [0.0, 1.0],
                            [[1.0]])


def test_writer_stores_session_and_window_start_only_when_given(parse):
  ex = dataloader.make_example('x', np.zeros([1, INPUT_DIM]), [0.0], [1],
                               [0.5], [[1.0, 2.0]], session_id='mouse-3',
                               window_start=12.25)
  feature = ex.features.feature
  assert feature['session_id'].bytes_list.value == [b'mouse-3']
  assert feature['window_start'].float_list.value == [12.25]
  assert 'session_id' not in GOOD[0].features.feature
  assert 'window_start' not in GOOD[0].features.feature
  out = parse(ex.SerializeToString(), 'f.rec')  # Still a valid record.
  np.testing.assert_array_equal(out['output_readout_index'], [1])



def test_pipelines_of_one_parser_configuration_trace_it_once(tmp_path,
                                                             monkeypatch):
  """Pipelines whose parsers are configured alike share one traced parse
  (tracing its checks costs about a second per pipeline); a parser that
  parses otherwise gets a function of its own."""
  traced = []
  original = dataloader.Parser.parse

  def counting_parse(self, *args, **kwargs):
    traced.append(self._params.max_queries)  # Runs while tracing only.
    return original(self, *args, **kwargs)

  monkeypatch.setattr(dataloader.Parser, 'parse', counting_parse)
  first = _batches(tmp_path, GOOD)
  assert traced in ([], [None])  # [] if an earlier test traced it already
  again = _batches(tmp_path, GOOD)  # e.g. a restarted run's pipeline
  assert traced in ([], [None]) and len(first) == len(again) == 1
  for key in first[0]:
    np.testing.assert_array_equal(first[0][key], again[0][key], err_msg=key)

  def fn(params=configs.DataConfig(input_dim=INPUT_DIM), readouts=READOUTS,
         vocab=VOCAB, sessions=None):
    return dataloader.traced_parse(params, readouts, vocab, sessions)

  # Fields the parser does not read (batching, batch size) share it.
  assert fn() is fn(configs.DataConfig(input_dim=INPUT_DIM,
                                       batching='varlen',
                                       global_batch_size=7))
  others = [
      fn(configs.DataConfig(input_dim=INPUT_DIM + 1)),
      fn(configs.DataConfig(input_dim=INPUT_DIM, max_queries=2)),
      fn(configs.DataConfig(input_dim=INPUT_DIM, max_input_tokens=2)),
      fn(readouts=READOUTS[:3]),
      fn(readouts=READOUTS[:3] + (configs.ReadoutSpec(
          name='licks', dim=1, type='binary'),)),
      fn(vocab=VOCAB + ('more',)),
      fn(sessions=['s0']),
  ]
  assert len({id(f) for f in [fn()] + others}) == 1 + len(others)
