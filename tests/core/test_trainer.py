"""The trainer creates the optimizer's slots before the first training step:
the train loop is traced once, not twice, and the slots are those the first
step would create (every trainable variable of each family's model gets a
gradient)."""
import os

import pytest
import tensorflow as tf, tf_keras  # pylint: disable=unused-import

from official.core import task_factory
from official_ext import train
from official_ext.yt8m import task as yt8m_task
from tests import shipped_configs

DEMO_YAMLS = {f: os.path.join(shipped_configs.REPO, 'configs', f, name)
              for f, name in (('yt8m', 'yt8m_demo_cpu.yaml'),
                              ('assemblenet', 'demo_cpu.yaml'),
                              ('readout', 'readout_demo_cpu.yaml'))}


@pytest.fixture(scope='module')
def cache(tmp_path_factory):
  return tmp_path_factory.mktemp('trainer_cache')


def test_the_training_step_is_traced_once(cache, tmp_path, monkeypatch):
  traced = []
  step = yt8m_task.YT8MTask.train_step

  def counting_step(self, *args, **kwargs):
    traced.append(tf.executing_eagerly())
    return step(self, *args, **kwargs)

  monkeypatch.setattr(yt8m_task.YT8MTask, 'train_step', counting_step)
  params = shipped_configs.tiny_params(DEMO_YAMLS['yt8m'], cache)
  # Two train loops of one step (tiny_params): the loop function is traced
  # on the first and reused by the second.
  assert params.trainer.steps_per_loop == 1
  assert params.trainer.train_steps == 2
  train.run(params, 'train', str(tmp_path / 'model'),
            strategy=tf.distribute.OneDeviceStrategy('/cpu:0'),
            policy=shipped_configs.policy_for(params))
  assert traced == [False], traced


@pytest.mark.parametrize('family', sorted(DEMO_YAMLS))
def test_every_trainable_variable_gets_a_gradient(family, cache):
  """One eager training step with an optimizer left to create its slots
  itself creates one for every trainable variable: the slots
  `core.run.trainer.create_optimizer_weights` makes up front are the same."""
  params = shipped_configs.tiny_params(DEMO_YAMLS[family], cache)
  task = task_factory.get_task(params.task)
  model = task.build_model()
  optimizer = task.create_optimizer(params.trainer.optimizer_config,
                                    params.runtime)
  batch = next(iter(task.build_inputs(params.task.train_data)))
  task.train_step(batch, model, optimizer, task.build_metrics(training=True))
  slot = optimizer.get_slot_names()[0]
  missing = []
  for variable in model.trainable_variables:
    try:
      optimizer.get_slot(variable, slot)
    except KeyError:
      missing.append(variable.name)
  assert model.trainable_variables and not missing, missing
