"""Every shipped yt8m YAML under configs/yt8m/ trains and evaluates
(tests/shipped_configs.py: the YAML on its demo experiment, tiny sizes, its
own precision, loss scale and model settings)."""
import os

import pytest

from tests import shipped_configs


@pytest.fixture(scope='module')
def cache(tmp_path_factory):
  return tmp_path_factory.mktemp('yt8m_shipped_cache')


@pytest.mark.parametrize('path', shipped_configs.yamls('yt8m'),
                         ids=os.path.basename)
def test_shipped_yaml_trains_and_evaluates(path, cache, tmp_path):
  shipped_configs.start(path, cache, tmp_path / 'model')
