"""Shared pytest setup: quiet TensorFlow, two logical CPU devices."""
import os

os.environ.setdefault('TF_CPP_MIN_LOG_LEVEL', '2')
# Under pytest-xdist each worker process gets one thread for an op's own
# parallelism (TensorFlow reads the variable when it starts; child processes
# inherit it): workers with TensorFlow's default of one per core each
# oversubscribe the cores. Ops still run concurrently (inter-op threads
# unchanged).
if int(os.environ.get('PYTEST_XDIST_WORKER_COUNT', '1')) > 1:
  os.environ.setdefault('TF_NUM_INTRAOP_THREADS', '1')

# XLA's CPU backend compiles without LLVM's optimisations: the suite checks
# what the compiled steps compute (IEEE semantics are the same at every
# level; XLA's own HLO passes still run), not how fast they run, and the
# compiles (the TPU YAMLs' whole steps, YT8M's jit_compile step, AssembleNet's
# representation flow and its training clips' post-processing) cost less.
# Benchmarks run outside pytest, with XLA's default.
os.environ.setdefault('XLA_FLAGS', '--xla_backend_optimization_level=0')

import tensorflow as tf  # pylint: disable=g-import-not-at-top

# Two logical CPU devices let tests run MirroredStrategy with 2 replicas.
# This must happen before TensorFlow initializes its devices.
_cpus = tf.config.list_physical_devices('CPU')
try:
  tf.config.set_logical_device_configuration(
      _cpus[0], [tf.config.LogicalDeviceConfiguration(),
                 tf.config.LogicalDeviceConfiguration()])
except RuntimeError:  # Already initialized (should not happen under pytest).
  pass

# Grappler, TensorFlow's graph optimizer, does not run on the functions the
# tests trace: its passes (constant folding, op fusion, layout, pruning)
# keep what a graph computes and only change how fast it runs, and on the
# tests' tiny steps optimizing each new graph costs more than it saves.
# Processes the tests start (the training CLI, workers, `saved_model_cli`)
# and the benchmarks run from the command line keep it.
tf.config.optimizer.set_experimental_options({'disable_meta_optimizer': True})

# Every experiment registered, and AutoGraph leaving the package's functions
# as written, as in the commands (docs/architecture.md#autograph).
from official_ext import registry_imports  # pylint: disable=g-import-not-at-top,unused-import,g-bad-import-order

# Model Garden's configs look up their fields' types with
# `typing.get_type_hints` each time they set a field
# (`base_config.Config._get_annotations`), most of what building a config
# costs, and the tests build thousands. A class's fields do not change once
# it is defined: the tests keep each class's, which changes no value.
from official.modeling.hyperparams import base_config  # pylint: disable=g-import-not-at-top,g-bad-import-order

_ANNOTATIONS = {}
_get_annotations = base_config.Config._get_annotations.__func__  # pylint: disable=protected-access


def _kept_annotations(cls):
  if cls not in _ANNOTATIONS:
    _ANNOTATIONS[cls] = _get_annotations(cls)
  return dict(_ANNOTATIONS[cls])


base_config.Config._get_annotations = classmethod(_kept_annotations)  # pylint: disable=protected-access

import gc  # pylint: disable=g-import-not-at-top,g-bad-import-order
import itertools  # pylint: disable=g-import-not-at-top,g-bad-import-order

import pytest  # pylint: disable=g-import-not-at-top,g-bad-import-order

_KEY_BASES = itertools.count(start=7000, step=1000)

# Python's cyclic garbage collector: TensorFlow's and Keras' import-time
# objects (millions) are moved out of its reach (`gc.freeze`), and it runs
# less often while tests trace graphs (which allocate many short-lived
# objects). Each test module's garbage is still collected after it
# (`_release_module_state`).
gc.collect()
gc.freeze()
gc.set_threshold(50_000, 20, 20)


def make_mirrored() -> tf.distribute.MirroredStrategy:
  """A fresh 2-replica MirroredStrategy over the two logical CPUs.

  Every MirroredStrategy in a process starts its collective group and
  instance keys at the same values, so a second strategy can collide with a
  first one's collectives ("Shape mismatch in the collective instance").
  `_collective_key_base` ("only set this in tests", TensorFlow) gives each
  strategy made here its own key range.
  """
  cls = type('MirroredStrategyForTest', (tf.distribute.MirroredStrategy,),
             {'_collective_key_base': next(_KEY_BASES)})
  return cls(['/cpu:0', '/cpu:1'])


@pytest.fixture
def mirrored():
  return make_mirrored()


@pytest.fixture(scope='session')
def demo_cache(tmp_path_factory):
  """One folder for the generated demo data of every tiny run made from a
  shipped YAML (tests/shipped_configs.py; keyed by its parameters, so each
  data set is generated once per process) and the small YAMLs around it."""
  return tmp_path_factory.mktemp('demo_cache')


def release_state() -> None:
  """Keras' global state reset, and everything the tests so far left is
  frozen (`gc.freeze`) instead of collected: later collections do not walk
  it again, and its `tf.data` iterators are never destroyed. Destroying one
  (a training run's input, distributed over replicas) can block the process
  for tens of seconds with the CPU idle (`RootDataset::Iterator::~Iterator`
  waiting for its pool's threads)."""
  import tf_keras  # pylint: disable=g-import-not-at-top
  tf_keras.backend.clear_session()
  gc.freeze()


@pytest.fixture(scope='module', autouse=True)
def _release_module_state():
  """After each test module: `release_state` (after each test, in modules
  whose every test trains a model of its own)."""
  yield
  release_state()
