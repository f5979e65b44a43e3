"""YT8M section of `python -m official_ext.benchmark yt8m`.

Figures (all measured in one process; every time goes through
`timing.interleaved_seconds`, speeds side by side with their reference):

* training step examples/sec of our model vs Model Garden's
  `official.projects.yt8m.modeling.yt8m_model.VideoClassificationModel` (the
  part of Model Garden's YT8M project that ships in the pip release) at the
  same sizes, optimizer, dtype and in-memory batch, both driven by
  `YT8MTask.train_step` (Model Garden's own YT8M task does not import from
  the pip release); for Model Garden's model that step adds the L2
  regularization through `model.losses` as Model Garden's task does
  (`analytic_l2_gradient=False`), ours computes it outside XLA. Model
  Garden's model runs as Model Garden runs it on CPU (no XLA;
  `runtime.enable_xla` only applies with GPUs), and with XLA as an extra
  reference;
* analytic FLOPs per example (only work a training step needs: no gradient
  w.r.t. the frame features), achieved GFLOP/s and fraction of the fp32
  matmul peak measured in the same run (`peak_fraction`: of the fastest
  matmul sample at the start of the run), and of a [3072, 3072] matmul timed
  in the step's own interleaved rounds (`interleaved_matmul_fraction`, its
  median rate `interleaved_matmul_gflops`: steadier where the machine's
  speed drifts during a run);
* the NeXtVLAD training step (`yt8m_nextvlad`: NeXtVLAD + logistic
  classifier, padding masked) at the published size: examples/sec, analytic
  FLOPs per example from the layer shapes and fraction of the same matmul
  peak (no reference implementation runs here: the authors' code is TF1);
* the input pipeline: examples/sec from TFRecord files to batches;
* `metrics.evaluate` on 100,000 x 3,862 predictions vs the straightforward
  reference (`metrics_reference`) on a 2,000-video slice, scaled.

The process runs with TensorFlow's BFC CPU allocator (`PROCESS_SETTINGS`, a
fast path of `core.kernel_policy` on CPUs, applied by the harness as by `train`;
`figures['cpu_allocator']` says which allocator a run had):
with the default allocator every large tensor (the 85 M-float MoE gradient,
XLA's buffers of [batch x frames, cluster] activations) is fresh memory from
the kernel each step, and ~16 % of the published-size step was spent in page
faults zeroing it (perf). Both models, ours and Model Garden's, run
in the same process, so both get it (it sped each up by 1.2-1.3x; the
speed-up between them is unchanged).
"""
import dataclasses
import tempfile
from typing import Dict, Optional, Tuple

import numpy as np
import tensorflow as tf, tf_keras

from official.core import exp_factory
from official.core import task_factory
from official_ext.benchmarks import timing
from official_ext.core import kernel_policy
from official_ext.yt8m import configs  # pylint: disable=unused-import  (registers 'yt8m')
from official_ext.yt8m import dataloader
from official_ext.yt8m import demo_data
from official_ext.yt8m import metrics
from official_ext.yt8m import metrics_reference
from official_ext.yt8m import task as yt8m_task  # pylint: disable=unused-import  (registers YT8MTask)


# Settings of a `benchmark yt8m` process: those a CPU training run of the
# family takes (module docstring).
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


def train_flops_per_example(size: Size) -> float:
  """FLOPs one training example needs (multiply-add = 2 FLOPs).

  Forward and weight gradients of the three matmul groups (cluster
  [F, K] per frame, hidden [K, H], MoE gate + expert [H, C(2M+1)]) plus the
  input gradients the backward pass needs (into the hidden and MoE layers).
  Not counted: the gradient w.r.t. the frame features (nothing uses it),
  batch norm / activations / pooling (O(T·K), < 1 % here), the optimizer.
  """
  t, f, k, h = size.frames, size.features, size.cluster, size.hidden
  moe = h * size.classes * (2 * size.mixtures + 1)
  cluster = 2 * t * f * k
  return 2 * cluster + 3 * 2 * k * h + 3 * 2 * moe


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


def nextvlad_train_flops_per_example(size: NextVladSize) -> float:
  """FLOPs one NeXtVLAD training example needs (multiply-add = 2 FLOPs).

  Per stream of N features (λN = expansion x N, N' = λN / G, T frames):
  the expansion [N, λN] per frame, forward and weight gradient only (no
  gradient w.r.t. the frame features); forward, weight and input gradients
  (x3) of the group attention [λN, G] and the assignment [λN, G K] per
  frame and of the aggregation (T G x K by T G x N' contraction, gradients
  w.r.t. both operands). Then x3 for the hidden layer [Σ N' K, H], the SE
  gate's two [H, H / r] layers and the classifier [H, C]. Not counted:
  batch norm, softmax, normalization and other element-wise work, the
  optimizer.
  """
  t = size.frames
  flops = 0
  vlad_width = 0
  for n, k, g in zip(size.feature_sizes, size.cluster_sizes, size.groups):
    wide = size.expansion * n
    flops += 2 * (2 * t * n * wide)
    flops += 3 * (2 * t * wide * g + 2 * t * wide * g * k)
    flops += 3 * (2 * t * g * k * (wide // g))
    vlad_width += wide // g * k
  h = size.hidden
  flops += 3 * 2 * (vlad_width * h + 2 * h * (h // size.gating_reduction) +
                    h * size.classes)
  return flops


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
  step = _step_fn(task, task.build_model(), make_batch(size))
  n = _matmul_size(size)
  seconds = timing.interleaved_seconds(
      {'nextvlad': step, 'matmul': timing.matmul_candidate(n)},
      rounds=rounds)
  flops = nextvlad_train_flops_per_example(size)
  examples_per_sec = size.batch / seconds['nextvlad']
  achieved = examples_per_sec * flops / 1e9
  return {'examples_per_sec': examples_per_sec,
          'gflops_per_example': flops / 1e9,
          'achieved_gflops': achieved,
          'peak_fraction': achieved / peak_gflops,
          **_interleaved_matmul(achieved, n, seconds['matmul'])}


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


def _model_garden_model(size: Size) -> tf_keras.Model:
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
  """A random in-memory training batch at `size` (a Size or NextVladSize).

  Returns:
    {'video_matrix': float32 [batch, frames, features] (dequantized uint8),
     'num_frames': int32 [batch] (all `frames`), 'labels': float32
     [batch, classes] with 3 positives per video}.
  """
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
  steps = {
      'ours': _step_fn(ours_task, ours_task.build_model(), batch),
      'reference': _step_fn(plain_task, _model_garden_model(size), batch),
      'reference_xla': _step_fn(xla_task, _model_garden_model(size), batch),
      'matmul': timing.matmul_candidate(_matmul_size(size)),
  }
  seconds = timing.interleaved_seconds(steps, rounds=rounds)
  flops = train_flops_per_example(size)
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


def run(quick: bool = False) -> Dict[str, object]:
  """All YT8M figures; `quick` uses tiny sizes (a smoke test)."""
  peak = timing.matmul_peak_gflops(
      sizes=(512,) if quick else (2048, 3072), repeats=3 if quick else 8)
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


def table(figures: Dict[str, object]) -> str:
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
