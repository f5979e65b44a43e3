"""Shipped GPU/TPU configs validate against their experiments, and every
shipped YAML is started by a test (tests/<family>/test_shipped_configs.py).

The Cloud TPU launcher (scripts/launch_cloud_tpu.sh) is tested in
tests/test_launch_cloud_tpu.py.
"""
import os

import pytest

from official.core import exp_factory
from official.modeling import hyperparams
from official_ext import registry_imports  # pylint: disable=unused-import
from tests import shipped_configs

REPO = shipped_configs.REPO
YAMLS = shipped_configs.YAMLS
TPU_CORES_PER_HOST = 8
FAMILIES = ('yt8m', 'assemblenet', 'readout')


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


def test_every_shipped_yaml_is_started_by_a_test():
  """Each YAML under configs/ belongs to a family whose
  test_shipped_configs.py starts it, on the demo counterpart of its
  experiment."""
  for path in YAMLS:
    family = shipped_configs.family(path)
    assert family in FAMILIES, path
    assert path in shipped_configs.yamls(family)
    assert os.path.exists(os.path.join(REPO, 'tests', family,
                                       'test_shipped_configs.py'))
    assert shipped_configs.experiment(path) in shipped_configs.DEMO_OF, path


@pytest.mark.parametrize('path', YAMLS, ids=lambda p: os.path.relpath(p, REPO))
def test_shipped_yaml_validates_against_its_experiment(path):
  config = exp_factory.get_exp_config(shipped_configs.experiment(path))
  config = hyperparams.override_params_dict(config, path, is_strict=True)
  config.validate()
  runtime = config.runtime
  if path.endswith('_tpu.yaml'):
    assert runtime.distribution_strategy == 'tpu'
    assert runtime.mixed_precision_dtype == 'bfloat16'
    for name, batch in _batches(config):
      # Divisible by the cores of one host, hence of any slice.
      assert batch % TPU_CORES_PER_HOST == 0, (name, batch)
  elif path.endswith('_gpu.yaml'):
    assert runtime.distribution_strategy == 'mirrored'
    # Model Garden's value: its optimizer gets loss scaling only for it.
    assert runtime.mixed_precision_dtype == 'float16'
    assert runtime.loss_scale in (None, 'dynamic')
    assert runtime.num_gpus > 0
    for name, batch in _batches(config):
      assert batch % runtime.num_gpus == 0, (name, batch)

