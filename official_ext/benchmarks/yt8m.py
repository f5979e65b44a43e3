"""`python -m official_ext.benchmark yt8m`: case 'model' (our DBoF + MoE step
beside Model Garden's, NeXtVLAD, the input pipeline, the metrics), 'zoo'
(every registered YouTube-8M model's published-size step) and 'zoo_demos'
(every model's demo trained to the same budget); docs/benchmarks.md#youtube-8m."""
import dataclasses
import os
import tempfile
import time
from typing import Any, Dict, List, Optional, Sequence, Tuple

from absl import logging
import numpy as np
import tensorflow as tf, tf_keras

from official.core import exp_factory
from official.core import task_factory
from official_ext.benchmarks import graph_flops
from official_ext.benchmarks import memory as memory_lib
from official_ext.benchmarks import timing
from official_ext.benchmarks import yt8m_metrics_reference as metrics_reference
from official_ext.core.kernels import kernel_policy
from official_ext import train
from official_ext.yt8m import configs  # pylint: disable=unused-import  (registers 'yt8m')
from official_ext.yt8m import dataloader
from official_ext.yt8m import demo_data
from official_ext.yt8m import metrics
from official_ext.yt8m import task as yt8m_task  # pylint: disable=unused-import  (registers YT8MTask)


# Settings of a `benchmark yt8m` process: those a CPU training run of the
# family takes (the BFC CPU allocator).
PROCESS_SETTINGS = kernel_policy.cpu_process_env('yt8m')


@dataclasses.dataclass(frozen=True)
class Size:
  name: str
  batch: int
  frames: int
  cluster: int
  hidden: int
  mixtures: int
  classes: int
  features: int = 1152


DEMO = Size('demo', batch=64, frames=32, cluster=256, hidden=256, mixtures=2,
            classes=100)
PUBLISHED = Size('published', batch=32, frames=300, cluster=3000, hidden=2000,
                 mixtures=5, classes=3862)
TINY = Size('tiny', batch=8, frames=8, cluster=32, hidden=32, mixtures=2,
            classes=20)


@dataclasses.dataclass(frozen=True)
class NextVladSize:
  """A NeXtVLAD training step's shapes (`configs.NextVladModel` fields)."""
  name: str
  batch: int
  frames: int
  cluster_sizes: Tuple[int, ...]
  groups: Tuple[int, ...]
  expansion: int
  hidden: int
  gating_reduction: int
  classes: int
  feature_sizes: Tuple[int, ...] = (1024, 128)

  @property
  def features(self) -> int:
    return sum(self.feature_sizes)


# The authors' configuration (`yt8m_nextvlad`) at the DBoF benchmark's batch.
NEXTVLAD_PUBLISHED = NextVladSize(
    'published', batch=32, frames=300, cluster_sizes=(128, 64), groups=(8, 4),
    expansion=2, hidden=2048, gating_reduction=8, classes=3862)
NEXTVLAD_TINY = NextVladSize(
    'tiny', batch=8, frames=8, cluster_sizes=(4, 2), groups=(2, 1),
    expansion=2, hidden=16, gating_reduction=4, classes=20,
    feature_sizes=(24, 8))


def build_nextvlad_task(size: NextVladSize):
  """A `YT8MTask` of the 'yt8m_nextvlad' experiment at `size`."""
  params = exp_factory.get_exp_config('yt8m_nextvlad')
  params.override({'task': {
      'model': {'backbone': {'nextvlad': {
          'feature_sizes': list(size.feature_sizes),
          'cluster_sizes': list(size.cluster_sizes),
          'groups': list(size.groups), 'expansion': size.expansion,
          'hidden_size': size.hidden,
          'gating_reduction': size.gating_reduction}}},
      'train_data': {'num_classes': size.classes, 'max_frames': size.frames,
                     'feature_sizes': list(size.feature_sizes),
                     'feature_dtypes': ['uint8'] * len(size.feature_sizes),
                     'feature_from_bytes': [True] * len(size.feature_sizes),
                     'global_batch_size': size.batch},
      'validation_data': {'num_classes': size.classes},
  }}, is_strict=True)
  return task_factory.get_task(params.task)


def bench_nextvlad_train_step(size: NextVladSize, peak_gflops: float,
                              rounds: int = 5) -> Dict[str, float]:
  """Examples/sec of the NeXtVLAD training step at `size` (XLA, padding
  masked: every video has all `size.frames` frames)."""
  task = build_nextvlad_task(size)
  model, batch = task.build_model(), make_batch(size)
  return bench_step(task, model, batch,
                    graph_flops.train_step_flops(task, model, batch),
                    peak_gflops, _matmul_size(size), rounds=rounds)


def bench_step(task, model: tf_keras.Model, batch: Dict[str, tf.Tensor],
               flops: float, peak_gflops: float, matmul_n: int,
               rounds: int = 5) -> Dict[str, float]:
  """Examples/sec of `task.train_step` of `model` on `batch`, timed
  interleaved with an [matmul_n, matmul_n] matmul; `flops` per example.

  Returns:
    {'examples_per_sec', 'gflops_per_example', 'achieved_gflops',
     'peak_fraction' (of `peak_gflops`), 'interleaved_matmul_gflops',
     'interleaved_matmul_fraction'}."""
  step = _step_fn(task, model, batch)
  seconds = timing.interleaved_seconds(
      {'step': step, 'matmul': timing.matmul_candidate(matmul_n)},
      rounds=rounds)
  examples_per_sec = int(batch['labels'].shape[0]) / seconds['step']
  achieved = examples_per_sec * flops / 1e9
  return {'examples_per_sec': examples_per_sec,
          'gflops_per_example': flops / 1e9,
          'achieved_gflops': achieved,
          'peak_fraction': achieved / peak_gflops,
          **_interleaved_matmul(achieved, matmul_n, seconds['matmul'])}


def _matmul_size(size) -> int:
  """The square matmul timed beside a step: 3072 (512 at the tiny sizes)."""
  return 512 if size.name == 'tiny' else 3072


def _interleaved_matmul(achieved: float, n: int, seconds: float
                        ) -> Dict[str, float]:
  """The [n, n] matmul's median rate in the step's rounds, and the step's
  fraction of it (`timing.matmul_candidate`)."""
  rate = timing.matmul_flops(n) / seconds / 1e9
  return {'interleaved_matmul_gflops': rate,
          'interleaved_matmul_fraction': achieved / rate}


def build_task(size: Size, jit_compile: bool = True):
  """A `YT8MTask` of the 'yt8m' experiment at `size` (model and train data)."""
  params = exp_factory.get_exp_config('yt8m')
  params.override({'task': {
      'model': {'backbone': {'dbof': {'cluster_size': size.cluster,
                                      'hidden_size': size.hidden}},
                'head': {'moe': {'num_mixtures': size.mixtures}}},
      'train_data': {'num_classes': size.classes, 'max_frames': size.frames,
                     'num_sample_frames': size.frames,
                     'global_batch_size': size.batch},
      'validation_data': {'num_classes': size.classes},
      'jit_compile': jit_compile,
  }}, is_strict=True)
  return task_factory.get_task(params.task)


def model_garden_model(size: Size) -> tf_keras.Model:
  # Imported here: only the benchmark needs Model Garden's YT8M modules.
  from official.projects.yt8m.configs import yt8m as mg_configs  # pylint: disable=g-import-not-at-top
  from official.projects.yt8m.modeling import yt8m_model as mg_model  # pylint: disable=g-import-not-at-top
  config = mg_configs.VideoClassificationModel()
  config.backbone.dbof.cluster_size = size.cluster
  config.backbone.dbof.hidden_size = size.hidden
  config.head.moe.num_mixtures = size.mixtures
  model = mg_model.VideoClassificationModel(
      config, num_classes=size.classes,
      input_specs=tf_keras.layers.InputSpec(shape=[None, None, size.features]),
      l2_weight_decay=1e-5)
  model(tf.zeros([1, size.frames, size.features]), num_frames=None)
  return model


def _step_fn(task, model, batch):
  optimizer = tf_keras.optimizers.legacy.Adam(1e-4)
  train_metrics = task.build_metrics(training=True)

  @tf.function
  def step():
    return task.train_step(batch, model, optimizer, train_metrics)['loss']
  return step


def make_batch(size, seed: int = 0) -> Dict[str, tf.Tensor]:
  """A random in-memory training batch at `size` (a Size or NextVladSize):
  {'video_matrix': float32 [batch, frames, features] (dequantized uint8),
  'num_frames': int32 [batch], 'labels': float32 [batch, classes], 3
  positives a video}."""
  rng = np.random.default_rng(seed)
  x = dataloader.dequantize(tf.constant(rng.integers(
      0, 256, [size.batch, size.frames, size.features], dtype=np.uint8)))
  labels = np.zeros([size.batch, size.classes], np.float32)
  for i in range(size.batch):
    labels[i, rng.choice(size.classes, size=3, replace=False)] = 1.0
  return {'video_matrix': x,
          'num_frames': tf.fill([size.batch], size.frames),
          'labels': tf.constant(labels)}


def bench_train_step(size: Size, peak_gflops: float, rounds: int = 5
                     ) -> Dict[str, float]:
  """Examples/sec of ours vs Model Garden's model at `size`."""
  batch = make_batch(size)
  ours_task = build_task(size, jit_compile=True)
  # The references train Model Garden's model the way Model Garden's YT8M
  # task does: its L2 regularization through `model.losses` in the step
  # (ours computes its value outside XLA: `YT8MTask.analytic_l2_gradient`).
  plain_task = build_task(size, jit_compile=False)
  plain_task.analytic_l2_gradient = False
  xla_task = build_task(size, jit_compile=True)
  xla_task.analytic_l2_gradient = False
  ours_model = ours_task.build_model()
  flops = graph_flops.train_step_flops(ours_task, ours_model, batch)
  steps = {
      'ours': _step_fn(ours_task, ours_model, batch),
      'reference': _step_fn(plain_task, model_garden_model(size), batch),
      'reference_xla': _step_fn(xla_task, model_garden_model(size), batch),
      'matmul': timing.matmul_candidate(_matmul_size(size)),
  }
  seconds = timing.interleaved_seconds(steps, rounds=rounds)
  ours = size.batch / seconds['ours']
  achieved = ours * flops / 1e9
  return {
      **_interleaved_matmul(achieved, _matmul_size(size), seconds['matmul']),
      'ours_examples_per_sec': ours,
      'reference_examples_per_sec': size.batch / seconds['reference'],
      'reference_xla_examples_per_sec': size.batch / seconds['reference_xla'],
      'speedup': seconds['reference'] / seconds['ours'],
      'gflops_per_example': flops / 1e9,
      'achieved_gflops': achieved,
      'peak_fraction': achieved / peak_gflops,
  }


def bench_pipeline(size: Size, num_batches: int = 20,
                   workdir: Optional[str] = None) -> float:
  """Examples/sec from TFRecord files to training batches at `size`."""
  workdir = workdir or tempfile.mkdtemp(prefix='yt8m_bench_')
  num_videos = max(4 * size.batch, 256)
  patterns = demo_data.write_demo_dataset(
      workdir, num_classes=size.classes, max_frames=size.frames,
      num_train_videos=num_videos, num_validation_videos=size.batch,
      num_shards=4, seed=0, segment_fraction=0.0)
  params = build_task(size).task_config.train_data.replace(
      input_path=patterns['train'])
  dataset = dataloader.build_dataset(params)
  iterator = iter(dataset)

  def next_batch():
    timing.block(next(iterator))  # Each batch computed before the next.

  # One timed run of `num_batches` batches after 3 untimed ones.
  seconds = timing.interleaved_seconds(
      {'pipeline': next_batch}, rounds=1, calls_per_round=num_batches,
      warmup=3)['pipeline']
  return size.batch / seconds


def bench_metrics(num_videos: int = 100_000, num_classes: int = 3862,
                  reference_videos: int = 2000) -> Dict[str, float]:
  """Seconds of `metrics.evaluate` vs the reference (slice, scaled)."""
  rng = np.random.default_rng(0)
  predictions = rng.random((num_videos, num_classes), dtype=np.float32)
  labels = np.zeros((num_videos, num_classes), np.float32)
  rows = np.repeat(np.arange(num_videos), 3)
  labels[rows, rng.integers(0, num_classes, rows.size)] = 1.0
  sl = slice(0, reference_videos)
  results = {}

  def reference():
    results['reference'] = metrics_reference.evaluate_reference(
        predictions[sl], labels[sl], 20)
    return results['reference']

  # One call of each, no warm-up: ours on all videos, the reference on the
  # first `reference_videos` (its time scaled linearly below).
  seconds = timing.interleaved_seconds({
      'ours': lambda: metrics.evaluate(predictions, labels, top_k=20),
      'reference': reference,
  }, rounds=1, warmup=0)
  ref = results['reference']
  ours = metrics.evaluate(predictions[sl], labels[sl], top_k=20)
  diff = max(abs(ours[k] - ref[k]) for k in metrics.METRIC_KEYS)
  return {'metrics_seconds': seconds['ours'],
          'reference_metrics_seconds_scaled': (
              seconds['reference'] * num_videos / reference_videos),
          'metrics_max_abs_diff_vs_reference': diff,
          'metrics_num_videos': num_videos,
          'metrics_num_classes': num_classes,
          'metrics_reference_videos': reference_videos}


# ---------------------------------------------------------------------------
# The model zoo (`--cases zoo`): every YouTube-8M model, one row each.
# ---------------------------------------------------------------------------

CASES = ('model', 'zoo', 'zoo_demos')
DEFAULT_CASES = ('model',)  # A run without --cases.
# The published-size training step of the zoo: batch 32, as the DBoF and
# NeXtVLAD figures above.
ZOO_BATCH = 32
# The experiment whose schedule is the demos' budget (`zoo_demo_budget`).
ZOO_DEMO_BUDGET_EXPERIMENT = 'yt8m_demo'
# Tiny sizes of `--quick` (and of the accelerator benchmark's quick
# cases): overrides of a published experiment (one without runs at its
# published size; `quick_overrides` gives every other zoo model its demo's
# model at these classes and frames), and of every demo (`_quick_demo`: a
# few videos, 2 steps).
QUICK_CLASSES = 20
QUICK_FRAMES = 8
# No quick model is larger (trainable parameters): the size of a demo's model.
QUICK_MAX_PARAMETERS = 5_000_000
QUICK_PUBLISHED = {
    'yt8m': {'task': {
        'model': {'backbone': {'dbof': {'cluster_size': 32,
                                        'hidden_size': 32}}},
        'train_data': {'num_classes': 20, 'max_frames': 8,
                       'num_sample_frames': 8},
        'validation_data': {'num_classes': 20}}},
    'yt8m_nextvlad': {'task': {
        'model': {'backbone': {'nextvlad': {
            'cluster_sizes': [4, 2], 'groups': [2, 1], 'hidden_size': 16}}},
        'train_data': {'num_classes': 20, 'max_frames': 8},
        'validation_data': {'num_classes': 20}}},
    'yt8m_mix_nextvlad': {'task': {
        'model': {'backbone': {'mix_nextvlad': {
            'cluster_sizes': [4, 2], 'groups': [2, 1], 'hidden_size': 16,
            'num_branches': 2}}},
        'train_data': {'num_classes': 20, 'max_frames': 8},
        'validation_data': {'num_classes': 20}}},
}
QUICK_BATCH = 4
QUICK_DEMO_VIDEOS = 16


@dataclasses.dataclass(frozen=True)
class ZooModel:
  """A model of the zoo: its published-size and demo experiments."""
  name: str  # `<model>` of `yt8m_<model>`; 'dbof' for `yt8m`.
  published: str  # The published-size experiment.
  demo: str  # Its demo experiment, `<published>_demo`.


@dataclasses.dataclass(frozen=True)
class PublishedGap:
  """A YouTube-8M GAP its authors published for a model of the zoo (not
  ours; on the real dataset, not the demo's videos)."""
  gap: float
  model: str  # The published model, as its source names it.
  evaluation: str  # Where: a validation partition, a leaderboard.
  dataset: str  # The dataset version: its year and number of classes.
  source: str  # The paper or page, and where in it.


_NEXTVLAD_PAPER = 'Lin, Xiao, Fan: "NeXtVLAD", ECCV 2018 workshops'
_YT8M_2018 = 'YouTube-8M 2018, 3,862 classes'
# The published GAPs of the zoo's models, by `ZooModel.name`: only figures
# read in their source, for the model the experiment `yt8m_<name>` builds.
PUBLISHED_GAP = {
    'netvlad': PublishedGap(
        0.8507, 'NetVLAD random (0.5 drop, 256K, 1024H; 274M parameters): '
        'WILLOW\'s, run by the NeXtVLAD authors', 'local validation partition',
        _YT8M_2018,
        f'{_NEXTVLAD_PAPER}, Table 1'),
    'nextvlad': PublishedGap(
        0.8723, 'NeXtVLAD (8G, 0.5 drop, 128K, 2048H; 89M parameters)',
        'local validation partition', _YT8M_2018,
        f'{_NEXTVLAD_PAPER}, Table 1'),
    'mix_nextvlad': PublishedGap(
        0.88722, '3 NeXtVLAD* (3T, 460k steps; 237M parameters), a final '
        'submission',
        'private leaderboard', _YT8M_2018, f'{_NEXTVLAD_PAPER}, Table 2'),
}


def _registered_experiments() -> List[str]:
  """The names of every registered experiment (Model Garden's registry)."""
  registered = getattr(exp_factory, '_REGISTERED_CONFIGS', None)
  if registered is None:
    raise RuntimeError('official.core.exp_factory has no _REGISTERED_CONFIGS:'
                       ' the zoo cannot list the registered experiments.')
  return sorted(registered)


def zoo_models(names: Optional[Sequence[str]] = None) -> List[ZooModel]:
  """The registered YouTube-8M models: each pair of experiments `yt8m_<model>`
  and `yt8m_<model>_demo` (and `yt8m` / `yt8m_demo`, DBoF + MoE) of a
  `YT8MTask`, so that a model registered later appears without a change here.

  Args:
    names: only these models (`ZooModel.name`, in this order); None: all,
      sorted by published experiment.

  Raises:
    ValueError: a pair whose task is not YT8M's, or a name in `names` that
      is not a model, naming it and the models found."""
  registered = set(_registered_experiments())
  models = {}
  for name in sorted(registered):
    if not (name == 'yt8m' or name.startswith('yt8m_')) or (
        name.endswith('_demo') or f'{name}_demo' not in registered):
      continue
    for experiment in (name, f'{name}_demo'):
      task = exp_factory.get_exp_config(experiment).task
      if not isinstance(task, configs.YT8MTask):
        raise ValueError(f'experiment {experiment!r}: named as a YouTube-8M '
                         f'model but its task is {type(task).__name__}, not '
                         'YT8MTask.')
    model = 'dbof' if name == 'yt8m' else name[len('yt8m_'):]
    models[model] = ZooModel(model, name, f'{name}_demo')
  if names is None:
    return list(models.values())
  unknown = [n for n in names if n not in models]
  if unknown:
    raise ValueError(f'zoo: unknown model(s) {unknown}; the registered '
                     f'models are {sorted(models)}.')
  return [models[n] for n in names]


def quick_overrides(model: ZooModel) -> Dict[str, Any]:
  """Overrides of `model.published` for `--quick`: `QUICK_PUBLISHED`'s
  entry, else its demo's model (backbone and head sizes) at
  `QUICK_CLASSES` classes and at most `QUICK_FRAMES` frames."""
  if model.published in QUICK_PUBLISHED:
    return QUICK_PUBLISHED[model.published]
  published = exp_factory.get_exp_config(model.published).task.train_data
  data = {'num_classes': QUICK_CLASSES}
  if published.record_type == 'frame':
    data['max_frames'] = QUICK_FRAMES
    if published.num_sample_frames:
      data['num_sample_frames'] = QUICK_FRAMES
  demo = exp_factory.get_exp_config(model.demo).task.model
  return {'task': {'model': demo.as_dict(), 'train_data': data,
                   'validation_data': {'num_classes': QUICK_CLASSES}}}


def zoo_params(experiment: str, batch: int,
                overrides: Optional[Dict[str, Any]] = None):
  """`experiment`'s config with training batch `batch` and `overrides`."""
  params = exp_factory.get_exp_config(experiment)
  if overrides:
    params.override(overrides, is_strict=True)
  params.override({'task': {'train_data': {'global_batch_size': batch}}},
                  is_strict=True)
  return params


def config_batch(data: configs.DataConfig, batch: int, seed: int = 0
                 ) -> Dict[str, tf.Tensor]:
  """A random training batch of the shapes `data` (a train DataConfig)
  gives: frame-level, its `num_sample_frames` (else `max_frames`) frames;
  video-level, one vector per video (`make_batch`'s values)."""
  video = data.record_type == 'video'
  frames = 1 if video else (data.num_sample_frames or data.max_frames)
  shape = _BatchShape(batch=batch, frames=frames,
                      features=sum(data.feature_sizes),
                      classes=data.num_classes)
  out = make_batch(shape, seed=seed)
  if video:
    out['video_matrix'] = out['video_matrix'][:, 0]
    out['num_frames'] = tf.ones([batch], tf.int32)
  return out


@dataclasses.dataclass(frozen=True)
class _BatchShape:
  batch: int
  frames: int
  features: int
  classes: int


def model_garden_size(params, batch: int, name: str = 'published'
                      ) -> Optional[Size]:
  """The `Size` (named `name`) of `bench_train_step` (ours vs Model
  Garden's DBoF + MoE) whose model and losses are `params`' (the `yt8m`
  experiment's, at any sizes), else None: Model Garden has no such model."""
  model = params.task.model
  data = params.task.train_data
  if (model.backbone.type != 'dbof' or model.head.type != 'moe' or
      data.record_type != 'frame' or not data.num_sample_frames):
    return None
  size = Size(name, batch=batch, frames=data.num_sample_frames,
              cluster=model.backbone.dbof.cluster_size,
              hidden=model.backbone.dbof.hidden_size,
              mixtures=model.head.moe.num_mixtures,
              classes=data.num_classes, features=sum(data.feature_sizes))
  twin = build_task(size, jit_compile=True).task_config
  if (twin.model.as_dict() != model.as_dict() or
      twin.losses.as_dict() != params.task.losses.as_dict()):
    return None
  return size


def zoo_demo_budget() -> Dict[str, int]:
  """The demos' training budget, `ZOO_DEMO_BUDGET_EXPERIMENT`'s schedule:
  {'train_examples' (its steps x its batch), 'train_steps', 'batch'}."""
  params = exp_factory.get_exp_config(ZOO_DEMO_BUDGET_EXPERIMENT)
  steps = params.trainer.train_steps
  batch = params.task.train_data.global_batch_size
  return {'train_examples': steps * batch, 'train_steps': steps,
          'batch': batch}


def demo_gap(experiment: str, examples: int, workdir: str,
             overrides: Optional[Dict[str, Any]] = None,
             seed: int = 0) -> Dict[str, float]:
  """The validation metrics of the demo `experiment` after `examples` training
  videos, trained and evaluated by `official_ext.train.run` in `workdir`
  (`overrides` applied first; `seed` set before the run).

  Returns:
    {'gap', 'map', 'hit_at_one', 'perr' (all its validation videos),
     'train_steps', 'train_examples', 'wall_seconds' (training and
     evaluation)}.

  Raises:
    ValueError: a budget below one batch or not a whole number of batches,
      naming the experiment, its batch and the budget."""
  params = exp_factory.get_exp_config(experiment)
  if overrides:
    params.override(overrides, is_strict=True)
  batch = params.task.train_data.global_batch_size
  steps = examples // batch
  if steps < 1:
    raise ValueError(f'zoo: {examples} training videos are less than one '
                     f'batch of {experiment} ({batch}).')
  if examples % batch:
    raise ValueError(
        f'zoo: {experiment} trains batches of {batch}, which do not divide '
        f'the budget of {examples} training videos: it would train on '
        f'{steps * batch}. Give the demo a batch that divides the budget.')
  params.override({'trainer': {
      'train_steps': steps, 'steps_per_loop': steps,
      'checkpoint_interval': steps, 'summary_interval': steps,
      'validation_interval': steps, 'validation_steps': -1}},
                  is_strict=True)
  params.validate()
  tf_keras.utils.set_random_seed(seed)
  start = time.perf_counter()
  _, metrics = train.run(params, 'train_and_eval',
                         os.path.join(workdir, experiment),
                         experiment=experiment)
  wall_seconds = time.perf_counter() - start
  missing = [k for k in ('gap', 'map', 'hit_at_one', 'perr')
             if k not in metrics]
  if missing:
    raise ValueError(f'zoo: the evaluation of {experiment} reported no '
                     f'{missing} (metrics: {sorted(metrics)}).')
  return {'gap': float(metrics['gap']), 'map': float(metrics['map']),
          'hit_at_one': float(metrics['hit_at_one']),
          'perr': float(metrics['perr']), 'train_steps': steps,
          'train_examples': steps * batch, 'wall_seconds': wall_seconds}


def zoo_model(model: ZooModel, peak_gflops: float, quick: bool = False,
              rounds: int = 5) -> Dict[str, Any]:
  """One row of the zoo: `model`'s figures at the published size.

  Returns:
    {'published', 'demo' (experiments), 'backbone', 'head' (types),
     'parameters' (trainable), 'gflops_per_example' (the traced training
     step's), the step's `bench_step` figures at batch `ZOO_BATCH`,
     'model_garden_examples_per_sec' and 'speedup_vs_model_garden' (None
     where Model Garden has no such model), 'batch', 'frames', 'features',
     'classes'}."""
  batch = QUICK_BATCH if quick else ZOO_BATCH
  params = zoo_params(model.published, batch,
                      quick_overrides(model) if quick else None)
  data = params.task.train_data
  task = task_factory.get_task(params.task)
  built = task.build_model()
  parameters = int(sum(np.prod(v.shape) for v in built.trainable_variables))
  inputs = config_batch(data, batch)
  flops = graph_flops.train_step_flops(task, built, inputs)
  size = model_garden_size(params, batch,
                           name='tiny' if quick else 'published')
  if size is None:
    step = bench_step(task, built, inputs, flops, peak_gflops,
                      512 if quick else 3072, rounds=rounds)
    reference = {'model_garden_examples_per_sec': None,
                 'speedup_vs_model_garden': None}
  else:
    del built  # `bench_train_step` builds ours and Model Garden's.
    both = bench_train_step(size, peak_gflops, rounds=rounds)
    achieved = both['ours_examples_per_sec'] * flops / 1e9
    step = {'examples_per_sec': both['ours_examples_per_sec'],
            'gflops_per_example': flops / 1e9,
            'achieved_gflops': achieved,
            'peak_fraction': achieved / peak_gflops,
            'interleaved_matmul_gflops': both['interleaved_matmul_gflops'],
            'interleaved_matmul_fraction': (
                achieved / both['interleaved_matmul_gflops'])}
    reference = {
        'model_garden_examples_per_sec': both['reference_examples_per_sec'],
        'speedup_vs_model_garden': both['speedup']}
  return {
      'published': model.published, 'demo': model.demo,
      'backbone': params.task.model.backbone.type,
      'head': params.task.model.head.type,
      'parameters': parameters, **step, **reference,
      'batch': batch, 'frames': int(inputs['video_matrix'].shape[1])
      if data.record_type == 'frame' else 0,
      'features': sum(data.feature_sizes), 'classes': data.num_classes}


def _quick_demo(workdir: str) -> Dict[str, Any]:
  """Overrides of a demo experiment for `--quick`: `QUICK_DEMO_VIDEOS`
  generated videos per split (cached in `workdir`), batches of
  `QUICK_BATCH`, no XLA."""
  return {
      'runtime': {'distribution_strategy': 'one_device', 'num_gpus': 0},
      'task': {
          'train_data': {'global_batch_size': QUICK_BATCH},
          'validation_data': {'global_batch_size': QUICK_BATCH},
          'demo_data': {'cache_dir': os.path.join(workdir, 'cache'),
                        'num_train_videos': QUICK_DEMO_VIDEOS,
                        'num_validation_videos': QUICK_DEMO_VIDEOS,
                        'num_shards': 1},
          'jit_compile': False}}


def zoo_model_child(name: str, peak_gflops: float, quick: bool
                    ) -> Dict[str, Any]:
  """Runs in a child process: `zoo_model` of the zoo's model `name`."""
  return zoo_model(zoo_models([name])[0], peak_gflops, quick=quick,
                   rounds=1 if quick else 5)


def zoo_model_child_code(name: str, peak_gflops: float, quick: bool) -> str:
  """The `python -c` program of `zoo_model_child`: prints 'RESULT {json}'."""
  return ('from official_ext.benchmarks import yt8m, memory; '
          f'r = yt8m.zoo_model_child({name!r}, {peak_gflops!r}, {quick}); '
          'print(memory.result_line(r))')


def zoo(quick: bool = False, models: Optional[Sequence[str]] = None,
        peak_gflops: Optional[float] = None) -> Dict[str, Any]:
  """The zoo's speed and size figures: `zoo_model` of each of
  `zoo_models(models)`, at full size each in a child process of its own
  (one process would hold every published-size model in turn).

  Args:
    quick: tiny sizes (`quick_overrides`), in this process.
    models: only these models (tests); None: every registered one.
    peak_gflops: the run's matmul peak (None: measured here).

  Returns:
    {'batch', 'matmul_peak_gflops', 'models': {name: `zoo_model` figures}}."""
  if peak_gflops is None:
    peak_gflops = timing.matmul_peak_gflops(
        sizes=(512,) if quick else (2048, 3072), repeats=3 if quick else 8)
  rows = {}
  for model in zoo_models(models):
    logging.info('zoo: %s (%s)', model.name, model.published)
    if quick:
      rows[model.name] = zoo_model_child(model.name, peak_gflops, quick)
      continue
    row = memory_lib.run_child(zoo_model_child_code(
        model.name, peak_gflops, quick), timeout=2 * 3600)
    row.pop('children_max_rss_gb')  # Every child's so far, not this one's.
    rows[model.name] = row
  return {'batch': QUICK_BATCH if quick else ZOO_BATCH,
          'matmul_peak_gflops': peak_gflops, 'models': rows}


def zoo_demo(model: ZooModel, examples: int, workdir: str,
             quick: bool = False) -> Dict[str, Any]:
  """One row of the demos' ranking: `model`'s demo after `examples` training
  videos (`demo_gap`; `quick`: on `_quick_demo`'s tiny data), with 'demo',
  'backbone', 'head' and 'batch'."""
  overrides = _quick_demo(workdir) if quick else None
  params = exp_factory.get_exp_config(model.demo)
  if overrides:
    params.override(overrides, is_strict=True)
  figures = demo_gap(model.demo, examples, workdir, overrides)
  return {'demo': model.demo, 'backbone': params.task.model.backbone.type,
          'head': params.task.model.head.type,
          'batch': params.task.train_data.global_batch_size, **figures}


def zoo_demo_child_code(name: str, examples: int, workdir: str) -> str:
  """The `python -c` program of `zoo_demo` of the zoo's model `name`:
  prints 'RESULT {json}'."""
  return ('from official_ext.benchmarks import yt8m, memory; '
          f'r = yt8m.zoo_demo(yt8m.zoo_models([{name!r}])[0], {examples}, '
          f'{workdir!r}); print(memory.result_line(r))')


def zoo_demos(quick: bool = False, models: Optional[Sequence[str]] = None,
              workdir: Optional[str] = None) -> Dict[str, Any]:
  """The demos' ranking: every model's demo trained on the same generated
  videos for the same budget (`zoo_demo_budget`), then evaluated; at full size
  each in a child process of its own, `quick` in this process on tiny data
  (`_quick_demo`). `workdir`: where the model_dirs (and quick data) go (None:
  a temporary folder).

  Returns:
    {'budget', 'budget_experiment', 'models': {name: `zoo_demo` figures}}.

  Raises:
    ValueError: a demo whose batch does not divide the budget (`demo_gap`)."""
  workdir = workdir or tempfile.mkdtemp(prefix='yt8m_zoo_demos_')
  budget = ({'train_examples': 2 * QUICK_BATCH, 'train_steps': 2,
             'batch': QUICK_BATCH} if quick else zoo_demo_budget())
  rows = {}
  for model in zoo_models(models):
    logging.info('zoo_demos: %s (%s), %d training videos', model.name,
                 model.demo, budget['train_examples'])
    if quick:
      rows[model.name] = zoo_demo(model, budget['train_examples'], workdir,
                                  quick=True)
      continue
    row = memory_lib.run_child(zoo_demo_child_code(
        model.name, budget['train_examples'], workdir), timeout=2 * 3600)
    row.pop('children_max_rss_gb')  # Every child's so far, not this one's.
    logging.info('zoo_demos: %s: %s', model.name, row)
    rows[model.name] = row
  return {'budget': budget, 'budget_experiment': ZOO_DEMO_BUDGET_EXPERIMENT,
          'models': rows}


def _m(v: Any) -> str:
  return f'{v / 1e6:,.2f} M' if v >= 1e5 else f'{v:,}'


def zoo_table(zoo_figures: Dict[str, Any]) -> str:
  """One markdown table of the zoo's models' speed and size (`zoo`'s
  figures)."""
  rows = [('model', 'experiments', 'backbone + head', 'parameters',
           'GFLOP per video, training step',
           f"examples/s, batch {zoo_figures['batch']}",
           'share of the matmul peak',
           "Model Garden's examples/s", "ours over Model Garden's")]
  for name, f in zoo_figures['models'].items():
    mg = f['model_garden_examples_per_sec']
    rows.append((
        name, f"`{f['published']}`, `{f['demo']}`",
        f"{f['backbone']} + {f['head']}", _m(f['parameters']),
        f"{f['gflops_per_example']:.3f}",
        f"{f['examples_per_sec']:.1f}", f"{f['peak_fraction']:.0%}",
        '–' if mg is None else f'{mg:.1f}',
        '–' if mg is None else f"{f['speedup_vs_model_garden']:.2f}×"))
  return timing.format_table(rows)


def zoo_demos_table(demo_figures: Dict[str, Any]) -> str:
  """One markdown table of the demos' ranking (`zoo_demos`' figures), with
  the published GAPs (`PUBLISHED_GAP`, not ours) beside."""
  budget = demo_figures['budget']
  rows = [('model', 'demo', 'backbone + head',
           f"training videos (budget {budget['train_examples']:,})",
           'train steps', 'GAP', 'mAP', 'hit@1', 'wall seconds',
           'published GAP (not ours)',
           'published model, evaluation, dataset, source')]
  for name, f in demo_figures['models'].items():
    published = PUBLISHED_GAP.get(name)
    rows.append((
        name, f"`{f['demo']}`", f"{f['backbone']} + {f['head']}",
        f"{f['train_examples']:,}", f"{f['train_steps']:,} × {f['batch']}",
        f"{f['gap']:.4f}", f"{f['map']:.4f}", f"{f['hit_at_one']:.3f}",
        f"{f['wall_seconds']:,.0f}",
        '–' if published is None else f'{published.gap}',
        '–' if published is None else (
            f'{published.model}; {published.evaluation}; '
            f'{published.dataset}; {published.source}')))
  return timing.format_table(rows)


def run(quick: bool = False, cases: Optional[Sequence[str]] = None,
        step_figures: Optional[Dict[str, Any]] = None,
        models: Optional[Sequence[str]] = None) -> Dict[str, object]:
  """The YT8M figures.

  Args:
    quick: tiny sizes (a smoke test).
    cases: which of `CASES` to measure (CLI `--cases`; default 'model'; the
      zoo's cases run only when asked for).
    step_figures: unused (the harness passes the recorded figures).
    models: the zoo's models (None: all), for both zoo cases.

  Raises:
    ValueError: a case not in `CASES`, naming it."""
  del step_figures  # No case reads another's figures.
  cases = list(cases or DEFAULT_CASES)
  unknown = [c for c in cases if c not in CASES]
  if unknown:
    raise ValueError(f'--cases: unknown yt8m case(s) {unknown}; the cases '
                     f'are {list(CASES)}.')
  figures = {}
  if 'zoo_demos' in cases:
    figures['zoo_demos'] = zoo_demos(quick=quick, models=models)
  if not {'zoo', 'model'} & set(cases):
    return figures
  peak = timing.matmul_peak_gflops(
      sizes=(512,) if quick else (2048, 3072), repeats=3 if quick else 8)
  if 'zoo' in cases:
    figures['zoo'] = zoo(quick=quick, models=models, peak_gflops=peak)
  if 'model' in cases:
    figures.update(_model_figures(quick, peak))
  return figures


def _model_figures(quick: bool, peak: float) -> Dict[str, object]:
  """The figures of the 'model' case (module docstring)."""
  sizes = [TINY] if quick else [DEMO, PUBLISHED]
  rounds = 2 if quick else 5
  per_size = {s.name: bench_train_step(s, peak, rounds=rounds) for s in sizes}
  nextvlad_size = NEXTVLAD_TINY if quick else NEXTVLAD_PUBLISHED
  nextvlad = bench_nextvlad_train_step(nextvlad_size, peak, rounds=rounds)
  main = per_size[sizes[-1].name]
  main_size = sizes[-1]
  pipeline = bench_pipeline(main_size, num_batches=3 if quick else 20)
  metric_figures = (bench_metrics(2000, 100, 200) if quick else
                    bench_metrics())
  figures = {
      'matmul_peak_gflops': peak,
      'cpu_allocator': timing.cpu_allocator(),
      **{k: main[k] for k in (
          'ours_examples_per_sec', 'reference_examples_per_sec', 'speedup',
          'achieved_gflops', 'peak_fraction', 'gflops_per_example',
          'reference_xla_examples_per_sec', 'interleaved_matmul_gflops',
          'interleaved_matmul_fraction')},
      'pipeline_examples_per_sec': pipeline,
      'pipeline_vs_train_step': pipeline / main['ours_examples_per_sec'],
      **metric_figures,
      'sizes': {s.name: dataclasses.asdict(s) for s in sizes},
      'per_size': per_size,
      'nextvlad': {**nextvlad, 'size': dataclasses.asdict(nextvlad_size)},
  }
  return figures


def _interleaved_row(f: Dict[str, float]) -> str:
  return (f"{f['interleaved_matmul_fraction']:.0%} of "
          f"{f['interleaved_matmul_gflops']:.1f} GFLOP/s")


ZOO_TITLE = 'The model zoo'
ZOO_INTRO = """\
Every registered YouTube-8M model (`yt8m_<model>` and its `yt8m_<model>_demo`; DBoF + MoE is
`yt8m`), from `--cases zoo`. Parameters: trainable, at the published size. GFLOP per video: the
published-size training step's matmuls and einsums, counted from its traced graph
(`benchmarks/graph_flops.py`: forward pass and the gradients the step computes; element-wise
work and the optimizer not counted). Speed: the published-size training step (fp32, Adam, an
in-memory batch), its achieved GFLOP/s as a share of the fp32 matmul peak measured at the start
of the run; beside Model Garden's model where Model Garden has it (DBoF + MoE, both driven by
`YT8MTask.train_step` as above). How well each model learns: the next table.
"""
ZOO_DEMOS_TITLE = 'The model zoo: every demo trained to the same budget'
ZOO_DEMOS_INTRO = """\
From `--cases zoo_demos`: each model's demo experiment (`yt8m_<model>_demo`) trained by
`official_ext.train` on the same generated videos (100 classes) for the same budget of training
videos, `yt8m_demo`'s own schedule (its steps × its batch, on which its DBoF reaches its
documented GAP; the training videos column), then evaluated on all its validation videos; each in
a process of its own, whose wall seconds (training and evaluation) are given. The published GAPs
are not ours: each is its authors' figure on the real dataset, with the model, evaluation, dataset
version and source named; the 2017 (4,716 classes) and 2018 (3,862 classes) datasets differ, and
neither is comparable with the demo's GAP. '–': no published single-model figure was available to
check ([yt8m.md](yt8m.md#every-model-in-one-table)).
"""


def subsections(figures: Dict[str, object]) -> List[Tuple[str, str, str, str]]:
  """(case, title, intro, table) of the report's subsections: the zoo's
  cases recorded in `figures`, except the one `table` shows (a run without
  the 'model' case)."""
  cases = [('zoo', ZOO_TITLE, ZOO_INTRO, zoo_table),
           ('zoo_demos', ZOO_DEMOS_TITLE, ZOO_DEMOS_INTRO, zoo_demos_table)]
  out = [(case, title, intro, render(figures[case]))
         for case, title, intro, render in cases if case in figures]
  return out if 'per_size' in figures else out[1:]


def table(figures: Dict[str, object]) -> str:
  """The 'model' case's table; a run without it: the first zoo case's."""
  if 'per_size' not in figures:
    for case, render in (('zoo', zoo_table), ('zoo_demos', zoo_demos_table)):
      if case in figures:
        return render(figures[case])
  rows = [('figure', 'value')]
  rows.append(('fp32 matmul peak (GFLOP/s)',
               f"{figures['matmul_peak_gflops']:.1f}"))
  rows.append(('TensorFlow CPU allocator', figures['cpu_allocator']))
  for name, f in figures['per_size'].items():
    s = figures['sizes'][name]
    label = (f"{name}: batch {s['batch']} x {s['frames']} frames, "
             f"cluster {s['cluster']}, hidden {s['hidden']}, "
             f"MoE {s['mixtures']}, {s['classes']} classes")
    rows.append((f'train step, {label}', ''))
    rows.append(('  ours (examples/sec)', f"{f['ours_examples_per_sec']:.1f}"))
    rows.append(('  Model Garden (examples/sec)',
                 f"{f['reference_examples_per_sec']:.1f}"))
    rows.append(('  speedup', f"{f['speedup']:.2f}x"))
    rows.append(('  Model Garden + XLA (examples/sec)',
                 f"{f['reference_xla_examples_per_sec']:.1f}"))
    rows.append(('  GFLOP per example (analytic)',
                 f"{f['gflops_per_example']:.3f}"))
    rows.append(('  achieved GFLOP/s (fraction of peak)',
                 f"{f['achieved_gflops']:.1f} ({f['peak_fraction']:.0%})"))
    rows.append(('  fraction of the matmul timed in the same rounds',
                 _interleaved_row(f)))
  nv = figures['nextvlad']
  s = nv['size']
  rows.append((f"NeXtVLAD train step, {s['name']}: batch {s['batch']} x "
               f"{s['frames']} frames, K {tuple(s['cluster_sizes'])}, G "
               f"{tuple(s['groups'])}, λ {s['expansion']}, hidden "
               f"{s['hidden']}, SE r {s['gating_reduction']}, logistic, "
               f"{s['classes']} classes", ''))
  rows.append(('  examples/sec', f"{nv['examples_per_sec']:.1f}"))
  rows.append(('  GFLOP per example (analytic)',
               f"{nv['gflops_per_example']:.3f}"))
  rows.append(('  achieved GFLOP/s (fraction of peak)',
               f"{nv['achieved_gflops']:.1f} ({nv['peak_fraction']:.0%})"))
  rows.append(('  fraction of the matmul timed in the same rounds',
               _interleaved_row(nv)))
  rows.append(('input pipeline (examples/sec)',
               f"{figures['pipeline_examples_per_sec']:.1f} "
               f"({figures['pipeline_vs_train_step']:.1f}x the train step)"))
  rows.append((f"metrics on {figures['metrics_num_videos']:,} x "
               f"{figures['metrics_num_classes']:,} (s)",
               f"{figures['metrics_seconds']:.2f}"))
  rows.append((f"  reference implementation, scaled from "
               f"{figures['metrics_reference_videos']:,} videos (s)",
               f"{figures['reference_metrics_seconds_scaled']:.1f}"))
  rows.append(('  max |difference| vs reference',
               f"{figures['metrics_max_abs_diff_vs_reference']:.1e}"))
  return timing.format_table(rows)
