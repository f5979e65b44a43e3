"""The readout family on accelerators simulated on CPU: float16 (dynamic loss
scaling) and bfloat16 training on two replicas with the kernel policy a GPU
takes agree with float32 (the training step of its GPU YAML at tiny sizes,
`benchmarks.accelerator.training_losses`); the family's train and validation
steps compile whole under XLA with its TPU YAML's settings in float32 and
bfloat16 (tests/shipped_configs.py)."""
import numpy as np
import pytest

from official.core import exp_factory
from official_ext.readout import configs
from official_ext.readout import dataloader
from official_ext.readout import unit_vocabulary
from tests import shipped_configs

# Each precision with a TPU YAML of the family (in turn, where it has two).
TPU_YAMLS = [p for p in shipped_configs.yamls('readout')
             if p.endswith('_tpu.yaml')]


@pytest.fixture(scope='module')
def cache(tmp_path_factory):
  return tmp_path_factory.mktemp('readout_accelerator_cache')


def test_mixed_precision_training_agrees_with_float32():
  shipped_configs.assert_precisions_agree('readout')


@pytest.mark.parametrize('precision', ['float32', 'bfloat16'])
def test_tpu_yaml_steps_compile_whole_under_xla(precision, cache):
  path = TPU_YAMLS[['float32', 'bfloat16'].index(precision) % len(TPU_YAMLS)]
  shipped_configs.xla_steps(path, cache, precision)



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


@pytest.mark.parametrize('precision', ['float32', 'bfloat16'])
def test_unit_token_steps_compile_whole_under_xla(precision, cache):
  """Unit tokens (unit and session embeddings, Perceiver latents): the
  train and validation steps compile whole under XLA."""
  shipped_configs.xla_steps_of(_unit_token_params(cache), 'unit_tokens',
                               precision)
  batch = shipped_configs.first_batch('unit_tokens', training=True)
  assert batch['input_unit_ids'].shape == (4, 8)
