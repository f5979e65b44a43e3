"""`python -m official_ext.benchmark assemblenet`: the published network's
forward pass, training step (beside the original-width variant), exported
SavedModel and peak host RAM, and the input pipeline case
(`assemblenet_input`); what each figure is: docs/benchmarks.md#assemblenetlite."""
import json
import os
import statistics
import tempfile
from typing import Any, Callable, Dict, Optional, Sequence

import numpy as np
import tensorflow as tf, tf_keras
from tf_keras.src.saving.legacy.saved_model import utils as keras_saved_model_utils

from official.core import exp_factory
from official.core import task_factory
from official_ext import export_saved_model
# (Also registers the experiment and the task.)
from official_ext.assemblenet import task as assemblenet_task
from official_ext.benchmarks import assemblenet_input
from official_ext.benchmarks import graph_flops
from official_ext.benchmarks import memory as memory_lib
from official_ext.benchmarks import timing
from official_ext.core.kernels import kernel_policy
from official_ext.core.kernels import process_settings


# Settings of a `benchmark assemblenet` process and of its peak-RSS child:
# those a CPU training run of the family takes.
PROCESS_SETTINGS = kernel_policy.cpu_process_env('assemblenet')

# Quick runs: both stems, one fused, one strided level-3 block; its
# original-width variant differs (the fusion projects the stems to their
# width, 16 at 32^2).
QUICK_STRUCTURE = [[-1, 1], [-2, 1], [3, [0, 1], [8, 8, 8], 1, 2]]
QUICK_BLOCKS_PER_LEVEL = (1, 1, 1, 1)


def _backbone_overrides(quick: bool, **extra) -> Dict[str, Any]:
  b = dict(extra)
  if quick:
    # 2 flow iterations (20 in full runs): each is unrolled in the flow's
    # XLA program, compiled once per network.
    b.update(model_structure=json.dumps(QUICK_STRUCTURE),
             model_edge_weights='',
             blocks_per_level=list(QUICK_BLOCKS_PER_LEVEL),
             stem_filters=8, rep_flow={'num_iter': 2})
  return b


def _params(batch: int, frames: int, size: int, quick: bool, **backbone):
  """The Charades experiment's config at the given clip size; its validation
  clips (the serving preprocessing) are the [frames, size, size] input as is,
  normalized."""
  params = exp_factory.get_exp_config('assemblenet_plus_lite_charades')
  data = {'feature_shape': [frames, size, size, 3], 'global_batch_size': batch}
  model = {'backbone': {'assemblenet_plus_lite': _backbone_overrides(
      quick, **backbone)}}
  if quick:
    model['head_filters'] = [16, 24]
  params.override({'task': {'model': model, 'train_data': data,
                            'validation_data': dict(
                                data, temporal_stride=1, num_test_clips=1,
                                num_test_crops=1, min_image_size=size)}},
                  is_strict=True)
  return params


def _task(batch: int, frames: int, size: int, quick: bool, **backbone):
  """An AssembleNetTask for the Charades experiment at the given clip size."""
  return task_factory.get_task(
      _params(batch, frames, size, quick, **backbone).task)


def _inputs(task, batch, frames, size, seed=0):
  rng = np.random.default_rng(seed)
  k = task.task_config.train_data.num_classes
  x = tf.constant(rng.uniform(0, 1, (batch, frames, size, size, 3)),
                  tf.float32)
  y = tf.constant((rng.uniform(size=(batch, k)) < 0.05).astype(np.float32))
  return {'image': x}, y


def _train_fn(task, model):
  optimizer = tf_keras.optimizers.SGD(learning_rate=1e-3, momentum=0.9)

  @tf.function
  def step(inputs):
    return task.train_step(inputs, model, optimizer)['loss']

  return step


QUICK_CONV3D = (1, 4, 8, 16)  # batch, frames, height = width, channels
FULL_CONV3D = (2, 16, 28, 152)


def _conv3d(quick: bool):
  """The peak's 3x3x3 SAME Conv3D (channels -> channels) on its input."""
  b, t, h, c = QUICK_CONV3D if quick else FULL_CONV3D
  x = tf.random.uniform([b, t, h, h, c])
  k = tf.random.uniform([3, 3, 3, c, c])
  return tf.function(
      lambda x: tf.reduce_sum(tf.nn.conv3d(x, k, [1] * 5, 'SAME'))), x


def conv3d_peak_gflops(quick: bool = False) -> float:
  """GFLOP/s of a large float32 3x3x3 Conv3D in this process."""
  conv, x = _conv3d(quick)
  sec = timing.interleaved_seconds({'conv3d': lambda: conv(x)},
                                   rounds=3 if quick else 5,
                                   warmup=2)['conv3d']
  return graph_flops.function_flops(lambda: conv(x)) / sec / 1e9


_CLIP_FLOPS: Dict[Any, Dict[str, int]] = {}


def clip_flops(frames: int, size: int, quick: bool, training: bool = False,
               **backbone) -> Dict[str, int]:
  """FLOPs of one [frames, size, size] clip through the network: 'forward'
  and, with `training`, 'train' (the training step), from the traced graph
  (`graph_flops`); each counted once per process."""
  flops = _CLIP_FLOPS.setdefault(
      (frames, size, quick, tuple(sorted(backbone.items()))), {})
  if 'forward' not in flops or (training and 'train' not in flops):
    task = _task(1, frames, size, quick, **backbone)
    model = task.build_model(input_shape=[1, frames, size, size, 3])
    inputs = _inputs(task, 1, frames, size)
    flops['forward'] = graph_flops.forward_flops(model, inputs[0])
    if training:
      flops['train'] = graph_flops.train_step_flops(task, model, inputs)
  return flops


QUICK_SPEED = (1, 4, 32)  # clips, frames, height = width
FULL_SPEED = (2, 16, 112)
QUICK_MEMORY = (2, 8, 64)  # clips, frames, height = width
FULL_MEMORY = (8, 32, 224)


def _speed(quick: bool, reference: bool) -> Dict[str, float]:
  """Seconds per forward batch and per training step, timed interleaved:
  'forward', 'train' and, with `reference`, the original-width network's
  'reference_forward', 'reference_train'."""
  batch, frames, size = QUICK_SPEED if quick else FULL_SPEED
  variants = {'': {}}
  if reference:
    variants['reference_'] = {'fusion_width_as_channels': True}
  candidates = {}
  for prefix, backbone in variants.items():
    task = _task(batch, frames, size, quick, **backbone)
    model = task.build_model()
    inputs = _inputs(task, batch, frames, size)
    forward = tf.function(lambda f, model=model: model(f, training=False))
    step = _train_fn(task, model)
    candidates[prefix + 'forward'] = (
        lambda forward=forward, inputs=inputs: forward(inputs[0]))
    candidates[prefix + 'train'] = (
        lambda step=step, inputs=inputs: step(inputs))
  seconds = timing.interleaved_seconds(candidates, rounds=2 if quick else 3,
                                       warmup=1)
  return dict(seconds, batch=batch)


QUICK_INFERENCE = (1, 4, 32)  # clips, frames, height = width
FULL_INFERENCE = (2, 32, 224)


def _inference(quick: bool) -> Dict[str, Any]:
  """Seconds per call of the exported SavedModel's `serving_default` (the
  network at initial weights, exported into a temporary directory and loaded
  back) on uint8 clips of the inference size."""
  batch, frames, size = QUICK_INFERENCE if quick else FULL_INFERENCE
  params = _params(batch, frames, size, quick)
  with tempfile.TemporaryDirectory() as tmp:
    model = task_factory.get_task(params.task).build_model()
    prefix = tf.train.Checkpoint(model=model).write(
        os.path.join(tmp, 'ckpt', 'ckpt'))
    del model
    # Without the Keras layers' own traces (`save_traces=False`; the
    # serving signature is the same): half the export time.
    with keras_saved_model_utils.keras_option_scope(
        save_traces=False, in_tf_saved_model_scope=True):
      export_dir = export_saved_model.export(
          params, prefix, os.path.join(tmp, 'saved_model'))
    serve = tf.saved_model.load(export_dir).signatures['serving_default']
    rng = np.random.default_rng(0)
    clips = tf.constant(rng.integers(0, 256, (batch, frames, size, size, 3),
                                     dtype=np.uint8))
    probabilities = serve(frames=clips)['probabilities']
    expected = (batch, params.task.train_data.num_classes)
    if probabilities.shape != expected:
      raise RuntimeError(f'serving_default of the exported {export_dir} '
                         f'returned probabilities of shape '
                         f'{probabilities.shape}; expected {expected}.')
    sec = timing.interleaved_seconds(
        {'serve': lambda: serve(frames=clips)['probabilities']},
        rounds=2 if quick else 3, warmup=1)['serve']
  return {'sec': sec, 'batch': batch, 'frames': frames, 'size': size}


def memory_child(batch: int, frames: int, size: int, quick: bool,
                 recompute: bool) -> Dict[str, Any]:
  """Runs in the child process, after the task's process settings: one
  training step; returns its peak RSS."""
  process_settings.apply(PROCESS_SETTINGS)
  threshold = os.environ.get(process_settings.MALLOC_MMAP_THRESHOLD)
  task = _task(batch, frames, size, quick, recompute_grad=recompute)
  model = task.build_model()
  step = _train_fn(task, model)
  loss = []

  def first_step():  # Inputs, tracing and the step: one call, no warm-up.
    loss.append(float(np.asarray(step(_inputs(task, batch, frames, size)))))

  seconds = timing.interleaved_seconds({'step': first_step}, rounds=1,
                                       warmup=0)['step']
  return {'loss': loss[0], 'step_sec': seconds,
          'peak_rss_gb': memory_lib.peak_rss_gb(),
          'malloc_mmap_threshold_bytes': (
              int(threshold) if threshold and threshold.isdigit() else None)}


def memory_child_code(batch: int, frames: int, size: int, quick: bool,
                      recompute: bool) -> str:
  """The `python -c` program of the memory child: prints 'RESULT {json}'."""
  return ('from official_ext.benchmarks import assemblenet, memory; '
          f'r = assemblenet.memory_child({batch}, {frames}, {size}, {quick}, '
          f'{recompute}); print(memory.result_line(r))')


def peak_rss_gb(batch: int, frames: int, size: int, quick: bool,
                recompute: bool = True, timeout: int = 3600) -> Dict[str, Any]:
  """Peak RSS of a training step, measured in a fresh subprocess."""
  return memory_lib.run_child(
      memory_child_code(batch, frames, size, quick, recompute), timeout)


def checkout_root() -> str:
  """The checkout this module runs from (the directory above `official_ext`)."""
  return os.path.dirname(os.path.dirname(os.path.dirname(
      os.path.abspath(__file__))))


def checkout_child_code(batch: int, frames: int, size: int,
                        quick: bool) -> str:
  """The `python -c` program of a `memory_lib.StepChild` running the training
  step of the checkout first on PYTHONPATH (its `_task`, `_inputs`,
  `_train_fn`; `official_ext.assemblenet.benchmark` in older checkouts): READY
  after one traced step, then one step per command."""
  memory_py = os.path.abspath(memory_lib.__file__)
  return f'''
import importlib.util
spec = importlib.util.spec_from_file_location('_benchmark_children', {memory_py!r})
children = importlib.util.module_from_spec(spec)
spec.loader.exec_module(children)

def build():
  import numpy as np
  import official_ext
  try:
    from official_ext.benchmarks import assemblenet as bench
  except ImportError:
    from official_ext.assemblenet import benchmark as bench
  task = bench._task({batch}, {frames}, {size}, {quick})
  model = task.build_model()
  inputs = bench._inputs(task, {batch}, {frames}, {size})
  train = bench._train_fn(task, model)
  loss = float(np.asarray(train(inputs)))
  step = lambda: {{'loss': float(np.asarray(train(inputs)))}}
  return step, {{'official_ext': official_ext.__file__, 'first_loss': loss}}

children.step_child_loop(build)
'''


def _step_child(checkout: str, batch: int, frames: int, size: int,
                quick: bool, name: str) -> memory_lib.StepChild:
  """A `StepChild` running `checkout`'s training step (PYTHONPATH first)."""
  path = os.environ.get('PYTHONPATH')
  return memory_lib.StepChild(
      checkout_child_code(batch, frames, size, quick), name,
      env={'PYTHONPATH': checkout + (os.pathsep + path if path else '')},
      cwd=checkout)


def reference_checkout_speed(
    checkout: str, quick: bool, rounds: Optional[int] = None,
    make_child: Callable[..., Any] = _step_child) -> Dict[str, Any]:
  """Training step of this checkout and of `checkout`, each in a long-lived
  child (`memory_lib.StepChild`), timed interleaved at the speed sizes.

  Args:
    checkout: the root of another checkout of this repository.
    quick: the quick sizes and each checkout's quick network.
    rounds: interleaved rounds (default 2 quick, 5 full).
    make_child: (checkout, batch, frames, size, quick, name) -> child with
      `wait_ready()`, `step()` and `close()` (tests pass fakes).

  Returns:
    'checkout_train_sec_per_step', 'reference_checkout_train_sec_per_step'
    (medians), their samples, the reference's path and
    'train_speedup_vs_reference_checkout' (reference / this).

  Raises:
    ValueError: `checkout` has no `official_ext` package, or a child imported
      `official_ext` from elsewhere (PYTHONPATH did not take)."""
  checkout = os.path.abspath(checkout)
  if not os.path.isdir(os.path.join(checkout, 'official_ext')):
    raise ValueError(f'reference checkout {checkout}: no official_ext '
                     'directory there (give the root of a checkout of this '
                     'repository).')
  batch, frames, size = QUICK_SPEED if quick else FULL_SPEED
  roots = {'checkout_train': checkout_root(),
           'reference_checkout_train': checkout}
  children = {}
  try:
    for key, root in roots.items():
      children[key] = make_child(root, batch, frames, size, quick, key)
    for key, child in children.items():
      imported = child.wait_ready().get('official_ext', '')
      want = os.path.join(roots[key], 'official_ext') + os.sep
      if not os.path.abspath(imported).startswith(want):
        raise ValueError(f'{key} child imported official_ext from '
                         f'{imported!r}, not from {roots[key]}.')
    samples = timing.interleaved_samples(
        {k: c.step for k, c in children.items()},
        rounds=rounds or (2 if quick else 5), warmup=0)
  finally:
    for child in children.values():
      child.close()
  median = {k: statistics.median(v) for k, v in samples.items()}
  return {
      'checkout_train_sec_per_step': median['checkout_train'],
      'reference_checkout_train_sec_per_step':
          median['reference_checkout_train'],
      'checkout_train_samples': samples['checkout_train'],
      'reference_checkout_train_samples': samples['reference_checkout_train'],
      'reference_checkout': checkout,
      'train_speedup_vs_reference_checkout':
          median['reference_checkout_train'] / median['checkout_train'],
  }


# The cases `run` measures ('model': the network's figures; 'input_pipeline':
# `assemblenet_input.run`, ours against Model Garden's video_input).
CASES = ('model', 'input_pipeline')


def run(quick: bool = False, memory: bool = True,
        reference: bool = True, inference: bool = True,
        reference_checkout: Optional[str] = None,
        cases: Optional[Sequence[str]] = None,
        step_figures: Optional[Dict[str, Any]] = None) -> Dict[str, Any]:
  """The figures of docs/benchmarks.md#assemblenetlite, flat, sizes included.

  Args:
    quick: `QUICK_STRUCTURE`, 2 flow iterations, tiny sizes (smoke tests).
    memory: also run the peak-RSS child (minutes in the full run).
    reference: also time the original-width architecture.
    inference: also export the network and time its SavedModel.
    reference_checkout: another checkout whose training step is timed beside
      this one's (`reference_checkout_speed`).
    cases: which of `CASES` to measure (default all; CLI `--cases`).
    step_figures: a recorded run's figures, for the input pipeline's
      cores-to-feed figure when the 'model' case is not run.

  Raises:
    ValueError: a case not in `CASES`, naming it."""
  cases = list(cases or CASES)
  unknown = [c for c in cases if c not in CASES]
  if unknown:
    raise ValueError(f'--cases: unknown assemblenet case(s) {unknown}; the '
                     f'cases are {list(CASES)}.')
  out: Dict[str, Any] = {'quick': quick}
  if 'model' in cases:
    out.update(_model_figures(quick, memory, reference, inference,
                              reference_checkout))
  if 'input_pipeline' in cases:
    # The step rate of this run's figures, else of the recorded run.
    out.update(assemblenet_input.run(
        quick=quick, step_figures=out if 'model' in cases else step_figures))
  return out


def _model_figures(quick: bool, memory: bool, reference: bool,
                   inference: bool, reference_checkout: Optional[str]
                   ) -> Dict[str, Any]:
  """The 'model' case of `run`: the figures of the module docstring."""
  out: Dict[str, Any] = {}
  batch, frames, size = QUICK_SPEED if quick else FULL_SPEED
  out['bench_size'] = f'{batch}x{frames}x{size}^2'
  if memory:  # first, while this process holds no model
    mb, mf, ms = QUICK_MEMORY if quick else FULL_MEMORY
    mem = peak_rss_gb(mb, mf, ms, quick, recompute=True)
    out['peak_rss_gb_8x32x224'] = mem['peak_rss_gb']
    out['peak_rss_size'] = f'{mb}x{mf}x{ms}^2' + (' (quick)' if quick else '')
    out['peak_rss_step_sec'] = mem['step_sec']
    out['peak_rss_recompute_grad'] = True
    out['peak_rss_malloc_mmap_threshold_bytes'] = mem[
        'malloc_mmap_threshold_bytes']
  if reference_checkout:
    out.update(reference_checkout_speed(reference_checkout, quick))
  # Counted after the children above, which start before any model is built.
  out['gflops_per_clip'] = clip_flops(32, 224, quick)['forward'] / 1e9
  out['gflops_per_clip_original_width'] = clip_flops(
      32, 224, quick, fusion_width_as_channels=True)['forward'] / 1e9
  bench_flops = clip_flops(frames, size, quick, training=True)
  out['gflops_per_clip_bench'] = bench_flops['forward'] / 1e9
  out['train_gflops_per_clip_bench'] = bench_flops['train'] / 1e9
  out['conv3d_peak_gflops'] = conv3d_peak_gflops(quick)
  speed = _speed(quick, reference)
  b = speed['batch']
  out['forward_clips_per_sec'] = b / speed['forward']
  out['train_clips_per_sec'] = b / speed['train']
  out['forward_sec_per_batch'] = speed['forward']
  out['train_sec_per_step'] = speed['train']
  out['forward_model_gflops'] = out['gflops_per_clip_bench'] * b / speed[
      'forward']
  out['train_model_gflops'] = out['train_gflops_per_clip_bench'] * b / speed[
      'train']
  if inference:
    inf = _inference(quick)
    ib = inf['batch']
    out['inference_size'] = f"{ib}x{inf['frames']}x{inf['size']}^2"
    out['inference_sec_per_batch'] = inf['sec']
    out['inference_clips_per_sec'] = ib / inf['sec']
    # The clip the model scores (32 x 224^2 in the full run).
    out['inference_gflops_per_clip'] = clip_flops(
        inf['frames'], inf['size'], quick)['forward'] / 1e9
    out['inference_model_gflops'] = (
        out['inference_gflops_per_clip'] * ib / inf['sec'])
  if reference:
    out['reference_original_width_train_clips_per_sec'] = (
        b / speed['reference_train'])
    out['reference_original_width_forward_clips_per_sec'] = (
        b / speed['reference_forward'])
    out['train_speedup_vs_original_width'] = (
        speed['reference_train'] / speed['train'])
    out['forward_speedup_vs_original_width'] = (
        speed['reference_forward'] / speed['forward'])
  if not quick:
    out['tf1_quoted_forward_clips_per_sec'] = 2 / 2.4
    out['tf1_quoted_train_clips_per_sec'] = 2 / 9.8
    out['train_speedup_vs_tf1_quoted'] = out['train_clips_per_sec'] / (2 / 9.8)
    out['forward_speedup_vs_tf1_quoted'] = (
        out['forward_clips_per_sec'] / (2 / 2.4))
  return out

