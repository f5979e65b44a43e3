"""The original TF1 AssembleNet++lite (google-research `assemblenet/`, which the
package cannot ship) timed as it trains, beside ours, each in a child process:
`python -m official_ext.benchmark assemblenet --tf1_reference=PATH`
(docs/benchmarks.md#assemblenetlite)."""
import os
import statistics
from typing import Any, Callable, Dict, Optional, Sequence

from official_ext.benchmarks import memory as memory_lib
from official_ext.benchmarks import timing

# The original's files the child imports (`assemblenet/` under the path).
ORIGINAL_FILES = ('run_asn.py', 'model_structures.py',
                  'assemblenet_plus_lite.py', 'rep_flow_2d_layer.py')
# The published lite network's blocks per level, as run_asn.py builds it.
PUBLISHED_BLOCKS = (3, 5, 11, 7)
QUICK_BLOCKS = (1, 1, 1, 1)


def original_root(path: str) -> str:
  """The folder holding the original's `assemblenet/` package: `path`, or its
  parent where `path` is `assemblenet/` itself.

  Raises:
    ValueError: no such package at either, naming the files looked for."""
  path = os.path.abspath(os.path.expanduser(path))
  for root in (path, os.path.dirname(path)):
    if all(os.path.isfile(os.path.join(root, 'assemblenet', f))
           for f in ORIGINAL_FILES):
      return root
  raise ValueError(
      f'--tf1_reference={path}: no original assemblenet/ there (looked for '
      f'{", ".join(ORIGINAL_FILES)} in {os.path.join(path, "assemblenet")} '
      f'and in {path}); give the google-research folder holding '
      'assemblenet/, or assemblenet/ itself.')


def child_code(root: str, batch: int, frames: int, size: int,
               num_classes: int, blocks: Sequence[int],
               l2_weight_decay: float, learning_rate: float = 1e-3,
               momentum: float = 0.9, seed: int = 0) -> str:
  """The `python -c` program of a `memory_lib.StepChild` training the
  original's AssembleNet++lite (peer attention, its published structure and
  edge weights, `blocks` per level) as TF1 code: a graph and a Session, the
  clip and labels constants in the graph, mean sigmoid cross-entropy plus
  `l2_weight_decay` * l2_loss of every kernel, `tf.compat.v1.train.
  MomentumOptimizer` after the batch-norm updates. READY after one step."""
  memory_py = os.path.abspath(memory_lib.__file__)
  return f'''
import importlib.util, json, os, sys
os.environ['TF_USE_LEGACY_KERAS'] = '1'  # compat.v1 layers: tf_keras' legacy
spec = importlib.util.spec_from_file_location('_benchmark_children', {memory_py!r})
children = importlib.util.module_from_spec(spec)
spec.loader.exec_module(children)

def build():
  sys.path.insert(0, {root!r})
  import numpy as np
  import tensorflow.compat.v1 as tf
  tf.disable_v2_behavior()
  from absl import flags
  from assemblenet import run_asn  # defines the flags the model reads
  from assemblenet import assemblenet_plus_lite as lite
  from assemblenet import model_structures
  FLAGS = flags.FLAGS
  FLAGS(['tf1_reference'])
  FLAGS.model_structure = json.dumps(model_structures.asnp_lite_structure)
  FLAGS.model_edge_weights = json.dumps(
      model_structures.asnp_lite_structure_weights)
  FLAGS.attention_mode = 'peer'
  FLAGS.num_frames = {frames}
  FLAGS.num_classes = {num_classes}
  rng = np.random.RandomState({seed})
  tf.set_random_seed({seed})
  clip = tf.constant(rng.uniform(0, 1, ({batch}, {frames}, {size}, {size}, 3)
                                 ).astype(np.float32))
  labels = tf.constant((rng.uniform(size=({batch}, {num_classes})) < 0.05
                        ).astype(np.float32))
  network = lite.assemblenet_plus_lite(num_layers={list(blocks)!r},
                                       num_classes={num_classes},
                                       data_format='channels_last')
  logits = network(clip, True)
  loss = tf.reduce_mean(tf.nn.sigmoid_cross_entropy_with_logits(
      labels=labels, logits=tf.cast(logits, tf.float32)))
  kernels = [v for v in tf.trainable_variables()
             if v.op.name.endswith('kernel')]
  if {l2_weight_decay!r} and kernels:
    loss += {l2_weight_decay!r} * tf.add_n([tf.nn.l2_loss(v) for v in kernels])
  optimizer = tf.train.MomentumOptimizer({learning_rate!r}, {momentum!r})
  with tf.control_dependencies(tf.get_collection(tf.GraphKeys.UPDATE_OPS)):
    train_op = optimizer.minimize(loss)
  sess = tf.Session()
  sess.run(tf.global_variables_initializer())
  first = float(sess.run([train_op, loss])[1])
  step = lambda: {{'loss': float(sess.run([train_op, loss])[1])}}
  return step, {{'assemblenet': lite.__file__, 'first_loss': first,
                'trainable_parameters': int(sum(
                    np.prod(v.shape.as_list())
                    for v in tf.trainable_variables()))}}

children.step_child_loop(build)
'''


def child_env(process_settings: Dict[str, str]) -> Dict[str, Optional[str]]:
  """The original's child's `StepChild` env: the process settings this
  benchmark set for our training (`process_settings`, where the environment
  holds their values) removed, as the original trains without them."""
  return {variable: None for variable, value in process_settings.items()
          if os.environ.get(variable) == value}


def speed(ours: Callable[[], Any], original: Callable[[], Any], root: str,
          rounds: int) -> Dict[str, Any]:
  """Our and the original's children (`StepChild`s, or fakes with
  `wait_ready`, `step`, `close`, made by `ours()` and `original()`) timed
  interleaved, closed after: medians, samples, the original's first loss and
  trainable parameters, and 'train_speedup_vs_tf1' (original / ours).

  Raises:
    ValueError: the original's child imported `assemblenet` from elsewhere
      than `root` (its READY 'assemblenet')."""
  def check(name, ready):
    imported = os.path.abspath(ready.get('assemblenet', ''))
    if name == 'tf1_train' and not imported.startswith(
        os.path.join(root, 'assemblenet') + os.sep):
      return (f'the TF1 child imported assemblenet from {imported!r}, not '
              f'from {root}.')
    return None

  samples, ready = timing.interleaved_children(
      {'train': ours, 'tf1_train': original}, rounds, check)
  median = {k: statistics.median(v) for k, v in samples.items()}
  return {'measured': True,
          'train_sec_per_step': median['train'],
          'tf1_train_sec_per_step': median['tf1_train'],
          'train_samples': samples['train'],
          'tf1_train_samples': samples['tf1_train'],
          'train_speedup_vs_tf1': median['tf1_train'] / median['train'],
          'tf1_first_loss': ready['tf1_train'].get('first_loss'),
          'tf1_trainable_parameters': ready['tf1_train'].get(
              'trainable_parameters')}


NOT_MEASURED = {
    'measured': False,
    'why': 'the original TF1 code was not given (--tf1_reference=PATH, the '
           'google-research folder holding assemblenet/)'}

