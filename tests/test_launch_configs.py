"""Shipped GPU/TPU configs validate against their experiments.

The Cloud TPU launcher (scripts/launch_cloud_tpu.sh) is tested in
tests/test_launch_cloud_tpu.py.
"""
import glob
import os
import re

import pytest

from official.core import exp_factory
from official.modeling import hyperparams
from official_ext import registry_imports  # pylint: disable=unused-import

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
YAMLS = sorted(glob.glob(os.path.join(REPO, 'configs', '*', '*.yaml')))
TPU_CORES_PER_HOST = 8


def _experiment(path):
  """The experiment a YAML is for, from its `--experiment=` usage comment."""
  with open(path) as f:
    match = re.search(r'--experiment=(\w+)', f.read())
  assert match, f'{path} does not say which --experiment it is for'
  return match.group(1)


def _batches(config):
  for name in ('train_data', 'validation_data'):
    data = getattr(config.task, name, None)
    if data is not None and getattr(data, 'global_batch_size', None):
      yield name, data.global_batch_size


def test_every_family_ships_gpu_and_tpu_yamls():
  names = {os.path.relpath(p, REPO) for p in YAMLS}
  for family in ('yt8m', 'assemblenet', 'readout'):
    assert any(n.startswith(f'configs/{family}/') and n.endswith('_tpu.yaml')
               for n in names), family
    assert any(n.startswith(f'configs/{family}/') and n.endswith('_gpu.yaml')
               for n in names), family


@pytest.mark.parametrize('path', YAMLS, ids=lambda p: os.path.relpath(p, REPO))
def test_shipped_yaml_validates_against_its_experiment(path):
  config = exp_factory.get_exp_config(_experiment(path))
  config = hyperparams.override_params_dict(config, path, is_strict=True)
  config.validate()
  runtime = config.runtime
  if path.endswith('_tpu.yaml'):
    assert runtime.distribution_strategy == 'tpu'
    assert runtime.mixed_precision_dtype in ('bfloat16', 'mixed_bfloat16')
    for name, batch in _batches(config):
      # Divisible by the cores of one host, hence of any slice.
      assert batch % TPU_CORES_PER_HOST == 0, (name, batch)
  elif path.endswith('_gpu.yaml'):
    assert runtime.distribution_strategy == 'mirrored'
    assert runtime.mixed_precision_dtype == 'mixed_float16'
    assert runtime.num_gpus > 0
    for name, batch in _batches(config):
      assert batch % runtime.num_gpus == 0, (name, batch)

