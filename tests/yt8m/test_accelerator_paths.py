"""The yt8m family on accelerators simulated on CPU: float16 (dynamic loss
scaling) and bfloat16 training on two replicas with the kernel policy a GPU
takes agree with float32 (the training step of its GPU YAML at tiny sizes,
`benchmarks.accelerator.training_losses`); the family's train and validation
steps compile whole under XLA with its TPU YAML's settings in float32 and
bfloat16 (tests/shipped_configs.py), and so do the model zoo's (each
demo at tiny sizes: tests/yt8m/test_zoo_backbones.py)."""
import pytest

from tests import shipped_configs
from tests.yt8m import test_zoo_backbones

# Each precision with a TPU YAML of the family (in turn, where it has two).
TPU_YAMLS = [p for p in shipped_configs.yamls('yt8m')
             if p.endswith('_tpu.yaml')]


@pytest.fixture(scope='module')
def cache(tmp_path_factory):
  return tmp_path_factory.mktemp('yt8m_accelerator_cache')


def test_mixed_precision_training_agrees_with_float32():
  shipped_configs.assert_precisions_agree('yt8m_dbof')


@pytest.mark.parametrize('precision', ['float32', 'bfloat16'])
def test_tpu_yaml_steps_compile_whole_under_xla(precision, cache):
  path = TPU_YAMLS[['float32', 'bfloat16'].index(precision) % len(TPU_YAMLS)]
  shipped_configs.xla_steps(path, cache, precision)


@pytest.mark.parametrize('precision', ['float32', 'bfloat16'])
@pytest.mark.parametrize('name', test_zoo_backbones.MODELS)
def test_zoo_steps_compile_whole_under_xla(name, precision, cache):
  # The zoo's demos read the same data: the first batches, cached under one
  # key, are read once for all of them.
  params = shipped_configs.tiny_params(
      test_zoo_backbones.demo_yaml(name, cache), cache)
  shipped_configs.xla_steps_of(params, 'yt8m zoo demos', precision)


@pytest.mark.parametrize('precision', ['float32', 'bfloat16'])
def test_mix_nextvlad_steps_compile_whole_under_xla(precision, cache):
  """The NeXtVLAD mixture's train step (branch and distillation losses
  included) and validation step, each compiled whole by XLA. One branch:
  every op of the mixture, half the compilation of two."""
  from tests.yt8m import test_mix_nextvlad  # pylint: disable=g-import-not-at-top
  params = test_mix_nextvlad.tiny_demo_params(cache, jit_compile=True,
                                              num_branches=1)
  params.override({'task': {'train_data': {'num_sample_frames': 4}}},
                  is_strict=True)
  losses = shipped_configs.xla_steps_of(params, 'yt8m_mix_nextvlad_demo',
                                        precision)
  assert losses['train'] > losses['validation'] > 0, losses
