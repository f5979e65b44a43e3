"""TensorFlow's private APIs this package uses, behind one version check
(`UntestedTensorFlowError` on another TensorFlow than `TESTED_VERSION`)."""
import importlib
from typing import Any, ContextManager, Optional, Sequence

# The TensorFlow release (major.minor) whose private APIs this module was
# tested with; setup.py pins `tensorflow~=2.20.0`.
TESTED_VERSION = '2.20'


class UntestedTensorFlowError(RuntimeError):
  """The running TensorFlow is not the version a private API was tested with."""


def check_version(api: str, version: Optional[str] = None) -> None:
  """`UntestedTensorFlowError` unless TensorFlow is `TESTED_VERSION`.x."""
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
  """Whether TensorFlow runs its oneDNN CPU kernels (without starting it)."""
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
  """Creates `optimizer`'s slots for `variables` now (False: unknown kind)."""
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
  """A While op's {'body', 'cond'} or an If op's {'then', 'else'} graphs."""
  if op.type not in _CONTROL_FLOW_GRAPHS:
    return {}
  check_version('Operation._body_graph (while_v2, cond_v2)')
  graphs = {key: getattr(op, attr, None)
            for key, attr in _CONTROL_FLOW_GRAPHS[op.type]}
  return graphs if all(g is not None for g in graphs.values()) else {}


_PACKAGE = __name__.split('.')[0]


def excluded_from_autograph(package: str = _PACKAGE) -> bool:
  """Whether AutoGraph leaves the functions of `package` as written."""
  config = _private('tensorflow.python.autograph.core.config')
  return any(isinstance(rule, config.DoNotConvert) and rule.matches(package)
             for rule in config.CONVERSION_RULES)


def exclude_from_autograph(package: str = _PACKAGE) -> None:
  """AutoGraph leaves the functions of `package` (default: this one) as
  written, as it does TensorFlow's and Keras', so their tensor control flow
  must be explicit (`tf.cond`, `tf.while_loop`); a second call changes
  nothing."""
  if not excluded_from_autograph(package):
    config = _private('tensorflow.python.autograph.core.config')
    config.CONVERSION_RULES = (
        (config.DoNotConvert(package),) + tuple(config.CONVERSION_RULES))
