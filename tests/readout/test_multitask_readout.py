"""MultitaskReadout: routing against a numpy reference, config, errors."""
import numpy as np
import pytest
import tensorflow as tf, tf_keras

from official_ext.readout import configs
from official_ext.readout.modeling import multitask_readout

DIM = 6
SPECS = {
    'a': configs.ReadoutSpec(name='a', dim=2, type='continuous'),
    'b': configs.ReadoutSpec(name='b', dim=3, type='binary'),
    'c': configs.ReadoutSpec(name='c', dim=1, type='event_rate'),
}
# 'x' (id 4) is a task without a head here, like an excluded task.
INDEX = {'a': 2, 'b': 1, 'c': 3, 'x': 4}


def _layer():
  layer = multitask_readout.MultitaskReadout(SPECS, INDEX, name='readout')
  rng = np.random.default_rng(0)
  layer(tf.zeros([1, 1, DIM]), tf.zeros([1, 1], tf.int32))
  for dense in layer.projections.values():  # Non-trivial weights and biases.
    dense.set_weights([rng.normal(size=w.shape).astype(np.float32)
                       for w in dense.get_weights()])
  return layer


def _reference(layer, embs, index, batch=None):
  """Plain numpy: rows of each id in row-major order through W x + b."""
  embs = np.asarray(embs).reshape([-1, DIM])
  index = np.asarray(index).reshape([-1])
  out, per_sample = {}, {}
  for name in SPECS:
    kernel, bias = layer.projections[name].get_weights()
    rows = np.flatnonzero(index == INDEX[name])
    out[name] = embs[rows] @ kernel + bias
    if batch is not None:
      per_sample[name] = (np.asarray(batch).reshape([-1])[rows], out[name])
  return out, per_sample


# Padding (0), repeated ids, an id without head (4), an unknown id (9); task
# 'c' (id 3) is absent.
PADDED_INDEX = np.array([[2, 1, 2, 0, 4], [1, 9, 1, 2, 0], [0, 0, 0, 0, 0]],
                        np.int32)


def _embs(shape, seed=1):
  return np.random.default_rng(seed).normal(size=shape).astype(np.float32)


def test_padded_routing_matches_numpy():
  layer = _layer()
  embs = _embs([3, 5, DIM])
  out = layer(embs, PADDED_INDEX)
  ref, _ = _reference(layer, embs, PADDED_INDEX)
  assert list(out) == ['a', 'b', 'c']
  assert out['c'].shape == (0, 1)  # Absent task: no rows.
  assert out['a'].shape == (3, 2) and out['b'].shape == (3, 3)
  for name in SPECS:
    np.testing.assert_allclose(out[name], ref[name], rtol=1e-5, atol=1e-5)


def test_padded_unpack_matches_numpy():
  layer = _layer()
  embs = _embs([3, 5, DIM])
  samples = layer(embs, PADDED_INDEX, unpack_output=True)
  batch = np.repeat(np.arange(3)[:, None], 5, 1)
  _, ref = _reference(layer, embs, PADDED_INDEX, batch)
  assert len(samples) == 3
  for name in SPECS:
    sample_of_row, rows = ref[name]
    for i in range(3):
      np.testing.assert_allclose(samples[i][name], rows[sample_of_row == i],
                                 rtol=1e-5, atol=1e-5)
  assert samples[2]['a'].shape == (0, 2)  # Sample of padding only.


def test_varlen_routing_and_unpack_match_numpy():
  layer = _layer()
  index = np.array([2, 1, 2, 4, 1, 9, 3, 3, 2], np.int32)
  batch = np.array([0, 0, 0, 0, 1, 1, 3, 3, 3], np.int32)  # Sample 2 empty.
  embs = _embs([9, DIM], seed=2)
  ref, per_sample = _reference(layer, embs, index, batch)
  out = layer.call_varlen(embs, index, batch)
  for name in SPECS:
    np.testing.assert_allclose(out[name], ref[name], rtol=1e-5, atol=1e-5)
  samples = layer.call_varlen(embs, index, batch, unpack_output=True)
  assert len(samples) == 4
  for name in SPECS:
    sample_of_row, rows = per_sample[name]
    for i in range(4):
      np.testing.assert_allclose(samples[i][name], rows[sample_of_row == i],
                                 rtol=1e-5, atol=1e-5)


def test_padded_and_varlen_agree_and_trace():
  layer = _layer()
  embs = _embs([3, 5, DIM])
  valid = PADDED_INDEX != 0
  chained = embs[valid]
  batch = np.nonzero(valid)[0].astype(np.int32)
  padded = tf.function(lambda e, i: layer(e, i))(embs, PADDED_INDEX)
  varlen = tf.function(lambda e, i, b: layer.call_varlen(
      e, i, b, unpack_output=True, num_samples=3))(
          chained, PADDED_INDEX[valid], batch)
  for name in SPECS:
    np.testing.assert_allclose(
        padded[name], np.concatenate([s[name] for s in varlen], 0),
        rtol=1e-5, atol=1e-5)


def test_static_path_compiles_and_masks_select_the_same_rows():
  layer = _layer()
  embs = _embs([3, 5, DIM])
  static = tf.function(layer.call_static, jit_compile=True)(
      tf.constant(embs), tf.constant(PADDED_INDEX))
  dynamic = layer(embs, PADDED_INDEX)
  for name in SPECS:
    outputs, mask = static[name]
    assert outputs.shape == (3, 5, SPECS[name].dim)
    np.testing.assert_array_equal(mask, PADDED_INDEX == INDEX[name])
    np.testing.assert_allclose(tf.boolean_mask(outputs, mask), dynamic[name],
                               rtol=1e-5, atol=1e-5)


def test_route_orders_values_like_outputs():
  layer = _layer()
  values = np.arange(15).reshape([15, 1])
  routed = layer.route(values, PADDED_INDEX.reshape([-1]))
  flat = PADDED_INDEX.reshape([-1])
  for name in SPECS:
    np.testing.assert_array_equal(routed[name][:, 0],
                                  np.flatnonzero(flat == INDEX[name]))


def test_variables_are_projections_by_task():
  layer = _layer()
  names = sorted(v.name for v in layer.variables)
  assert names == sorted(f'readout/projections/{t}/{w}:0'
                         for t in SPECS for w in ('kernel', 'bias'))
  assert set(layer.projections) == set(SPECS)
  assert all(isinstance(d, tf_keras.layers.Dense)
             for d in layer.projections.values())


def test_config_round_trip():
  layer = _layer()
  clone = multitask_readout.MultitaskReadout.from_config(layer.get_config())
  assert clone.readout_ids == layer.readout_ids
  assert {k: v.as_dict() for k, v in clone.readout_specs.items()} == {
      k: v.as_dict() for k, v in SPECS.items()}


def test_spec_without_index_names_the_tasks():
  with pytest.raises(ValueError, match=r"\['b', 'c'\]"):
    multitask_readout.MultitaskReadout(SPECS, {'a': 1})


@pytest.mark.parametrize('index, match', [
    ({'a': 0, 'b': 1, 'c': 2}, 'padding'),
    ({'a': 1, 'b': 1, 'c': 2}, 'same id'),
    ({'a': -3, 'b': 1, 'c': 2}, '>= 1'),
])
def test_bad_indices(index, match):
  with pytest.raises(ValueError, match=match):
    multitask_readout.MultitaskReadout(SPECS, index)


def test_sequence_of_specs_and_bad_name():
  layer = multitask_readout.MultitaskReadout(list(SPECS.values()), INDEX)
  assert layer.task_names == ['a', 'b', 'c']
  with pytest.raises(ValueError, match='cannot name a variable'):
    multitask_readout.MultitaskReadout(
        [configs.ReadoutSpec(name='bad name')], {'bad name': 1})
