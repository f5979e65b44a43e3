"""Readout experiments and readout specs validate (the shipped YAMLs:
tests/test_shipped_configs.py)."""
import pytest

from official.core import exp_factory
from official_ext.readout import configs


def test_demo_has_eight_readouts_of_five_types():
  task = exp_factory.get_exp_config('readout_demo').task
  assert len(task.readouts) == 8
  # The five original types; `von_mises` (registered too) is not in it.
  assert {s.type for s in task.readouts} == {
      'continuous', 'binary', 'multinomial', 'multilabel', 'event_rate'}
  assert set(configs.READOUT_TYPES) > {s.type for s in task.readouts}


def test_bad_specs_name_the_key():
  spec = configs.ReadoutSpec(name='x', type='gaussian')
  with pytest.raises(ValueError, match="readouts `x`: type 'gaussian'"):
    configs.validate_readouts([spec], ['x'])
  spec = configs.ReadoutSpec(name='x', type='binary', metrics=('r2',))
  with pytest.raises(ValueError, match=r"metrics \['r2'\] are not defined"):
    configs.validate_readouts([spec], ['x'])


@pytest.mark.parametrize('name', configs.RESERVED_NAMES)
def test_reserved_names_are_rejected(name):
  """`total` would log `total_loss` twice; `average` would overwrite the
  `average/<metric>` keys."""
  spec = configs.ReadoutSpec(name=name, type='continuous')
  with pytest.raises(ValueError, match=f"readouts `{name}`: the name is "
                     'reserved'):
    configs.validate_readouts([spec], [name])
