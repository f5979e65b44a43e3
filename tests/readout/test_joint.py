"""Joint readout + YT8M training on one shared encoder (official multitask)."""
import numpy as np
import pytest
import tensorflow as tf, tf_keras

from official.core import exp_factory
from official_ext.readout import joint
from official_ext.readout.modeling import model as model_lib


def _params(cache_dir, train_steps=4):
  params = exp_factory.get_exp_config('readout_yt8m_joint')
  readout, yt8m = params.task.task_routines
  readout.task_config.override({
      'model': {'encoder': {'hidden_size': 8, 'num_heads': 2, 'num_layers': 1,
                            'intermediate_size': 8}},
      'train_data': {'global_batch_size': 8, 'seed': 1},
      'validation_data': {'global_batch_size': 16},
      'demo_data': {'cache_dir': str(cache_dir), 'num_train_trials': 16,
                    'num_validation_trials': 16},
      'evaluation': {'print_table': False},
  }, is_strict=True)
  yt8m.task_config.override({
      'train_data': {'global_batch_size': 8, 'max_frames': 6, 'seed': 1,
                     'num_classes': 5, 'feature_sizes': [4, 2]},
      'validation_data': {'global_batch_size': 16, 'max_frames': 6,
                          'num_classes': 5, 'feature_sizes': [4, 2]},
      'demo_data': {'cache_dir': str(cache_dir), 'num_train_videos': 16,
                    'num_validation_videos': 16, 'num_shards': 1},
  }, is_strict=True)
  params.override({
      'runtime': {'distribution_strategy': 'one_device', 'num_gpus': 0},
      'trainer': {'train_steps': train_steps, 'steps_per_loop': train_steps,
                  'summary_interval': train_steps,
                  'checkpoint_interval': train_steps,
                  'validation_interval': train_steps}}, is_strict=True)
  return params


def test_joint_train_eval_and_graft(tmp_path):
  params = _params(tmp_path / 'cache')
  model, logs = joint.run(params, 'train_and_eval', str(tmp_path / 'model'),
                          strategy=tf.distribute.OneDeviceStrategy('/cpu:0'))
  readout_model = model.sub_tasks['readout']
  yt8m_model = model.sub_tasks['yt8m']
  assert readout_model.encoder is yt8m_model.encoder is model.encoder
  # Each task evaluated with its own metrics.
  assert 'choice/balanced_accuracy' in logs['readout']
  assert 'wheel_speed/r2' in logs['readout']
  assert 'map' in logs['yt8m'] and 'gap' in logs['yt8m']
  # The readout head grafted out of the joint checkpoint predicts the same.
  readout_config = params.task.task_routines[0].task_config
  single = model_lib.graft_single_task_head(readout_config, 'wheel_speed',
                                            str(tmp_path / 'model'))
  task = joint.JointMultiTask.from_config(params.task).tasks['readout']
  batch = next(iter(task.build_inputs(readout_config.validation_data)))
  np.testing.assert_allclose(single(batch)['wheel_speed'],
                             readout_model(batch)['wheel_speed'], atol=1e-5)


def test_one_update_from_the_weighted_sum_of_task_losses(tmp_path):
  params = _params(tmp_path / 'cache')
  params.task.gradient_clip_norm = 0.0
  routines = params.task.task_routines
  routines[0].task_weight, routines[1].task_weight = 0.7, 1.3
  tf_keras.utils.set_random_seed(2)
  multi = joint.JointMultiTask.from_config(params.task)
  model = joint.JointModel(params.task)
  inputs = {name: next(iter(task.build_inputs(task.task_config.train_data)))
            for name, task in multi.tasks.items()}
  tvars = model.trainable_variables
  shared = {v.ref() for v in model.encoder.trainable_variables}
  assert shared and shared <= {v.ref() for v in tvars}
  with tf.GradientTape(persistent=True) as tape:
    task_losses = {name: multi.task_losses(multi.tasks[name], sub,
                                           inputs[name])[1]
                   for name, sub in model.sub_tasks.items()}
    expected_total = (0.7 * task_losses['readout'] +
                      1.3 * task_losses['yt8m'])
  grads = tape.gradient(expected_total, tvars)
  yt8m_grads = tape.gradient(task_losses['yt8m'], model.encoder.variables)
  # Both tasks reach the shared encoder.
  assert any(float(tf.norm(g)) > 0 for g in yt8m_grads if g is not None)
  before = [v.numpy() for v in tvars]
  optimizer = tf_keras.optimizers.SGD(learning_rate=1.0)
  metrics = {n: t.build_metrics(training=True) for n, t in multi.tasks.items()}
  losses = multi.joint_train_step(inputs, model, optimizer, metrics)
  assert float(losses['total_loss']) == pytest.approx(
      float(expected_total), rel=1e-5)
  for v, b, g in zip(tvars, before, grads):
    g = np.zeros_like(b) if g is None else tf.convert_to_tensor(g).numpy()
    np.testing.assert_allclose(v.numpy(), b - g, rtol=1e-4, atol=1e-6,
                               err_msg=v.name)
