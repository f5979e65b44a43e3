"""scripts/run_xla_steps.py and the export's command line, on CPU at
`--quick` sizes: the manifest, values drawn from recipes, the runner without
TensorFlow, `--resume`, a changed module refused, StableHLO a PJRT plugin
takes."""
import json
import os
import subprocess
import sys

import numpy as np
import pytest
import tensorflow as tf

from official_ext import benchmark
from official_ext.benchmarks import xla_export
from official_ext.benchmarks import xla_steps
from tests import cli

RUNNER = xla_steps.RUNNER


@pytest.fixture(scope='module')
def runner():
  return xla_steps.load_runner()


@pytest.fixture(scope='module')
def exported(tmp_path_factory):
  """The yt8m_dbof case's folder, exported through the command line."""
  folder = str(tmp_path_factory.mktemp('xla_export') / 'yt8m_dbof')
  cli.run_main(benchmark, 'accelerator', '--quick', f'--export_xla={folder}',
               '--cases=yt8m_dbof')
  return {'yt8m_dbof': folder}


def _manifest(folder):
  with open(os.path.join(folder, xla_export.MANIFEST)) as f:
    return json.load(f)


def test_manifest_describes_every_argument_and_the_run_order(exported):
  manifest = _manifest(exported['yt8m_dbof'])
  assert manifest['format'] == xla_export.FORMAT
  assert manifest['tensorflow'] == tf.__version__ and manifest['quick']
  assert manifest['kernel_policy']['device'] == 'GPU'
  assert not manifest['kernel_policy']['fast_paths']  # The stock ops.
  names = [e['name'] for e in manifest['cases']]
  assert names[:3] == ['yt8m_dbof/train/bfloat16', 'yt8m_dbof/train/float16',
                       'yt8m_dbof/train/float32']
  assert len(names) == 6
  train = manifest['cases'][0]
  roles = {a['role'] for a in train['arguments']}
  assert {'batch', 'variable', 'optimizer_slot', 'step'} <= roles, roles
  assert train['yaml'] == 'configs/yt8m/yt8m_gpu.yaml'
  assert train['examples_per_step'] == 2 and train['flops_per_step'] > 0
  step_counter = next(a for a in train['arguments'] if a['role'] == 'step')
  assert step_counter['dtype'] == 'int64'
  for entry in manifest['cases']:
    for argument in entry['arguments']:
      assert manifest['values'][argument['value']]['kind'] == 'stored'


def test_published_sizes_travel_as_recipes():
  """Above the store limit a floating array travels as how to draw it."""
  rng = np.random.default_rng(0)
  limit = xla_export.STORE_LIMIT_BYTES // 4 + 1
  normal = xla_export.describe(rng.normal(2, 3, limit).astype(np.float32),
                               store_all=False)
  assert normal['kind'] == 'normal'
  assert normal['mean'] == pytest.approx(2, abs=0.05)
  assert normal['std'] == pytest.approx(3, rel=0.05)
  labels = (rng.uniform(size=limit) < 0.25).astype(np.float32)
  choice = xla_export.describe(labels, store_all=False)
  assert choice['kind'] == 'choice' and choice['values'] == [0.0, 1.0]
  assert choice['p'][1] == pytest.approx(0.25, abs=0.01)
  ones = xla_export.describe(np.ones(limit, np.float32), store_all=False)
  assert ones == {'shape': [limit], 'dtype': 'float32', 'kind': 'constant',
                  'value': 1.0}
  ids = xla_export.describe(np.arange(limit), store_all=False)
  assert ids['kind'] == 'stored'  # Integers always travel.
  small = xla_export.describe(np.ones(8, np.float32), store_all=False)
  assert small['kind'] == 'stored'
  runner = xla_steps.load_runner()
  drawn = runner.make_value('k', normal, None)
  assert drawn.shape == (limit,) and drawn.dtype == np.float32
  assert drawn.std() == pytest.approx(3, rel=0.05)
  drawn = runner.make_value('k', choice, None)
  assert set(np.unique(drawn)) == {0.0, 1.0}


def test_runner_needs_neither_tensorflow_nor_official_ext(exported, tmp_path):
  """The runner's command line on CPU: one JSON entry per module, written
  as it goes; `--resume` keeps what the JSON holds and runs the rest; no
  TensorFlow or official_ext imported."""
  out = tmp_path / 'figures.json'
  common = [exported['yt8m_dbof'], '--json', str(out), '--warmup', '1',
            '--steps', '2', '--rounds', '2']
  code = (
      'import importlib.util, sys\n'
      f'spec = importlib.util.spec_from_file_location("r", {RUNNER!r})\n'
      'runner = importlib.util.module_from_spec(spec)\n'
      'spec.loader.exec_module(runner)\n'
      f'assert runner.main({common!r} + ["--cases", '
      '"yt8m_dbof/train/float16"]) == 0\n'
      f'assert runner.main({common!r} + ["--cases", "yt8m_dbof/train", '
      '"--resume"]) == 0\n'
      'bad = [m for m in sys.modules if m.split(".")[0] in '
      '("tensorflow", "official_ext", "tf_keras")]\n'
      'assert not bad, bad\n')
  env = {**os.environ, 'JAX_PLATFORMS': 'cpu'}
  result = subprocess.run([sys.executable, '-c', code], capture_output=True,
                          text=True, env=env, cwd=str(tmp_path), check=False)
  assert result.returncode == 0, result.stderr[-3000:]
  figures = json.loads(out.read_text())
  assert figures['platform'] == 'cpu' and figures['quick']
  assert len(figures['command']) == 2 and '--resume' in figures['command'][1]
  names = [c['name'] for c in figures['cases']]
  assert names == ['yt8m_dbof/train/float16', 'yt8m_dbof/train/bfloat16',
                   'yt8m_dbof/train/float32']
  for case in figures['cases']:
    assert case['examples_per_sec'] > 0 and case['compile_s'] > 0
    assert case['loss_finite'] and case['loss_moved']
    assert case['memory_bytes']['argument'] > 0
    assert case['peak_share'] is None  # No peak for a CPU.


def test_a_changed_module_is_refused(exported, runner, tmp_path):
  folder = runner.Folder(exported['yt8m_dbof'])
  entry = dict(folder.manifest['cases'][0], sha256='0' * 64)
  with pytest.raises(ValueError, match='SHA-256'):
    folder.module(entry)


def test_peaks_by_device_kind(runner):
  assert runner.peak_tflops('NVIDIA H200', 'bfloat16') == 989.4
  assert runner.peak_tflops('NVIDIA H100 80GB HBM3', 'float32') == 494.7
  assert runner.peak_tflops('TPU v4', 'float32') is None
  assert runner.peak_tflops('cpu', 'float32') is None


def test_modules_convert_to_portable_stablehlo(exported, runner):
  """What a PJRT plugin (the CUDA one) compiles: StableHLO serialized as a
  portable artifact, which refuses ops of other dialects (tf2xla's copies
  of returned values convert to `mhlo.copy`)."""
  from jax._src.lib import _jax  # pylint: disable=g-import-not-at-top
  from jax._src.lib.mlir.dialects import hlo  # pylint: disable=g-import-not-at-top
  folder = runner.Folder(exported['yt8m_dbof'])
  for entry in folder.manifest['cases']:
    text = runner.stablehlo_text(folder.module(entry))
    assert 'mhlo.copy' not in text
    assert _jax.mlir.serialize_portable_artifact(
        text, hlo.get_current_version()), entry['name']
