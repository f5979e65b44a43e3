"""core.tf_internals: TensorFlow's private APIs, each behind a version check."""
import types

import pytest
import tensorflow as tf, tf_keras

from official_ext.core import experiment_params
from official_ext.core import tf_internals

# Each accessor and the private module it uses.
ACCESSORS = {
    'tensorflow.python.eager.record': [
        lambda: tf_internals.should_record_backprop([tf.constant(1.0)]),
        tf_internals.stop_recording],
    'tensorflow.python.ops.control_flow_util': [
        lambda: tf_internals.in_xla_context(tf.Graph())],
    'tensorflow.python.util._pywrap_util_port': [
        tf_internals.onednn_cpu_kernels],
    'tensorflow.python.eager.context': [tf_internals.eager_runtime_started],
    'tensorflow.python.training.checkpoint_state_pb2': [
        tf_internals.checkpoint_state],
    'tensorflow.core.protobuf.trackable_object_graph_pb2': [
        tf_internals.trackable_object_graph],
    'tensorflow.lite.python.convert_phase': [
        tf_internals.tflite_converter_error],
    'tensorflow.python.autograph.core.config': [
        tf_internals.exclude_from_autograph,
        tf_internals.excluded_from_autograph],
    'tf_keras OptimizerV2._create_all_weights': [
        lambda: tf_internals.create_optimizer_weights(
            tf_keras.optimizers.legacy.Adam(), [tf.Variable(1.0)])],
}
_CASES = [(api, f) for api, fs in ACCESSORS.items() for f in fs]


def test_the_tested_version_is_this_one():
  assert tf.__version__.startswith(tf_internals.TESTED_VERSION + '.')
  for version in ('2.20', '2.20.0', '2.20.1rc0'):
    tf_internals.check_version('x', version)


def test_each_private_api_works_on_the_tested_version(tmp_path):
  with tf.GradientTape() as tape:
    x = tf.constant(1.0)
    tape.watch(x)
    assert tf_internals.should_record_backprop([x])
    with tf_internals.stop_recording():
      assert not tf_internals.should_record_backprop([x])
  assert not tf_internals.should_record_backprop([tf.constant(1.0)])

  assert not tf_internals.in_xla_context(tf.Graph())
  seen = []

  @tf.function(jit_compile=True)
  def compiled(v):
    seen.append(tf_internals.in_xla_context(tf.compat.v1.get_default_graph()))
    return v + 1

  compiled(tf.constant(1.0))
  assert seen == [True]

  assert isinstance(tf_internals.onednn_cpu_kernels(), bool)
  tf.constant(1.0).numpy()
  assert tf_internals.eager_runtime_started()

  state = tf_internals.checkpoint_state()
  state.model_checkpoint_path = 'ckpt-3'
  assert 'model_checkpoint_path: "ckpt-3"' in str(state)

  checkpoint = tf.train.Checkpoint(v=tf.Variable(1.0))
  graph = tf_internals.trackable_object_graph()
  reader = tf.train.load_checkpoint(checkpoint.write(str(tmp_path / 'ckpt')))
  graph.ParseFromString(reader.get_tensor('_CHECKPOINTABLE_OBJECT_GRAPH'))
  assert any(c.local_name == 'v' for n in graph.nodes for c in n.children)

  variable = tf.Variable([1.0, 2.0])
  for optimizer in (tf_keras.optimizers.legacy.Adam(),
                    tf_keras.mixed_precision.LossScaleOptimizer(
                        tf_keras.optimizers.legacy.Adam()),
                    tf_keras.optimizers.Adam()):
    assert tf_internals.create_optimizer_weights(optimizer, [variable])
    inner = getattr(optimizer, 'inner_optimizer', optimizer)
    assert len(inner.variables()) >= 3, inner.variables()  # m, v, step.

  error = tf_internals.tflite_converter_error()
  assert issubclass(error, Exception) and error.__name__ == 'ConverterError'


@pytest.mark.parametrize('api,accessor', _CASES,
                         ids=[f'{api}-{i}' for i, (api, _) in
                              enumerate(_CASES)])
def test_an_untested_version_fails_naming_it_and_the_api(
    monkeypatch, api, accessor):
  monkeypatch.setattr(tf, '__version__', '2.21.0')
  with pytest.raises(tf_internals.UntestedTensorFlowError) as raised:
    accessor()
  message = str(raised.value)
  assert f'private API {api}, tested with TensorFlow 2.20.x only' in message
  assert 'this is TensorFlow 2.21.0' in message
  assert 'tensorflow~=2.20.0' in message


def _magnitude(x):
  if x < 0:  # Python control flow on a tensor: AutoGraph's to convert.
    return -x
  return x


def _called_in_a_function(module: str) -> float:
  """`_magnitude` as a function of `module`, called by a `tf.function` (as a
  task's step is called by Orbit's training loop)."""
  fn = types.FunctionType(_magnitude.__code__, _magnitude.__globals__)
  fn.__module__ = module
  return float(tf.function(lambda x: fn(x))(tf.constant(-2.0)))  # pylint: disable=unnecessary-lambda


@pytest.mark.parametrize('how', ['registry_imports', 'load_params'])
def test_autograph_leaves_the_package_as_written(how, monkeypatch):
  """Once `registry_imports` is imported or an experiment loaded (every
  command's config), AutoGraph converts no function of the package, as it
  converts none of TensorFlow's or Keras': a Python `if` on a tensor there
  fails when traced, where the same function in another package is
  converted."""
  from official_ext import registry_imports  # pylint: disable=g-import-not-at-top,unused-import
  from tensorflow.python.autograph.core import config  # pylint: disable=g-import-not-at-top
  assert tf_internals.excluded_from_autograph()
  if how == 'load_params':  # As before either.
    monkeypatch.setattr(config, 'CONVERSION_RULES', tuple(
        r for r in config.CONVERSION_RULES if not r.matches('official_ext')))
    assert _called_in_a_function('official_ext.registry_imports') == 2.0
    experiment_params.load_params('yt8m_demo', lock=False)
  assert _called_in_a_function(__name__) == 2.0
  with pytest.raises(TypeError, match='tf.Tensor` as a Python `bool`'):
    _called_in_a_function('official_ext.registry_imports')
