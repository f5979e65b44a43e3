"""The kernel policy: TensorFlow's stock ops, or this project's fast paths
(`FAST_PATHS`; docs/architecture.md, "Kernel policy")."""
import contextlib
import dataclasses
import functools
from typing import Dict, Iterator, List, Mapping, Optional, Tuple

from official.core import config_definitions as cfg
from official_ext.core.kernels import process_settings
from official_ext.core import tf_internals

SETTINGS = ('auto', 'stock', 'fast')
DEVICES = ('CPU', 'GPU', 'TPU')


@dataclasses.dataclass
class RuntimeConfig(cfg.RuntimeConfig):
  """Model Garden's `RuntimeConfig`; `kernel_policy`: auto, stock or fast."""
  kernel_policy: str = 'auto'


@dataclasses.dataclass(frozen=True)
class FastPath:
  """One fast path as `FAST_PATHS` declares it.

  Attributes:
    name: '<family>.<what>', asked by `KernelPolicy.takes`.
    replaces: the stock op(s).
    where: dotted path of its implementation.
    auto: when 'auto' takes it, on `devices`.
    off: how to turn it off.
    test: the equivalence test.
    env: for a process setting, {variable: value}.
  """
  name: str
  replaces: str
  where: str
  auto: str
  devices: Tuple[str, ...]
  off: str
  test: str
  env: Tuple[Tuple[str, str], ...] = ()

  @property
  def family(self) -> str:
    return self.name.split('.')[0]


_OFF = '`runtime.kernel_policy: stock`'

FAST_PATHS: Tuple[FastPath, ...] = (
    FastPath(
        name='assemblenet.conv3d_as_2d',
        replaces='`tf_keras.layers.Conv3D` (Conv3D; SpaceToBatchND for a '
        'temporal dilation)',
        where='official_ext.assemblenet.modeling.convolutions.conv3d_as_2d',
        auto='CPU: every kernel where oneDNN\'s CPU kernels are off; with '
        'them on, 1x1x1 kernels and temporally dilated kernels on frames of '
        '<= 16 pixels (`convolutions.conv3d_implementation`)',
        devices=('CPU',), off=_OFF,
        test='tests/assemblenet/test_modeling.py::'
        'test_conv3d_implementations'),
    FastPath(
        name='assemblenet.conv3d_time_phases',
        replaces='a temporally dilated Conv3D as SpaceToBatchND + Conv3D',
        where='official_ext.assemblenet.modeling.convolutions.conv3d_native',
        auto='CPU with oneDNN\'s CPU kernels on: temporally dilated kernels '
        '(odd kt) on frames of > 16 pixels',
        devices=('CPU',), off=_OFF,
        test='tests/assemblenet/test_modeling.py::'
        'test_conv3d_implementations'),
    FastPath(
        name='assemblenet.ordered_recompute',
        replaces='`tf.recompute_grad` (with `recompute_grad: true`)',
        where='official_ext.assemblenet.modeling.recompute.recompute_grad',
        auto='CPU, outside XLA: one segment\'s backward rerun at a time '
        '(host-memory peak); inside XLA always `tf.recompute_grad`',
        devices=('CPU',), off=_OFF,
        test='tests/assemblenet/test_recompute.py::'
        'test_independent_segments_rerun_one_after_the_other'),
    FastPath(
        name='yt8m.batch_norm_gradient',
        replaces='`tf_keras.layers.BatchNormalization` in training '
        '(automatic gradient)',
        where='official_ext.yt8m.modeling.batch_norm.BatchNormalization',
        auto='CPU: float32 training calls over the last axis, trainable, '
        'not synchronized (`BatchNormalization._written_out`)',
        devices=('CPU',), off=_OFF,
        test='tests/yt8m/test_batch_norm.py::'
        'test_batch_norm_training_matches_tf_keras'),
    FastPath(
        name='yt8m.bias_gradient',
        replaces='`tf_keras.layers.Dense` bias gradient over frames',
        where='official_ext.yt8m.modeling.batch_norm.Dense',
        auto='CPU: float32 inputs of rank >= 3 with a bias',
        devices=('CPU',), off=_OFF,
        test='tests/yt8m/test_batch_norm.py::'
        'test_dense_bias_gradient_matches_tf_keras'),
    FastPath(
        name='yt8m.dbof_cluster_pool',
        replaces='DBoF cluster BatchNormalization + ReLU + average pooling, '
        'layer by layer',
        where=('official_ext.yt8m.modeling.batch_norm.'
               'batch_norm_relu_average_pool'),
        auto='CPU: float32 training, batch norm on, ReLU, average pooling, no '
        'cluster context gate, not synchronized (`Dbof.'
        '_fused_training`)',
        devices=('CPU',), off=_OFF,
        test='tests/yt8m/test_modeling.py::'
        'test_fused_dbof_training_matches_the_layers'),
    FastPath(
        name='yt8m.nextvlad_joint_projection',
        replaces='NeXtVLAD\'s attention and assignment `Dense` layers, two '
        'matmuls of the same input',
        where='official_ext.yt8m.modeling.nextvlad.NextVladAggregation',
        auto='CPU',
        devices=('CPU',), off=_OFF,
        test='tests/yt8m/test_nextvlad.py::'
        'test_attention_and_assignment_as_one_matmul'),
    FastPath(
        name='yt8m.bfc_cpu_allocator',
        replaces='TensorFlow\'s default CPU allocator',
        where='official_ext.core.kernels.process_settings.apply',
        auto='runs whose `runtime` names no accelerator (no TPU strategy, '
        '`num_gpus: 0`), unless the variable is already set',
        devices=('CPU',),
        off=_OFF + ', or set the variable yourself',
        test='tests/core/test_process_settings.py::'
        'test_experiment_process_settings_follow_the_kernel_policy',
        env=((process_settings.BFC_ALLOCATOR, 'true'),)),
    FastPath(
        name='assemblenet.malloc_mmap_threshold',
        replaces='glibc malloc\'s dynamic mmap threshold',
        where='official_ext.core.kernels.process_settings.apply',
        auto='runs whose `runtime` names no accelerator (no TPU strategy, '
        '`num_gpus: 0`), unless the variable is already set',
        devices=('CPU',),
        off=_OFF + ', or set the variable yourself',
        test='tests/core/test_process_settings.py::'
        'test_experiment_process_settings_follow_the_kernel_policy',
        env=((process_settings.MALLOC_MMAP_THRESHOLD, str(1 << 20)),)),
)

_BY_NAME: Dict[str, FastPath] = {p.name: p for p in FAST_PATHS}
for _path in FAST_PATHS:
  process_settings.check(dict(_path.env), f'fast path {_path.name}')


def fast_path(name: str) -> FastPath:
  """The declaration of fast path `name`; ValueError listing the names if none.
  """
  if name not in _BY_NAME:
    raise ValueError(f'no fast path {name!r} is declared in '
                     f'core.kernels.kernel_policy.FAST_PATHS; declared: '
                     f'{sorted(_BY_NAME)}')
  return _BY_NAME[name]


def check_setting(value, key: str = 'runtime.kernel_policy') -> str:
  """`value` if it is one of `SETTINGS`, else ValueError naming `key`."""
  if value not in SETTINGS:
    raise ValueError(f'{key}={value!r} is not a kernel policy; expected one '
                     f'of {list(SETTINGS)}.')
  return value


@functools.lru_cache(maxsize=None)
def onednn_cpu_kernels() -> bool:
  """Whether TensorFlow runs its oneDNN CPU kernels (`TF_ENABLE_ONEDNN_OPTS`).
  """
  return tf_internals.onednn_cpu_kernels()


@dataclasses.dataclass(frozen=True)
class KernelPolicy:
  """A resolved policy: `setting` on `device` (oneDNN's CPU kernels: `onednn`).
  """
  setting: str = 'auto'
  device: str = 'CPU'
  onednn: bool = False

  def takes(self, name: str) -> bool:
    """Whether fast path `name` may run (its own condition still applies)."""
    return self.takes_path(fast_path(name))

  def takes_path(self, path: FastPath) -> bool:
    """Whether the fast path declared by `path` may run."""
    if self.setting == 'stock':
      return False
    if self.setting == 'fast':
      return True
    return self.device in path.devices

  def taken(self) -> List[str]:
    """The names of the fast paths this policy takes."""
    return [p.name for p in FAST_PATHS if self.takes(p.name)]

  def describe(self) -> str:
    """One log line: the setting, the device and the fast paths taken."""
    kernels = [n for n in self.taken() if not fast_path(n).env]
    onednn = ' (oneDNN CPU kernels)' if self.onednn else ''
    return (f'Kernel policy {self.setting!r} on {self.device}{onednn}: '
            + (f'fast paths {", ".join(kernels)}; stock ops elsewhere'
               if kernels else 'stock TensorFlow / tf_keras ops'))


def resolve(setting: str = 'auto', device: Optional[str] = None,
            onednn: Optional[bool] = None) -> KernelPolicy:
  """The policy of `setting` on `device` (None: this process's)."""
  check_setting(setting)
  device = default_device() if device is None else device.upper()
  if device not in DEVICES:
    raise ValueError(f'unknown device kind {device!r}; one of {DEVICES}.')
  if onednn is None:
    onednn = device == 'CPU' and onednn_cpu_kernels()
  return KernelPolicy(setting, device, bool(onednn) and device == 'CPU')


def default_device() -> str:
  """'TPU' or 'GPU' if one is visible to this process, else 'CPU'."""
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  for kind in ('TPU', 'GPU'):
    if tf.config.list_logical_devices(kind):
      return kind
  return 'CPU'


def physical_gpus() -> int:
  """How many GPUs TensorFlow sees on this machine (physical devices)."""
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  return len(tf.config.list_physical_devices('GPU'))


def strategy_device(strategy) -> str:
  """The device kind a `tf.distribute` strategy computes on."""
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  if isinstance(strategy, (tf.distribute.TPUStrategy,
                           tf.distribute.experimental.TPUStrategy)):
    return 'TPU'
  kinds = {tf.DeviceSpec.from_string(d).device_type
           for d in strategy.extended.worker_devices}
  for kind in ('TPU', 'GPU'):
    if kind in kinds:
      return kind
  return 'CPU'


def runtime_device(runtime) -> str:
  """The device kind a runtime config names, without starting TensorFlow."""
  if runtime.distribution_strategy == 'tpu':
    return 'TPU'
  return 'GPU' if (runtime.num_gpus or 0) > 0 else 'CPU'


def setting_of(params) -> str:
  """`runtime.kernel_policy` of an experiment config ('auto' without the field).
  """
  return check_setting(getattr(params.runtime, 'kernel_policy', 'auto'))


def for_strategy(params, strategy) -> KernelPolicy:
  """The run's policy: `runtime.kernel_policy` on the strategy's devices."""
  return resolve(setting_of(params), strategy_device(strategy))


# Where an export will serve (`export_saved_model --serving_device`); 'any':
# unknown, the stock ops.
SERVING_DEVICES = ('any', 'cpu', 'gpu', 'tpu')


def for_export(setting: str = 'auto', serving_device: str = 'any'
               ) -> KernelPolicy:
  """The policy a SavedModel is traced with: `setting` on `serving_device`
  ('cpu': this process's CPU kernels, so its fast paths; 'any': 'auto' gives
  the stock ops)."""
  check_setting(setting)
  if serving_device not in SERVING_DEVICES:
    raise ValueError(f'--serving_device={serving_device!r}: expected one of '
                     f'{list(SERVING_DEVICES)}.')
  if serving_device == 'any':
    return resolve('stock' if setting == 'auto' else setting, 'CPU')
  return resolve(setting, serving_device.upper())


# The TFLite export: every 3-D convolution in the 2-D ops and matmuls that
# TFLite has builtins for (it has no 5-D SpaceToBatchND for a temporal
# dilation): the fast paths as on a CPU without oneDNN.
TFLITE = KernelPolicy('fast', 'CPU', onednn=False)

_STACK: List[KernelPolicy] = []


@contextlib.contextmanager
def use(policy: KernelPolicy) -> Iterator[KernelPolicy]:
  """Within the block, `current()` is `policy` (in every thread)."""
  if not isinstance(policy, KernelPolicy):
    raise TypeError(f'use() takes a KernelPolicy (resolve()); got '
                    f'{policy!r}.')
  _STACK.append(policy)
  try:
    yield policy
  finally:
    _STACK.pop()


@functools.lru_cache(maxsize=None)
def _process_default() -> KernelPolicy:
  return resolve('auto')


def current() -> KernelPolicy:
  """The innermost `use` block's policy, else 'auto' on the default device."""
  return _STACK[-1] if _STACK else _process_default()


def _task_configs(params) -> Dict[str, object]:
  """{config key: task config}: `task`, or each routine's (multitask)."""
  routines = getattr(params.task, 'task_routines', None)
  if routines:
    return {f'task.task_routines[{i}] ({r.task_name})': r.task_config
            for i, r in enumerate(routines)}
  return {'task': params.task}


def family_of(task_config) -> Optional[str]:
  """The family package a task config class lives in ('yt8m', ...)."""
  parts = type(task_config).__module__.split('.')
  return parts[1] if len(parts) > 2 and parts[0] == 'official_ext' else None


def process_env_for(families, policy: KernelPolicy,
                    paths: Tuple[FastPath, ...] = FAST_PATHS
                    ) -> Dict[str, str]:
  """{variable: value} the `policy` takes for `families`' tasks."""
  env: Dict[str, str] = {}
  source: Dict[str, str] = {}
  for path in paths:
    if (not path.env or path.family not in families or
        not policy.takes_path(path)):
      continue
    for variable, value in path.env:
      if variable in env and env[variable] != value:
        raise ValueError(
            f'process setting {variable}: fast path {source[variable]} sets '
            f'{env[variable]!r}, {path.name} {value!r}; set {variable} in '
            'the environment to choose.')
      env[variable] = value
      source[variable] = path.name
  return env


def cpu_process_env(family: str) -> Dict[str, str]:
  """The process settings 'auto' takes for a CPU run of `family`'s tasks."""
  return process_env_for({family}, KernelPolicy('auto', 'CPU'))


def process_env(params) -> Dict[str, str]:
  """An experiment's process settings for its runtime's device."""
  families = {family_of(t) for t in _task_configs(params).values()}
  policy = resolve(setting_of(params), runtime_device(params.runtime),
                   onednn=False)
  return process_env_for(families, policy)


def markdown_table() -> str:
  """`FAST_PATHS` as the Markdown table of docs/architecture.md."""
  rows = ['| fast path | replaces | where | `auto` takes it | off | '
          'equivalence test |', '|---|---|---|---|---|---|']
  for p in FAST_PATHS:
    where = f'`{p.where.replace("official_ext.", "")}`'
    if p.env:
      where += ' (' + ', '.join(f'`{k}={v}`' for k, v in p.env) + ')'
    rows.append(f'| `{p.name}` | {p.replaces} | {where} | {p.auto} | '
                f'{p.off} | `{p.test}` |')
  return '\n'.join(rows) + '\n'


def as_dict(policy: KernelPolicy) -> Mapping[str, object]:
  """The policy as JSON-serializable figures (benchmarks)."""
  return {'setting': policy.setting, 'device': policy.device,
          'onednn': policy.onednn, 'fast_paths': policy.taken()}
