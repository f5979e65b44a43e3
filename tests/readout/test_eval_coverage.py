"""Readout evaluation covers every validation trial, never an empty one.

`configs/readout/readout_tpu.yaml` evaluates with static batches
(`drop_remainder: true`) of 1024 trials; on a smaller validation set that used
to give zero batches and no metric. The last batch is now padded and the
padding masked (`official_ext.core.input.eval_padding`), and an evaluation of zero
records is an error naming the dataset.
"""
import math
import re

import numpy as np
import pytest
import tensorflow as tf, tf_keras

from official.core import exp_factory
from official_ext.core.input import eval_padding
from official_ext.readout import configs
from official_ext.readout import dataloader
from official_ext.readout import demo_data
from official_ext import registry_imports  # pylint: disable=unused-import
from official_ext import train

_NUM_VALIDATION = 20


def _params(cache_dir):
  params = exp_factory.get_exp_config('readout_demo')
  data = {'global_batch_size': 8, 'batching': 'padded', 'seed': 5,
          'shuffle_buffer_size': 16}
  params.override({
      'runtime': {'distribution_strategy': 'one_device', 'num_gpus': 0},
      'task': {
          'model': {'encoder': {'hidden_size': 8, 'num_heads': 2,
                                'num_layers': 1, 'intermediate_size': 8},
                    'static_shapes': True},
          'train_data': data,
          'validation_data': dict(data, drop_remainder=False),
          'demo_data': {'cache_dir': str(cache_dir), 'num_train_trials': 16,
                        'num_validation_trials': _NUM_VALIDATION},
      },
      'trainer': {'train_steps': 1, 'steps_per_loop': 1,
                  'checkpoint_interval': 1, 'summary_interval': 1,
                  'validation_interval': 1, 'validation_steps': -1},
  }, is_strict=True)
  params.validate()
  return params


@pytest.fixture(scope='module')
def trained(tmp_path_factory):
  """(params, model_dir): one training step, checkpointed.

  The step runs eagerly (`trainer.train_tf_function` false): the evaluations
  only need a checkpoint, and tracing a training step costs ~10x running it.
  The evaluations run in graphs, as configured.
  """
  root = tmp_path_factory.mktemp('readout_eval')
  params = _params(root / 'cache')
  params.override({'trainer': {'train_tf_function': False,
                               'train_tf_while_loop': False}}, is_strict=True)
  tf_keras.utils.set_random_seed(3)
  train.run(params, 'train', str(root / 'model'))
  return params, str(root / 'model')


def _evaluate(params, model_dir, strategy=None, **validation):
  params = params.replace(task=params.task.replace(
      validation_data=params.task.validation_data.replace(**validation)))
  _, logs = train.run(params, 'eval', model_dir, strategy=strategy)
  return logs


# As readout_tpu.yaml: a static batch larger than the validation set
# (drop_remainder, fixed token and query counts).
_TPU = dict(global_batch_size=64, drop_remainder=True, max_input_tokens=24,
            max_queries=40)


@pytest.fixture(scope='module')
def tpu_one_device(trained):
  """The one-device evaluation with `_TPU` batches (two tests compare
  with it)."""
  params, model_dir = trained
  return _evaluate(params, model_dir, **_TPU)


def test_static_batch_larger_than_the_validation_set(trained, tpu_one_device):
  """As readout_tpu.yaml (batch > trials, drop_remainder, fixed sizes): every
  trial is evaluated, and the metrics equal a small-batch run's."""
  params, model_dir = trained
  tpu = tpu_one_device
  small = _evaluate(params, model_dir, global_batch_size=8,
                    drop_remainder=False)
  keys = sorted(k for k in small if '/' in k)
  assert 'wheel_speed/r2' in keys and 'average/score' in keys
  assert keys == sorted(k for k in tpu if '/' in k)
  assert int(tpu['num_examples']) == _NUM_VALIDATION
  assert int(small['num_examples']) == _NUM_VALIDATION
  for key in keys:
    assert math.isfinite(float(tpu[key])), key
    assert float(tpu[key]) == pytest.approx(float(small[key]), rel=1e-4,
                                            abs=1e-5), key


@pytest.mark.parametrize('drop_remainder', [True, False])
def test_empty_validation_set_is_an_error_naming_it(trained, tmp_path,
                                                    drop_remainder):
  params, model_dir = trained
  path = str(tmp_path / 'empty.tfrecord')
  with tf.io.TFRecordWriter(path):
    pass  # Zero records.
  with pytest.raises(eval_padding.EmptyEvaluationError,
                     match=re.escape(path) + r'.*global_batch_size=64.*'
                     fr'drop_remainder={drop_remainder}'):
    _evaluate(params, model_dir, input_path=path, global_batch_size=64,
              drop_remainder=drop_remainder)


def test_static_batch_on_two_replicas(trained, tpu_one_device, mirrored):
  """Two replicas: the padded pipeline gives every replica a batch at every
  step (one of them all padding here); the metrics are one device's."""
  params, model_dir = trained
  one = tpu_one_device
  two = _evaluate(params, model_dir, strategy=mirrored, **_TPU)
  assert int(two['num_examples']) == _NUM_VALIDATION
  keys = sorted(k for k in one if '/' in k)
  assert keys == sorted(k for k in two if '/' in k)
  for key in keys + ['total_loss']:
    assert float(two[key]) == pytest.approx(float(one[key]), rel=1e-4,
                                            abs=1e-5), key


@pytest.mark.parametrize('batching', ['padded', 'varlen'])
def test_padding_trials_have_query_weight_zero(tmp_path, batching):
  """The dataloader's padded last batch: `eval_mask` marks the copies, whose
  queries weigh 0 (so no loss or metric sees them)."""
  trials = list(demo_data.generate_trials(5, seed=1, split_id=2))
  path = str(tmp_path / 'valid.tfrecord')
  dataloader.write_records(path, trials)
  data = configs.DataConfig(input_path=path, global_batch_size=4,
                            drop_remainder=True, batching=batching,
                            input_dim=configs.DEMO_INPUT_DIM,
                            is_training=False)
  batches = list(dataloader.build_dataset(data, configs.DEMO_READOUTS,
                                          configs.DEMO_VOCABULARY))
  assert len(batches) == 2
  mask = np.concatenate([b[eval_padding.MASK_KEY] for b in batches])
  np.testing.assert_array_equal(mask, [True] * 5 + [False] * 3)
  for b in batches:
    assert b['input_values'].shape[0] == 4  # Static batch size.
    weights = b['output_weights'].numpy()
    if batching == 'varlen':
      trial_of_query = b['output_batch_index'].numpy()
    else:
      trial_of_query = np.broadcast_to(np.arange(4)[:, None], weights.shape)
    real = b[eval_padding.MASK_KEY].numpy()[trial_of_query]
    assert (weights[~real] == 0).all() and (weights[real] > 0).any()
