"""ReadoutTask.train_step: the 2-replica update equals the one-device update.

Plain SGD (learning rate 1), so the weights move by exactly the (clipped)
gradient: a loss scaled wrongly per replica (e.g. a task's weighted mean taken
over the local instead of the global batch, or the replicas' losses averaged
instead of summed) changes the update. Adam, as in the end-to-end test, would
hide a constant factor.
"""
import numpy as np
import pytest
import tensorflow as tf, tf_keras

from official_ext.readout import configs
from official_ext.readout import task as task_lib

INPUT_DIM = 3
READOUTS = (
    configs.ReadoutSpec(name='speed', dim=2, type='continuous',
                        loss_weight=2.0),
    configs.ReadoutSpec(name='choice', dim=1, type='binary'),
    configs.ReadoutSpec(name='stim', dim=3, type='multinomial',
                        loss_weight=0.5),
    configs.ReadoutSpec(name='licks', dim=1, type='event_rate'),
)
VOCAB = ('speed', 'choice', 'stim', 'licks')


def _task_config(clip_norm):
  config = configs.ReadoutTaskConfig(
      readouts=READOUTS, task_vocabulary=VOCAB, gradient_clip_norm=clip_norm,
      train_data=configs.DataConfig(input_dim=INPUT_DIM),
      validation_data=configs.DataConfig(input_dim=INPUT_DIM))
  config.model.encoder.override({'hidden_size': 8, 'num_heads': 2,
                                 'num_layers': 1, 'intermediate_size': 8})
  return config


def _global_batch():
  """4 samples (2 per replica), padded queries; replica 0 holds 2 queries,
  replica 1 holds 6 with other weights; `licks` only on replica 1 and
  `stim` only with weight 0 on replica 0."""
  rng = np.random.default_rng(0)
  index = np.array([[1, 2, 0, 0, 0],
                    [0, 0, 0, 0, 0],
                    [1, 4, 3, 3, 0],
                    [2, 4, 3, 0, 0]], np.int32)
  weights = np.array([[1.0, 3.0, 0, 0, 0],
                      [0, 0, 0, 0, 0],
                      [0.5, 1.0, 2.0, 0.0, 0],
                      [1.0, 1.0, 1.0, 0, 0]], np.float32)
  targets = np.zeros([4, 5, 2], np.float32)
  targets[..., :] = rng.normal(size=[4, 5, 2])
  targets[index == 2, 0] = [1.0, 0.0]
  targets[index == 3, 0] = [2.0, 0.0, 1.0]
  targets[index == 4, 0] = [3.0, 0.0]
  targets[index != 1, 1] = 0.0
  targets[index == 0] = 0.0
  return {
      'input_values': rng.normal(size=[4, 6, INPUT_DIM]).astype(np.float32),
      'input_timestamps': np.tile(np.arange(6, dtype=np.float32) * 0.1,
                                  [4, 1]),
      'input_mask': np.array([[1] * 6, [1] * 3 + [0] * 3, [1] * 4 + [0] * 2,
                              [1] * 6], bool),
      'output_readout_index': index,
      'output_timestamps': rng.uniform(0, 0.5, [4, 5]).astype(np.float32),
      'output_weights': weights,
      'output_targets': targets,
  }


def _chained(batch):
  """The batch with chained (varlen) queries."""
  valid = batch['output_readout_index'] != 0
  out = {k: batch[k] for k in ('input_values', 'input_timestamps',
                               'input_mask')}
  for k in ('output_readout_index', 'output_timestamps', 'output_weights',
            'output_targets'):
    out[k] = batch[k][valid]
  out['output_batch_index'] = np.nonzero(valid)[0].astype(np.int32)
  return out


def _half(batch, i):
  return {k: v[2 * i:2 * i + 2] for k, v in batch.items()}


def _updated_weights(task, strategy, per_replica_batches, initial,
                     graph=True):
  """Weights and per-replica losses after one `task.train_step`.

  `graph`: run the step in a `tf.function`, as the trainer does; False runs
  it eagerly (one device only: tracing the step costs ~10x its eager run).
  """
  with strategy.scope():
    model = task.build_model()
    model.set_weights(initial)
    optimizer = tf_keras.optimizers.SGD(learning_rate=1.0)
  inputs = strategy.experimental_distribute_values_from_function(
      lambda ctx: {k: tf.constant(v) for k, v in
                   per_replica_batches[ctx.replica_id_in_sync_group].items()})

  def step(inputs):
    return strategy.run(task.train_step, args=(inputs, model, optimizer))

  logs = (tf.function(step) if graph else step)(inputs)
  loss = strategy.experimental_local_results(logs['loss'])
  return [v.numpy() for v in model.trainable_variables], [float(l)
                                                           for l in loss]


# Padded batching without clipping; chained (varlen) queries with clipping
# on two replicas are tests/readout/test_train.py's
# test_mirrored_two_replicas_matches_one_device (through train.run).
@pytest.mark.parametrize('batching,clip_norm', [('padded', 0.0)])
def test_two_replica_update_equals_one_device(mirrored, batching, clip_norm):
  task = task_lib.ReadoutTask(_task_config(clip_norm))
  tf_keras.utils.set_random_seed(1)
  initial = task.build_model().get_weights()
  batch = _global_batch()
  halves = [_half(batch, 0), _half(batch, 1)]
  if batching == 'varlen':
    batch, halves = _chained(batch), [_chained(h) for h in halves]

  # The expected update, by hand: w - clip(grad of the global-batch loss).
  model = task.build_model()
  model.set_weights(initial)
  before = [v.numpy() for v in model.trainable_variables]
  with tf.GradientTape() as tape:
    outputs = model({k: tf.constant(v) for k, v in batch.items()})
    loss = task.build_losses(batch, outputs, model=model)
  grads = [tf.convert_to_tensor(g) if g is not None else tf.zeros_like(v)
           for g, v in zip(tape.gradient(loss, model.trainable_variables),
                           model.trainable_variables)]
  if clip_norm > 0:
    assert float(tf.linalg.global_norm(grads)) > clip_norm  # Clipping acts.
    grads, _ = tf.clip_by_global_norm(grads, clip_norm)
  expected = [b - g.numpy() for b, g in zip(before, grads)]

  # One device eagerly (the end-to-end tests run it in the trainer's graph);
  # two replicas in a graph, as the trainer runs them.
  one, one_loss = _updated_weights(
      task, tf.distribute.OneDeviceStrategy('/cpu:0'), [batch], initial,
      graph=False)
  two, two_loss = _updated_weights(task, mirrored, halves, initial)
  assert one_loss[0] == pytest.approx(float(loss), rel=1e-5)
  assert two_loss == pytest.approx([float(loss)] * 2, rel=1e-5)
  for e, a, b, v in zip(expected, one, two, model.trainable_variables):
    np.testing.assert_allclose(a, e, rtol=1e-4, atol=1e-6, err_msg=v.name)
    np.testing.assert_allclose(b, e, rtol=1e-4, atol=1e-6, err_msg=v.name)
  # The update moved the weights (the test can fail).
  assert any(not np.allclose(e, b) for e, b in zip(expected, before))
