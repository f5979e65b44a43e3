"""AssembleNet++lite: a 2-replica training step equals a 1-replica step."""
import numpy as np
import tensorflow as tf

from official.core import exp_factory
from official.core import task_factory
from official_ext import registry_imports  # pylint: disable=unused-import
from official_ext.assemblenet import demo_data
from tests.assemblenet import minimal

_GLOBAL_BATCH = 4
_SHAPE = (4, 16, 16, 3)  # frames, height, width, channels.


def _params():
  params = exp_factory.get_exp_config('assemblenet_plus_lite_demo')
  params.override({
      'task': {
          'model': {
              # The minimal network (tests/assemblenet/minimal.py): stems,
              # a peer-attention fusion, a block group, the head.
              'backbone': minimal.backbone(
                  rep_flow={'num_iter': 1},
                  # The batch statistics of the global batch on every
                  # replica.
                  use_sync_bn=True),
              'head_filters': [16, 24],
              'dropout_rate': 0.0},  # Dropout masks differ per replica.
          'train_data': {'feature_shape': list(_SHAPE),
                         'global_batch_size': _GLOBAL_BATCH},
          'validation_data': {'feature_shape': list(_SHAPE)},
          # Active (the gradient summed over the replicas is clipped) but
          # not binding for the one step here (its norm: ~0.8), so the
          # update is proportional to the gradient.
          'gradient_clip_norm': 1.0},
      # Plain SGD at a constant rate: the step moves every weight by the
      # rate times its (summed, clipped) gradient. (The demo's schedule
      # warms up from 0: its first step moved no trainable weight, and Adam's
      # first step, +-rate whatever the gradient's size, would hide a
      # gradient off by a factor.)
      'trainer': {'optimizer_config': {
          'optimizer': {'type': 'sgd',
                        'sgd': {'momentum': 0.0, 'nesterov': False}},
          'learning_rate': {'type': 'constant',
                            'constant': {'learning_rate': 0.1}},
          'warmup': {'type': None}}}}, is_strict=True)
  return params


def _batch():
  rng = np.random.default_rng(0)
  images = rng.uniform(-1.0, 1.0, (_GLOBAL_BATCH,) + _SHAPE).astype(np.float32)
  # RepresentationFlow rescales each clip by its own min and max (with
  # `rescale_per_batch`, as the original, by those of the whole batch it
  # sees: a replica's half-batch by its own extremes). Every clip here holds
  # the global extremes (-1 and 1), which makes the scaling the same for any
  # split of the batch either way.
  images[:, 0, 0, 0, :] = -1.0
  images[:, 0, 0, 1, :] = 1.0
  labels = np.eye(demo_data.NUM_CLASSES, dtype=np.float32)[[1, 3, 5, 7]]
  return {'image': images}, labels


def _step(strategy, params, initial_weights=None):
  """Weights before and after one task.train_step on the global batch."""
  task = task_factory.get_task(params.task)
  with strategy.scope():
    model = task.build_model()
    optimizer = task.create_optimizer(params.trainer.optimizer_config,
                                      params.runtime)
  features, labels = _batch()
  model(features, training=False)  # Creates the variables.
  if initial_weights is not None:
    model.set_weights(initial_weights)
  before = [w.copy() for w in model.get_weights()]
  dataset = strategy.experimental_distribute_dataset(
      tf.data.Dataset.from_tensor_slices((features, labels)).batch(
          _GLOBAL_BATCH))

  # Eagerly: tracing this model's step costs ~15 s per strategy here.
  strategy.run(task.train_step, args=(next(iter(dataset)),),
               kwargs={'model': model, 'optimizer': optimizer})
  return before, model.get_weights(), [w.name for w in model.weights]


def test_two_replica_step_equals_one_replica_step(mirrored):
  params = _params()
  before, one, names = _step(tf.distribute.OneDeviceStrategy('/cpu:0'), params)
  _, two, _ = _step(mirrored, params, initial_weights=before)
  changed = []
  for name, b, x, y in zip(names, before, one, two):
    # Trainable weights and batch norm moving statistics alike.
    np.testing.assert_allclose(y, x, rtol=1e-4, atol=1e-6, err_msg=name)
    if not np.allclose(b, x, rtol=0, atol=1e-7):
      changed.append(name)
  # The step did update the weights (not those behind zero-initialized
  # residual gammas, whose gradients are zero in the first step), from the
  # stems to the classifier, and the moving statistics.
  for prefix in ('node_0/', 'node_1/', 'node_2_fusion/', 'node_2/', 'head/'):
    assert any(n.startswith(prefix) and 'moving_' not in n
               for n in changed), (prefix, changed)
  assert 'head/final_dense/kernel:0' in changed, changed
  assert any('moving_mean' in n for n in changed), changed
