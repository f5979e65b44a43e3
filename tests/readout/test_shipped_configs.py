"""Every shipped readout YAML under configs/readout/ trains and evaluates
(tests/shipped_configs.py: the YAML on its demo experiment, tiny sizes, its
own precision, loss scale and model settings)."""
import os

import pytest

from tests import shipped_configs


@pytest.fixture(scope='module')
def cache(tmp_path_factory):
  return tmp_path_factory.mktemp('readout_shipped_cache')


@pytest.mark.parametrize('path', shipped_configs.yamls('readout'),
                         ids=os.path.basename)
def test_shipped_yaml_trains_and_evaluates(path, cache, tmp_path):
  shipped_configs.start(path, cache, tmp_path / 'model')
