"""`python -m official_ext.benchmark accelerator --export_xla=DIR`: each
case's training and validation steps as serialized XLA (HLO) modules with
a `manifest.json`, for `scripts/run_xla_steps.py` to run without
TensorFlow. The format and what a figure from it means:
docs/distributed.md#figures-through-xla-on-any-accelerator."""
import contextlib
import dataclasses
import gc
import gzip
import hashlib
import json
import os
import re
import tempfile
from typing import Any, Callable, Dict, Iterator, List, Optional, Sequence

from absl import logging
import numpy as np
import tensorflow as tf, tf_keras
import yaml

from official.core import task_factory
from official.modeling import performance
from official_ext.benchmarks import accelerator
from official_ext.benchmarks import assemblenet as assemblenet_bench
from official_ext.benchmarks import graph_flops
from official_ext.benchmarks import memory
from official_ext.benchmarks import readout as readout_bench
from official_ext.benchmarks import yt8m as yt8m_bench
from official_ext.core import experiment_params
from official_ext.core.kernels import kernel_policy
from official_ext.core.run import trainer as trainer_lib
from official_ext import registry_imports  # pylint: disable=unused-import

FORMAT = 'official_ext.xla_steps/1'
MANIFEST = 'manifest.json'
PRECISIONS = ('bfloat16', 'float16', 'float32')
STEPS = ('train', 'validation')
# The GPU kernel policy: the stock ops (what a GPU or TPU takes).
POLICY = kernel_policy.resolve('auto', 'GPU')
# Published sizes: an array up to this size travels as its values; a larger
# one as a recipe the runner draws from (`describe`). Integer arrays
# (indices, ids) always travel.
STORE_LIMIT_BYTES = 1 << 20
SEED = 7

_HLO_DTYPES = {'pred': 'bool', 's8': 'int8', 's16': 'int16', 's32': 'int32',
               's64': 'int64', 'u8': 'uint8', 'u16': 'uint16',
               'u32': 'uint32', 'u64': 'uint64', 'f16': 'float16',
               'bf16': 'bfloat16', 'f32': 'float32', 'f64': 'float64'}


@dataclasses.dataclass
class Built:
  """A case built in one precision: what its two steps take."""
  task: Any
  model: tf_keras.Model
  optimizer: Any
  batches: Dict[str, Any]  # 'train' / 'validation' -> one replica's batch
  examples: Dict[str, int]  # step -> videos / trials a step takes
  experiment: str
  yaml: Optional[str]
  params: Any = None


@dataclasses.dataclass(frozen=True)
class XlaCase:
  """One exported model: `build(quick, precision, overrides) -> Built`."""
  name: str
  family: str
  build: Callable[..., Built]
  about: str


def _yaml(family: str, name: str) -> str:
  return os.path.join(accelerator.REPO, 'configs', family, name)


def _one_replica(params, quick_overrides: Optional[Dict[str, Any]],
                 quick: bool, precision: str,
                 overrides: Optional[Dict[str, Any]] = None) -> None:
  """One GPU's share of the YAML's global batches (tiny sizes and batch 2
  with `quick`), in `precision` (float16 with dynamic loss scaling), then
  `overrides`."""
  gpus = params.runtime.num_gpus or 1
  batches = {split: getattr(params.task, split).global_batch_size // gpus
             for split in ('train_data', 'validation_data')}
  if quick:
    params.override(quick_overrides or {}, is_strict=True)
    batches = {split: 2 for split in batches}
  params.override({
      'task': {split: {'global_batch_size': b} for split, b in
               batches.items()},
      'runtime': {'num_gpus': 1, 'mixed_precision_dtype': precision,
                  'loss_scale': 'dynamic' if precision == 'float16' else None}
  }, is_strict=True)
  params.override(overrides or {}, is_strict=True)


def _task_model_optimizer(params, model: Optional[tf_keras.Model] = None):
  task = task_factory.get_task(params.task)
  model = task.build_model() if model is None else model
  optimizer = task.create_optimizer(params.trainer.optimizer_config,
                                    params.runtime)
  trainer_lib.create_optimizer_weights(tf.distribute.get_strategy(),
                                       optimizer, model.trainable_variables)
  return task, model, optimizer


def _yt8m_batch(data, per_replica: int, seed: int = 0) -> Dict[str, Any]:
  frames = data.num_sample_frames or data.max_frames
  shape = yt8m_bench.Size('export', per_replica, frames, 0, 0, 0,
                          data.num_classes, sum(data.feature_sizes))
  return yt8m_bench.make_batch(shape, seed)


# Tiny sizes of the YT8M cases (`--quick`): the published experiments'
# quick sizes of `benchmark yt8m`, and as few validation frames.
_YT8M_QUICK = {
    **yt8m_bench.QUICK_PUBLISHED,
    'yt8m_mix_nextvlad': {'task': {
        'model': {'backbone': {'mix_nextvlad': {
            'cluster_sizes': [4, 2], 'groups': [2, 1], 'hidden_size': 8,
            'num_branches': 2}}},
        'train_data': {'num_classes': 20, 'max_frames': 8},
        'validation_data': {'num_classes': 20}}},
}


def _yt8m_case(experiment: str, yaml_name: str,
               model_garden: bool = False) -> Callable[..., Built]:

  def build(quick: bool, precision: str, overrides=None) -> Built:
    path = _yaml('yt8m', yaml_name)
    params = experiment_params.load_params(experiment, [path], lock=False)
    _one_replica(params, _YT8M_QUICK[experiment], quick, precision,
                 overrides)
    if quick:
      params.override({'task': {'validation_data': {'max_frames': 8}}},
                      is_strict=True)
    model = None
    if model_garden:
      size = yt8m_bench.model_garden_size(
          params, params.task.train_data.global_batch_size)
      if size is None:
        raise ValueError(f'{experiment}: Model Garden has no such model.')
      model = yt8m_bench.model_garden_model(size)
    task, model, optimizer = _task_model_optimizer(params, model)
    if model_garden:
      # Model Garden's task adds the L2 loss through `model.losses`.
      task.analytic_l2_gradient = False
    batches = {
        'train': _yt8m_batch(params.task.train_data,
                             params.task.train_data.global_batch_size),
        'validation': _yt8m_batch(
            params.task.validation_data,
            params.task.validation_data.global_batch_size, seed=1)}
    return Built(task, model, optimizer, batches,
                 {s: int(b['labels'].shape[0]) for s, b in batches.items()},
                 experiment, os.path.relpath(path, accelerator.REPO), params)
  return build


def _assemblenet_case(name: str) -> Callable[..., Built]:
  """The build of the AssembleNet accelerator case `name` on its GPU YAML:
  random clips (a validation video's views each), one-hot labels and, for
  an experiment with object maps, `assemblenet_bench.object_maps`."""

  def build(quick: bool, precision: str, overrides=None) -> Built:
    case = next(c for c in accelerator.CASES if c.name == name)
    path = accelerator.yaml_path(case, 'GPU')
    params = experiment_params.load_params(case.experiment, [path],
                                           lock=False)
    _one_replica(params, case.quick, quick, precision, overrides)
    task, model, optimizer = _task_model_optimizer(params)
    rng = np.random.default_rng(0)
    batches = {}
    for step, data in (('train', params.task.train_data),
                       ('validation', params.task.validation_data)):
      videos = data.global_batch_size
      views = 1 if step == 'train' else (data.num_test_clips *
                                         data.num_test_crops)
      labels = np.eye(data.num_classes, dtype=np.float32)[
          rng.integers(0, data.num_classes, videos)]
      image = rng.uniform(0, 1, [videos * views, *data.feature_shape])
      features = {'image': tf.constant(image, tf.float32)}
      if data.num_object_classes:
        features['objects'] = tf.constant(assemblenet_bench.object_maps(
            rng, image.shape[:-1], data.num_object_classes))
      batches[step] = (features, tf.constant(labels))
    return Built(task, model, optimizer, batches,
                 {s: int(b[1].shape[0]) for s, b in batches.items()},
                 case.experiment, os.path.relpath(path, accelerator.REPO),
                 params)
  return build


def _readout_static(params) -> None:
  """The readout TPU YAML's static shapes (padded batches of fixed token
  and query counts, masked routing) on a GPU YAML's config."""
  with open(_yaml('readout', 'readout_tpu.yaml')) as f:
    tpu = yaml.safe_load(f)['task']
  data = {k: v for k, v in tpu['train_data'].items()
          if k != 'global_batch_size'}
  params.override({'task': {'model': tpu['model'], 'train_data': data,
                            'validation_data': data}}, is_strict=True)


def _readout_build(quick: bool, precision: str, overrides=None) -> Built:
  case = next(c for c in accelerator.CASES if c.name == 'readout')
  path = _yaml('readout', 'readout_gpu.yaml')
  params = experiment_params.load_params(case.experiment, [path], lock=False)
  _one_replica(params, case.quick, quick, precision, overrides)
  _readout_static(params)
  task, model, optimizer = _task_model_optimizer(params)
  sizes = {'train': params.task.train_data.global_batch_size,
           'validation': params.task.validation_data.global_batch_size}
  made = {n: readout_bench.demo_batches(task, n)['padded']
          for n in set(sizes.values())}
  batches = {step: made[n] for step, n in sizes.items()}
  return Built(task, model, optimizer, batches,
               {s: int(b['input_values'].shape[0])
                for s, b in batches.items()},
               case.experiment, os.path.relpath(path, accelerator.REPO),
               params)


def _unit_tokens_build(quick: bool, precision: str, overrides=None
                       ) -> Built:
  """The spike-token case of `benchmark readout` (every spike a token:
  `readout_bench.SPIKES`) with static shapes, the readout GPU YAML's
  optimizer and precision."""
  path = _yaml('readout', 'readout_gpu.yaml')
  params = experiment_params.load_params('readout_demo', [path], lock=False)
  _one_replica(params, None, quick, precision)
  vocabulary = readout_bench.spike_vocabulary(quick)
  folder = tempfile.mkdtemp(prefix='xla_export_units')
  vocabulary_file = os.path.join(folder, 'vocabulary.json')
  from official_ext.readout import unit_vocabulary as vocabulary_lib  # pylint: disable=g-import-not-at-top
  vocabulary_lib.save(vocabulary, vocabulary_file)
  config = readout_bench.spike_task(quick, vocabulary_file).task_config
  config.override({'model': {'static_shapes': True}}, is_strict=True)
  params.task = config
  params.override(overrides or {}, is_strict=True)
  task, model, optimizer = _task_model_optimizer(params)
  batch = readout_bench.spike_batches(task, vocabulary, quick)['padded']
  batches = {'train': batch, 'validation': batch}
  return Built(task, model, optimizer, batches,
               {s: int(b['input_values'].shape[0])
                for s, b in batches.items()},
               'readout_demo', os.path.relpath(path, accelerator.REPO),
               params)


# In the order the device runs them first (the bfloat16 training steps of
# ours and Model Garden's DBoF, then AssembleNet++lite's); the full
# AssembleNets last.
CASES = (
    XlaCase('yt8m_dbof', 'yt8m', _yt8m_case('yt8m', 'yt8m_gpu.yaml'),
            'DBoF + MoE, the yt8m experiment (Model Garden\'s published '
            'size), configs/yt8m/yt8m_gpu.yaml'),
    XlaCase('yt8m_dbof_model_garden', 'yt8m',
            _yt8m_case('yt8m', 'yt8m_gpu.yaml', model_garden=True),
            'Model Garden\'s VideoClassificationModel at the same size, '
            'trained by the same task (its L2 through model.losses)'),
    XlaCase('assemblenet_kinetics', 'assemblenet',
            _assemblenet_case('assemblenet_kinetics'),
            'AssembleNet++lite on Kinetics clips (32 x 224^2), '
            'configs/assemblenet/kinetics_gpu.yaml'),
    XlaCase('yt8m_nextvlad', 'yt8m',
            _yt8m_case('yt8m_nextvlad', 'yt8m_nextvlad_gpu.yaml'),
            'NeXtVLAD as its authors trained it, '
            'configs/yt8m/yt8m_nextvlad_gpu.yaml'),
    XlaCase('yt8m_mix_nextvlad', 'yt8m',
            _yt8m_case('yt8m_mix_nextvlad', 'yt8m_nextvlad_gpu.yaml'),
            'the 3-NeXtVLAD mixture with online distillation, on the '
            'NeXtVLAD GPU YAML'),
    XlaCase('readout', 'readout', _readout_build,
            'readout_demo on configs/readout/readout_gpu.yaml with the TPU '
            'YAML\'s static shapes'),
    XlaCase('readout_unit_tokens', 'readout', _unit_tokens_build,
            'unit tokens: benchmark readout\'s spike-token windows (every '
            'spike a token), static shapes, the readout GPU YAML\'s '
            'optimizer'),
    XlaCase('assemblenet50_kinetics', 'assemblenet',
            _assemblenet_case('assemblenet50_kinetics'),
            'AssembleNet-50 on Kinetics-400 clips (32 x 224^2), '
            'configs/assemblenet/assemblenet50_kinetics400_gpu.yaml'),
    XlaCase('assemblenet_plus_charades', 'assemblenet',
            _assemblenet_case('assemblenet_plus_charades'),
            'AssembleNet++-50 with its object stem on Charades clips '
            '(32 x 224^2) and their object maps (151 classes), '
            'configs/assemblenet/assemblenet_plus_charades_gpu.yaml'),
)


def case_names() -> List[str]:
  return [c.name for c in CASES]


@contextlib.contextmanager
def _precision(precision: str) -> Iterator[None]:
  previous = tf_keras.mixed_precision.global_policy()
  performance.set_mixed_precision_policy(precision)
  try:
    yield
  finally:
    tf_keras.mixed_precision.set_global_policy(previous)


def build(case: XlaCase, quick: bool, precision: str,
          overrides: Optional[Dict[str, Any]] = None) -> Built:
  """`case` built from `SEED` in `precision` under the GPU kernel policy
  (the caller holds `_precision(precision)` and `kernel_policy.use`), its
  config changed by `overrides` (tests)."""
  tf_keras.utils.set_random_seed(SEED)
  return case.build(quick, precision, overrides)


def step_function(built: Built, step: str) -> Callable[[Any], Any]:
  """The task's own `train_step` / `validation_step` on one replica, as
  one XLA program."""
  task, model = built.task, built.model
  if step == 'train':
    metrics = task.build_metrics(training=True)
    fn = lambda b: task.train_step(b, model, built.optimizer, metrics)
  else:
    metrics = task.build_metrics(training=False)
    fn = lambda b: task.validation_step(b, model, metrics)
  fn.metrics = metrics
  return tf.function(fn, jit_compile=True)


# -- what the module's arguments are ------------------------------------------


def _variables_of(built: Built, metrics) -> Dict[int, tuple]:
  """id(resource handle) -> (name, role, variable) of every variable a
  step can capture: the model's, the optimizer's (its step counter, slots,
  hyperparameters, loss scale) and the metrics'."""
  out = {}
  optimizers = [built.optimizer]
  inner = getattr(built.optimizer, 'inner_optimizer', None)
  if inner is not None:
    optimizers.append(inner)
  for optimizer in optimizers:
    found = [v for v in tf.train.TrackableView(optimizer).descendants()
             if isinstance(v, tf.Variable)]
    found += [v for v in getattr(optimizer, '_hyper', {}).values()
              if isinstance(v, tf.Variable)]
    for v in found:
      out.setdefault(id(v.handle), (v.name, 'optimizer', v))
  for optimizer in optimizers:
    v = optimizer.iterations
    out[id(v.handle)] = (v.name, 'step', v)
    if hasattr(optimizer, 'get_slot_names'):
      for var in built.model.trainable_variables:
        for slot in optimizer.get_slot_names():
          s = optimizer.get_slot(var, slot)
          out[id(s.handle)] = (s.name, 'optimizer_slot', s)
  for v in built.model.variables:
    out[id(v.handle)] = (v.name, 'variable', v)
  for m in metrics:
    for v in m.variables:
      out[id(v.handle)] = (v.name, 'metric', v)
  return out


def flat_with_paths(structure, prefix: str = '') -> List[tuple]:
  """(path, leaf) in `tf.nest.flatten`'s order (dict keys sorted)."""
  if isinstance(structure, dict):
    return [x for k in sorted(structure)
            for x in flat_with_paths(structure[k], f'{prefix}/{k}')]
  if isinstance(structure, (list, tuple)):
    return [x for i, s in enumerate(structure)
            for x in flat_with_paths(s, f'{prefix}/{i}')]
  return [(prefix.lstrip('/'), structure)]


def _parse_layout(hlo_text: str):
  """(parameters, outputs, aliases) of the module's entry computation:
  [(dtype, shape)] each, and [(output index, parameter index)]."""
  header = hlo_text.split('\n', 1)[0]
  layout = re.search(r'entry_computation_layout=\{\((.*)\)->\((.*)\)\}',
                     header)
  if layout is None:
    raise ValueError(f'Unexpected HLO module header: {header[:300]}')
  arrays = lambda s: [
      (_HLO_DTYPES[d], [int(x) for x in dims.split(',') if x])
      for d, dims in re.findall(r'\b([a-z]+[0-9]*)\[([0-9,]*)\]', s)]
  aliases = [(int(o), int(p)) for o, p in re.findall(
      r'\{(\d+)\}: \((\d+), \{\}', header.split('entry_computation_layout')[0]
  )]
  return arrays(layout.group(1)), arrays(layout.group(2)), aliases


def _np_dtype(dtype: tf.DType) -> str:
  return 'bool' if dtype == tf.bool else dtype.name


class Values:
  """The arrays the modules' arguments start from: each stored once per
  content (in the npz file `file`) or described for the runner to draw."""

  def __init__(self, store_all: bool, file: str = 'values.npz'):
    self.store_all = store_all
    self.file = file
    self.arrays: Dict[str, np.ndarray] = {}
    self.specs: Dict[str, Dict[str, Any]] = {}

  def add(self, case: str, name: str, value: np.ndarray) -> str:
    """The key of `value` (a case's argument named `name`)."""
    value = np.asarray(value)
    spec = describe(value, self.store_all)
    content = (value.tobytes() if spec['kind'] == 'stored' else
               json.dumps(spec, sort_keys=True).encode())
    digest = hashlib.sha256(content + str(value.shape).encode() +
                            str(value.dtype).encode()).hexdigest()[:12]
    key = f'{case}/{name}/{digest}'
    if key not in self.specs:
      if spec['kind'] == 'stored':
        spec['file'] = self.file
        self.arrays[key] = (value.view(np.uint16)
                            if value.dtype.name == 'bfloat16' else value)
      self.specs[key] = spec
    return key

  def write(self, folder: str) -> None:
    if self.arrays:
      np.savez_compressed(os.path.join(folder, self.file), **self.arrays)


def describe(value: np.ndarray, store_all: bool) -> Dict[str, Any]:
  """How the runner gets `value`: its values ('stored'), or for a large
  floating array one value ('constant'), a few values drawn with their
  frequencies ('choice': labels, masks) or a normal with its mean and
  standard deviation ('normal')."""
  spec = {'shape': list(value.shape), 'dtype': value.dtype.name}
  floating = value.dtype.kind == 'f' or value.dtype.name == 'bfloat16'
  if store_all or not floating or value.nbytes <= STORE_LIMIT_BYTES:
    return {**spec, 'kind': 'stored'}
  x = value.ravel()
  distinct = np.unique(x[:1 << 16])
  if distinct.size <= 16 and np.isin(x, distinct).all():
    counts = np.array([np.count_nonzero(x == d) for d in distinct])
    if distinct.size == 1:
      return {**spec, 'kind': 'constant', 'value': float(distinct[0])}
    return {**spec, 'kind': 'choice', 'values': distinct.tolist(),
            'p': (counts / x.size).tolist()}
  chunks = lambda: (x[i:i + (1 << 22)].astype(np.float64)
                    for i in range(0, x.size, 1 << 22))
  mean = sum(c.sum() for c in chunks()) / x.size
  std = np.sqrt(sum(((c - mean) ** 2).sum() for c in chunks()) / x.size)
  return {**spec, 'kind': 'normal', 'mean': float(mean), 'std': float(std)}


def _step_flops(built: Built, step: str) -> Dict[str, Any]:
  """FLOPs of one step, counted from its traced graph (`graph_flops`); None
  with the counter's reason where it cannot count."""
  batch = built.batches[step]
  try:
    flops = graph_flops.step_flops(
        built.task, accelerator.counting_model(built.task, batch, built.model),
        batch, training=step == 'train')
  except ValueError as e:
    return {'flops_per_step': None, 'flops_source': f'not counted: {e}'}
  return {'flops_per_step': float(flops),
          'flops_source': 'benchmarks/graph_flops.py (the traced step)'}


def step_arguments(built: Built, fn, batch, case: str, step: str
                   ) -> List[tuple]:
  """(name, role, value or variable) of each argument of `fn`'s program on
  `batch`, in the module's order: the batch's tensors, then what the step
  captures (variables, constants)."""
  concrete = fn.get_concrete_function(batch)
  known = _variables_of(built, fn.metrics)
  arguments = [('batch/' + path, 'batch', tensor)
               for path, tensor in flat_with_paths(batch)]
  for i, captured in enumerate(concrete.captured_inputs):
    if captured.dtype != tf.resource:
      arguments.append((f'constant_{i}', 'constant', captured))
    elif id(captured) in known:
      arguments.append(known[id(captured)])
    else:
      raise ValueError(f'{case} {step}: captured variable {i} is none of '
                       'the model\'s, optimizer\'s or metrics\'.')
  return arguments


def export_step(built: Built, case: XlaCase, step: str, precision: str,
                folder: str, values: Values, flops: Dict[str, Any],
                fn=None) -> Dict[str, Any]:
  """Writes one step's HLO module (of `fn`, default `step_function`) into
  `folder`; returns its manifest entry."""
  fn = fn or step_function(built, step)
  batch = built.batches[step]
  arguments = step_arguments(built, fn, batch, case.name, step)
  logs = fn.get_concrete_function(batch).structured_outputs
  ir = fn.experimental_get_compiler_ir(batch)
  module = ir(stage='hlo_serialized')
  parameters, outputs, aliases = _parse_layout(ir(stage='hlo'))
  if len(arguments) != len(parameters):
    raise ValueError(f'{case.name} {step}: the module takes '
                     f'{len(parameters)} arguments, the function '
                     f'{len(arguments)}.')
  entries = []
  for (name, role, value), (dtype, shape) in zip(arguments, parameters):
    value = np.asarray(value.numpy())
    if list(value.shape) != shape or _np_dtype(tf.as_dtype(
        value.dtype)) != dtype:
      raise ValueError(f'{case.name} {step}: argument {name!r} is '
                       f'{value.dtype}{list(value.shape)}, the module takes '
                       f'{dtype}{shape}.')
    entries.append({'name': name, 'role': role, 'dtype': dtype,
                    'shape': shape, 'value': values.add(case.name, name,
                                                        value)})
  flat = flat_with_paths(logs)
  if len(flat) != len(tf.nest.flatten(logs)):
    raise ValueError(f'{case.name} {step}: outputs of an unexpected '
                     'structure.')
  loss_key = built.task.loss
  loss_output = next((i for i, (p, _) in enumerate(flat) if p == loss_key),
                     None)
  if loss_output is None or outputs[loss_output][1]:
    raise ValueError(f'{case.name} {step}: no scalar {loss_key!r} among '
                     f'the outputs {[p for p, _ in flat]}.')
  file = f'{case.name}.{step}.{precision}.hlo.pb.gz'
  with open(os.path.join(folder, file), 'wb') as f:
    f.write(gzip.compress(module, mtime=0))
  aliases = sorted(aliases)
  if [o for o, _ in aliases] != list(range(len(flat), len(outputs))):
    raise ValueError(f'{case.name} {step}: outputs {len(flat)}.. of the '
                     f'module are not all variable updates: {aliases}.')
  names = [p for p, _ in flat] + [
      'update of ' + arguments[p][0] for _, p in aliases]
  return {
      'name': f'{case.name}/{step}/{precision}', 'case': case.name,
      'family': case.family, 'about': case.about, 'step': step,
      'precision': precision, 'experiment': built.experiment,
      'yaml': built.yaml, 'module': file,
      'sha256': hashlib.sha256(module).hexdigest(),
      'examples_per_step': built.examples[step], **flops,
      'arguments': entries,
      'outputs': [{'name': n, 'dtype': d, 'shape': s}
                  for n, (d, s) in zip(names, outputs)],
      'loss_output': loss_output, 'aliases': aliases,
  }


def run_order(entries: Sequence[Dict[str, Any]]) -> List[Dict[str, Any]]:
  """The device's order: training steps before validation steps; bfloat16,
  then float16, then float32; cases in `CASES` order."""
  names = case_names()
  return sorted(entries, key=lambda e: (
      STEPS.index(e['step']), PRECISIONS.index(e['precision']),
      names.index(e['case'])))


def export_one(folder: str, case: XlaCase, quick: bool, precision: str,
               steps: Sequence[str] = STEPS) -> Dict[str, Any]:
  """Exports `case`'s `steps` in `precision` into `folder`: {'entries':
  their manifest entries, 'values': the specs of their arguments' values}
  (stored ones in their own npz file)."""
  values = Values(store_all=quick, file=f'values.{case.name}.{precision}.npz')
  entries = []
  with _precision(precision), kernel_policy.use(POLICY):
    built = build(case, quick, precision)
    for step in steps:
      entries.append(export_step(built, case, step, precision, folder,
                                 values, _step_flops(built, step)))
      logging.info('Exported %s (%d arguments).', entries[-1]['name'],
                   len(entries[-1]['arguments']))
  values.write(folder)
  del built
  tf_keras.backend.clear_session()
  gc.collect()
  return {'entries': entries, 'values': values.specs}


def _child_code(folder: str, case: str, quick: bool, precision: str,
                steps: Sequence[str]) -> str:
  return (
      'from official_ext.benchmarks import memory, xla_export\n'
      f'case = next(c for c in xla_export.CASES if c.name == {case!r})\n'
      f'print(memory.result_line(xla_export.export_one({folder!r}, case, '
      f'{quick!r}, {precision!r}, {list(steps)!r})))\n')


def export(folder: str, quick: bool = False,
           cases: Optional[Sequence[str]] = None,
           precisions: Sequence[str] = PRECISIONS,
           steps: Sequence[str] = STEPS,
           isolate: Optional[bool] = None) -> Dict[str, Any]:
  """Exports `cases` (default all) into `folder`; returns the manifest.
  `isolate` (default: at published sizes) builds each case and precision in
  a child process, so that no process holds more than one model."""
  unknown = set(cases or ()) - set(case_names())
  if unknown:
    raise ValueError(f'Unknown case(s) {sorted(unknown)}; the cases are '
                     f'{case_names()}.')
  isolate = not quick if isolate is None else isolate
  os.makedirs(folder, exist_ok=True)
  entries, specs = [], {}
  for case in CASES:
    if cases and case.name not in cases:
      continue
    for precision in precisions:
      if isolate:
        done = memory.run_child(_child_code(folder, case.name, quick,
                                            precision, steps))
        logging.info('Exported %s in %s.', case.name, precision)
      else:
        done = export_one(folder, case, quick, precision, steps)
      entries += done['entries']
      specs.update(done['values'])
    _merge_values(folder, case.name, specs)
  return write_manifest(folder, entries, specs, quick)


def _merge_values(folder: str, case: str, specs: Dict[str, Any]) -> None:
  """The stored values of `case`'s precisions in one file,
  `values.<case>.npz` (an array the precisions share, e.g. the initial
  weights, once); `specs` updated to point there."""
  merged_file = f'values.{case}.npz'
  files = sorted(f for f in os.listdir(folder)
                 if f.startswith(f'values.{case}.') and f.endswith('.npz') and
                 f[len(f'values.{case}.'):-len('.npz')] in PRECISIONS)
  arrays = {}
  for file in files:
    with np.load(os.path.join(folder, file)) as stored:
      arrays.update({key: stored[key] for key in stored.files})
  if arrays:
    np.savez_compressed(os.path.join(folder, merged_file), **arrays)
  for file in files:
    if file != merged_file:
      os.remove(os.path.join(folder, file))
  for key, spec in specs.items():
    if spec.get('file') in files:
      spec['file'] = merged_file


def write_manifest(folder: str, entries: Sequence[Dict[str, Any]],
                   values: Dict[str, Dict[str, Any]], quick: bool
                   ) -> Dict[str, Any]:
  """Writes the manifest of the modules `entries`, whose arguments'
  values `values` describes, into `folder`; returns it."""
  manifest = {
      'format': FORMAT, 'tensorflow': tf.__version__, 'quick': quick,
      'seed': SEED, 'kernel_policy': dict(kernel_policy.as_dict(POLICY)),
      'values': values, 'cases': run_order(entries),
  }
  with open(os.path.join(folder, MANIFEST), 'w') as f:
    json.dump(manifest, f, indent=1)
  return manifest


def main(folder: str, quick: bool = False,
         cases: Optional[Sequence[str]] = None) -> Dict[str, Any]:
  """The command line's export: logs each module and where the run
  command is."""
  manifest = export(folder, quick=quick, cases=cases)
  total = sum(os.path.getsize(os.path.join(folder, f))
              for f in os.listdir(folder))
  print(f'Exported {len(manifest["cases"])} XLA modules into {folder} '
        f'({total / 2**20:.1f} MiB). Run them without TensorFlow: python '
        f'scripts/run_xla_steps.py {folder} --json FILE')
  return manifest
