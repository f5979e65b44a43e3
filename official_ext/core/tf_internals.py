"""TensorFlow's private APIs this package uses, behind one version check.

TensorFlow has no public equivalent of what this module gives; everything
else in the package uses TensorFlow's public API only (`tf.*`), and
`tests/core/test_layering.py` checks that no other module imports from inside
`tensorflow`. A private API may change or go in any release, so each use is
checked against the TensorFlow version it was tested with
(`TESTED_VERSION`): on another version it raises `UntestedTensorFlowError`
naming the version found, the version tested and the private API, instead of
failing somewhere inside TensorFlow, or computing something else.

The private APIs, and who uses them:

* `tensorflow.python.eager.record` (`should_record_backprop`,
  `stop_recording`): whether a tape watches a tensor, and a context in which
  no tape records; `tf.recompute_grad`'s own helpers, used by AssembleNet's
  `recompute.recompute_grad`.
* `tensorflow.python.ops.control_flow_util` (`in_xla_context`): whether a
  graph is compiled by XLA (which ignores control dependencies);
  `recompute.recompute_grad`.
* `tensorflow.python.util._pywrap_util_port` (`onednn_cpu_kernels`): whether
  TensorFlow runs its oneDNN CPU kernels (what TensorFlow's own
  `test_util.IsMklEnabled` reads); `core.kernels.kernel_policy`.
* `tensorflow.python.eager.context` (`eager_runtime_started`): whether the
  eager runtime has started in this process; `core.kernels.process_settings`.
* `tensorflow.python.training.checkpoint_state_pb2` (`checkpoint_state`):
  the message of a model_dir's `checkpoint` state file, read strictly by
  `core.checkpoints`.
* `tensorflow.core.protobuf.trackable_object_graph_pb2`
  (`trackable_object_graph`): the object graph a checkpoint stores, read by
  `assemblenet.derive_structure`.
* `tensorflow.lite.python.convert_phase` (`tflite_converter_error`): the
  error class of the TFLite converter, whose list of unsupported ops
  `official_ext.export_tflite` reports.
* tf_keras's legacy optimizers' `_create_all_weights`
  (`create_optimizer_weights`): an optimizer's slots made before the first
  training step is traced (`core.run.trainer`); tf_keras's newer optimizers
  have the public `build` for it.

* the `_body_graph` / `_cond_graph` and `_true_graph` / `_false_graph`
  attributes that `while_v2` and `cond_v2` set on the While and If ops they
  build (`control_flow_graphs`): the traced graphs of a loop's body and a
  conditional's branches, with their static shapes; the FLOP count of
  `benchmarks/graph_flops.py`.

Nothing is imported from TensorFlow when this module is imported: each
function checks the version, then imports what it needs.
"""
import importlib
from typing import Any, ContextManager, Optional, Sequence

# The TensorFlow release (major.minor) whose private APIs this module was
# tested with; setup.py pins `tensorflow~=2.20.0`.
TESTED_VERSION = '2.20'


class UntestedTensorFlowError(RuntimeError):
  """The running TensorFlow is not the version a private API was tested with."""


def check_version(api: str, version: Optional[str] = None) -> None:
  """Raises unless TensorFlow `version` is `TESTED_VERSION`.x.

  Args:
    api: the private API about to be used (named in the error).
    version: a TensorFlow version; None: the running one (`tf.__version__`).

  Raises:
    UntestedTensorFlowError: naming `version`, `TESTED_VERSION` and `api`.
  """
  if version is None:
    import tensorflow as tf  # pylint: disable=g-import-not-at-top
    version = tf.__version__
  if version == TESTED_VERSION or version.startswith(TESTED_VERSION + '.'):
    return
  raise UntestedTensorFlowError(
      f'official_ext uses TensorFlow\'s private API {api}, tested with '
      f'TensorFlow {TESTED_VERSION}.x only; this is TensorFlow {version}. '
      f'Install tensorflow~={TESTED_VERSION}.0 (as setup.py pins it), or '
      f'check {api} in TensorFlow {version} and then raise TESTED_VERSION in '
      'official_ext/core/tf_internals.py.')


def _private(module: str) -> Any:
  """Imports TensorFlow's private `module` once the version is checked."""
  check_version(module)
  return importlib.import_module(module)


def should_record_backprop(tensors: Sequence[Any]) -> bool:
  """Whether a gradient tape watches any of `tensors` (eager or in a graph)."""
  record = _private('tensorflow.python.eager.record')
  return record.should_record_backprop(tensors)


def stop_recording() -> ContextManager[None]:
  """A context in which no gradient tape records the ops run."""
  return _private('tensorflow.python.eager.record').stop_recording()


def in_xla_context(graph: Any) -> bool:
  """Whether `graph` (or a graph it is nested in) is compiled by XLA."""
  control_flow_util = _private('tensorflow.python.ops.control_flow_util')
  return bool(control_flow_util.GraphOrParentsInXlaContext(graph))


def onednn_cpu_kernels() -> bool:
  """Whether TensorFlow runs its oneDNN (MKL) CPU kernels in this process.

  Does not start TensorFlow's runtime.
  """
  util_port = _private('tensorflow.python.util._pywrap_util_port')
  return bool(util_port.IsMklEnabled())


def eager_runtime_started() -> bool:
  """Whether TensorFlow's eager runtime has started in this process."""
  context = _private('tensorflow.python.eager.context')
  return context.context()._context_handle is not None  # pylint: disable=protected-access


def checkpoint_state() -> Any:
  """A new, empty `CheckpointState` message (a `checkpoint` state file)."""
  return _private(
      'tensorflow.python.training.checkpoint_state_pb2').CheckpointState()


def trackable_object_graph() -> Any:
  """A new, empty `TrackableObjectGraph` message (a checkpoint's objects)."""
  return _private('tensorflow.core.protobuf.trackable_object_graph_pb2'
                  ).TrackableObjectGraph()


def tflite_converter_error() -> type:
  """The exception class `tf.lite.TFLiteConverter.convert` raises."""
  return _private('tensorflow.lite.python.convert_phase').ConverterError


def create_optimizer_weights(optimizer: Any, variables: Sequence[Any]) -> bool:
  """Creates `optimizer`'s slots (and step counter) for `variables` now.

  What the optimizer's first `apply_gradients` would create. Made before a
  `tf.function` first runs the training step, that trace creates no
  variable, and TensorFlow traces it once instead of twice (a function
  that creates variables on its first call is traced again without them).
  Wrappers with an `inner_optimizer` (tf_keras's `LossScaleOptimizer`) are
  unwrapped: their own variables exist from construction.

  Args:
    optimizer: a tf_keras optimizer (legacy or not).
    variables: the variables it will update.

  Returns:
    Whether the weights were created (False for an optimizer of another
    kind, which then creates them in its first step as before).
  """
  while hasattr(optimizer, 'inner_optimizer'):
    optimizer = optimizer.inner_optimizer
  if hasattr(optimizer, 'build') and callable(optimizer.build):
    optimizer.build(list(variables))
    return True
  if not hasattr(optimizer, '_create_all_weights'):
    return False
  check_version('tf_keras OptimizerV2._create_all_weights')
  optimizer._create_all_weights(list(variables))  # pylint: disable=protected-access
  return True


# Where `while_v2` / `cond_v2` keep the graphs of the ops they build.
_CONTROL_FLOW_GRAPHS = {
    'While': (('body', '_body_graph'), ('cond', '_cond_graph')),
    'StatelessWhile': (('body', '_body_graph'), ('cond', '_cond_graph')),
    'If': (('then', '_true_graph'), ('else', '_false_graph')),
    'StatelessIf': (('then', '_true_graph'), ('else', '_false_graph')),
}


def control_flow_graphs(op: Any) -> dict:
  """The traced graphs of a While op's body and condition ({'body', 'cond'})
  or of an If op's branches ({'then', 'else'}), as `tf.while_loop` and
  `tf.cond` built them in this process; {} for another op, or one whose
  graphs are not kept (e.g. a loaded graph)."""
  if op.type not in _CONTROL_FLOW_GRAPHS:
    return {}
  check_version('Operation._body_graph (while_v2, cond_v2)')
  graphs = {key: getattr(op, attr, None)
            for key, attr in _CONTROL_FLOW_GRAPHS[op.type]}
  return graphs if all(g is not None for g in graphs.values()) else {}
