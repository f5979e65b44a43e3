"""The YAMLs under configs/, made runnable on this CPU for the tests.

A shipped YAML is code a user is told to run: every one is started by a test
(tests/test_shipped_configs.py). `tiny_params` applies a YAML to its
experiment's demo counterpart (generated data, no download) with tiny sizes
around it: the demo experiment, then the family's tiny model, then the YAML
itself (its precision, loss scale, strategy settings and model settings win
over the tiny model), then batch 8, 2 training steps and 1 evaluation step on
a small generated data set. The runtime strategy the YAML names is replaced
by one that exists on this machine (`strategy_for`: one CPU device); the
kernel policy is resolved for the device the YAML is written for
(`policy_for`), so a GPU or TPU YAML runs the ops an accelerator would.
"""
import functools
import glob
import json
import os
import re
from typing import Any, Dict, List

import numpy as np
import pytest
import tensorflow as tf, tf_keras
import yaml

from official_ext.core import experiment_params
from official_ext.core.kernels import kernel_policy
from official_ext.core.run import trainer as trainer_lib
from official_ext import registry_imports  # pylint: disable=unused-import
from official_ext import train
from tests.assemblenet import minimal

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
YAMLS = sorted(glob.glob(os.path.join(REPO, 'configs', '*', '*.yaml')))

# The demo counterpart of each experiment a shipped YAML is for: the same
# model family on generated data.
DEMO_OF = {
    'yt8m': 'yt8m_demo',
    'yt8m_demo': 'yt8m_demo',
    'yt8m_nextvlad': 'yt8m_nextvlad_demo',
    'assemblenet_plus_lite_charades': 'assemblenet_plus_lite_demo',
    'assemblenet_plus_lite_kinetics': 'assemblenet_plus_lite_demo',
    'assemblenet_plus_lite_demo': 'assemblenet_plus_lite_demo',
    'readout_demo': 'readout_demo',
    'assemblenet50_demo': 'assemblenet50_demo',
    'assemblenet50_charades': 'assemblenet50_demo',
    'assemblenet50_kinetics400': 'assemblenet50_demo',
    'assemblenet50_ucf101': 'assemblenet50_demo',
    'assemblenet_plus_demo': 'assemblenet_plus_demo',
    'assemblenet_plus_charades': 'assemblenet_plus_demo',
    'assemblenet_plus_kinetics400': 'assemblenet_plus_demo',
    'assemblenet_plus_ucf101': 'assemblenet_plus_demo',
}
# The model zoo's demos (tests/yt8m/test_zoo_backbones.py starts them).
ZOO_DEMOS = ('yt8m_frame_logistic_demo', 'yt8m_lstm_demo',
             'yt8m_netvlad_demo', 'yt8m_netrvlad_demo', 'yt8m_soft_dbof_demo',
             'yt8m_netfv_demo')
DEMO_OF.update({name: name for name in ZOO_DEMOS})

BATCH = 8
TRAIN_STEPS = 2

# Each demo experiment's model at tiny sizes (applied before the YAML).
_TINY_MODEL = {
    'yt8m_demo': {'backbone': {'dbof': {'cluster_size': 16,
                                        'hidden_size': 16}},
                  'head': {'moe': {'num_mixtures': 2}}},
    'yt8m_nextvlad_demo': {'backbone': {'nextvlad': {
        'cluster_sizes': [4, 4], 'groups': [2, 2], 'expansion': 1,
        'hidden_size': 16}}},
    'yt8m_frame_logistic_demo': {},
    'yt8m_lstm_demo': {'backbone': {'lstm': {'cells': 8}}},
    'yt8m_netvlad_demo': {'backbone': {'netvlad': {
        'cluster_sizes': [4, 2], 'hidden_size': 16}}},
    'yt8m_netrvlad_demo': {'backbone': {'netrvlad': {
        'cluster_sizes': [4, 2], 'hidden_size': 16}}},
    'yt8m_soft_dbof_demo': {'backbone': {'soft_dbof': {
        'cluster_sizes': [8, 2], 'hidden_size': 16}}},
    'yt8m_netfv_demo': {'backbone': {'netfv': {
        'cluster_sizes': [4, 2], 'hidden_size': 16}}},
    'assemblenet_plus_lite_demo': {'backbone': minimal.backbone(),
                                   'head_filters': [16, 24]},
    'assemblenet50_demo': {'backbone': {'assemblenet': minimal.asn_backbone(
        minimal.ASN_STRUCTURE)}},
    'assemblenet_plus_demo': {'backbone': {
        'assemblenet_plus': minimal.asn_backbone(minimal.ASNP_STRUCTURE)}},
    'readout_demo': {'encoder': {'hidden_size': 8, 'num_heads': 2,
                                 'num_layers': 1, 'intermediate_size': 8}},
}


def family(path: str) -> str:
  """The family a YAML belongs to: its folder under configs/."""
  return os.path.basename(os.path.dirname(path))


def yamls(family_name: str) -> List[str]:
  return [p for p in YAMLS if family(p) == family_name]


def experiment(path: str) -> str:
  """The experiment a YAML is for, from its `--experiment=` usage comment."""
  with open(path) as f:
    match = re.search(r'--experiment=(\w+)', f.read())
  assert match, f'{path} does not say which --experiment it is for'
  return match.group(1)


def _data_overrides(demo: str, cache_dir: str) -> Dict[str, Any]:
  """Batch 8 in both splits and a small generated data set."""
  batch = {'global_batch_size': BATCH}
  if demo.startswith('yt8m'):
    return {'train_data': dict(batch, max_frames=12),
            'validation_data': dict(batch, max_frames=12),
            'demo_data': {'cache_dir': cache_dir, 'num_train_videos': 48,
                          'num_validation_videos': 32, 'num_shards': 2}}
  if demo.startswith('assemblenet'):
    tiny = ('moving_shapes/tiny_objects' if demo == 'assemblenet_plus_demo'
            else 'moving_shapes/tiny')
    data = dict(batch, tfds_name=tiny,
                feature_shape=[4, 32, 32, 3])
    return {'train_data': data, 'validation_data': dict(data),
            'demo_data': {'data_dir': os.path.join(cache_dir, 'tfds')}}
  return {'train_data': dict(batch), 'validation_data': dict(batch),
          'demo_data': {'cache_dir': cache_dir, 'num_train_trials': 32,
                        'num_validation_trials': 32}}


def _write_yaml(path: str, overrides: Dict[str, Any]) -> str:
  with open(path, 'w') as f:
    yaml.safe_dump(overrides, f)
  return path


def tiny_params(path: str, cache_dir: str, lock: bool = True):
  """The YAML at `path` applied to its demo experiment at tiny sizes
  (module docstring), parsed as `official_ext.train` parses its config
  files (`experiment_params.load_params`). Generated data and the two
  small YAMLs around the shipped one go to `cache_dir`."""
  demo = DEMO_OF[experiment(path)]
  cache_dir = str(cache_dir)
  os.makedirs(cache_dir, exist_ok=True)
  name = os.path.splitext(os.path.basename(path))[0]
  before = _write_yaml(os.path.join(cache_dir, f'{name}.tiny_model.yaml'),
                       {'task': {'model': _TINY_MODEL[demo]}})
  after = _write_yaml(os.path.join(cache_dir, f'{name}.tiny_run.yaml'), {
      'task': _data_overrides(demo, cache_dir),
      'trainer': {'train_steps': TRAIN_STEPS, 'steps_per_loop': 1,
                  'summary_interval': 1, 'checkpoint_interval': TRAIN_STEPS,
                  'validation_interval': TRAIN_STEPS, 'validation_steps': 1},
  })
  return experiment_params.load_params(
      demo, config_files=[before, path, after], lock=lock)


def same_tiny_run_as(path: str, cache_dir: str):
  """The first YAML before `path` in `YAMLS` whose tiny run
  (`tiny_params`) is `path`'s, key for key, or None: the YAMLs of one
  network on several data sets differ only in what the tiny run replaces."""
  mine = _tiny_run_key(path, str(cache_dir))
  for other in YAMLS[:YAMLS.index(path)]:
    if (family(other) == family(path)
        and _tiny_run_key(other, str(cache_dir)) == mine):
      return other
  return None


@functools.lru_cache(maxsize=None)
def _tiny_run_key(path: str, cache_dir: str) -> str:
  """`tiny_params` of `path` as sorted JSON, computed once per process."""
  return json.dumps(tiny_params(path, cache_dir, lock=False).as_dict(),
                    sort_keys=True, default=str)


def policy_for(params) -> kernel_policy.KernelPolicy:
  """The kernel policy of the device the YAML is written for (its
  `runtime`: a GPU YAML's 'auto' takes the stock ops, as on a GPU)."""
  return kernel_policy.resolve(
      kernel_policy.setting_of(params),
      kernel_policy.runtime_device(params.runtime))


def strategy_for(path: str):
  """A strategy of this machine for the YAML's: one CPU device (a GPU or
  TPU YAML's several replicas are simulated by the 2-replica tests of
  tests/test_accelerator_paths.py, which cost twice the tracing)."""
  del path  # Every YAML's.
  return tf.distribute.OneDeviceStrategy('/cpu:0')


def start(path: str, cache_dir: str, model_dir: str) -> Dict[str, Any]:
  """Trains the YAML's tiny run 2 steps and evaluates 1 (`train.run`,
  'train_and_eval'); returns the final metrics after checking that the run
  finished, its metrics are finite and the model computed in the YAML's
  precision."""
  params = tiny_params(path, cache_dir)
  try:
    model, metrics = train.run(params, 'train_and_eval', str(model_dir),
                               strategy=strategy_for(path),
                               policy=policy_for(params))
  finally:  # The mixed-precision policy is process-wide Keras state.
    tf_keras.mixed_precision.set_global_policy('float32')
  latest = tf.train.latest_checkpoint(str(model_dir))
  assert latest and latest.endswith(f'ckpt-{TRAIN_STEPS}'), latest
  losses = {k: v for k, v in metrics.items() if k.endswith('loss')}
  assert losses, metrics
  for key, value in losses.items():
    assert np.isfinite(float(value)), (path, key, value)
  dtype = params.runtime.mixed_precision_dtype or 'float32'
  computed = {layer.compute_dtype for layer in _layers(model)
              if layer.weights}
  assert dtype in computed, (path, dtype, computed)
  return metrics


def _layers(model):
  """Every layer of `model`, nested ones included."""
  out = []
  stack = list(model.layers)
  while stack:
    layer = stack.pop()
    out.append(layer)
    stack.extend(getattr(layer, 'layers', []) or [])
  return out


# Accelerators simulated on CPU -------------------------------------------

# What a GPU's kernel policy takes ('auto' there: the stock ops).
GPU_POLICY = kernel_policy.resolve('auto', 'GPU')
# Relative agreement of the loss of the third step with float32's: float16
# keeps ~3 significant digits, bfloat16 ~2 (8-bit mantissa).
PRECISION_TOLERANCE = {'float16': 0.01, 'bfloat16': 0.05}


def assert_precisions_agree(case_name: str) -> Dict[str, float]:
  """float16 (dynamic loss scaling) and bfloat16 training of the
  accelerator benchmark's case `case_name` (its GPU YAML's step at tiny
  sizes, on two replicas, with the kernel policy a GPU takes:
  `accelerator.training_losses`) agree with float32 at the third step,
  and bfloat16 visibly rounds; returns the three losses."""
  from official_ext.benchmarks import accelerator  # pylint: disable=g-import-not-at-top
  from tests import conftest  # pylint: disable=g-import-not-at-top
  case = next(c for c in accelerator.CASES if c.name == case_name)
  strategy = conftest.make_mirrored()
  losses = {precision: accelerator.training_losses(
      case, 'CPU', GPU_POLICY, steps=3, strategy=strategy,
      precision=precision)[-1]
            for precision in ('float32', 'float16', 'bfloat16')}
  print('loss of the third step:', losses)
  for precision, tolerance in PRECISION_TOLERANCE.items():
    assert losses[precision] == pytest.approx(losses['float32'],
                                              rel=tolerance), losses
  # The precision did change the computation (bfloat16 rounds visibly).
  assert losses['bfloat16'] != losses['float32'], losses
  return losses
TPU_POLICY = kernel_policy.resolve('auto', 'TPU')


def _leaves(batch, prefix=''):
  """(path, tensor) of every tensor of a batch (nested dicts, tuples)."""
  if isinstance(batch, dict):
    return [x for k in sorted(batch) for x in _leaves(batch[k],
                                                       f'{prefix}/{k}')]
  if isinstance(batch, (list, tuple)):
    return [x for i, b in enumerate(batch) for x in _leaves(b,
                                                            f'{prefix}/{i}')]
  return [(prefix or '/', batch)]


def _no_strings(batch, what: str) -> None:
  for path, tensor in _leaves(batch):
    assert tensor.dtype != tf.string, f'{what}: {path} is a string tensor'


# The first batch of each YAML's splits, read once per process (both
# precisions of `xla_steps` take it; its input pipeline costs seconds).
_FIRST_BATCHES: Dict[Any, Any] = {}


def _first_batch(task, data, path: str):
  key = (path, data.is_training)
  if key not in _FIRST_BATCHES:
    _FIRST_BATCHES[key] = next(iter(task.build_inputs(data)))
  return _FIRST_BATCHES[key]


def first_batch(path: str, training: bool):
  """The first training (or validation) batch `xla_steps_of` read for
  `path`."""
  return _FIRST_BATCHES[(path, training)]


def xla_steps(path: str, cache_dir: str, precision: str) -> Dict[str, float]:
  """A TPU YAML's train and validation steps, each compiled whole by XLA
  (`tf.function(jit_compile=True)`) in `precision` with the kernel policy
  a TPU takes: one step of each on the first batch of the YAML's tiny run.
  The training batch has static shapes (a TPU program's), no batch a string
  tensor. Returns the two steps' losses."""
  return xla_steps_of(tiny_params(path, cache_dir), path, precision)


def xla_steps_of(params, path: str, precision: str) -> Dict[str, float]:
  """`xla_steps` of an experiment's tiny `params` (`path` names it in the
  messages and keys its cached first batches)."""
  from official.core import task_factory  # pylint: disable=g-import-not-at-top
  from official.modeling import performance  # pylint: disable=g-import-not-at-top
  previous = tf_keras.mixed_precision.global_policy()
  performance.set_mixed_precision_policy(precision)
  try:
    with kernel_policy.use(TPU_POLICY):
      tf_keras.utils.set_random_seed(5)
      task = task_factory.get_task(params.task)
      model = task.build_model()
      optimizer = task.create_optimizer(params.trainer.optimizer_config,
                                        params.runtime)
      trainer_lib.create_optimizer_weights(tf.distribute.get_strategy(),
                                           optimizer,
                                           model.trainable_variables)
      train_batch = _first_batch(task, params.task.train_data, path)
      _no_strings(train_batch, 'training batch')
      for key, tensor in _leaves(train_batch):
        assert tensor.shape.is_fully_defined(), (key, tensor.shape)
      metrics = task.build_metrics(training=True)
      train_step = tf.function(
          lambda b: task.train_step(b, model, optimizer, metrics),
          jit_compile=True)
      train_logs = train_step(train_batch)
      eval_batch = _first_batch(task, params.task.validation_data, path)
      _no_strings(eval_batch, 'validation batch')
      eval_metrics = task.build_metrics(training=False)
      eval_step = tf.function(
          lambda b: task.validation_step(b, model, eval_metrics),
          jit_compile=True)
      eval_logs = eval_step(eval_batch)
  finally:
    tf_keras.mixed_precision.set_global_policy(previous)
  losses = {'train': float(train_logs[task.loss]),
            'validation': float(eval_logs[task.loss])}
  for key, value in losses.items():
    assert np.isfinite(value), (path, precision, key, value)
  return losses
