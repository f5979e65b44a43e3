"""The harness behind `python -m official_ext.benchmark FAMILY`. A family module
has `run(quick=False) -> figures` (JSON-serializable), may have `table(figures)
-> str` and `PROCESS_SETTINGS` (a CPU training run's process settings, applied
before TensorFlow's runtime starts where the user has not set them); every
run's figures get `machine` and `environment`."""
import datetime
import importlib
import inspect
import json
import os
import platform
from typing import Any, Dict, List, Optional

from absl import logging
import tensorflow as tf

from official_ext.benchmarks import timing
from official_ext.core.kernels import process_settings

# The repository's results folder: one JSON file per family, the latest run.
REPO_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(
    os.path.abspath(__file__))))
RESULTS_DIR = os.path.join(REPO_ROOT, 'benchmarks', 'results')

# CPU flags that decide which kernels TensorFlow runs (vector units).
_CPU_FLAG_PREFIXES = ('avx', 'amx', 'fma', 'f16c', 'sse4')

FAMILIES = {
    'yt8m': 'official_ext.benchmarks.yt8m',
    'assemblenet': 'official_ext.benchmarks.assemblenet',
    'readout': 'official_ext.benchmarks.readout',
    # Quality, not speed: a pretrained unit-token readout model adapted to
    # a held-out recording against the same model from scratch (rendered
    # into README.md and docs/readout.md, `report.BLOCKS`).
    'readout_adaptation': 'official_ext.benchmarks.readout_adaptation',
    # The commands' start-up with and without the Keras 3 import.
    'startup': 'official_ext.benchmarks.startup',
    # The training steps of the shipped GPU / TPU YAMLs on this machine's
    # accelerators (exits non-zero without one).
    'accelerator': 'official_ext.benchmarks.accelerator',
    # An exported XLA step under JAX (PJRT) beside TensorFlow's jit-compiled
    # step on this machine's CPU.
    'xla_steps': 'official_ext.benchmarks.xla_steps',
}


def machine() -> str:
  """One line describing this machine: CPU, cores, devices, TF version."""
  cpus = len(tf.config.list_physical_devices('CPU'))
  gpus = tf.config.list_physical_devices('GPU')
  return (f'{platform.processor() or platform.machine()}, '
          f'{os.cpu_count()} cores, {cpus} CPU device(s), '
          f'{len(gpus)} GPU(s), TF {tf.__version__}')


def _cpuinfo() -> Dict[str, str]:
  """The first processor's fields of /proc/cpuinfo ({} where unreadable)."""
  fields = {}
  try:
    with open('/proc/cpuinfo') as f:
      for line in f:
        if not line.strip():
          break
        key, _, value = line.partition(':')
        fields[key.strip()] = value.strip()
  except OSError:
    pass
  return fields


def cpu_model() -> str:
  """The CPU's model name (/proc/cpuinfo), else `platform.processor()`."""
  return (_cpuinfo().get('model name') or platform.processor() or
          platform.machine())


def cpu_flags() -> List[str]:
  """The CPU's vector-unit flags (AVX*, AMX*, FMA, F16C, SSE4), sorted."""
  return sorted(f for f in _cpuinfo().get('flags', '').split()
                if f.startswith(_CPU_FLAG_PREFIXES))


def environment(quick: bool = False) -> Dict[str, Any]:
  """Where and when a run measured: {'cpu_model', 'cpu_flags', 'cores',
  'cpu_devices', 'gpus', 'onednn_cpu_kernels', 'tensorflow', 'python',
  'platform', 'date' (UTC), 'loadavg' (as the run ended), 'quick'}."""
  from official_ext.core.kernels import kernel_policy  # pylint: disable=g-import-not-at-top
  gpus = tf.config.list_physical_devices('GPU')
  return {
      'cpu_model': cpu_model(),
      'cpu_flags': cpu_flags(),
      'cores': os.cpu_count(),
      'cpu_devices': len(tf.config.list_physical_devices('CPU')),
      'gpus': [tf.config.experimental.get_device_details(g).get(
          'device_name', g.name) for g in gpus],
      'onednn_cpu_kernels': kernel_policy.onednn_cpu_kernels(),
      'tensorflow': tf.__version__,
      'python': platform.python_version(),
      'platform': platform.platform(),
      'date': datetime.datetime.now(datetime.timezone.utc).strftime(
          '%Y-%m-%dT%H:%M:%SZ'),
      'loadavg': [round(x, 2) for x in os.getloadavg()],
      'quick': quick,
  }


def generic_table(figures: Dict[str, Any]) -> str:
  """A two-column table of the flat (non-dict, non-list) figures."""
  rows = [('figure', 'value')]
  for key in sorted(figures):
    value = figures[key]
    if isinstance(value, float):
      value = f'{value:.4g}'
    elif isinstance(value, (dict, list)):
      continue
    rows.append((key, str(value)))
  return timing.format_table(rows)


def family_module(family: str):
  """The benchmark module of `family` (a key of FAMILIES)."""
  if family not in FAMILIES:
    raise ValueError(f'unknown benchmark family {family!r}; one of '
                     f'{sorted(FAMILIES)}')
  return importlib.import_module(FAMILIES[family])


def gate_for(quick: bool, max_other_cores: Optional[float] = None
             ) -> Optional[timing.QuietGate]:
  """The rounds' `timing.QuietGate` of a run: enforced in full runs (at
  `max_other_cores`, default the gate's), recorded only in quick ones; None
  where /proc cannot be read."""
  if not timing.can_gate():
    return None
  gate = timing.QuietGate(enforce=not quick)
  if max_other_cores is not None:
    gate.max_other_cores = max_other_cores
  return gate


def run(family: str, quick: bool = False,
        reference_checkout: Optional[str] = None,
        tpu: Optional[str] = None,
        cases: Optional[List[str]] = None,
        previous: Optional[Dict[str, Any]] = None,
        tf1_reference: Optional[str] = None,
        max_other_cores: Optional[float] = None) -> Dict[str, Any]:
  """Runs `family`'s benchmark; its figures plus 'machine', 'environment',
  'command' and 'timed_rounds' (`timing.rounds_summary`; every round gated by
  `gate_for(quick, max_other_cores)`).

  `reference_checkout`, `tf1_reference`, `tpu` and `cases` go to the families
  whose `run` takes them, with `previous` (the family's recorded figures) as
  their `step_figures`."""
  module = family_module(family)
  options = {}
  if cases:
    options['step_figures'] = previous
  for name, value, who in (('reference_checkout', reference_checkout,
                            'assemblenet'),
                           ('tf1_reference', tf1_reference, 'assemblenet'),
                           ('tpu', tpu, 'accelerator'),
                           ('cases', cases, 'assemblenet, readout and yt8m')):
    if not value:
      continue
    if name not in inspect.signature(module.run).parameters:
      raise ValueError(f'--{name}: the {family} benchmark does not take it '
                       f'({who} does).')
    options[name] = value
  settings = getattr(module, 'PROCESS_SETTINGS', {})
  applied = process_settings.apply(settings)
  logging.info(process_settings.describe(applied))
  logging.info('Benchmarking %s on %s', family, machine())
  gate = gate_for(quick, max_other_cores)
  previous_gate = timing.set_gate(gate)
  timing.take_rounds()
  try:
    figures = module.run(quick=quick, **options)
  finally:
    timing.set_gate(previous_gate)
  figures['timed_rounds'] = timing.rounds_summary(timing.take_rounds(), gate)
  figures['machine'] = machine()
  figures['environment'] = environment(quick)
  figures['command'] = ' '.join(
      ['python -m official_ext.benchmark', family] +
      (['--quick'] if quick else []) +
      ([f'--reference_checkout {reference_checkout}']
       if reference_checkout else []) +
      (['--tf1_reference PATH'] if tf1_reference else []) +
      ([f'--cases {",".join(cases)}'] if cases else []))
  return figures


# What describes a run rather than a figure.
RUN_KEYS = ('machine', 'environment', 'command', 'timed_rounds')


def merge_cases(previous: Dict[str, Any], figures: Dict[str, Any],
                cases: List[str]) -> Dict[str, Any]:
  """A results file's figures with a run of some cases merged in: the run's
  figures replace those of the same key, and its machine, environment and
  command are kept as `<case>_machine`, ... (the 'model' case's as the file's
  own)."""
  named = [c for c in cases if c != 'model']
  merged = dict(previous)
  for key, value in figures.items():
    if key in RUN_KEYS:
      for case in named:
        merged[f'{case}_{key}'] = value
      if 'model' in cases:
        merged[key] = value
    elif key != 'quick':
      merged[key] = value
  return merged


def other_cases_figures(module, previous: Dict[str, Any]) -> Dict[str, Any]:
  """The figures of `previous` (a results file) that a run without --cases
  leaves alone: those of the module's cases outside its `DEFAULT_CASES`
  (`<case>` and `<case>_*` keys), e.g. YT8M's zoo."""
  cases = getattr(module, 'CASES', ())
  others = [c for c in cases if c not in getattr(module, 'DEFAULT_CASES',
                                                 cases)]
  return {k: v for k, v in previous.items()
          if any(k == c or k.startswith(c + '_') for c in others)}


def report(family: str, figures: Dict[str, Any], quick: bool = False) -> str:
  """The printed report: a header line and the family's table."""
  module = family_module(family)
  table = getattr(module, 'table', generic_table)
  text = (f'{family} benchmark on {figures["machine"]}'
          f'{" (quick sizes)" if quick else ""}:\n{table(figures)}')
  # A family's further tables (the YT8M zoo), unless `table` printed it.
  for _, title, _, sub in getattr(module, 'subsections', lambda f: [])(
      figures):
    if sub is not None and sub not in text:
      text += f'\n{title}:\n{sub}'
  return text


def main(family: str, quick: bool = False,
         json_path: Optional[str] = None,
         reference_checkout: Optional[str] = None,
         tpu: Optional[str] = None,
         cases: Optional[List[str]] = None,
         tf1_reference: Optional[str] = None,
         max_other_cores: Optional[float] = None) -> Dict[str, Any]:
  """Runs, prints the report, writes the figures to `json_path` if given.

  With `cases` and an existing `json_path`, the run's figures are merged
  into that file's (`merge_cases`) instead of replacing them; without, they
  replace them but for the cases the run did not measure
  (`other_cases_figures`)."""
  previous = None
  if json_path and os.path.exists(json_path):
    with open(json_path) as f:
      previous = json.load(f)
  figures = run(family, quick=quick, reference_checkout=reference_checkout,
                tpu=tpu, cases=cases, previous=previous if cases else None,
                tf1_reference=tf1_reference, max_other_cores=max_other_cores)
  print(report(family, figures, quick=quick))
  if previous is not None and cases:
    figures = merge_cases(previous, figures, cases)
  elif previous is not None:
    figures = {**other_cases_figures(family_module(family), previous),
               **figures}
  if json_path:
    os.makedirs(os.path.dirname(os.path.abspath(json_path)), exist_ok=True)
    with open(json_path, 'w') as f:
      json.dump(figures, f, indent=2, sort_keys=True, default=float)
    print(f'wrote {json_path}')
  return figures
