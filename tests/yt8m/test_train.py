"""End to end: official_ext.train on generated data, resume, 2-replica parity."""
import glob
import os
import re
import subprocess
import sys

import numpy as np
import pytest
import tensorflow as tf, tf_keras

from official.core import exp_factory
from official.core import train_utils
from official_ext import registry_imports  # pylint: disable=unused-import
from official_ext import train


def _tiny_overrides(cache_dir, train_steps=8, jit_compile=False):
  """The tiny yt8m_demo of the tests that train. `jit_compile` (the demo's
  XLA training step) costs a compilation per process: the CLI test and the
  2-replica test here keep it; tests of other subjects leave it off."""
  return {
      'runtime': {'distribution_strategy': 'one_device', 'num_gpus': 0},
      'task': {
          'model': {
              'backbone': {'dbof': {'cluster_size': 16, 'hidden_size': 16}},
              'head': {'moe': {'num_mixtures': 2}},
          },
          'train_data': {'global_batch_size': 8, 'max_frames': 12,
                         'num_sample_frames': None, 'seed': 7,
                         'shuffle_buffer_size': 16},
          'validation_data': {'global_batch_size': 8, 'max_frames': 12},
          'demo_data': {'cache_dir': str(cache_dir), 'num_train_videos': 48,
                        'num_validation_videos': 32, 'num_shards': 2},
          'jit_compile': jit_compile,
      },
      'trainer': {'train_steps': train_steps, 'steps_per_loop': 4,
                  'checkpoint_interval': 4, 'summary_interval': 4,
                  'validation_interval': train_steps, 'validation_steps': -1},
  }


def _params(cache_dir, **kwargs):
  params = exp_factory.get_exp_config('yt8m_demo')
  params.override(_tiny_overrides(cache_dir, **kwargs), is_strict=True)
  params.validate()
  return params


def _yaml(path, overrides):
  import yaml  # pylint: disable=g-import-not-at-top
  with open(path, 'w') as f:
    yaml.safe_dump(overrides, f)
  return str(path)


def _run_cli(args, env):
  return subprocess.run(
      [sys.executable, '-m', 'official_ext.train', *args],
      capture_output=True, text=True, env=env, timeout=600, check=False)


def test_train_py_writes_model_dir_and_reads_cleanly(tmp_path):
  """The CLI end to end: model_dir contents, and output that reads cleanly
  (each line once, no notice that is no problem, the metrics table last:
  `core.run.run_logging`). Resuming through the CLI: tests/test_resilience.py
  (`test_sigkill_at_any_point_then_same_command_finishes`)."""
  model_dir = tmp_path / 'model'
  config = _yaml(tmp_path / 'tiny.yaml',
                 _tiny_overrides(tmp_path / 'cache', jit_compile=True))
  # Without TF_CPP_MIN_LOG_LEVEL: official_ext.train sets it.
  env = {k: v for k, v in os.environ.items() if k != 'TF_CPP_MIN_LOG_LEVEL'}
  args = ['--experiment=yt8m_demo', '--mode=train_and_eval',
          f'--model_dir={model_dir}', f'--config_file={config}']
  first = _run_cli(args, env)
  assert first.returncode == 0, first.stderr[-3000:]
  assert (model_dir / 'params.yaml').exists()
  assert tf.train.latest_checkpoint(str(model_dir)).endswith('ckpt-8')
  assert glob.glob(str(model_dir / 'train' / 'events.out.tfevents.*'))
  assert glob.glob(str(model_dir / 'validation' / 'events.out.tfevents.*'))
  # Orbit prints its lines (stdout) and its log copies are dropped; the
  # progress line is logged (stderr).
  both = first.stdout + first.stderr
  for line in ('train | step:      4 | steps/sec',
               'train | step:      8 | steps/sec',
               ' eval | step:      8 | eval time',
               f'saved checkpoint to {model_dir / "ckpt-8"}.',
               'progress | step 8/8 (100%)'):
    assert both.count(line) == 1, (line, both[-4000:])
  assert 'time left' in first.stderr
  assert 'INFO:tensorflow:' not in both
  assert 'Failed to count model FLOPs' not in both
  assert 'Final experiment parameters' not in both
  assert 'Model FLOPs are not counted here' in both
  # TensorFlow's C++ INFO / WARNING lines are off (TF_CPP_MIN_LOG_LEVEL).
  assert not re.search(r'^\S+ \S+: [IW] tensorflow/', both, re.MULTILINE)
  # The final metrics table ends the output.
  tail = first.stdout.rstrip().splitlines()
  table = tail.index(next(l for l in tail if l.startswith('Final metrics')))
  assert tail[table] == 'Final metrics (yt8m_demo, mode=train_and_eval):'
  rows = tail[table + 1:]
  assert all(re.match(r'\s+\w+\s+-?\d+\.\d{4}$', l) for l in rows), rows
  assert {l.split()[0] for l in rows} >= {'gap', 'map', 'hit_at_one', 'perr'}


def test_train_py_rejects_misspelled_key():
  # What `main` parses its flags with (in-process; the CLI ends with it).
  options = train_utils.ParseConfigOptions(
      experiment='yt8m_demo', config_file=None,
      params_override='task.train_data.num_sampled_frames=3')
  with pytest.raises(KeyError, match='num_sampled_frames'):
    train.parse_configuration(options)


def _train_and_eval(params, model_dir, strategy):
  tf_keras.utils.set_random_seed(11)
  _, metrics = train.run(params, 'train_and_eval', str(model_dir),
                         strategy=strategy)
  return metrics


def test_mirrored_two_replicas_matches_one_device(tmp_path, mirrored):
  params = _params(tmp_path / 'cache', jit_compile=True)
  # Synchronized batch norm: the 2-replica batch statistics equal the global
  # batch's, so the two runs compute the same updates.
  params.override({'task': {'model': {'norm_activation': {
      'use_sync_bn': True}}}})
  # The one-device reference trains and evaluates eagerly (a traced step
  # costs more than running it); the two replicas run in graphs.
  reference = params.replace(trainer=params.trainer.replace(
      train_tf_function=False, train_tf_while_loop=False,
      eval_tf_function=False, eval_tf_while_loop=False))
  one = _train_and_eval(reference, tmp_path / 'one',
                        tf.distribute.OneDeviceStrategy('/cpu:0'))
  two = _train_and_eval(params, tmp_path / 'two',
                        mirrored)
  for key in ('gap', 'map', 'map_all_classes', 'hit_at_one', 'perr',
              'model_loss'):
    assert key in two, two.keys()
    np.testing.assert_allclose(float(two[key]), float(one[key]),
                               rtol=1e-4, atol=1e-5, err_msg=key)
  # Every validation example was counted once, across both replicas.
  assert int(two['num_videos']) == int(one['num_videos']) == 32
