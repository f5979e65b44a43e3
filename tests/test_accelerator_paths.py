"""Each family on accelerators simulated on CPU (tests/shipped_configs.py):
float16 (dynamic loss scaling) and bfloat16 training on two replicas with
the kernel policy a GPU takes agree with float32 (the training step of the
family's GPU YAML at tiny sizes, `benchmarks.accelerator.training_losses`);
the train and validation steps compile whole under XLA with the family's
TPU YAML settings in bfloat16, as a TPU runs them, and so do those of the
models no TPU YAML names (the yt8m zoo's demos, the NeXtVLAD mixture and
readout's unit tokens). Each family's steps compiled whole in float32, and
what they compute: tests/benchmarks/test_xla_steps.py."""
import os

import numpy as np
import pytest

from official.core import exp_factory
from official_ext.readout import configs
from official_ext.readout import dataloader
from official_ext.readout import unit_vocabulary
from tests import conftest
from tests import shipped_configs
from tests.yt8m import test_zoo_backbones

TPU_PRECISION = ('bfloat16',)
# The accelerator benchmark's case of each family's GPU YAML.
PRECISION_CASES = {'yt8m': 'yt8m_dbof', 'assemblenet': 'assemblenet_kinetics',
                   'readout': 'readout'}


def _tpu_yaml_steps():
  """(TPU YAML, precision): the first TPU YAML of each family."""
  for family in PRECISION_CASES:
    path = next(p for p in shipped_configs.yamls(family)
                if p.endswith('_tpu.yaml'))
    for precision in TPU_PRECISION:
      yield pytest.param(
          path, precision,
          id=f'{os.path.relpath(path, shipped_configs.REPO)}-{precision}')

@pytest.fixture(autouse=True)
def _release_state_after_each_test():
  """Every test trains models of its own: each one's state released after it
  (`conftest.release_state`), as after a module."""
  yield
  conftest.release_state()


@pytest.mark.parametrize('family', PRECISION_CASES)
def test_mixed_precision_training_agrees_with_float32(family):
  shipped_configs.assert_precisions_agree(PRECISION_CASES[family])


@pytest.mark.parametrize('path,precision', _tpu_yaml_steps())
def test_tpu_yaml_steps_compile_whole_under_xla(path, precision, demo_cache):
  shipped_configs.xla_steps(path, demo_cache, precision)


@pytest.mark.parametrize('precision', TPU_PRECISION)
@pytest.mark.parametrize('name', test_zoo_backbones.MODELS)
def test_yt8m_zoo_steps_compile_whole_under_xla(name, precision, demo_cache):
  """Each zoo demo at tiny sizes (tests/yt8m/test_zoo_backbones.py)."""
  # The zoo's demos read the same data: the first batches, cached under one
  # key, are read once for all of them.
  params = shipped_configs.tiny_params(
      test_zoo_backbones.demo_yaml(name, demo_cache), demo_cache)
  shipped_configs.xla_steps_of(params, 'yt8m zoo demos', precision)


@pytest.mark.parametrize('precision', TPU_PRECISION)
def test_yt8m_mix_nextvlad_steps_compile_whole_under_xla(precision,
                                                         demo_cache):
  """The NeXtVLAD mixture's train step (branch and distillation losses
  included) and validation step, each compiled whole by XLA. One branch:
  every op of the mixture, half the compilation of two."""
  from tests.yt8m import test_mix_nextvlad  # pylint: disable=g-import-not-at-top
  params = test_mix_nextvlad.tiny_demo_params(demo_cache, jit_compile=True,
                                              num_branches=1)
  params.override({'task': {'train_data': {'num_sample_frames': 4}}},
                  is_strict=True)
  losses = shipped_configs.xla_steps_of(params, 'yt8m_mix_nextvlad_demo',
                                        precision)
  assert losses['train'] > losses['validation'] > 0, losses


def _unit_token_params(cache):
  """A unit-token task at tiny sizes (two readouts, hand-made records of two
  sessions) with the TPU YAML's static shapes (fixed token and query counts,
  masked routing)."""
  units = unit_vocabulary.from_names(['a', 'b'], ['a/0', 'a/1', 'b/0'])
  unit_vocabulary.save(units, str(cache / 'units.json'))
  rng = np.random.default_rng(0)
  records = []
  for i in range(4):
    session = 'ab'[i % 2]
    ids = rng.choice(units.unit_ids_of(session), 6)
    records.append(dataloader.make_example(
        f'r{i}', np.ones([6, 1]), np.sort(rng.uniform(0, 1, 6)),
        output_task_ids=[1, 2], output_timestamps=[0.5, 0.9],
        output_targets=[[rng.normal()], [i % 2]], session_id=session,
        input_unit_ids=ids))
  path = str(cache / 'units.tfrecord')
  dataloader.write_records(path, records)
  params = exp_factory.get_exp_config('readout_units_demo')
  task = params.task
  task.readouts = (configs.ReadoutSpec(name='speed', type='continuous'),
                   configs.ReadoutSpec(name='choice', type='binary'))
  task.task_vocabulary = ('speed', 'choice')
  task.vocabulary_file = str(cache / 'units.json')
  task.model = task.model.replace(
      static_shapes=True, encoder=task.model.encoder.replace(
          hidden_size=8, num_heads=2, num_layers=1, num_latents=4,
          intermediate_size=8))
  task.demo_data = task.demo_data.replace(enabled=False)
  static = dict(input_path=path, global_batch_size=4, drop_remainder=True,
                batching='padded', max_input_tokens=8, max_queries=8)
  task.train_data = task.train_data.replace(**static)
  task.validation_data = task.validation_data.replace(**static)
  task.evaluation = task.evaluation.replace(stitch=False)
  return params


@pytest.mark.parametrize('precision', TPU_PRECISION)
def test_readout_unit_token_steps_compile_whole_under_xla(precision,
                                                          demo_cache):
  """Unit tokens (unit and session embeddings, Perceiver latents): the
  train and validation steps compile whole under XLA."""
  shipped_configs.xla_steps_of(_unit_token_params(demo_cache), 'unit_tokens',
                               precision)
  batch = shipped_configs.first_batch('unit_tokens', training=True)
  assert batch['input_unit_ids'].shape == (4, 8)
