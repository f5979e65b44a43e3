"""`python -m official_ext.benchmark xla_steps`: an exported step run by
scripts/run_xla_steps.py (JAX through PJRT) beside the same step jit-compiled
by TensorFlow, on this machine's CPU, timed interleaved in one process: the
PJRT path's own cost, before its figures on a GPU are read
(docs/benchmarks.md#gpus-and-tpus)."""
import importlib.util
import os
import tempfile
import time
from typing import Any, Dict, List

import numpy as np

from official_ext.benchmarks import harness
from official_ext.benchmarks import timing
from official_ext.benchmarks import xla_export
from official_ext.core.kernels import kernel_policy

RUNNER = os.path.join(harness.REPO_ROOT, 'scripts', 'run_xla_steps.py')
# The published-size training steps a 2-core CPU runs in seconds.
CASES = ('yt8m_dbof', 'readout')
PRECISION = 'float32'


def load_runner():
  """scripts/run_xla_steps.py as a module."""
  spec = importlib.util.spec_from_file_location('run_xla_steps', RUNNER)
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  return module


def compare(case: xla_export.XlaCase, quick: bool, runner,
            rounds: int) -> Dict[str, Any]:
  """Seconds per training step of `case` jit-compiled by TensorFlow and as
  its exported module under PJRT (each call waits for the loss), and the
  compile seconds of each."""
  with tempfile.TemporaryDirectory() as folder, xla_export._precision(  # pylint: disable=protected-access
      PRECISION), kernel_policy.use(xla_export.POLICY):
    built = xla_export.build(case, quick, PRECISION)
    compiled = xla_export.step_function(built, 'train')
    values = xla_export.Values(store_all=True)
    entry = xla_export.export_step(built, case, 'train', PRECISION, folder,
                                   values, {}, fn=compiled)
    values.write(folder)
    xla_export.write_manifest(folder, [entry], values.specs, quick)
    batch = built.batches['train']
    loss = built.task.loss
    start = time.perf_counter()
    float(compiled(batch)[loss])
    tf_compile = time.perf_counter() - start
    step = runner.Step(runner.Folder(folder), entry,
                       runner.jax.devices('cpu')[0])
    seconds = timing.interleaved_seconds({
        'tensorflow': lambda: float(compiled(batch)[loss]),
        'pjrt': lambda: float(np.asarray(step.run())),
    }, rounds=rounds, warmup=2)
  return {
      'examples_per_step': built.examples['train'],
      'tensorflow_step_s': seconds['tensorflow'],
      'pjrt_step_s': seconds['pjrt'],
      'pjrt_over_tensorflow': seconds['tensorflow'] / seconds['pjrt'],
      'tensorflow_first_call_s': tf_compile,
      'pjrt_compile_s': step.compile_s,
  }


def run(quick: bool = False) -> Dict[str, Any]:
  """{case: figures} of `CASES` (`compare`), float32 training steps at the
  published sizes of the GPU YAMLs (one replica's batch)."""
  runner = load_runner()
  figures: Dict[str, Any] = {'precision': PRECISION,
                             'jax': runner.jax.__version__}
  for case in xla_export.CASES:
    if case.name in CASES:
      figures[case.name] = compare(case, quick, runner,
                                   rounds=3 if quick else 7)
  return figures


def table(figures: Dict[str, Any]) -> str:
  rows: List[tuple] = [('case', 'batch', 'TensorFlow XLA s/step',
                        'PJRT s/step', 'PJRT speed / TensorFlow',
                        'TF first call s', 'PJRT compile s')]
  for name in CASES:
    f = figures.get(name)
    if f:
      rows.append((name, str(f['examples_per_step']),
                   f'{f["tensorflow_step_s"]:.4g}', f'{f["pjrt_step_s"]:.4g}',
                   f'{f["pjrt_over_tensorflow"]:.3f}',
                   f'{f["tensorflow_first_call_s"]:.3g}',
                   f'{f["pjrt_compile_s"]:.3g}'))
  return timing.format_table(rows)
