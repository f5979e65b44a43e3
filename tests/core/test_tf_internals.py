"""core.tf_internals: TensorFlow's private APIs, each behind a version check."""
import pytest
import tensorflow as tf, tf_keras

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
