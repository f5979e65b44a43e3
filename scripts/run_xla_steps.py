"""Runs the training and validation steps that `python -m official_ext.benchmark
accelerator --export_xla=DIR` exported, on jax's default device, with numpy and
jax alone (docs/distributed.md, "Figures through XLA on any accelerator")."""
import argparse
import gzip
import hashlib
import importlib
import json
import os
import platform
import re
import statistics
import sys
import time

import numpy as np

import jax
import jax.extend  # pylint: disable=unused-import

jax.config.update('jax_enable_x64', True)  # The optimizer's int64 step.

FORMAT = 'official_ext.xla_steps/1'

# Dense (no sparsity) peak TFLOP/s by device kind and precision. float32:
# the TF32 tensor-core peak on NVIDIA GPUs (XLA's default precision for a
# float32 matmul); a TPU has no float32 peak.
PEAK_TFLOPS = (
    ('H200', {'bfloat16': 989.4, 'float16': 989.4, 'float32': 494.7}),
    ('H100 PCIe', {'bfloat16': 756.0, 'float16': 756.0, 'float32': 378.0}),
    ('H100', {'bfloat16': 989.4, 'float16': 989.4, 'float32': 494.7}),
    ('A100', {'bfloat16': 312.0, 'float16': 312.0, 'float32': 156.0}),
    ('L4', {'bfloat16': 121.0, 'float16': 121.0, 'float32': 60.0}),
    ('TPU v4', {'bfloat16': 275.0}),
    ('TPU v5 lite', {'bfloat16': 197.0}),
    ('TPU v5e', {'bfloat16': 197.0}),
)


def peak_tflops(device_kind: str, precision: str):
  """The device's peak for `precision`, or None for a kind not in the table."""
  for name, peaks in PEAK_TFLOPS:
    if name.lower() in device_kind.lower():
      return peaks.get(precision)
  return None


def _jax_internal(attribute: str):
  """`attribute` of jax's XLA extension module (it moved between releases)."""
  for module in ('jax._src.lib._jax', 'jaxlib._jax', 'jax._src.lib',
                 'jaxlib.xla_extension'):
    try:
      found = importlib.import_module(module)
    except ImportError:
      continue
    for part in attribute.split('.'):
      found = getattr(found, part, None)
      if found is None:
        break
    if found is not None:
      return found
  raise RuntimeError(f'This jax ({jax.__version__}) has no {attribute}: '
                     'the runner needs jax 0.6 or newer.')


# tf2xla copies some returned values (`copy`); the HLO-to-StableHLO
# conversion keeps them as `mhlo.copy`, which a PJRT plugin (the CUDA one)
# refuses. A reshape to the same shape is the same no-op in StableHLO.
_MHLO_COPY = re.compile(r'(%[\w#]+) = mhlo\.copy (%[\w#]+) : (tensor<[^>]*>)')


def stablehlo_text(module: bytes) -> str:
  """The serialized HLO module as StableHLO text, every op StableHLO's."""
  from jax._src.interpreters import mlir  # pylint: disable=g-import-not-at-top
  from jax._src.lib.mlir import ir  # pylint: disable=g-import-not-at-top
  converted = _jax_internal('mlir.hlo_to_stablehlo')(module)
  context = mlir.make_ir_context()
  context.allow_unregistered_dialects = True
  with context:
    text = str(ir.Module.parse(converted))
  text = _MHLO_COPY.sub(r'\1 = stablehlo.reshape \2 : (\3) -> \3', text)
  left = sorted(set(re.findall(r'= "?(mhlo\.[a-z_]+)', text)))
  if left:
    raise ValueError(f'The module holds operations StableHLO lacks: {left}')
  return text


def compile_module(module: bytes, device):
  """The serialized HLO module compiled for `device`, as jax compiles its own.
  """
  from jax._src import compiler  # pylint: disable=g-import-not-at-top
  from jax._src.interpreters import mlir  # pylint: disable=g-import-not-at-top
  from jax._src.lib.mlir import ir  # pylint: disable=g-import-not-at-top
  text = stablehlo_text(module)
  backend = jax.extend.backend.get_backend(device.platform)
  options = compiler.get_compile_options(num_replicas=1, num_partitions=1)
  devices = _jax_internal('DeviceList')((device,))
  with mlir.make_ir_context():
    parsed = ir.Module.parse(text)
    return backend.compile_and_load(parsed, executable_devices=devices,
                                    compile_options=options)


def memory_bytes(executable):
  """XLA's compiled memory in bytes: arguments, outputs, aliased, temporaries.
  """
  stats = executable.get_compiled_memory_stats()
  return {k: int(getattr(stats, f'{k}_size_in_bytes'))
          for k in ('argument', 'output', 'alias', 'temp')}


def _dtype(name: str):
  return jax.numpy.dtype(name)


def _seed(key: str) -> int:
  return int.from_bytes(hashlib.sha256(key.encode()).digest()[:8], 'little')


def make_value(key: str, spec, stored) -> np.ndarray:
  """The array `spec` describes: stored values, or drawn (seeded by `key`)."""
  dtype, shape = _dtype(spec['dtype']), tuple(spec['shape'])
  kind = spec['kind']
  if kind == 'stored':
    value = stored[key]
    return value.view(dtype) if spec['dtype'] == 'bfloat16' else value
  rng = np.random.default_rng(_seed(key))
  if kind == 'constant':
    return np.full(shape, spec['value'], dtype)
  if kind == 'choice':
    return rng.choice(np.asarray(spec['values']), size=shape,
                      p=np.asarray(spec['p'])).astype(dtype)
  if kind == 'normal':
    draw = rng.standard_normal(shape, dtype=np.float32)
    draw *= spec['std']
    draw += spec['mean']
    return draw.astype(dtype, copy=False)
  raise ValueError(f'{key}: unknown value kind {kind!r}')


class Folder:
  """An exported folder: its manifest and its modules' arrays (made once each).
  """

  def __init__(self, path: str):
    self.path = path
    with open(os.path.join(path, 'manifest.json')) as f:
      self.manifest = json.load(f)
    if self.manifest.get('format') != FORMAT:
      raise ValueError(f'{path}: manifest format '
                       f'{self.manifest.get("format")!r}, expected {FORMAT}')
    self._files = {}
    self._made = {}

  def module(self, entry) -> bytes:
    with open(os.path.join(self.path, entry['module']), 'rb') as f:
      data = gzip.decompress(f.read())
    digest = hashlib.sha256(data).hexdigest()
    if digest != entry['sha256']:
      raise ValueError(f'{entry["module"]}: SHA-256 {digest}, the manifest '
                       f'says {entry["sha256"]}')
    return data

  def value(self, key: str) -> np.ndarray:
    if key not in self._made:
      spec = self.manifest['values'][key]
      stored = None
      if spec['kind'] == 'stored':
        if spec['file'] not in self._files:
          self._files[spec['file']] = np.load(
              os.path.join(self.path, spec['file']))
        stored = self._files[spec['file']]
      self._made[key] = make_value(key, spec, stored)
    return self._made[key]

  def arguments(self, entry):
    return [self.value(a['value']) for a in entry['arguments']]


class Step:
  """One compiled module and its arguments on `device`; `run()` executes one
  step, feeding the aliased outputs back as the next step's arguments."""

  def __init__(self, folder: Folder, entry, device, arguments=None):
    self.entry = entry
    start = time.perf_counter()
    self.executable = compile_module(folder.module(entry), device)
    self.compile_s = time.perf_counter() - start
    host = folder.arguments(entry) if arguments is None else arguments
    self.arguments = [jax.device_put(a, device) for a in host]
    self.outputs = None

  def run(self):
    self.outputs = self.executable.execute(self.arguments)
    for output, parameter in self.entry['aliases']:
      self.arguments[parameter] = self.outputs[output]
    return self.outputs[self.entry['loss_output']]

  def loss(self) -> float:
    return float(np.asarray(self.outputs[self.entry['loss_output']]))

  def memory_bytes(self):
    return memory_bytes(self.executable)

  def xla_flops(self):
    try:
      cost = self.executable.cost_analysis()
      cost = cost[0] if isinstance(cost, (list, tuple)) else cost
      return float(cost['flops'])
    except Exception:  # pylint: disable=broad-except
      return None


def compile_figures(folder: Folder, entry, device):
  """A case compiled and not run: its compile seconds and memory."""
  start = time.perf_counter()
  executable = compile_module(folder.module(entry), device)
  return {'name': entry['name'], 'case': entry['case'], 'step': entry['step'],
          'precision': entry['precision'],
          'compile_s': time.perf_counter() - start,
          'memory_bytes': memory_bytes(executable)}


def measure(folder: Folder, entry, device, warmup: int, steps: int,
            rounds: int, case_seconds: float):
  """One case's figures (the JSON's `cases` entries)."""
  started = time.perf_counter()
  step = Step(folder, entry, device)
  step.run()
  first_loss = step.loss()
  for _ in range(max(warmup - 1, 0)):
    step.run()
  jax.block_until_ready(step.outputs)
  seconds = []
  timed = time.perf_counter()
  for _ in range(rounds):
    start = time.perf_counter()
    for _ in range(steps):
      loss = step.run()
    jax.block_until_ready(loss)
    seconds.append((time.perf_counter() - start) / steps)
    if time.perf_counter() - timed > case_seconds:
      break
  step_s = statistics.median(seconds)
  examples = entry['examples_per_step']
  flops = entry.get('flops_per_step')
  tflops = None if flops is None else flops / step_s / 1e12
  peak = peak_tflops(device.device_kind, entry['precision'])
  final_loss = step.loss()
  return {
      'name': entry['name'], 'case': entry['case'], 'step': entry['step'],
      'precision': entry['precision'], 'examples_per_step': examples,
      'step_s': step_s, 'examples_per_sec': examples / step_s,
      'flops_per_step': flops, 'tflops': tflops,
      'peak_tflops': peak,
      'peak_share': None if tflops is None or peak is None else tflops / peak,
      'xla_flops_per_step': step.xla_flops(),
      'compile_s': step.compile_s, 'memory_bytes': step.memory_bytes(),
      'rounds': len(seconds), 'steps_per_round': steps,
      'first_loss': first_loss, 'loss': final_loss,
      'loss_finite': bool(np.isfinite(final_loss)),
      'loss_moved': final_loss != first_loss,
      'seconds': time.perf_counter() - started,
  }


def main(argv=None) -> int:
  parser = argparse.ArgumentParser(description=__doc__.split('\n\n')[0])
  parser.add_argument('folder')
  parser.add_argument('--json', required=True)
  parser.add_argument('--cases', default='',
                      help='comma-separated prefixes of case names')
  parser.add_argument('--warmup', type=int, default=3)
  parser.add_argument('--steps', type=int, default=10)
  parser.add_argument('--rounds', type=int, default=5)
  parser.add_argument('--case_seconds', type=float, default=60.0,
                      help='no new timed round after this many seconds of '
                      'timed rounds')
  parser.add_argument('--compile_only', action='store_true',
                      help='compile each module (seconds, memory); run none')
  parser.add_argument('--resume', action='store_true',
                      help='keep the cases the --json file holds (measured on '
                      'this device kind) and run the others')
  args = parser.parse_args(argv)
  folder = Folder(args.folder)
  device = jax.devices()[0]
  prefixes = [p for p in args.cases.split(',') if p]
  result = {
      'device': device.device_kind, 'platform': device.platform,
      'jax': jax.__version__, 'python': platform.python_version(),
      'exported_with_tensorflow': folder.manifest['tensorflow'],
      'quick': folder.manifest['quick'],
      'kernel_policy': folder.manifest['kernel_policy'],
      'command': [' '.join(['python scripts/run_xla_steps.py'] +
                           (sys.argv[1:] if argv is None else list(argv)))],
      'settings': {'warmup': args.warmup, 'steps': args.steps,
                   'rounds': args.rounds,
                   'case_seconds': args.case_seconds},
      'cases': [],
  }
  if args.resume and os.path.exists(args.json):
    with open(args.json) as f:
      previous = json.load(f)
    if previous.get('device') == device.device_kind:
      result['cases'] = [c for c in previous['cases'] if 'error' not in c]
      commands = previous.get('command', [])
      result['command'] = ([commands] if isinstance(commands, str) else
                           commands) + result['command']
    else:
      print(f'{args.json} was measured on {previous.get("device")}: every '
            f'case runs on this {device.device_kind}.', flush=True)
  done = {c['name'] for c in result['cases']}
  failed = 0
  for entry in folder.manifest['cases']:
    if prefixes and not any(entry['name'].startswith(p) for p in prefixes):
      continue
    if entry['name'] in done:
      continue
    print(f'{entry["name"]}: ', end='', flush=True)
    try:
      if args.compile_only:
        figures = compile_figures(folder, entry, device)
        print(f'compiled in {figures["compile_s"]:.1f} s', flush=True)
      else:
        figures = measure(folder, entry, device, args.warmup, args.steps,
                          args.rounds, args.case_seconds)
        print(f'{figures["examples_per_sec"]:.1f} examples/s, compile '
              f'{figures["compile_s"]:.1f} s, loss {figures["loss"]:.4g}',
              flush=True)
    except Exception as e:  # pylint: disable=broad-except
      failed += 1
      figures = {'name': entry['name'], 'case': entry['case'],
                 'step': entry['step'], 'precision': entry['precision'],
                 'error': f'{type(e).__name__}: {e}'}
      print(figures['error'], flush=True)
    result['cases'].append(figures)
    with open(args.json, 'w') as f:
      json.dump(result, f, indent=1)
  return 1 if failed else 0


if __name__ == '__main__':
  sys.exit(main())
