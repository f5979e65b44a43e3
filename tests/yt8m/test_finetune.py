"""Fine-tuning: `task.init_checkpoint` with `task.init_checkpoint_modules`.

A backbone trained on one label set (4 classes) initializes a model for
another (6 classes) with a fresh head; 'all' with another class count is an
error naming the head's variables; model_dir's own checkpoint wins over
`init_checkpoint` when a run resumes.
"""
import glob
import logging as std_logging
import os
import shutil

import numpy as np
import pytest
import tensorflow as tf, tf_keras

from official.core import exp_factory
from official.core import task_factory
from official_ext import registry_imports  # pylint: disable=unused-import
from official_ext import train
from official_ext.core import checkpoints
from official_ext.yt8m import task as task_lib


def _params(cache_dir, num_classes, train_steps=2, **task):
  params = exp_factory.get_exp_config('yt8m_demo')
  data = {'num_classes': num_classes, 'global_batch_size': 4,
          'max_frames': 6}
  params.override({
      'runtime': {'distribution_strategy': 'one_device', 'num_gpus': 0},
      'task': {
          'model': {
              'backbone': {'dbof': {'cluster_size': 8, 'hidden_size': 8}},
              'head': {'moe': {'num_mixtures': 2}},
          },
          'train_data': dict(data, num_sample_frames=None, seed=3,
                             shuffle_buffer_size=8),
          'validation_data': data,
          'demo_data': {'cache_dir': str(cache_dir), 'num_train_videos': 16,
                        'num_validation_videos': 8, 'num_shards': 1},
          'jit_compile': False,  # Spares the XLA compilation (seconds).
          **task,
      },
      'trainer': {'train_steps': train_steps, 'steps_per_loop': train_steps,
                  'checkpoint_interval': train_steps,
                  'summary_interval': train_steps},
  }, is_strict=True)
  params.validate()
  return params


@pytest.fixture(scope='module')
def pretrained(tmp_path_factory):
  """A model_dir trained 2 steps on the 4-class label set."""
  root = tmp_path_factory.mktemp('finetune')
  model_dir = root / 'pretrained'
  params = _params(root / 'cache', num_classes=4)
  tf_keras.utils.set_random_seed(1)
  train.run(params, 'train', str(model_dir))
  trained = task_factory.get_task(params.task).build_model()
  checkpoints.restore_model(trained, str(model_dir))
  return {'root': root, 'model_dir': str(model_dir), 'model': trained}


def _values(variables):
  return [v.numpy() for v in variables]


def _build(params):
  task = task_factory.get_task(params.task)
  return task, task.build_model()


def test_backbone_initializes_a_new_label_set_with_a_fresh_head(
    pretrained, caplog):
  params = _params(pretrained['root'] / 'cache', num_classes=6,
                   init_checkpoint=pretrained['model_dir'],
                   init_checkpoint_modules='backbone')
  task, model = _build(params)
  backbone_before = _values(model.backbone.variables)
  head_before = _values(model.head.variables)
  with caplog.at_level(std_logging.INFO, logger='absl'):
    task.initialize(model)
  trained = pretrained['model'].backbone.variables
  assert len(trained) == len(model.backbone.variables) > 0
  for new, old, before in zip(model.backbone.variables, trained,
                              backbone_before):
    np.testing.assert_array_equal(new.numpy(), old.numpy(), err_msg=new.name)
  # Training changed the backbone, so the equality above shows the restore.
  assert any(not np.array_equal(a, b.numpy())
             for a, b in zip(backbone_before, trained))
  # The head is the fresh one, for 6 classes.
  for new, before in zip(model.head.variables, head_before):
    np.testing.assert_array_equal(new.numpy(), before, err_msg=new.name)
  assert model(tf.zeros([1, 6, 1152]))['predictions'].shape == (1, 6)
  # The log lists what was restored, and what was not.
  log = caplog.text
  assert 'task.init_checkpoint: initialized backbone from ' in log
  assert 'backbone/_cluster_dense/kernel' in log and 'freshly initialized: head' in log
  assert 'head/' not in log.split('freshly initialized')[0]


def test_all_restores_the_head_too(pretrained):
  params = _params(pretrained['root'] / 'cache', num_classes=4,
                   init_checkpoint=pretrained['model_dir'],
                   init_checkpoint_modules='all')
  task, model = _build(params)
  task.initialize(model)
  for new, old in zip(model.variables, pretrained['model'].variables):
    np.testing.assert_array_equal(new.numpy(), old.numpy(), err_msg=new.name)


def test_all_with_another_class_count_names_the_head_variable(pretrained):
  params = _params(pretrained['root'] / 'cache', num_classes=6,
                   init_checkpoint=pretrained['model_dir'],
                   init_checkpoint_modules='all')
  task, model = _build(params)
  before = _values(model.variables)
  with pytest.raises(ValueError, match=(
      r"(?s)task.init_checkpoint: Checkpoint .*ckpt-2 does not match the "
      r"model.*head/\S+ \[\d+, 12\] \(checkpoint has \[\d+, 8\]\)")):
    task.initialize(model)
  # Strict: nothing was restored, not even the matching backbone.
  for v, b in zip(model.variables, before):
    np.testing.assert_array_equal(v.numpy(), b, err_msg=v.name)


def test_init_checkpoint_modules_must_be_all_or_backbone(pretrained):
  params = _params(pretrained['root'] / 'cache', num_classes=4,
                   init_checkpoint=pretrained['model_dir'],
                   init_checkpoint_modules='head')
  task, model = _build(params)
  with pytest.raises(ValueError, match=r"task.init_checkpoint_modules='head'"):
    task.initialize(model)


def test_model_dir_checkpoint_takes_precedence_on_resume(pretrained,
                                                         monkeypatch):
  calls = []
  initialize = task_lib.YT8MTask.initialize

  def spy(self, model):
    calls.append(self.task_config.init_checkpoint)
    return initialize(self, model)

  monkeypatch.setattr(task_lib.YT8MTask, 'initialize', spy)
  model_dir = str(pretrained['root'] / 'finetuned')
  task = {'init_checkpoint': pretrained['model_dir'],
          'init_checkpoint_modules': 'backbone'}
  cache = pretrained['root'] / 'cache'
  train.run(_params(cache, 6, **task), 'train', model_dir)
  assert calls == [pretrained['model_dir']]  # A fresh model_dir: initialized.
  # The same command again: model_dir's ckpt-2 is restored (training is
  # done), and init_checkpoint is not read.
  train.run(_params(cache, 6, **task), 'train', model_dir)
  assert calls == [pretrained['model_dir']]
  assert tf.train.latest_checkpoint(model_dir).endswith('ckpt-2')


def test_a_truncated_init_checkpoint_is_named_before_the_task_is_built(
    pretrained, tmp_path, monkeypatch):
  """A checkpoint cut short (a copy interrupted) is an error naming
  task.init_checkpoint, the checkpoint and what is wrong, raised before the
  model and its input are built."""
  copy = tmp_path / 'pretrained'
  shutil.copytree(pretrained['model_dir'], copy)
  data, = glob.glob(str(copy / 'ckpt-2.data-*'))
  with open(data, 'r+b') as f:
    f.truncate(os.path.getsize(data) // 2)
  params = _params(pretrained['root'] / 'cache', num_classes=4,
                   init_checkpoint=str(copy), init_checkpoint_modules='all')
  # The task's own restore names it too.
  task, model = _build(params)
  with pytest.raises(ValueError, match=r'task.init_checkpoint=.*ckpt-2 '
                     r'cannot be read \(IndexError: Read less bytes'):
    task.initialize(model)
  built = []
  monkeypatch.setattr(task_factory, 'get_task',
                      lambda *a, **k: built.append(a) or 1 / 0)
  with pytest.raises(ValueError, match=r'task.init_checkpoint=.*cannot be '
                     r'read') as e:
    train.run(params, 'train', str(tmp_path / 'model'))
  assert str(copy / 'ckpt-2') in str(e.value)
  assert 'Read less bytes than requested' in str(e.value)
  assert not built
