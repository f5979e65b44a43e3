"""`python -m official_ext.benchmark assemblenet`: the published network's
forward pass, training step (beside the original-width variant), exported
SavedModel and peak host RAM ('model'), the input pipeline
(`assemblenet_input`) and the full networks, AssembleNet-50 and
AssembleNet++-50 with its object stem, beside the lite ('networks'); what
each figure is: docs/benchmarks.md#assemblenetlite."""
import dataclasses
import json
import os
import statistics
import subprocess
import tempfile
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

import numpy as np
import tensorflow as tf, tf_keras
from tf_keras.src.saving.legacy.saved_model import utils as keras_saved_model_utils

from official.core import exp_factory
from official.core import task_factory
from official.core import train_utils
from official_ext import export_saved_model
# (Also registers the experiment and the task.)
from official_ext.assemblenet import task as assemblenet_task
from official_ext.benchmarks import assemblenet_input
from official_ext.benchmarks import graph_flops
from official_ext.benchmarks import memory as memory_lib
from official_ext.benchmarks import tf1_reference as tf1_lib
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


@dataclasses.dataclass(frozen=True)
class Network:
  """A network the benchmark builds: its registered experiment (the config
  of its published size) and the backbone overrides of `--quick` runs."""
  key: str  # The figures' key.
  title: str  # What the report calls it.
  experiment: str
  quick_backbone: Dict[str, Any]  # Backbone fields at tiny sizes.


# 2 flow iterations in quick runs (20 or 40 in full runs): each is unrolled
# in the flow's XLA program, compiled once per network.
LITE = Network('assemblenet_plus_lite', 'AssembleNet++lite',
               'assemblenet_plus_lite_charades', {
                   'model_structure': json.dumps(QUICK_STRUCTURE),
                   'model_edge_weights': '',
                   'blocks_per_level': list(QUICK_BLOCKS_PER_LEVEL),
                   'stem_filters': 8, 'rep_flow': {'num_iter': 2}})
# The full networks at quick sizes: their stems (AssembleNet++'s object stem
# included) fused into one strided level-3 block, edge weights learned.
QUICK_ASN_STRUCTURE = [[-1, 1], [-2, 1], [3, [0, 1], 8, 1, 2]]
QUICK_ASNP_STRUCTURE = [[-1, 1], [-2, 1], [-3, 1], [3, [0, 1, 2], 8, 1, 2]]


def _quick_asn(structure) -> Dict[str, Any]:
  return {'model_structure': json.dumps(structure), 'model_edge_weights': '',
          'blocks_per_level': list(QUICK_BLOCKS_PER_LEVEL),
          'rep_flow': {'num_iter': 2}}


ASN50 = Network('assemblenet50', 'AssembleNet-50', 'assemblenet50_charades',
                _quick_asn(QUICK_ASN_STRUCTURE))
ASNP50 = Network('assemblenet_plus50', 'AssembleNet++-50 with objects',
                 'assemblenet_plus_charades', _quick_asn(QUICK_ASNP_STRUCTURE))
# The networks of the 'networks' case, in the report's order.
NETWORKS = (LITE, ASN50, ASNP50)


def network(key: str) -> Network:
  """The `NETWORKS` entry of `key`.

  Raises:
    ValueError: an unknown key, naming the networks."""
  for n in NETWORKS:
    if n.key == key:
      return n
  raise ValueError(f'unknown assemblenet benchmark network {key!r}; the '
                   f'networks are {[n.key for n in NETWORKS]}.')


def _backbone_overrides(net: Network, quick: bool, **extra) -> Dict[str, Any]:
  b = dict(net.quick_backbone) if quick else {}
  b.update(extra)
  return b


def _params(batch: int, frames: int, size: int, quick: bool,
            net: Network = LITE, **backbone):
  """The config of `net`'s experiment (default the lite's Charades one) at
  the given clip size; its validation clips (the serving preprocessing) are
  the [frames, size, size] input as is, normalized."""
  params = exp_factory.get_exp_config(net.experiment)
  data = {'feature_shape': [frames, size, size, 3], 'global_batch_size': batch}
  backbone_type = params.task.model.backbone.type
  model = {'backbone': {backbone_type: _backbone_overrides(
      net, quick, **backbone)}}
  if quick and backbone_type == 'assemblenet_plus_lite':
    model['head_filters'] = [16, 24]
  params.override({'task': {'model': model, 'train_data': data,
                            'validation_data': dict(
                                data, temporal_stride=1, num_test_clips=1,
                                num_test_crops=1, min_image_size=size)}},
                  is_strict=True)
  return params


def _task(batch: int, frames: int, size: int, quick: bool,
          net: Network = LITE, **backbone):
  """An AssembleNetTask of `net`'s experiment at the given clip size."""
  return task_factory.get_task(
      _params(batch, frames, size, quick, net, **backbone).task)


def object_maps(rng: np.random.Generator, shape: Sequence[int],
                num_classes: int, block: int = 8) -> np.ndarray:
  """Random object class maps, int32 of `shape` ([..., H, W]): ids in
  [0, num_classes), constant over `block` x `block` pixel regions (maps of
  regions, as a segmenter's; they also compress)."""
  *lead, h, w = shape
  coarse = rng.integers(0, num_classes,
                        [*lead, -(-h // block), -(-w // block)])
  maps = np.repeat(np.repeat(coarse, block, axis=-2), block, axis=-1)
  return maps[..., :h, :w].astype(np.int32)


def _inputs(task, batch, frames, size, seed=0):
  """(features, multi-hot labels) of random clips: features {'image'} and,
  for a task with object maps, 'objects' (`object_maps`)."""
  rng = np.random.default_rng(seed)
  k = task.task_config.train_data.num_classes
  x = tf.constant(rng.uniform(0, 1, (batch, frames, size, size, 3)),
                  tf.float32)
  y = tf.constant((rng.uniform(size=(batch, k)) < 0.05).astype(np.float32))
  features = {'image': x}
  num_objects = task.task_config.train_data.num_object_classes
  if num_objects:
    features['objects'] = tf.constant(
        object_maps(rng, (batch, frames, size, size), num_objects))
  return features, y


def _train_fn(task, model, net: Network = LITE):
  """`AssembleNetTask.train_step` with the optimizer that training builds
  for `net`'s experiment (`train_utils.create_optimizer`), as a function."""
  optimizer = train_utils.create_optimizer(
      task, exp_factory.get_exp_config(net.experiment))

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
               net: Network = LITE, **backbone) -> Dict[str, int]:
  """FLOPs of one [frames, size, size] clip through `net`: 'forward'
  and, with `training`, 'train' (the training step), from the traced graph
  (`graph_flops`); each counted once per process."""
  flops = _CLIP_FLOPS.setdefault(
      (net.key, frames, size, quick, tuple(sorted(backbone.items()))), {})
  if 'forward' not in flops or (training and 'train' not in flops):
    task = _task(1, frames, size, quick, net, **backbone)
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


def _timed(quick: bool, variants: Dict[str, Tuple[Network, Dict[str, Any]]],
           models: Optional[Dict[str, tf_keras.Model]] = None
           ) -> Dict[str, float]:
  """Seconds per forward batch and per training step at the speed size,
  timed interleaved: '<prefix>forward' and '<prefix>train' of each variant
  (prefix -> (network, backbone overrides)), and 'batch'; `models` gets
  each prefix's model."""
  batch, frames, size = QUICK_SPEED if quick else FULL_SPEED
  candidates = {}
  for prefix, (net, backbone) in variants.items():
    task = _task(batch, frames, size, quick, net, **backbone)
    model = task.build_model()
    if models is not None:
      models[prefix] = model
    inputs = _inputs(task, batch, frames, size)
    forward = tf.function(lambda f, model=model: model(f, training=False))
    step = _train_fn(task, model, net)
    candidates[prefix + 'forward'] = (
        lambda forward=forward, inputs=inputs: forward(inputs[0]))
    candidates[prefix + 'train'] = (
        lambda step=step, inputs=inputs: step(inputs))
  seconds = timing.interleaved_seconds(candidates, rounds=2 if quick else 3,
                                       warmup=1)
  return dict(seconds, batch=batch)


def _speed(quick: bool, reference: bool) -> Dict[str, float]:
  """The lite's `_timed` figures: 'forward', 'train' and, with `reference`,
  the original-width network's 'reference_forward', 'reference_train'."""
  variants = {'': (LITE, {})}
  if reference:
    variants['reference_'] = (LITE, {'fusion_width_as_channels': True})
  return _timed(quick, variants)


QUICK_INFERENCE = (1, 4, 32)  # clips, frames, height = width
FULL_INFERENCE = (2, 32, 224)


def _inference(quick: bool) -> Dict[str, Any]:
  """Seconds per call of the exported SavedModel's `serving_default` (the
  network at initial weights, exported for serving on CPU and, beside it,
  for any device (the stock ops), each loaded back), timed interleaved on
  uint8 clips of the inference size: 'sec' (CPU export), 'stock_sec'."""
  batch, frames, size = QUICK_INFERENCE if quick else FULL_INFERENCE
  params = _params(batch, frames, size, quick)
  rng = np.random.default_rng(0)
  clips = tf.constant(rng.integers(0, 256, (batch, frames, size, size, 3),
                                   dtype=np.uint8))
  expected = (batch, params.task.train_data.num_classes)
  with tempfile.TemporaryDirectory() as tmp:
    model = task_factory.get_task(params.task).build_model()
    prefix = tf.train.Checkpoint(model=model).write(
        os.path.join(tmp, 'ckpt', 'ckpt'))
    del model
    serves = {}
    for key, device in (('sec', 'cpu'), ('stock_sec', 'any')):
      # Without the Keras layers' own traces (`save_traces=False`; the
      # serving signature is the same): half the export time.
      with keras_saved_model_utils.keras_option_scope(
          save_traces=False, in_tf_saved_model_scope=True):
        export_dir = export_saved_model.export(
            params, prefix, os.path.join(tmp, f'saved_model_{device}'),
            serving_device=device)
      serve = tf.saved_model.load(export_dir).signatures['serving_default']
      probabilities = serve(frames=clips)['probabilities']
      if probabilities.shape != expected:
        raise RuntimeError(f'serving_default of the exported {export_dir} '
                           f'returned probabilities of shape '
                           f'{probabilities.shape}; expected {expected}.')
      serves[key] = (lambda serve=serve: serve(frames=clips)['probabilities'])
    seconds = timing.interleaved_seconds(serves, rounds=2 if quick else 3,
                                         warmup=1)
  return dict(seconds, batch=batch, frames=frames, size=size)


def memory_child(batch: int, frames: int, size: int, quick: bool,
                 recompute: bool, net: str = LITE.key) -> Dict[str, Any]:
  """Runs in the child process, after the task's process settings: one
  training step of the network `net` (a `NETWORKS` key); returns its peak
  RSS."""
  process_settings.apply(PROCESS_SETTINGS)
  threshold = os.environ.get(process_settings.MALLOC_MMAP_THRESHOLD)
  task = _task(batch, frames, size, quick, network(net),
               recompute_grad=recompute)
  model = task.build_model()
  step = _train_fn(task, model, network(net))
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
                      recompute: bool, net: str = LITE.key) -> str:
  """The `python -c` program of the memory child: prints 'RESULT {json}'."""
  return ('from official_ext.benchmarks import assemblenet, memory; '
          f'r = assemblenet.memory_child({batch}, {frames}, {size}, {quick}, '
          f'{recompute}, {net!r}); print(memory.result_line(r))')


def peak_rss_gb(batch: int, frames: int, size: int, quick: bool,
                recompute: bool = True, timeout: int = 3600,
                net: str = LITE.key) -> Dict[str, Any]:
  """Peak RSS of a training step of `net`, measured in a fresh subprocess
  (`memory_lib.run_child`, whose errors it raises)."""
  return memory_lib.run_child(
      memory_child_code(batch, frames, size, quick, recompute, net), timeout)


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

  def check(key, ready):
    imported = ready.get('official_ext', '')
    want = os.path.join(roots[key], 'official_ext') + os.sep
    if not os.path.abspath(imported).startswith(want):
      return (f'{key} child imported official_ext from {imported!r}, not '
              f'from {roots[key]}.')
    return None

  samples, _ = timing.interleaved_children(
      {key: (lambda key=key, root=root: make_child(root, batch, frames, size,
                                                   quick, key))
       for key, root in roots.items()},
      rounds or (2 if quick else 5), check)
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


def tf1_reference_speed(path: str, quick: bool,
                        rounds: Optional[int] = None,
                        make_ours: Optional[Callable[..., Any]] = None,
                        make_original: Optional[Callable[..., Any]] = None
                        ) -> Dict[str, Any]:
  """Our lite's training step (the checkout's, `_step_child`) and the original
  TF1 code's (`tf1_reference.child_code`, from `path`), each in a child, timed
  interleaved at the speed size: `tf1_reference.speed`'s figures plus the
  size, blocks per level and the original's root.

  Args:
    path: the original (`tf1_reference.original_root`).
    quick: quick sizes, one block per level in the original, our quick lite.
    rounds: interleaved rounds (default 2 quick, 5 full).
    make_ours, make_original: (batch, frames, size, ...) -> child, for tests
      (defaults: the `StepChild`s)."""
  root = tf1_lib.original_root(path)
  batch, frames, size = QUICK_SPEED if quick else FULL_SPEED
  blocks = tf1_lib.QUICK_BLOCKS if quick else tf1_lib.PUBLISHED_BLOCKS
  params = _params(batch, frames, size, quick)
  if not quick and tuple(params.task.model.backbone.get().blocks_per_level
                         ) != blocks:
    raise ValueError(f'our lite has blocks per level '
                     f'{params.task.model.backbone.get().blocks_per_level}, '
                     f'the original\'s published network {blocks}.')

  def ours():
    return (make_ours or _step_child)(checkout_root(), batch, frames, size,
                                      quick, 'train')

  def original():
    if make_original:
      return make_original(root, batch, frames, size, blocks)
    return memory_lib.StepChild(
        tf1_lib.child_code(root, batch, frames, size,
                           params.task.train_data.num_classes, blocks,
                           float(params.task.losses.l2_weight_decay)),
        'tf1_train', env=tf1_lib.child_env(PROCESS_SETTINGS))

  figures = tf1_lib.speed(ours, original, root,
                          rounds or (2 if quick else 5))
  figures.update(bench_size=f'{batch}x{frames}x{size}^2',
                 tf1_blocks_per_level=list(blocks), tf1_root=root)
  return figures


# The cases `run` measures ('model': the network's figures; 'input_pipeline':
# `assemblenet_input.run`, ours against Model Garden's video_input;
# 'networks': `NETWORKS` side by side; 'tf1_reference': the original TF1
# code beside ours alone, as the 'model' case also times it), and those a
# run without --cases measures.
CASES = ('model', 'input_pipeline', 'networks', 'tf1_reference')
DEFAULT_CASES = CASES[:3]
# The clip of the networks' per-clip FLOPs: the published input.
FLOPS_CLIP = (32, 224)  # frames, height = width


def run(quick: bool = False, memory: bool = True,
        reference: bool = True, inference: bool = True,
        reference_checkout: Optional[str] = None,
        cases: Optional[Sequence[str]] = None,
        step_figures: Optional[Dict[str, Any]] = None,
        networks: Optional[Sequence[str]] = None,
        tf1_reference: Optional[str] = None) -> Dict[str, Any]:
  """The figures of docs/benchmarks.md#assemblenetlite, flat, sizes included
  (the 'networks' case's under 'networks': `network_figures`).

  Args:
    quick: `QUICK_STRUCTURE`, 2 flow iterations, tiny sizes (smoke tests).
    memory: also run the peak-RSS children (minutes in the full run).
    reference: also time the original-width architecture.
    inference: also export the network and time its SavedModel.
    reference_checkout: another checkout whose training step is timed beside
      this one's (`reference_checkout_speed`).
    cases: which of `CASES` to measure (default `DEFAULT_CASES`; CLI
      `--cases`).
    step_figures: a recorded run's figures, for the input pipeline's
      cores-to-feed figure when the 'model' case is not run.
    networks: the 'networks' case's `NETWORKS` keys (default all).
    tf1_reference: the original TF1 code, whose lite training step is timed
      beside ours in the 'model' case (`tf1_reference_speed`; without it the
      figures say it was not measured).

  Raises:
    ValueError: a case not in `CASES` or a network not in `NETWORKS`,
      naming it."""
  cases = list(cases or DEFAULT_CASES)
  unknown = [c for c in cases if c not in CASES]
  if unknown:
    raise ValueError(f'--cases: unknown assemblenet case(s) {unknown}; the '
                     f'cases are {list(CASES)}.')
  nets = [network(k) for k in networks] if networks else list(NETWORKS)
  out: Dict[str, Any] = {'quick': quick}
  net_memory = None
  # The lite's peak RSS is the 'model' case's, when it runs.
  shared = LITE in nets and 'model' in cases
  if 'networks' in cases and memory:
    # Children first, while this process holds no model.
    net_memory = networks_peak_rss(
        quick, [n for n in nets if not (shared and n == LITE)])
  if 'tf1_reference' in cases and 'model' not in cases:
    if not tf1_reference:
      raise ValueError('--cases tf1_reference: give the original with '
                       '--tf1_reference=PATH.')
    out['tf1_reference'] = tf1_reference_speed(tf1_reference, quick)
  if 'model' in cases:
    out.update(_model_figures(quick, memory, reference, inference,
                              reference_checkout, tf1_reference))
  if 'input_pipeline' in cases:
    # The step rate of this run's figures, else of the recorded run.
    out.update(assemblenet_input.run(
        quick=quick, step_figures=out if 'model' in cases else step_figures))
  if 'networks' in cases:
    if net_memory is not None and shared:
      net_memory[LITE.key] = {'peak_rss_gb': out['peak_rss_gb_8x32x224'],
                              'peak_rss_step_sec': out['peak_rss_step_sec'],
                              'peak_rss_error': None}
    out['networks'] = network_figures(quick, nets, net_memory)
  return out


def networks_peak_rss(quick: bool, nets: Sequence[Network],
                      timeout: int = 3600) -> Dict[str, Dict[str, Any]]:
  """Peak RSS of each network's training step at the memory size with
  gradient checkpointing, each in a fresh child (`peak_rss_gb`): {key:
  {'peak_rss_gb', 'peak_rss_step_sec', 'peak_rss_error'}}; a child that
  fails, is killed (out of memory) or passes `timeout` seconds gives None
  figures and the reason, never a number."""
  mb, mf, ms = QUICK_MEMORY if quick else FULL_MEMORY
  out = {}
  for net in nets:
    try:
      mem = peak_rss_gb(mb, mf, ms, quick, recompute=True, timeout=timeout,
                        net=net.key)
      out[net.key] = {'peak_rss_gb': mem['peak_rss_gb'],
                      'peak_rss_step_sec': mem['step_sec'],
                      'peak_rss_error': None}
    except subprocess.TimeoutExpired:
      out[net.key] = {'peak_rss_gb': None, 'peak_rss_step_sec': None,
                      'peak_rss_error': f'memory child killed after its '
                                        f'timeout of {timeout} s'}
    except RuntimeError as e:  # `memory_lib.run_child`: exit code, stderr.
      out[net.key] = {'peak_rss_gb': None, 'peak_rss_step_sec': None,
                      'peak_rss_error': str(e)}
  return out


def network_figures(quick: bool, nets: Sequence[Network] = NETWORKS,
                    peak_rss: Optional[Dict[str, Dict[str, Any]]] = None
                    ) -> Dict[str, Any]:
  """The 'networks' case: each of `nets` on its experiment's config, its
  forward pass and training step timed interleaved with the others'.

  Args:
    quick: each network's `quick_backbone`, tiny sizes.
    nets: the networks.
    peak_rss: `networks_peak_rss`' figures (None: not measured).

  Returns:
    {'bench_size', 'flops_size', 'peak_rss_size', 'peak_rss_recompute_grad',
    'models': {key: {'network', 'experiment', 'backbone', 'parameters'
    (model.count_params()), 'trainable_parameters', 'gflops_per_clip' (the
    forward pass of one `FLOPS_CLIP` clip), 'gflops_per_clip_bench',
    'train_gflops_per_clip_bench', seconds, clips/s and achieved GFLOP/s of
    the forward pass and the training step at the speed size, and the
    `peak_rss` figures}}}."""
  batch, frames, size = QUICK_SPEED if quick else FULL_SPEED
  mb, mf, ms = QUICK_MEMORY if quick else FULL_MEMORY
  rows: Dict[str, Dict[str, Any]] = {}
  for net in nets:
    bench = clip_flops(frames, size, quick, training=True, net=net)
    rows[net.key] = {
        'network': net.title, 'experiment': net.experiment,
        'gflops_per_clip': clip_flops(*FLOPS_CLIP, quick,
                                      net=net)['forward'] / 1e9,
        'gflops_per_clip_bench': bench['forward'] / 1e9,
        'train_gflops_per_clip_bench': bench['train'] / 1e9}
  models: Dict[str, tf_keras.Model] = {}
  seconds = _timed(quick, {f'{n.key}/': (n, {}) for n in nets}, models)
  for net in nets:
    row, model = rows[net.key], models[f'{net.key}/']
    forward, train = (seconds[f'{net.key}/forward'],
                      seconds[f'{net.key}/train'])
    row.update(
        backbone=exp_factory.get_exp_config(
            net.experiment).task.model.backbone.type,
        parameters=int(model.count_params()),
        trainable_parameters=assemblenet_task.count_params(
            model.trainable_variables),
        forward_sec_per_batch=forward, train_sec_per_step=train,
        forward_clips_per_sec=batch / forward,
        train_clips_per_sec=batch / train,
        forward_model_gflops=row['gflops_per_clip_bench'] * batch / forward,
        train_model_gflops=row['train_gflops_per_clip_bench'] * batch / train)
    if peak_rss is not None:
      row.update(peak_rss[net.key])
  return {'bench_size': f'{batch}x{frames}x{size}^2',
          'flops_size': f'{FLOPS_CLIP[0]}x{FLOPS_CLIP[1]}^2',
          'peak_rss_size': f'{mb}x{mf}x{ms}^2',
          'peak_rss_recompute_grad': True, 'models': rows}


def _model_figures(quick: bool, memory: bool, reference: bool,
                   inference: bool, reference_checkout: Optional[str],
                   tf1_reference: Optional[str] = None) -> Dict[str, Any]:
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
  out['tf1_reference'] = (tf1_reference_speed(tf1_reference, quick)
                          if tf1_reference else dict(tf1_lib.NOT_MEASURED))
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
  out['train_conv3d_peak_fraction'] = (out['train_model_gflops'] /
                                       out['conv3d_peak_gflops'])
  if inference:
    inf = _inference(quick)
    ib = inf['batch']
    out['inference_size'] = f"{ib}x{inf['frames']}x{inf['size']}^2"
    out['inference_sec_per_batch'] = inf['sec']
    out['inference_clips_per_sec'] = ib / inf['sec']
    out['inference_stock_export_clips_per_sec'] = ib / inf['stock_sec']
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
  return out



NETWORKS_TITLE = 'AssembleNet-50 and AssembleNet++-50 beside the lite'
NETWORKS_INTRO = """\
From `--cases networks`: the full networks, each on its Charades experiment's model config (157
classes; AssembleNet-50: `assemblenet50_charades`, AssembleNet++-50 with peer attention and its
object stem over 151 object classes: `assemblenet_plus_charades`, fed random object maps of the
clip's size) beside the lite (`assemblenet_plus_lite_charades`), float32, one device. Parameters
are `model.count_params()` (batch-norm statistics included) and the trainable ones; forward GFLOP
per 32 × 224² clip as above ([how they are counted](#how-flops-are-counted)). The forward pass and
the training step (`AssembleNetTask.train_step`, each experiment's optimizer as above) of the three
networks are timed interleaved at the benchmark's clip size. Peak host RAM: a child process per
network runs one training step of 8 clips of 32 × 224² with gradient checkpointing, as the lite's
figure above (the lite's row is that figure when the run measured both); a child that failed or was
killed (out of memory, for one) has no figure, only its reason.
"""


def _failure(reason: str) -> str:
  """The first line of a child's failure, for a table's note."""
  return reason.strip().splitlines()[0].rstrip(':') if reason.strip() else (
      reason)


def networks_table(figures: Dict[str, Any]) -> str:
  """One markdown table of the 'networks' case (`network_figures`), one row
  a network in `NETWORKS` order, with a note under it for each peak-RSS
  child that gave no figure."""
  rows = [('network', 'experiment', 'parameters (trainable)',
           f"forward GFLOP per {figures['flops_size']} clip",
           f"forward clips/s, {figures['bench_size']}",
           'training step clips/s', 'forward GFLOP/s', 'training GFLOP/s',
           f"peak host RAM, {figures['peak_rss_size']} with checkpointing, "
           'GiB')]
  notes = []
  order = [n.key for n in NETWORKS]  # JSON files hold the keys sorted.
  models = figures['models']
  for key in sorted(models, key=lambda k: (
      order.index(k) if k in order else len(order), k)):
    f = models[key]
    if f.get('peak_rss_gb') is not None:
      peak = f"{f['peak_rss_gb']:.2f}"
    elif f.get('peak_rss_error'):
      peak = 'no figure (below)'
      notes.append(f"- {f['network']}: {_failure(f['peak_rss_error'])}")
    else:
      peak = 'not measured'
    rows.append((
        f['network'], f"`{f['experiment']}`",
        f"{f['parameters']:,} ({f['trainable_parameters']:,})",
        f"{f['gflops_per_clip']:.1f}", f"{f['forward_clips_per_sec']:.3f}",
        f"{f['train_clips_per_sec']:.3f}", f"{f['forward_model_gflops']:.1f}",
        f"{f['train_model_gflops']:.1f}", peak))
  text = timing.format_table(rows)
  if notes:
    text += ('\n\nPeak host RAM not measured (the child\'s failure; the '
             'whole reason is in the results JSON):\n\n' + '\n'.join(notes))
  return text


def subsections(figures: Dict[str, Any]
                ) -> List[Tuple[str, str, str, Optional[str]]]:
  """(case, title, intro, table) of the report's subsections: the
  'networks' case, its table None where `figures` holds no such run."""
  recorded = figures.get('networks')
  return [('networks', NETWORKS_TITLE, NETWORKS_INTRO,
           networks_table(recorded) if recorded else None)]
