"""The assemblenet family on accelerators simulated on CPU: float16 (dynamic loss
scaling) and bfloat16 training on two replicas with the kernel policy a GPU
takes agree with float32 (the training step of its GPU YAML at tiny sizes,
`benchmarks.accelerator.training_losses`); the family's train and validation
steps compile whole under XLA with its TPU YAML's settings in float32 and
bfloat16 (tests/shipped_configs.py)."""
import pytest

from tests import shipped_configs

# Each precision with a TPU YAML of the family (in turn, where it has two).
TPU_YAMLS = [p for p in shipped_configs.yamls('assemblenet')
             if p.endswith('_tpu.yaml')]


@pytest.fixture(scope='module')
def cache(tmp_path_factory):
  return tmp_path_factory.mktemp('assemblenet_accelerator_cache')


def test_mixed_precision_training_agrees_with_float32():
  shipped_configs.assert_precisions_agree('assemblenet_kinetics')


@pytest.mark.parametrize('precision', ['float32', 'bfloat16'])
def test_tpu_yaml_steps_compile_whole_under_xla(precision, cache):
  path = TPU_YAMLS[['float32', 'bfloat16'].index(precision) % len(TPU_YAMLS)]
  shipped_configs.xla_steps(path, cache, precision)
