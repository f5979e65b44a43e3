"""The readout task end to end: demo data, train.run, 2-replica parity."""
import numpy as np
import pytest
import tensorflow as tf, tf_keras

from official.core import exp_factory
from official_ext import registry_imports  # pylint: disable=unused-import
from official_ext import train
from official_ext.readout import configs
from official_ext.readout import demo_data
from official_ext.readout import task as task_lib


def _params(cache_dir, batching='padded', train_steps=6):
  params = exp_factory.get_exp_config('readout_demo')
  data = {'global_batch_size': 8, 'batching': batching, 'seed': 5,
          'shuffle_buffer_size': 16}
  params.override({
      'runtime': {'distribution_strategy': 'one_device', 'num_gpus': 0},
      'task': {
          'model': {'encoder': {'hidden_size': 8, 'num_heads': 2,
                                'num_layers': 1, 'intermediate_size': 8}},
          'train_data': data,
          'validation_data': dict(data, global_batch_size=16),
          'demo_data': {'cache_dir': str(cache_dir), 'num_train_trials': 32,
                        'num_validation_trials': 32},
          'evaluation': {'print_table': True},
      },
      'trainer': {'train_steps': train_steps, 'steps_per_loop': train_steps,
                  'checkpoint_interval': train_steps,
                  'summary_interval': train_steps,
                  'validation_interval': train_steps, 'validation_steps': -1},
  }, is_strict=True)
  params.validate()
  return params


def _run(params, model_dir, strategy):
  tf_keras.utils.set_random_seed(3)
  return train.run(params, 'train_and_eval', str(model_dir),
                   strategy=strategy)


@pytest.fixture(scope='module')
def cache(tmp_path_factory):
  """The demo data cache of the tests here (generated once)."""
  return tmp_path_factory.mktemp('readout_cache')


@pytest.fixture(scope='module')
def validation_batch(cache):
  """The first validation batch of `_params(cache)` (padded queries), for
  two tests (an input pipeline costs seconds to build)."""
  params = _params(cache)
  task = task_lib.ReadoutTask(params.task)
  return next(iter(task.build_inputs(params.task.validation_data)))


def test_mirrored_two_replicas_matches_one_device(tmp_path, capsys, mirrored,
                                                  cache, validation_batch):
  """train.run (train + eval) under 2 replicas equals one device.

  Training uses chained (varlen) queries, so replicas hold different numbers
  of queries (and sparse task-embedding gradients of different sizes);
  evaluation uses padded queries. Clipping is active.

  Two steps, without the demo's warmup (its first steps have a learning rate
  of ~3e-5, which moves Adam's weights by less than the tolerance): each
  step moves a weight by ~0.01, so a different update on two replicas (e.g.
  each replica clipping its own gradient) shows in the weights. The
  one-device reference trains and evaluates eagerly (`trainer.*_tf_function`
  false: tracing a step costs ~10x running it twice); the two replicas
  train and evaluate in graphs, as configured.
  """
  params = _params(cache, 'varlen', train_steps=2)
  params.task.validation_data.batching = 'padded'
  params.task.gradient_clip_norm = 0.5
  params.override({'trainer': {'optimizer_config': {
      'learning_rate': {'cosine': {'initial_learning_rate': 0.01}},
      'warmup': {'type': None}}}}, is_strict=True)
  reference = params.replace(trainer=params.trainer.replace(
      train_tf_function=False, train_tf_while_loop=False,
      eval_tf_function=False, eval_tf_while_loop=False))
  one_model, one = _run(reference, tmp_path / 'one',
                        tf.distribute.OneDeviceStrategy('/cpu:0'))
  two_model, two = _run(params, tmp_path / 'two',
                        mirrored)
  for name in configs.DEMO_VOCABULARY:
    assert f'{name}_loss' in two
  keys = [k for k in one if '/' in k] + ['total_loss', 'choice_loss']
  assert 'wheel_speed/r2' in keys and 'average/score' in keys
  for key in keys:
    np.testing.assert_allclose(float(two[key]), float(one[key]), rtol=2e-3,
                               atol=2e-4, err_msg=key)
  for a, b in zip(one_model.trainable_variables,
                  two_model.trainable_variables):
    np.testing.assert_allclose(a.numpy(), b.numpy(), rtol=1e-3, atol=1e-5,
                               err_msg=a.name)
  out = capsys.readouterr().out
  assert 'Readout evaluation at step 2' in out and 'trial_events' in out
  # A head grafted out of the trainer's checkpoint predicts like the model.
  single = task_lib.ReadoutTask(params.task).build_single_task_model(
      'paw_speed', str(tmp_path / 'two'))
  # The validation batch of these params (their validation data is
  # `_params(cache)`'s).
  batch = validation_batch
  np.testing.assert_allclose(single(batch)['paw_speed'],
                             one_model(batch)['paw_speed'], rtol=1e-3,
                             atol=1e-4)


def test_demo_data_is_deterministic_and_valid(validation_batch):
  a = list(demo_data.generate_trials(5, seed=1, split_id=1))
  b = list(demo_data.generate_trials(5, seed=1, split_id=1))
  c = list(demo_data.generate_trials(5, seed=1, split_id=2))
  assert a == b and a != c
  # Generated trials pass the dataloader's checks: a batch of 16 of the
  # generated validation split (`ensure_demo_data`), read by the dataloader.
  batch = validation_batch
  assert batch['input_values'].shape[0] == 16
  index = batch['output_readout_index'].numpy()
  # Every one of the eight readouts has queries; choice and reward once per
  # trial.
  for i, name in enumerate(configs.DEMO_VOCABULARY, start=1):
    assert (index == i).any(), name
  assert ((index == 1).sum(1) == 1).all() and ((index == 2).sum(1) == 1).all()
  assert batch['output_targets'].shape[-1] == 3


def test_demo_trial_noise_is_a_parameter_of_the_data(tmp_path):
  """`trial_noise_std` changes the records and the cache key; wheel speeds
  are unsigned (they would give the choice away)."""
  default = list(demo_data.generate_trials(20, seed=1, split_id=1))
  clean = list(demo_data.generate_trials(20, seed=1, split_id=1,
                                         trial_noise_std=0.0))
  assert default != clean
  wheel_id = configs.DEMO_VOCABULARY.index('wheel_speed') + 1
  speeds = []
  for record in default:
    f = tf.train.Example.FromString(record).features.feature
    ids = list(f['output_task_ids'].int64_list.value)
    sizes = list(f['output_target_sizes'].int64_list.value)
    values = list(f['output_targets'].float_list.value)
    starts = np.cumsum([0] + sizes)
    speeds += [values[starts[q]] for q, i in enumerate(ids) if i == wheel_id]
  assert speeds and min(speeds) >= 0.0
  config = configs.readout_demo_task()
  key = demo_data.demo_data_params(config)
  config.demo_data.trial_noise_std = 0.0
  assert demo_data.demo_data_params(config) != key


def test_static_shapes_give_the_same_losses_and_metrics(cache,
                                                        validation_batch):
  params = _params(cache, 'padded')
  task = task_lib.ReadoutTask(params.task)
  dynamic = task.build_model()
  static_config = params.task.replace(model=params.task.model.replace(
      static_shapes=True))
  static_task = task_lib.ReadoutTask(static_config)
  static = static_task.build_model()
  static.set_weights(dynamic.get_weights())
  batch = validation_batch
  results = []
  for t, model in ((task, dynamic), (static_task, static)):
    _, global_losses, _ = t.compute_losses(batch, model, training=False)
    # The base-task API (labels, outputs) gives the same total, with or
    # without the model.
    for m in (model, None):
      assert float(t.build_losses(batch, model(batch), model=m)) == (
          pytest.approx(float(global_losses['total_loss']), rel=1e-6))
    t.build_metrics(training=False)
    logs = t.validation_step(batch, model)
    state = t.aggregate_logs(None, {k: v for k, v in logs.items()})
    results.append(({k: float(v) for k, v in global_losses.items()},
                    t.reduce_aggregated_logs(state)))
  (dyn_losses, dyn_metrics), (st_losses, st_metrics) = results
  assert dyn_losses == pytest.approx(st_losses, rel=1e-5)
  assert set(dyn_metrics) == set(st_metrics)
  for key, value in dyn_metrics.items():
    assert st_metrics[key] == pytest.approx(value, rel=1e-5, nan_ok=True), key
