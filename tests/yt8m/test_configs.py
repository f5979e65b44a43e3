"""YT8M experiment configs: registration, YAML round trip, strict overrides
(the shipped YAMLs: tests/test_shipped_configs.py)."""
import os
import re

import pytest

from official.core import exp_factory
from official.core import train_utils
from official.modeling import hyperparams
from official_ext import registry_imports  # pylint: disable=unused-import
from official_ext.yt8m import configs

REPO = os.path.dirname(os.path.dirname(os.path.dirname(__file__)))


@pytest.mark.parametrize('name', ['yt8m', 'yt8m_demo'])
def test_experiments_registered_and_valid(name):
  config = exp_factory.get_exp_config(name)
  config.validate()
  assert isinstance(config.task, configs.YT8MTask)


def test_published_config_values():
  config = exp_factory.get_exp_config('yt8m')
  dbof = config.task.model.backbone.dbof
  assert (dbof.cluster_size, dbof.hidden_size) == (3000, 2000)
  assert config.task.model.head.moe.num_mixtures == 5
  assert config.runtime.mixed_precision_dtype == 'bfloat16'
  assert config.trainer.optimizer_config.optimizer.type == 'adam'
  assert config.trainer.optimizer_config.learning_rate.type == 'exponential'
  assert config.trainer.optimizer_config.warmup.type == 'linear'
  assert config.task.train_data.input_path == ''
  assert config.task.train_data.max_frames == 300


def test_yaml_round_trip(tmp_path):
  config = exp_factory.get_exp_config('yt8m_demo')
  config.override({'task': {'model': {'backbone': {'dbof': {
      'pooling_method': 'swap'}}}, 'train_data': {'num_sample_frames': 16}}})
  train_utils.serialize_config(config, str(tmp_path))
  path = os.path.join(tmp_path, 'params.yaml')
  as_read = hyperparams.read_yaml_to_params_dict(path).as_dict()
  assert as_read['task']['model']['backbone']['dbof']['pooling_method'] == (
      'swap')
  restored = exp_factory.get_exp_config('yt8m_demo')
  restored = hyperparams.override_params_dict(restored, path, is_strict=True)
  assert restored.as_dict() == config.as_dict()


def test_strict_override_names_the_key():
  config = exp_factory.get_exp_config('yt8m_demo')
  with pytest.raises(KeyError, match='num_sampled_frames'):
    hyperparams.override_params_dict(
        config, 'task.train_data.num_sampled_frames=3', is_strict=True)


def test_every_registered_experiment_is_documented():
  """docs/yt8m.md, not a count in a docstring, lists the experiments this
  package registers (not Model Garden's own `yt8m_experiment`, registered
  by whichever test imports its project first)."""
  from official.projects.yt8m.configs import yt8m as _  # pylint: disable=g-import-not-at-top
  registered = exp_factory._REGISTERED_CONFIGS  # pylint: disable=protected-access
  names = [n for n, factory in registered.items()
           if (n == 'yt8m' or n.startswith('yt8m_')) and
           factory.__module__.startswith('official_ext.')]
  assert len(names) >= 20
  with open(os.path.join(REPO, 'docs', 'yt8m.md')) as f:
    page = f.read()
  assert [n for n in names if f'`{n}`' not in page] == []
  stale_count = r'\b(one|two|three|\d+)\s+experiments\s+are\s+registered'
  assert not re.search(stale_count, configs.__doc__, re.I)
