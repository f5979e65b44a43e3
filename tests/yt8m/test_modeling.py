"""YT8M model: shapes, masking, the MoE output gate, config round trips."""
import numpy as np
import pytest
import tensorflow as tf, tf_keras

from official_ext.core.kernels import kernel_policy
from official_ext.yt8m import configs
from official_ext.yt8m.modeling import heads
from official_ext.yt8m.modeling import model as yt8m_model

FEATURES = 12
CPU = kernel_policy.resolve('auto', 'CPU')
CLASSES = 7


def _model_config(pooling='average', **moe):
  c = configs.VideoClassificationModel()
  c.backbone.dbof.cluster_size = 16
  c.backbone.dbof.hidden_size = 8
  c.backbone.dbof.pooling_method = pooling
  c.head.moe.num_mixtures = 2
  c.head.moe.override(moe)
  return c


@pytest.mark.parametrize('pooling', ['average', 'max', 'swap', 'none'])
@pytest.mark.parametrize('num_sample_frames', [None, 16, 32])
def test_shapes_every_pooling(pooling, num_sample_frames):
  frames = num_sample_frames or 40  # None: padded to max_frames (40 here).
  model = yt8m_model.build_model(_model_config(pooling), CLASSES, FEATURES)
  inputs = tf.random.uniform([3, frames, FEATURES])
  num_frames = None if num_sample_frames else tf.constant([1, 40, 17])
  out = model(inputs, num_frames=num_frames, training=True)
  assert out['predictions'].shape == (3, CLASSES)
  assert out['predictions'].dtype == tf.float32
  p = out['predictions'].numpy()
  assert np.all((p >= 0) & (p <= 1))
  if pooling == 'none':
    assert out['frame_predictions'].shape == (3, frames, CLASSES)


@pytest.mark.parametrize('pooling', ['average', 'max', 'swap', 'none'])
def test_padding_frames_do_not_change_predictions(pooling):
  model = yt8m_model.build_model(_model_config(pooling), CLASSES, FEATURES)
  rng = np.random.default_rng(0)
  valid = rng.normal(size=[2, 5, FEATURES]).astype(np.float32)
  pad_zero = np.concatenate([valid, np.zeros([2, 3, FEATURES], np.float32)], 1)
  pad_junk = np.concatenate(
      [valid, 100 * rng.normal(size=[2, 3, FEATURES]).astype(np.float32)], 1)
  num_frames = tf.constant([5, 5])
  a = model(pad_zero, num_frames=num_frames, training=False)['predictions']
  b = model(pad_junk, num_frames=num_frames, training=False)['predictions']
  c = model(valid, num_frames=None, training=False)['predictions']
  np.testing.assert_allclose(a, b, atol=1e-6)
  np.testing.assert_allclose(a, c, atol=1e-6)


@pytest.mark.parametrize('pooling', ['average', 'max', 'swap', 'none'])
def test_non_finite_padding_frames_are_ignored(pooling):
  # Padding was masked by multiplying (NaN * 0 = NaN): a NaN or Inf in a
  # frame past num_frames made every probability of its video NaN (and, in
  # training, the masked batch-norm moments of the whole batch).
  model = yt8m_model.build_model(_model_config(pooling), CLASSES, FEATURES)
  rng = np.random.default_rng(2)
  zero = np.concatenate([rng.normal(size=[3, 4, FEATURES]),
                         np.zeros([3, 3, FEATURES])], 1).astype(np.float32)
  bad = zero.copy()
  bad[0, 4:] = np.nan
  bad[1, 5, 2] = np.inf
  bad[2, 6, :3] = [-np.inf, np.nan, 1e38]
  num_frames = tf.constant([4, 4, 4])
  for training in (False, True):
    a = model(zero, num_frames=num_frames, training=training)['predictions']
    b = model(bad, num_frames=num_frames, training=training)['predictions']
    assert np.isfinite(b.numpy()).all(), (training, b.numpy())
    np.testing.assert_allclose(a, b, atol=1e-6, err_msg=f'{training}')


def test_masked_batch_norm_statistics_ignore_padding():
  model = yt8m_model.build_model(_model_config(), CLASSES, FEATURES)
  rng = np.random.default_rng(1)
  valid = rng.normal(size=[2, 4, FEATURES]).astype(np.float32)
  junk = np.concatenate(
      [valid, 50 * rng.normal(size=[2, 6, FEATURES]).astype(np.float32)], 1)
  a = model(valid, num_frames=tf.constant([4, 4]), training=True)
  b = model(junk, num_frames=tf.constant([4, 4]), training=True)
  np.testing.assert_allclose(a['predictions'], b['predictions'], atol=1e-5)


def test_moe_output_context_gate_is_applied():
  """Regression: Model Garden 2.20 builds the output gate and drops it."""
  head = heads.MoeHead(num_classes=CLASSES, num_mixtures=2,
                       use_output_context_gate=True)
  plain = heads.MoeHead(num_classes=CLASSES, num_mixtures=2)
  x = tf.random.normal([4, 6], seed=3)
  gated = head(x, training=False)['predictions']
  plain(x)
  for src, dst in zip([head._gate_dense, head._expert_dense],
                      [plain._gate_dense, plain._expert_dense]):
    dst.set_weights(src.get_weights())
  ungated = plain(x, training=False)['predictions'].numpy()
  gate = head._output_context_gate
  kernel = gate._gates.kernel.numpy()
  bn = gate._gates_norm
  logits = ungated @ kernel
  logits = ((logits - bn.moving_mean.numpy())
            / np.sqrt(bn.moving_variance.numpy() + bn.epsilon)
            * bn.gamma.numpy() + bn.beta.numpy())
  expected = ungated / (1 + np.exp(-logits))
  np.testing.assert_allclose(gated, expected, rtol=1e-5, atol=1e-6)
  assert not np.allclose(gated, ungated, atol=1e-3)
  # Changing the gate's weights changes the output.
  gate._gates.kernel.assign(gate._gates.kernel + 1.0)
  assert not np.allclose(head(x, training=False)['predictions'], gated)


def test_moe_vocab_as_last_dim_same_math():
  a = heads.MoeHead(num_classes=CLASSES, num_mixtures=3)
  b = heads.MoeHead(num_classes=CLASSES, num_mixtures=3,
                    vocab_as_last_dim=True)
  x = tf.random.normal([2, 5], seed=4)
  a(x)
  b(x)
  # Permute the kernels from [C, M] to [M, C] layout.
  gate, = a._gate_dense.get_weights()
  kernel, bias = a._expert_dense.get_weights()
  perm = lambda w, m: w.reshape(w.shape[:-1] + (CLASSES, m)).swapaxes(
      -1, -2).reshape(w.shape)
  b._gate_dense.set_weights([perm(gate, 4)])
  b._expert_dense.set_weights([perm(kernel, 3), perm(bias, 3)])
  np.testing.assert_allclose(a(x)['predictions'], b(x)['predictions'],
                             atol=1e-6)


def test_logistic_head():
  c = _model_config()
  c.head.type = 'logistic'
  c.head.logistic.return_logits = True
  model = yt8m_model.build_model(c, CLASSES, FEATURES)
  out = model(tf.random.uniform([2, 3, FEATURES]))
  np.testing.assert_allclose(out['predictions'], tf.sigmoid(out['logits']),
                             atol=1e-6)


def test_get_config_from_config_round_trip():
  c = _model_config('max', use_output_context_gate=True)
  c.backbone.dbof.use_context_gate_cluster_layer = True
  c.backbone.dbof.context_gate_cluster_bottleneck_size = 4
  model = yt8m_model.build_model(c, CLASSES, FEATURES, l2_weight_decay=1e-4)
  config = model.get_config()
  clone = yt8m_model.VideoClassificationModel.from_config(config)
  clone(tf.zeros([1, 1, FEATURES]), num_frames=tf.ones([1], tf.int32))
  clone.set_weights(model.get_weights())
  x = tf.random.uniform([2, 4, FEATURES])
  np.testing.assert_allclose(model(x)['predictions'], clone(x)['predictions'],
                             atol=1e-6)
  assert len(clone.losses) == len(model.losses) > 0
  # Layers serialize too.
  for layer in (model.backbone, model.head):
    assert type(layer).from_config(layer.get_config()).get_config() == (
        layer.get_config())


def test_unknown_pooling_names_the_key():
  with pytest.raises(ValueError, match='pooling_method'):
    yt8m_model.build_model(_model_config('mean'), CLASSES, FEATURES)


def test_variable_names_are_stable():
  model = yt8m_model.build_model(_model_config(), CLASSES, FEATURES)
  names = {v.name.split('/', 1)[1] for v in model.trainable_variables}
  assert 'backbone/cluster_dense/kernel:0' in names
  assert 'backbone/hidden_dense/kernel:0' in names
  assert 'head/gate/kernel:0' in names
  assert 'head/expert/kernel:0' in names


def _fused_and_plain_step(num_frames, jit):
  """Outputs, gradients and moving moments of one training call of the
  fused DBoF path (the CPU kernel policy) and of the layer-by-layer path
  (the stock policy: tf_keras' layers), same weights."""
  rng = np.random.default_rng(4)
  x = tf.constant(rng.normal(size=[3, 7, FEATURES]).astype(np.float32))
  models = [yt8m_model.build_model(_model_config(), CLASSES, FEATURES)
            for _ in range(2)]
  fused, plain = models
  plain.set_weights(fused.get_weights())
  # Scales and offsets away from 1 and 0 (ReLU cuts), the same in both
  # models (seeded by the variable's place, not its name: the second model's
  # name has a suffix, `_1`, `_10`, that the first's may not).
  for i, (v_f, v_p) in enumerate(zip(fused.backbone.weights,
                                     plain.backbone.weights)):
    if v_f.name.endswith(('gamma:0', 'beta:0')):
      value = np.random.default_rng(i).normal(size=v_f.shape)
      v_f.assign(value.astype(np.float32))
      v_p.assign(value.astype(np.float32))
  results = []
  for m, policy in zip(models, (CPU, kernel_policy.resolve('stock', 'CPU'))):
    def step(m=m):
      with tf.GradientTape() as tape:
        p = m(x, num_frames=num_frames, training=True)['predictions']
        loss = tf.reduce_sum(p * tf.range(CLASSES, dtype=tf.float32))
      return p, tape.gradient(loss, m.trainable_variables)
    with kernel_policy.use(policy):
      p, grads = tf.function(step, jit_compile=jit)() if jit else step()
    results.append((p.numpy(), [g.numpy() for g in grads],
                    [v.numpy() for v in m.non_trainable_variables]))
  return fused, results


@pytest.mark.parametrize('num_frames,jit', [
    (None, False), ([7, 3, 5], False), ([7, 0, 2], False), ([6, 3, 7], True)])
def test_fused_dbof_training_matches_the_layers(num_frames, jit):
  """The fused cluster batch norm + ReLU + average pooling (and the input
  batch norm's moments) give the layers' outputs, gradients and moving
  averages to float32 rounding, with and without padding, with a video of
  no valid frame, and under XLA."""
  nf = None if num_frames is None else tf.constant(num_frames)
  fused, ((p_f, g_f, m_f), (p_p, g_p, m_p)) = _fused_and_plain_step(nf, jit)
  x = tf.zeros([1, 2, FEATURES])
  with kernel_policy.use(CPU):
    assert fused.backbone._fused_training(x, True)
  np.testing.assert_allclose(p_f, p_p, rtol=1e-5, atol=1e-6)
  names = [v.name for v in fused.trainable_variables]
  for name, a, b in zip(names, g_f, g_p):
    assert np.isfinite(a).all(), name
    scale = max(np.abs(b).max(), 1e-3)
    # Float32 summation order: components that cancel to ~1e-6 differed by
    # 2.8e-5 of the largest in one full-suite run (oneDNN's blocking follows
    # its threads); a wrong gradient is off by the order of `scale`.
    np.testing.assert_allclose(a, b, rtol=0, atol=1e-4 * scale, err_msg=name)
  for a, b in zip(m_f, m_p):
    np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)


def test_fused_dbof_path_only_where_it_computes_the_same():
  x = tf.zeros([1, 2, FEATURES])
  model = yt8m_model.build_model(_model_config(), CLASSES, FEATURES)
  assert model.backbone._fused_training(x, True)
  for device in ('GPU', 'TPU'):  # A CPU fast path only.
    with kernel_policy.use(kernel_policy.resolve('auto', device)):
      assert not model.backbone._fused_training(x, True), device
  assert not model.backbone._fused_training(x, False)
  assert not model.backbone._fused_training(x, None)
  for pooling in ('max', 'swap', 'none'):
    other = yt8m_model.build_model(_model_config(pooling), CLASSES, FEATURES)
    assert not other.backbone._fused_training(x, True), pooling
  gated = _model_config()
  gated.backbone.dbof.use_context_gate_cluster_layer = True
  model = yt8m_model.build_model(gated, CLASSES, FEATURES)
  assert not model.backbone._fused_training(x, True)
  frozen = yt8m_model.build_model(_model_config(), CLASSES, FEATURES)
  frozen.backbone.trainable = False  # Its batch norms use moving averages.
  assert not frozen.backbone._fused_training(x, True)
