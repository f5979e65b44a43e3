"""`python -m official_ext.benchmark accelerator`: each case's published-size
training step under its shipped GPU or TPU YAML, on this machine's GPUs or
TPU (what it reports: docs/benchmarks.md#tensorflow-on-gpus-and-tpus)."""
import dataclasses
import os
import time
from typing import Any, Callable, Dict, List, Optional

import numpy as np
import tensorflow as tf, tf_keras

from official.core import task_factory
from official.modeling import performance
from official_ext.benchmarks import assemblenet as assemblenet_bench
from official_ext.benchmarks import graph_flops
from official_ext.benchmarks import timing
from official_ext.benchmarks import yt8m as yt8m_bench
from official_ext.core import experiment_params
from official_ext.core.kernels import kernel_policy
from official_ext.core.run import distribution
from official_ext.core.run import trainer as trainer_lib
from official_ext import registry_imports  # pylint: disable=unused-import

REPO = os.path.dirname(os.path.dirname(os.path.dirname(
    os.path.abspath(__file__))))


class NoAcceleratorError(RuntimeError):
  """No GPU or TPU is visible to this process."""


@dataclasses.dataclass(frozen=True)
class Case:
  """One published-size training step."""
  name: str  # The figures' key.
  experiment: str  # The registered experiment.
  family: str  # The folder of its YAMLs under configs/.
  yaml: str  # The YAML's name without `_gpu.yaml` / `_tpu.yaml`.
  quick: Dict[str, Any]  # Overrides of `quick` runs (tiny sizes).


def _quick_assemblenet(backbone_type: str, net) -> Dict[str, Any]:
  """A full AssembleNet's quick overrides: the benchmark's tiny backbone of
  `net` and clips of 4 x 32^2."""
  clips = {'feature_shape': [4, 32, 32, 3]}
  return {'task': {
      'model': {'backbone': {backbone_type: dict(net.quick_backbone)}},
      'train_data': dict(clips), 'validation_data': dict(clips)}}

CASES = (
    Case('yt8m_dbof', 'yt8m', 'yt8m', 'yt8m',
         yt8m_bench.QUICK_PUBLISHED['yt8m']),
    Case('yt8m_nextvlad', 'yt8m_nextvlad', 'yt8m', 'yt8m_nextvlad',
         yt8m_bench.QUICK_PUBLISHED['yt8m_nextvlad']),
    Case('assemblenet_kinetics', 'assemblenet_plus_lite_kinetics',
         'assemblenet', 'kinetics', {'task': {
             'model': {'backbone': {'assemblenet_plus_lite': {
                 'model_structure':
                     '[[-1, 1], [-2, 1], [3, [0, 1], [8, 8, 8], 1, 2]]',
                 'model_edge_weights': '', 'blocks_per_level': [1, 1, 1, 1],
                 'stem_filters': 8, 'rep_flow': {'num_iter': 2}}},
                       'head_filters': [16, 24]},
             'train_data': {'feature_shape': [4, 32, 32, 3]},
             'validation_data': {'feature_shape': [4, 32, 32, 3]}}}),
    Case('assemblenet50_kinetics', 'assemblenet50_kinetics400',
         'assemblenet', 'assemblenet50_kinetics400',
         _quick_assemblenet('assemblenet', assemblenet_bench.ASN50)),
    # Its batches carry object maps (151 classes, `_batch`).
    Case('assemblenet_plus_charades', 'assemblenet_plus_charades',
         'assemblenet', 'assemblenet_plus_charades',
         _quick_assemblenet('assemblenet_plus', assemblenet_bench.ASNP50)),
    Case('readout', 'readout_demo', 'readout', 'readout', {'task': {
        'model': {'encoder': {'hidden_size': 8, 'num_heads': 2,
                              'num_layers': 1, 'intermediate_size': 8}}}}),
)

# Cases whose family has fast paths (`kernel_policy.FAST_PATHS`): timed
# under 'fast' too.
_FAST_FAMILIES = {p.family for p in kernel_policy.FAST_PATHS if not p.env}


def accelerator_kind() -> str:
  """'GPU' or 'TPU' (`kernel_policy.default_device`).

  Raises:
    NoAcceleratorError: only CPUs are visible, naming what TensorFlow sees.
  """
  device = kernel_policy.default_device()
  if device == 'CPU':
    seen = sorted({d.device_type for d in tf.config.list_logical_devices()})
    raise NoAcceleratorError(
        f'No GPU or TPU is visible to this process (TensorFlow sees: '
        f'{", ".join(seen)}): `python -m official_ext.benchmark accelerator` '
        'times the training steps on accelerators only. Run it on a GPU or '
        'Cloud TPU machine (a TPU VM: --tpu=local); CPU figures come from '
        '`python -m official_ext.benchmark yt8m|assemblenet|readout`.')
  return device


def yaml_path(case: Case, device: str) -> str:
  """The case's shipped YAML for `device` (the GPU YAML on CPUs)."""
  kind = 'tpu' if device == 'TPU' else 'gpu'
  return os.path.join(REPO, 'configs', case.family,
                      f'{case.yaml}_{kind}.yaml')


def _params(case: Case, device: str, quick: bool, tpu: str):
  """The case's experiment with its GPU or TPU YAML. On GPUs (and the
  CPUs of the tests) the YAML's per-GPU batch on every visible device; on a
  TPU the YAML's global batch over the slice's cores."""
  params = experiment_params.load_params(
      case.experiment, [yaml_path(case, device)], tpu=tpu, lock=False)
  if device != 'TPU':
    replicas = len(tf.config.list_logical_devices(device))
    per_replica = (params.task.train_data.global_batch_size //
                   (params.runtime.num_gpus or 1))
    params.override({'task': {'train_data': {
        'global_batch_size': per_replica * replicas}}}, is_strict=True)
    if device == 'GPU':
      params.override({'runtime': {'num_gpus': replicas}}, is_strict=True)
  if quick:
    params.override(case.quick, is_strict=True)
    params.override({'task': {'train_data': {'global_batch_size': 2 * len(
        tf.config.list_logical_devices(device))}}}, is_strict=True)
  return params


def strategy_for(params, device: str) -> tf.distribute.Strategy:
  if device == 'CPU':
    cpus = tf.config.list_logical_devices('CPU')
    return tf.distribute.MirroredStrategy([d.name for d in cpus])
  return distribution.distribution_strategy(params)


def _batch(task, params, per_replica: int) -> Any:
  """One in-memory training batch of the experiment's shapes, as its
  dataloader yields them."""
  data = params.task.train_data
  rng = np.random.default_rng(0)
  family = type(params.task).__module__.split('.')[1]
  if family == 'yt8m':
    frames = data.num_sample_frames or data.max_frames
    features = sum(data.feature_sizes)
    labels = np.zeros([per_replica, data.num_classes], np.float32)
    for i in range(per_replica):
      labels[i, rng.choice(data.num_classes, 3, replace=False)] = 1.0
    return {'video_matrix': tf.constant(rng.uniform(
        -2, 2, [per_replica, frames, features]).astype(np.float32)),
            'num_frames': tf.fill([per_replica], frames),
            'labels': tf.constant(labels)}
  if family == 'assemblenet':
    shape = [per_replica, *data.feature_shape]
    labels = np.eye(data.num_classes, dtype=np.float32)[
        rng.integers(0, data.num_classes, per_replica)]
    features = {'image': tf.constant(rng.uniform(0, 1, shape), tf.float32)}
    if data.num_object_classes:
      features['objects'] = tf.constant(assemblenet_bench.object_maps(
          rng, shape[:-1], data.num_object_classes))
    return features, tf.constant(labels)
  # Readout: demo trials, parsed and batched by the dataloader.
  from official_ext.benchmarks import readout as readout_bench  # pylint: disable=g-import-not-at-top
  return readout_bench.demo_batches(task, per_replica)[data.batching]


def counting_model(task, batch, model: Optional[tf_keras.Model] = None
                   ) -> tf_keras.Model:
  """The model whose step on `batch` `graph_flops` counts: `model` (or the
  task's), but for AssembleNet++lite one built for the batch's exact clip
  shape (its flow is a nested function traced at the model's shapes)."""
  if type(task).__module__.split('.')[1] == 'assemblenet':
    return task.build_model(input_shape=batch[0]['image'].shape)
  return model if model is not None else task.build_model()


def flops_per_example(params, per_replica: int = 1,
                      batch: Optional[Any] = None) -> float:
  """Training FLOPs per example of the experiment `params`, counted from
  its traced training step on `batch` of `per_replica` examples (default:
  an in-memory batch of the experiment's shapes)."""
  task = task_factory.get_task(params.task)
  if batch is None:
    batch = _batch(task, params, per_replica)
  return graph_flops.step_flops(
      task, counting_model(task, batch), batch) / per_replica


def _peak_memory_gb(device: str) -> Optional[float]:
  peaks = []
  for d in tf.config.list_logical_devices(device):
    try:
      peaks.append(tf.config.experimental.get_memory_info(d.name)['peak'])
    except (ValueError, tf.errors.OpError):
      return None
  return max(peaks) / 2**30 if peaks else None


def _reset_memory(device: str) -> None:
  for d in tf.config.list_logical_devices(device):
    try:
      tf.config.experimental.reset_memory_stats(d.name)
    except (ValueError, tf.errors.OpError):
      return


# In-memory batches built in this process: (case, device, quick, per-replica
# batch) -> batch (`_build_step`).
_BATCHES: Dict[Any, Any] = {}


@dataclasses.dataclass
class _Step:
  """A case's compiled training step on one in-memory batch."""
  step: Callable[[], tf.Tensor]  # One step; returns the mean loss.
  params: Any
  per_replica: int
  precision: str
  policy: kernel_policy.KernelPolicy
  batch: Any  # One replica's batch.


def _build_step(case: Case, device: str, policy: kernel_policy.KernelPolicy,
                quick: bool, strategy: tf.distribute.Strategy, tpu: str = '',
                precision: Optional[str] = None) -> _Step:
  """The case's model, optimizer and `tf.function` training step (the
  task's `train_step` under `strategy.run`) on an in-memory batch of the
  experiment's shapes, built in the YAML's precision (or `precision`) under
  `policy`. Keras' global dtype policy is set for the build and left set:
  the caller restores it."""
  params = _params(case, device, quick, tpu)
  if precision is not None:
    params.override({'runtime': {
        'mixed_precision_dtype': precision,
        'loss_scale': 'dynamic' if precision == 'float16' else None}},
                    is_strict=True)
  per_replica = (params.task.train_data.global_batch_size //
                 strategy.num_replicas_in_sync)
  precision = params.runtime.mixed_precision_dtype or 'float32'
  performance.set_mixed_precision_policy(precision)
  with kernel_policy.use(policy), strategy.scope():
    task = task_factory.get_task(params.task)
    model = task.build_model()
    optimizer = task.create_optimizer(params.trainer.optimizer_config,
                                      params.runtime)
    # Slots made now: the step's first call then traces once, as in a run.
    trainer_lib.create_optimizer_weights(strategy, optimizer,
                                         model.trainable_variables)
    metrics = task.build_metrics(training=True)
    # The same batch for every run of the case in this process (the stock
    # and the fast policy, several precisions): a readout batch goes
    # through the dataloader, whose tracing costs seconds.
    key = (case.name, device, quick, per_replica)
    if key not in _BATCHES:
      _BATCHES[key] = _batch(task, params, per_replica)
    batch = _BATCHES[key]
    inputs = strategy.experimental_distribute_values_from_function(
        lambda _: batch)

    @tf.function
    def step():
      logs = strategy.run(
          lambda b: task.train_step(b, model, optimizer, metrics),
          args=(inputs,))
      return strategy.reduce('MEAN', logs[task.loss], axis=None)

  def traced_step():
    # The first call traces.
    with kernel_policy.use(policy), strategy.scope():
      return step()

  return _Step(traced_step, params, per_replica, precision, policy, batch)


def training_losses(case: Case, device: str,
                    policy: kernel_policy.KernelPolicy, steps: int,
                    strategy: tf.distribute.Strategy, quick: bool = True,
                    precision: Optional[str] = None, seed: int = 11
                    ) -> List[float]:
  """The loss of each of `steps` training steps of `case` on one in-memory
  batch, in the YAML's precision or `precision` (float16 with dynamic loss
  scaling), the weights initialized from `seed` (tests: the precisions
  agree)."""
  previous = tf_keras.mixed_precision.global_policy()
  try:
    tf_keras.utils.set_random_seed(seed)
    built = _build_step(case, device, policy, quick, strategy,
                        precision=precision)
    return [float(built.step()) for _ in range(steps)]
  finally:
    tf_keras.mixed_precision.set_global_policy(previous)


def time_case(case: Case, device: str, setting: str, steps: int,
              warmup: int, quick: bool, strategy: tf.distribute.Strategy,
              tpu: str = '') -> Dict[str, Any]:
  """Times `steps` training steps of `case` under kernel policy `setting`
  on `strategy` (one for the whole run: a second strategy over the same
  devices could collide with the first one's collectives)."""
  previous = tf_keras.mixed_precision.global_policy()
  try:
    built = _build_step(case, device, kernel_policy.resolve(setting, device),
                        quick, strategy, tpu)
    for _ in range(warmup):
      timing.block(built.step())
    _reset_memory(device)
    start = time.perf_counter()
    for _ in range(steps):
      loss = built.step()
    timing.block(loss)
    seconds = (time.perf_counter() - start) / steps
  finally:
    tf_keras.mixed_precision.set_global_policy(previous)
  global_batch = built.per_replica * strategy.num_replicas_in_sync
  try:
    flops = flops_per_example(built.params, built.per_replica, built.batch)
    not_counted = {}
  except ValueError as e:  # The counter names what it cannot count.
    flops, not_counted = None, {'flops_not_counted': str(e)}
  return {
      'yaml': os.path.relpath(yaml_path(case, device), REPO),
      'precision': built.precision,
      'replicas': strategy.num_replicas_in_sync,
      'global_batch': global_batch,
      'step_sec': seconds,
      'examples_per_sec': global_batch / seconds,
      'gflops_per_example': None if flops is None else flops / 1e9,
      'achieved_tflops': (None if flops is None else
                          flops * global_batch / seconds / 1e12),
      'peak_memory_gb': _peak_memory_gb(device),
      'loss': float(loss),
      'kernel_policy': kernel_policy.as_dict(built.policy),
      **not_counted,
  }


def run(quick: bool = False, steps: int = 20, warmup: int = 3,
        tpu: str = '', device: Optional[str] = None,
        cases: Optional[List[str]] = None) -> Dict[str, Any]:
  """Figures of every case, keyed by case name.

  Args:
    quick: tiny sizes (a check of the harness).
    steps, warmup: timed and untimed steps per measurement.
    tpu: the TPU address (`--tpu`; 'local' on a TPU VM).
    device: 'GPU', 'TPU', or 'CPU' (the tests: the same code on the logical
      CPUs); None: the accelerator found here (`accelerator_kind`).
    cases: names of `CASES` to run (default all)."""
  device = accelerator_kind() if device is None else device.upper()
  figures: Dict[str, Any] = {'device': device}
  strategy = None
  for case in CASES:
    if cases and case.name not in cases:
      continue
    if strategy is None:
      strategy = strategy_for(_params(case, device, quick, tpu), device)
    stock = time_case(case, device, 'auto', steps, warmup, quick, strategy,
                      tpu)
    if case.family in _FAST_FAMILIES:
      fast = time_case(case, device, 'fast', steps, warmup, quick, strategy,
                       tpu)
      stock['fast_examples_per_sec'] = fast['examples_per_sec']
      stock['fast_vs_stock'] = fast['examples_per_sec'] / stock[
          'examples_per_sec']
      stock['fast_kernel_policy'] = fast['kernel_policy']
    figures[case.name] = stock
  return figures


def table(figures: Dict[str, Any]) -> str:
  """One row per case."""
  rows = [('case', 'precision', 'replicas', 'batch', 'examples/s',
           'TFLOP/s', 'peak GB', 'policy', 'fast / stock')]

  def fmt(value, spec='.3g'):
    return '-' if value is None else format(value, spec)

  for name, f in figures.items():
    if not isinstance(f, dict) or 'examples_per_sec' not in f:
      continue
    policy = f['kernel_policy']
    rows.append((name, f['precision'], str(f['replicas']),
                 str(f['global_batch']), fmt(f['examples_per_sec']),
                 fmt(f['achieved_tflops']), fmt(f['peak_memory_gb']),
                 f'{policy["setting"]} on {policy["device"]}',
                 fmt(f.get('fast_vs_stock'))))
  return timing.format_table(rows)
