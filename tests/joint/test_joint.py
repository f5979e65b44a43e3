"""Joint experiments: readout and YT8M tasks on one shared encoder.

They run through `official_ext.train.run` like every other experiment (the
one runner: batch check, checkpoint restore, resume reseed, non-finite stop,
progress line, final metrics), with Model Garden's joint or interleaving
multitask trainer.
"""
import glob
import logging
import os
import re
import shutil

import numpy as np
import pytest
import tensorflow as tf, tf_keras
import yaml

from official.core import config_definitions as cfg
from official.core import exp_factory
from official.core import task_factory
from official_ext.core import config_comparison
from official_ext.core import experiment_params
from official_ext.core.input import input_files
from official_ext.core.run import orbit_actions
from official_ext import export_saved_model
from official_ext.joint import configs
from official_ext.joint import modeling
from official_ext.readout import configs as readout_configs
from official_ext.readout import dataloader as readout_dataloader
from official_ext.readout import demo_data as readout_demo_data
from official_ext.readout import export as readout_export
from official_ext.readout.modeling import model as readout_model
from official_ext.readout import task as readout_task
from official_ext import registry_imports  # pylint: disable=unused-import
from official_ext import train
from official_ext.yt8m import configs as yt8m_configs
from official_ext.yt8m import export as yt8m_export
from official_ext.yt8m import task as yt8m_task
from tests import cli

_ENCODER = {'hidden_size': 8, 'num_heads': 2, 'num_layers': 1,
            'intermediate_size': 8}


def _readout(cache_dir, seed=0) -> readout_configs.ReadoutTaskConfig:
  """The readout demo task, tiny; `seed` chooses its generated dataset."""
  config = readout_configs.readout_demo_task(num_train=16, num_val=16,
                                             batch_size=8)
  config.override({
      'model': {'encoder': _ENCODER},
      'train_data': {'seed': 1, 'shuffle_buffer_size': 16},
      'validation_data': {'global_batch_size': 16},
      'demo_data': {'cache_dir': str(cache_dir), 'seed': seed},
      'evaluation': {'print_table': False},
  }, is_strict=True)
  return config


def _yt8m(cache_dir) -> yt8m_configs.YT8MTask:
  config = configs.tiny_yt8m_task()
  data = {'max_frames': 6, 'num_classes': 5, 'feature_sizes': [4, 2]}
  config.override({
      'train_data': dict(data, global_batch_size=8, seed=1,
                         shuffle_buffer_size=16),
      'validation_data': dict(data, global_batch_size=16),
      'demo_data': {'cache_dir': str(cache_dir), 'num_train_videos': 16,
                    'num_validation_videos': 16, 'num_shards': 1},
      'jit_compile': False,
  }, is_strict=True)
  return config


def _params(cache_dir, train_steps=4, routines=None, **trainer):
  """readout_yt8m_joint, tiny; `routines`: [(task name, task config)]."""
  params = exp_factory.get_exp_config('readout_yt8m_joint')
  params.override({
      'task': {'model': {'encoder': _ENCODER}},
      'runtime': {'distribution_strategy': 'one_device', 'num_gpus': 0},
      'trainer': dict({'train_steps': train_steps, 'steps_per_loop': 2,
                       'summary_interval': 2, 'checkpoint_interval': 2,
                       'validation_interval': train_steps}, **trainer),
  }, is_strict=True)
  if routines is None:
    routines = [('readout', _readout(cache_dir)), ('yt8m', _yt8m(cache_dir))]
  params.task.task_routines = tuple(
      configs.JointTaskRoutine(task_name=name, task_config=task_config)
      for name, task_config in routines)
  params.validate()
  return params


# Tests whose subject is not graph training train eagerly: tracing the joint
# training step (every task's forward and backward) costs ~10x running a few
# of its steps; `joint_run` trains in a graph, as configured.
_EAGER = {'train_tf_function': False, 'train_tf_while_loop': False}


def _loops(records):
  return [int(s) for s in re.findall(r'train \| step:\s+(\d+) \| steps/sec',
                                     records)]


@pytest.fixture(scope='module')
def cache(tmp_path_factory):
  """The demo data cache of every test here (each dataset generated once)."""
  return tmp_path_factory.mktemp('joint_cache')


@pytest.fixture(scope='module')
def joint_run(tmp_path_factory, cache):
  """(cache, model_dir, params, model, final metrics) of a 4-step run."""
  root = tmp_path_factory.mktemp('joint')
  params = _params(cache)
  tf_keras.utils.set_random_seed(1)
  model, logs = train.run(params, 'train_and_eval', str(root / 'model'))
  return cache, str(root / 'model'), params, model, logs


@pytest.fixture(scope='module')
def train_batches(cache):
  """{routine: its first training batch} of `_params` (each input pipeline
  costs seconds to build)."""
  multi = task_factory.get_task(_params(cache).task)
  return {name: next(iter(task.build_inputs(task.task_config.train_data)))
          for name, task in multi.tasks.items()}


def test_joint_train_eval_and_graft(joint_run, train_batches):
  _, model_dir, params, model, logs = joint_run
  readout_sub = model.sub_tasks['readout']
  yt8m_sub = model.sub_tasks['yt8m']
  assert readout_sub.encoder is yt8m_sub.encoder is model.encoder
  assert tf.train.latest_checkpoint(model_dir).endswith('ckpt-4')
  # Each task evaluated with its own metrics, reported as <task>/<metric>.
  assert 'readout/choice/balanced_accuracy' in logs
  assert 'readout/wheel_speed/r2' in logs
  assert 'yt8m/map' in logs and 'yt8m/gap' in logs
  assert logs['yt8m/num_videos'] == 16
  # The readout head grafted out of the joint checkpoint predicts the same.
  readout_config = params.task.task_routines[0].task_config
  single = readout_model.graft_single_task_head(readout_config, 'wheel_speed',
                                                model_dir)
  batch = train_batches['readout']
  np.testing.assert_allclose(single(batch)['wheel_speed'],
                             readout_sub(batch)['wheel_speed'], atol=1e-5)


def test_joint_run_resumes_from_the_newest_checkpoint(joint_run, tmp_path,
                                                     monkeypatch, caplog,
                                                     capsys):
  """The same runner as single-task runs: the newest checkpoint restored,
  every routine's training input reseeded from (seed, step), the progress
  line logged."""
  cache, trained_dir, _, _, _ = joint_run
  model_dir = str(tmp_path / 'model')
  shutil.copytree(trained_dir, model_dir)
  seeds = {}

  def recording(task_cls):
    build_inputs = task_cls.build_inputs

    def build(self, params, input_context=None):
      if params.is_training:
        seeds[self.name] = params.seed
      return build_inputs(self, params, input_context)
    return build

  for task_cls in (readout_task.ReadoutTask, yt8m_task.YT8MTask):
    monkeypatch.setattr(task_cls, 'build_inputs', recording(task_cls))
  caplog.set_level(logging.INFO, logger='absl')
  capsys.readouterr()
  _, logs = train.run(_params(cache, train_steps=6, **_EAGER), 'train',
                      model_dir)
  assert tf.train.latest_checkpoint(model_dir).endswith('ckpt-6')
  assert _loops(capsys.readouterr().out) == [6]  # Steps 5-6 only.
  assert seeds == {'readout': input_files.restart_seed(1, 4),
                   'yt8m': input_files.restart_seed(1, 4)}
  assert 'progress | step 6/6 (100%)' in caplog.text
  assert np.isfinite(logs['training_loss'])
  assert 'readout/training_loss' in logs and 'yt8m/training_loss' in logs


def test_batch_check_names_the_routine_key(tmp_path, cache, mirrored):
  params = _params(cache)
  params.task.task_routines[1].task_config.train_data.global_batch_size = 7
  with pytest.raises(ValueError, match=re.escape(
      'task.task_routines[1].task_config.train_data.global_batch_size=7 does '
      'not divide evenly over the 2 replicas')):
    train.run(params, 'train', str(tmp_path / 'model'), strategy=mirrored)
  assert not os.path.exists(tmp_path / 'model' / 'checkpoint')


def _yt8m_alone(cache_dir, **kwargs):
  return _params(cache_dir, routines=[('video', _yt8m(cache_dir))], **kwargs)


def test_yt8m_alone_on_the_token_encoder(tmp_path, cache):
  params = _yt8m_alone(cache, train_steps=2, **_EAGER)
  model, logs = train.run(params, 'train', str(tmp_path / 'model'))
  assert list(model.sub_tasks) == ['video']
  assert model.sub_tasks['video'].encoder is model.encoder
  assert np.isfinite(logs['video/training_loss'])


def test_non_finite_loss_stops_a_joint_run(tmp_path, cache):
  params = _yt8m_alone(
      cache, train_steps=8, steps_per_loop=4,
      summary_interval=4, checkpoint_interval=4,
      optimizer_config={
          'learning_rate': {'type': 'stepwise', 'stepwise': {
              'boundaries': [2], 'values': [0.002, 1e38]}},
          'warmup': {'type': None}}, **_EAGER)
  params.task.gradient_clip_norm = 0.0
  model_dir = str(tmp_path / 'model')
  with pytest.raises(orbit_actions.NonFiniteLossError) as e:
    train.run(params, 'train', model_dir)
  step = int(re.search(r'not finite at step (\d+)', str(e.value)).group(1))
  assert 2 < step <= 8
  # Stopped before Orbit saved the bad loop's checkpoint: the latest one (if
  # any) is from before the step, and finite.
  latest = tf.train.latest_checkpoint(model_dir)
  if latest:
    assert int(latest.rsplit('-', 1)[1]) < step
    reader = tf.train.load_checkpoint(latest)
    assert all(np.all(np.isfinite(reader.get_tensor(name)))
               for name, dtype in reader.get_variable_to_dtype_map().items()
               if dtype.is_floating)


def test_two_readout_routines_interleaved(tmp_path, cache, monkeypatch):
  """Two readout tasks (two datasets) on one encoder, Model Garden's
  interleaving trainer: each step trains one task, sampled uniformly.

  The steps run eagerly (`trainer.train_tf_function` false, which the
  multitask trainers honour as the single-task one does): tracing the
  interleaving step traces every task's step (a `tf.cond` per task), ~5x
  the cost of the run; the joint trainer's test trains in a graph.
  """
  params = _params(cache, train_steps=4, trainer_type='interleaving',
                   steps_per_loop=4, summary_interval=4,
                   checkpoint_interval=4,
                   routines=[('lab_a', _readout(cache, seed=0)),
                             ('lab_b', _readout(cache, seed=1))])
  params.override({'trainer': dict({'task_sampler': {'type': 'uniform'}},
                                   **_EAGER)})
  task_steps = []
  task_step = readout_task.ReadoutTask.train_step

  def counted_step(self, *args, **kwargs):
    task_steps.append(type(self).__name__)
    return task_step(self, *args, **kwargs)

  monkeypatch.setattr(readout_task.ReadoutTask, 'train_step', counted_step)
  model, logs = train.run(params, 'train', str(tmp_path / 'model'))
  # Eager: one task step per training step (a graph would have run the
  # Python function once per task, when tracing).
  assert len(task_steps) == 4
  assert set(model.sub_tasks) == {'lab_a', 'lab_b'}
  assert (model.sub_tasks['lab_a'].encoder is
          model.sub_tasks['lab_b'].encoder is model.encoder)
  assert (model.sub_tasks['lab_a'].decoder is not
          model.sub_tasks['lab_b'].decoder)
  # Both tasks were trained in the loop (a task never sampled has no mean
  # loss: 0); the loop's training_loss is the mean over its 4 steps.
  for name in ('lab_a', 'lab_b'):
    assert logs[f'{name}/training_loss'] > 0
    assert f'{name}/choice_loss' in logs
  assert 'total_loss/training_loss' not in logs  # Interleaving has none.
  assert min(logs['lab_a/training_loss'], logs['lab_b/training_loss']) <= (
      logs['training_loss']) <= max(logs['lab_a/training_loss'],
                                    logs['lab_b/training_loss'])
  assert tf.train.latest_checkpoint(str(tmp_path / 'model')).endswith('ckpt-4')


def _kernels(variables, exclude=()):
  exclude = {v.ref() for v in exclude}
  return [v for v in variables if v.ref() not in exclude and
          v.name.split('/')[-1].startswith('kernel')]


def _sum_sq(variables):
  return tf.add_n([tf.reduce_sum(tf.square(v)) for v in variables])


def test_total_loss_is_the_hand_sum_of_task_losses_and_regularization(
    train_batches, cache):
  """total = 0.7 readout + 1.3 yt8m + each L2 term once, and one SGD step
  moves every variable by the gradient of that hand-computed sum."""
  params = _params(cache)
  params.task.gradient_clip_norm = 0.0
  params.task.model.encoder_l2_weight_decay = 0.2
  readout, yt8m = params.task.task_routines
  readout.task_weight, yt8m.task_weight = 0.7, 1.3
  yt8m.task_config.losses.l2_weight_decay = 0.1
  tf_keras.utils.set_random_seed(2)
  multi = task_factory.get_task(params.task)
  model = multi.build_multitask_model()
  inputs = dict(train_batches)  # `_params`' batches: the same data configs.
  readout_sub, yt8m_sub = model.sub_tasks['readout'], model.sub_tasks['yt8m']
  encoder = model.encoder.trainable_variables
  tvars = model.trainable_variables
  # The encoder's term is in both sub-models' losses, once in the model's.
  assert len(readout_sub.losses) == 1 and len(yt8m_sub.losses) == 4
  assert len(model.regularization_losses()) == 4

  with tf.GradientTape(persistent=True) as tape:
    # Readout: the single-task loss of the readout task (its own function).
    batch = inputs['readout']
    readout_loss = multi.tasks['readout'].build_losses(
        batch, readout_sub(batch, training=True), model=readout_sub)
    # YT8M: mean binary cross-entropy over examples and classes, by hand.
    batch = inputs['yt8m']
    p = tf.clip_by_value(
        yt8m_sub(batch['video_matrix'], num_frames=batch['num_frames'],
                 training=True)['predictions'], 1e-7, 1 - 1e-7)
    y = batch['labels']
    yt8m_loss = -tf.reduce_mean(y * tf.math.log(p) +
                                (1 - y) * tf.math.log(1 - p))
    # L2: 0.1 / 2 on the YT8M frame embedding and head kernels, 0.2 / 2 on
    # the encoder's kernels, each once.
    yt8m_l2 = 0.05 * _sum_sq(_kernels(yt8m_sub.trainable_variables, encoder))
    encoder_l2 = 0.1 * _sum_sq(_kernels(encoder))
    expected = 0.7 * readout_loss + 1.3 * yt8m_loss + yt8m_l2 + encoder_l2
  grads = tape.gradient(expected, tvars)
  assert float(encoder_l2) > 0.01 * float(expected)  # Counting it twice shows.
  # Both tasks' losses reach the shared encoder.
  for loss in (readout_loss, yt8m_loss):
    assert any(float(tf.norm(g)) > 0
               for g in tape.gradient(loss, encoder) if g is not None)

  before = [v.numpy() for v in tvars]
  optimizer = tf_keras.optimizers.SGD(learning_rate=1.0)
  metrics = {n: t.build_metrics(training=True) for n, t in multi.tasks.items()}
  losses = multi.joint_train_step(inputs, model, optimizer, metrics)
  assert float(losses['total_loss']) == pytest.approx(float(expected),
                                                      rel=1e-5)
  assert float(losses['readout']) == pytest.approx(float(readout_loss),
                                                   rel=1e-5)
  assert float(losses['yt8m']) == pytest.approx(float(yt8m_loss), rel=1e-5)
  for v, b, g in zip(tvars, before, grads):
    g = np.zeros_like(b) if g is None else tf.convert_to_tensor(g).numpy()
    np.testing.assert_allclose(v.numpy(), b - g, rtol=1e-4, atol=1e-6,
                               err_msg=v.name)


@pytest.mark.parametrize('head, shapes', [
    ({'type': 'logistic'}, {'head/logits/kernel': (8, 5)}),
    ({'type': 'moe', 'moe': {'num_mixtures': 3}},
     {'head/gate/kernel': (8, 5 * 4), 'head/expert/kernel': (8, 5 * 3)}),
])
def test_yt8m_head_and_l2_follow_the_yt8m_task_config(cache, head, shapes):
  params = _yt8m_alone(cache)
  task = params.task.task_routines[0].task_config
  task.model.head.override(head)
  task.losses.l2_weight_decay = 0.3
  model = modeling.JointModel(params.task)
  sub = model.sub_tasks['video']
  names = {re.sub(r'^.*?(head/|frame_embedding/)', r'\1', v.name)[:-2]:
           tuple(v.shape) for v in sub.trainable_variables
           if 'encoder' not in v.name}
  assert {k: names[k] for k in shapes} == shapes
  assert names['frame_embedding/kernel'] == (6, 8)  # 4 + 2 features -> 8.
  # Every own kernel carries 0.3 / 2 * sum(w^2); the encoder none (decay 0).
  kernels = _kernels(sub.trainable_variables, model.encoder.variables)
  assert len(kernels) == len(shapes) + 1
  np.testing.assert_allclose(
      sorted(float(l) for l in sub.losses),
      sorted(0.15 * float(_sum_sq([k])) for k in kernels), rtol=1e-6)
  # YT8M's own head class, as the YT8M model builds it.
  assert type(sub.head).__name__ == {'logistic': 'LogisticHead',
                                     'moe': 'MoeHead'}[head['type']]


def test_routines_of_another_number_and_family_from_yaml(tmp_path):
  """A YAML file may give any list of routines: each builds its family's
  task config (Model Garden's generic routine would build base TaskConfigs)."""
  path = tmp_path / 'three.yaml'
  path.write_text(yaml.safe_dump({'task': {'task_routines': [
      {'task_name': 'a', 'family': 'readout',
       'task_config': {'model': {'encoder': {'hidden_size': 64}}}},
      {'task_name': 'b', 'family': 'readout',
       'task_config': {'train_data': {'global_batch_size': 4}}},
      {'task_name': 'v', 'family': 'yt8m',
       'task_config': {'model': {'backbone': {'type': None}}}},
  ]}}))
  params = experiment_params.load_params('readout_yt8m_joint', [str(path)])
  kinds = [type(r.task_config).__name__ for r in params.task.task_routines]
  assert kinds == ['ReadoutTaskConfig', 'ReadoutTaskConfig', 'YT8MTask']
  assert params.task.task_routines[1].task_config.train_data \
      .global_batch_size == 4
  # Strict inside a routine: a key the family's config lacks is named.
  path.write_text(yaml.safe_dump({'task': {'task_routines': [
      {'task_name': 'a', 'family': 'yt8m',
       'task_config': {'readouts': []}}]}}))
  with pytest.raises(KeyError, match="'readouts' does not exist"):
    experiment_params.load_params('readout_yt8m_joint', [str(path)])


@pytest.mark.parametrize('override, key', [
    ({'task': {'task_routines': [
        {'task_config': {'model': {'encoder': {'num_heads': 2}}}}, {}]}},
     r'task.task_routines[0].task_config.model.encoder.num_heads=2 differs '
     r'from task.model.encoder.num_heads=4'),
    ({'task': {'task_routines': [
        {}, {'task_config': {'model': {'backbone': {'type': 'dbof'}}}}]}},
     "task.task_routines[1].task_config.model.backbone.type='dbof'"),
    ({'task': {'task_routines': [{}, {'task_name': 'readout'}]}},
     "task.task_routines[1].task_name='readout' repeats "
     'task.task_routines[0].task_name'),
    ({'trainer': {'trainer_type': 'alternating'}},
     "trainer.trainer_type='alternating'"),
    ({'task': {'init_checkpoint': '/x'}}, "task.init_checkpoint='/x'"),
    ({'task': {'task_routines': [{}, {'task_config': {
        'init_checkpoint': '/x'}}]}},
     "task.task_routines[1].task_config.init_checkpoint='/x'"),
    ({'task': {'task_routines': []}}, 'task.task_routines is empty'),
])
def test_combination_that_cannot_work_names_the_key(override, key):
  params = exp_factory.get_exp_config('readout_yt8m_joint')
  params.override(override, is_strict=True)
  with pytest.raises(ValueError, match=re.escape(key)):
    params.validate()


def test_wrong_type_inside_a_routine_names_the_key(tmp_path):
  path = tmp_path / 'bad.yaml'
  path.write_text(yaml.safe_dump({'task': {'task_routines': [
      {}, {'task_config': {'train_data': {'global_batch_size': 'abc'}}}]}}))
  with pytest.raises(ValueError, match=re.escape(
      "task.task_routines[1].task_config.train_data.global_batch_size: "
      "expected int, got 'abc' (str)")):
    experiment_params.load_params('readout_yt8m_joint', [str(path)])


def test_joint_config_round_trips_through_params_yaml(joint_run):
  """params.yaml of a joint run loads back to the same config."""
  _, model_dir, params, _, _ = joint_run
  loaded = experiment_params.load_params('readout_yt8m_joint',
                                         checkpoint_path=model_dir)
  assert (config_comparison.config_leaves(loaded) ==
          config_comparison.config_leaves(params))
  assert [r.family for r in loaded.task.task_routines] == ['readout', 'yt8m']


def test_export_saved_model_serves_each_routine_like_its_family(joint_run,
                                                                tmp_path):
  """`export_saved_model` on a joint run (its params.yaml, its newest
  checkpoint restored strictly): one signature per routine, named after it,
  each serving the routine's sub-model as its family's `serving_default`
  serves it; TensorFlow's saved_model_cli shows their inputs and outputs."""
  cache, model_dir, params, model, _ = joint_run
  export_dir = tmp_path / 'export'
  cli.run_main(export_saved_model, '--experiment=readout_yt8m_joint',
               f'--checkpoint_path={model_dir}', f'--export_dir={export_dir}',
               '--top_k=3')
  # TensorFlow's own tool, in a fresh process, meanwhile.
  shown = cli.start_saved_model_cli(['show', '--dir', export_dir, '--all'])
  loaded = tf.saved_model.load(str(export_dir))
  assert sorted(loaded.signatures) == ['readout', 'yt8m']
  readout_config, yt8m_config = (r.task_config
                                 for r in params.task.task_routines)
  readout_records = list(readout_demo_data.generate_trials(
      3, seed=0, split_id=2))
  yt8m_records = list(tf.data.TFRecordDataset(
      glob.glob(os.path.join(str(cache), '**', 'validation-*'),
                recursive=True)).take(3).as_numpy_iterator())
  assert len(yt8m_records) == 3
  # The family modules on the trained sub-models, in this process.
  family = lambda task: cfg.ExperimentConfig(task=task)
  expected = {
      'readout': readout_export.ReadoutExportModule(
          family(readout_config), model.sub_tasks['readout']).serve(
              tf.constant(readout_records)),
      'yt8m': yt8m_export.YT8MExportModule(
          family(yt8m_config), model.sub_tasks['yt8m'], top_k=3).serve(
              tf.constant(yt8m_records)),
  }
  for name, records in (('readout', readout_records),
                        ('yt8m', yt8m_records)):
    served = loaded.signatures[name](examples=tf.constant(records))
    assert sorted(served) == sorted(expected[name]), name
    for key, value in expected[name].items():
      if value.dtype == tf.string:
        assert served[key].numpy().tolist() == value.numpy().tolist()
      else:
        np.testing.assert_allclose(served[key], value, atol=1e-5,
                                   err_msg=f'{name}/{key}')
  # A bad record is refused as the family's serving_default refuses it.
  with pytest.raises(tf.errors.InvalidArgumentError,
                     match=r'input `examples`\[1\]'):
    loaded.signatures['yt8m'](examples=tf.constant([yt8m_records[0],
                                                    b'not a record']))

  shown = cli.shown_signatures(shown())
  examples = {'examples': ('DT_STRING', '(-1)')}
  classes = yt8m_config.validation_data.num_classes
  assert shown['yt8m'] == (examples, {
      'video_id': ('DT_STRING', '(-1)'),
      'top_k_classes': ('DT_INT32', '(-1, 3)'),
      'top_k_scores': ('DT_FLOAT', '(-1, 3)'),
      'probabilities': ('DT_FLOAT', f'(-1, {classes})')})
  width = lambda spec: 2 if spec.type == 'von_mises' else spec.dim
  readouts = {spec.name: ('DT_FLOAT', f'(-1, -1, {width(spec)})')
              for spec in readout_config.readouts}
  assert shown['readout'][0] == examples
  targets = readout_dataloader.Parser(
      readout_config.validation_data, readout_config.readouts,
      readout_config.task_vocabulary).max_target_size
  assert shown['readout'][1] == dict(
      readouts, output_readout_index=('DT_INT32', '(-1, -1)'),
      targets=('DT_FLOAT', f'(-1, -1, {targets})'),
      weights=('DT_FLOAT', '(-1, -1)'))
  assert sorted(shown) == ['readout', 'yt8m']
