"""The yt8m family on accelerators simulated on CPU (tests/shipped_configs.py):
float16 (dynamic loss scaling) and bfloat16 training on two replicas with
the kernel policy a GPU takes agree with float32; the family's train and
validation steps compile whole under XLA with its TPU YAML's settings in
float32 and bfloat16."""
import os

import pytest

from tests import shipped_configs

DEMO_YAML = os.path.join(shipped_configs.REPO, 'configs', 'yt8m', 'yt8m_demo_cpu.yaml')
# Relative agreement of the loss after 3 steps with float32's: float16
# keeps ~3 significant digits, bfloat16 ~2 (8-bit mantissa).
TOLERANCE = {'float16': 0.01, 'bfloat16': 0.05}


@pytest.fixture(scope='module')
def cache(tmp_path_factory):
  return tmp_path_factory.mktemp('yt8m_accelerator_cache')


def test_mixed_precision_training_agrees_with_float32(cache, tmp_path):
  losses = {precision: shipped_configs.training_loss(
      DEMO_YAML, cache, tmp_path / precision, precision)
            for precision in ('float32', 'float16', 'bfloat16')}
  print('loss after 3 steps:', losses)
  for precision, tolerance in TOLERANCE.items():
    assert losses[precision] == pytest.approx(losses['float32'],
                                              rel=tolerance), losses
  # The precision did change the computation (bfloat16 rounds visibly).
  assert losses['bfloat16'] != losses['float32'], losses


# Each precision with a TPU YAML of the family (in turn, where it has two).
TPU_YAMLS = [p for p in shipped_configs.yamls('yt8m')
             if p.endswith('_tpu.yaml')]


@pytest.mark.parametrize('precision', ['float32', 'bfloat16'])
def test_tpu_yaml_steps_compile_whole_under_xla(precision, cache):
  path = TPU_YAMLS[['float32', 'bfloat16'].index(precision) % len(TPU_YAMLS)]
  shipped_configs.xla_steps(path, cache, precision)
