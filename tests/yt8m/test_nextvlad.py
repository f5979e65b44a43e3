"""NeXtVLAD: the paper's equations, padding, parameter count, configs."""
import numpy as np
import pytest
import tensorflow as tf, tf_keras

from official.core import exp_factory
from official.core import task_factory
from official_ext.core.kernels import kernel_policy
from official_ext.yt8m import configs
from official_ext.yt8m.modeling import model as yt8m_model
from official_ext.yt8m.modeling import nextvlad
from official_ext.yt8m import task as yt8m_task  # pylint: disable=unused-import

# Two streams, as rgb + audio: 6 + 2 features.
FEATURE_SIZES = (6, 2)
CLASSES = 5


def _small_config(dropout_rate=0.0, **overrides):
  c = configs.VideoClassificationModel()
  c.backbone.type = 'nextvlad'
  c.backbone.nextvlad.override(dict(dict(
      feature_sizes=FEATURE_SIZES, cluster_sizes=(3, 2), groups=(2, 1),
      expansion=2, hidden_size=8, gating_reduction=4,
      dropout_rate=dropout_rate), **overrides))
  c.head.type = 'logistic'
  return c


@pytest.fixture(scope='module')
def small_model():
  return yt8m_model.build_model(_small_config(), CLASSES, sum(FEATURE_SIZES),
                                l2_weight_decay=1e-5)


def _reference_vlad(layer, x):
  """Eqs. 5-8 of the paper + intra-normalization + the batch norm, in numpy.

  `layer` is a built `NextVladAggregation`; batch norms in inference mode.
  x: [batch, T, N] float64.
  """
  def bn(v, norm):
    mean, var, gamma, beta = (norm.moving_mean.numpy(),
                              norm.moving_variance.numpy(),
                              norm.gamma.numpy(), norm.beta.numpy())
    return (v - mean) / np.sqrt(var + norm.epsilon) * gamma + beta

  groups = layer._config['groups']
  k = layer._config['cluster_size']
  w_exp, b_exp = [w.astype(np.float64)
                  for w in layer._expansion.get_weights()]
  w_att, b_att = layer._attention.get_weights()
  w_asg, = layer._assignment.get_weights()
  centers = layer.cluster_centers.numpy()            # [N', K]
  batch, frames, _ = x.shape
  xd = x @ w_exp + b_exp                               # [B, T, λN]
  n_group = xd.shape[-1] // groups
  out = np.zeros([batch, n_group, k])
  for b in range(batch):
    for t in range(frames):
      attention = 1 / (1 + np.exp(-(xd[b, t] @ w_att + b_att)))   # [G]
      logits = bn(xd[b, t] @ w_asg, layer._assignment_bn).reshape(groups, k)
      alpha = np.exp(logits) / np.exp(logits).sum(-1, keepdims=True)
      for g in range(groups):
        x_g = xd[b, t, g * n_group:(g + 1) * n_group]
        for kk in range(k):
          out[b, :, kk] += attention[g] * alpha[g, kk] * (x_g - centers[:, kk])
  out /= np.linalg.norm(out, axis=1, keepdims=True)  # intra-normalization
  return bn(out.reshape(batch, n_group * k), layer._vlad_bn)


def test_aggregation_is_the_papers_equations():
  layer = nextvlad.NextVladAggregation(cluster_size=3, groups=2, expansion=2)
  rng = np.random.default_rng(0)
  x = rng.normal(size=[2, 4, 6])
  out = layer(tf.constant(x, tf.float32), training=False)
  assert out.shape == (2, layer.output_size) == (2, 6 * 3)
  # Non-trivial batch norm statistics, so their place in the layer counts.
  for norm in (layer._assignment_bn, layer._vlad_bn):
    norm.moving_mean.assign(rng.normal(size=norm.moving_mean.shape))
    norm.moving_variance.assign(rng.uniform(0.5, 2, norm.moving_variance.shape))
    norm.gamma.assign(rng.uniform(0.5, 2, norm.gamma.shape))
    norm.beta.assign(rng.normal(size=norm.beta.shape))
  out = layer(tf.constant(x, tf.float32), training=False)
  np.testing.assert_allclose(out, _reference_vlad(layer, x), rtol=1e-4,
                             atol=1e-4)


def test_padded_frames_are_masked_out_of_the_aggregation(small_model):
  rng = np.random.default_rng(1)
  valid = rng.normal(size=[3, 4, sum(FEATURE_SIZES)]).astype(np.float32)
  zeros = np.concatenate(
      [valid, np.zeros([3, 3, sum(FEATURE_SIZES)], np.float32)], axis=1)
  junk = np.concatenate(
      [valid, 50 * rng.normal(size=[3, 3, sum(FEATURE_SIZES)])], axis=1
  ).astype(np.float32)
  junk[0, 5] = np.nan
  junk[1, 4, 1] = np.inf
  num_frames = tf.constant([4, 4, 4])
  for training in (False, True):  # training: masked batch-norm statistics.
    a = small_model(valid, num_frames=None, training=training)['predictions']
    b = small_model(zeros, num_frames=num_frames,
                    training=training)['predictions']
    c = small_model(junk, num_frames=num_frames,
                    training=training)['predictions']
    assert np.isfinite(c.numpy()).all()
    np.testing.assert_allclose(a, b, atol=1e-5, err_msg=f'{training}')
    np.testing.assert_allclose(a, c, atol=1e-5, err_msg=f'{training}')
  # Without num_frames the same padded frames do change the output.
  d = small_model(np.nan_to_num(junk), training=False)['predictions']
  assert not np.allclose(a, d, atol=1e-3)


def test_each_stream_has_its_own_module(small_model):
  backbone = small_model.backbone
  names = {v.name.split('/', 1)[1] for v in small_model.trainable_variables}
  for i, (k, g) in enumerate(((3, 2), (2, 1))):
    assert f'backbone/nextvlad_{i}/cluster_assignment/kernel:0' in names
    stream = backbone._streams[i]
    assert stream._config['cluster_size'] == k
    assert stream._config['groups'] == g
    assert stream._expansion.kernel.shape == (FEATURE_SIZES[i],
                                              2 * FEATURE_SIZES[i])
  for name in ('backbone/hidden_dense/kernel:0', 'backbone/se_gate/squeeze/'
               'kernel:0', 'backbone/se_gate/excite/kernel:0',
               'head/logits/kernel:0'):
    assert name in names
  # Only the classifier is L2-regularized, as the authors do ...
  assert len(small_model.losses) == 1
  # ... unless asked for.
  regularized = yt8m_model.build_model(
      _small_config(regularize_backbone=True), CLASSES, sum(FEATURE_SIZES),
      l2_weight_decay=1e-5)
  # 2 streams x (expansion, attention, assignment, centers) + hidden +
  # squeeze + excite + classifier.
  assert len(regularized.losses) == 12


def test_get_config_round_trip(small_model):
  config = small_model.get_config()
  clone = yt8m_model.VideoClassificationModel.from_config(config)
  clone(tf.zeros([1, 1, sum(FEATURE_SIZES)]), num_frames=tf.ones([1], tf.int32))
  clone.set_weights(small_model.get_weights())
  x = tf.random.uniform([2, 3, sum(FEATURE_SIZES)], seed=2)
  np.testing.assert_allclose(small_model(x)['predictions'],
                             clone(x)['predictions'], atol=1e-6)
  backbone = small_model.backbone
  assert type(backbone).from_config(backbone.get_config()).get_config() == (
      backbone.get_config())


def test_feature_sizes_must_match_the_input():
  with pytest.raises(ValueError, match=r'nextvlad\.feature_sizes.*add up to 8'
                     r'.*10 features'):
    yt8m_model.build_model(_small_config(), CLASSES, 10)
  with pytest.raises(ValueError, match='one entry per stream'):
    yt8m_model.build_model(_small_config(groups=(2,)), CLASSES, 8)


def _nextvlad_weights(n, expansion, groups, clusters):
  """Weights of one NeXtVLAD module up to its output, per layer (paper §3.2).

  Returns (dict layer -> weights, output width λN K / G).
  """
  wide = expansion * n
  return {
      'expansion λN·N': wide * n,
      'group attention λN·G': wide * groups,
      'cluster assignment λN·G·K': wide * groups * clusters,
      'cluster centers (λN/G)·K': wide // groups * clusters,
  }, wide // groups * clusters


def _published_count(hidden, clusters, groups, reduction, classes=3862,
                     expansion=2):
  """(weights as the paper counts them, every trainable parameter)."""
  weights, biases_and_bn = {}, 0
  vlad_width = 0
  # rgb (1024) and audio (128): audio has K/2 clusters and G/2 groups.
  for n, k, g in ((1024, clusters, groups), (128, clusters // 2, groups // 2)):
    per_layer, width = _nextvlad_weights(n, expansion, g, k)
    weights.update({f'{n}: {name}': v for name, v in per_layer.items()})
    vlad_width += width
    biases_and_bn += (expansion * n + g      # expansion and attention biases
                      + 2 * g * k            # cluster_bn gamma, beta
                      + 2 * width)           # vlad_bn gamma, beta
  weights['hidden (ΣλN·K/G)·H'] = vlad_width * hidden
  weights['SE gating 2H²/r'] = 2 * hidden * hidden // reduction
  weights['classifier H·C'] = hidden * classes
  biases_and_bn += 2 * hidden + 2 * (hidden // reduction) + classes
  total = sum(weights.values())
  return total, total + biases_and_bn


def test_parameter_count_of_the_published_model_by_hand():
  # The paper's eq. 9, λN(N + G + K(G + (H + 1)/G)), is one module + the
  # hidden layer; its example (λ=2, G=8, N=1024, K=128, H=2048) is "71M+".
  per_layer, width = _nextvlad_weights(1024, 2, 8, 128)
  assert (sum(per_layer.values()) + width * 2048 ==
          2048 * (1024 + 8 + 128 * 8) + 2048 * 128 * 2049 // 8 ==
          71_352_320)
  # The published configuration: rgb + audio modules, hidden 2048, SE r=8,
  # logistic classifier on 3,862 classes. The paper's Table 1 gives 89M
  # (NeXtVLAD 8G, 0.5drop, 128K, 2048H).
  weights, trainable = _published_count(2048, 128, 8, 8)
  assert weights == 88_802_304
  assert trainable == 88_889_378
  # Its "79M" single model (Table 2, the model behind GAP 0.87846) is a
  # branch of the final mixture: K=112, SE r=16.
  weights_112, trainable_112 = _published_count(2048, 112, 8, 16)
  assert weights_112 == 78_565_888
  assert trainable_112 < 80_000_000

  # The model the experiment builds has exactly these. Built in a graph: the
  # variables get their shapes, their 89 M initial values are never drawn.
  config = exp_factory.get_exp_config('yt8m_nextvlad').task
  with tf.Graph().as_default():
    model = yt8m_model.build_model(
        config.model, num_classes=config.train_data.num_classes,
        input_feature_size=sum(config.train_data.feature_sizes))
    sizes = {v.name: int(np.prod(v.shape)) for v in model.trainable_variables}
  assert sum(sizes.values()) == trainable
  assert sum(n for name, n in sizes.items()
             if 'kernel' in name or 'cluster_centers' in name) == weights


def test_experiments():
  published = exp_factory.get_exp_config('yt8m_nextvlad')
  published.validate()
  task = published.task
  assert task.model.backbone.type == 'nextvlad'
  nv = task.model.backbone.nextvlad
  assert (nv.expansion, nv.groups, nv.cluster_sizes, nv.hidden_size,
          nv.gating_reduction, nv.dropout_rate) == (
              2, (8, 4), (128, 64), 2048, 8, 0.5)
  assert nv.feature_sizes == task.train_data.feature_sizes == (1024, 128)
  assert task.model.head.type == 'logistic'
  assert task.train_data.num_sample_frames is None  # no augmentation
  assert task.train_data.global_batch_size == 160
  assert task.train_data.input_path == ''
  lr = published.trainer.optimizer_config.learning_rate.exponential
  assert (lr.initial_learning_rate, lr.decay_rate, lr.decay_steps,
          lr.staircase) == (2e-4, 0.8, 12_500, True)
  assert published.trainer.optimizer_config.warmup.type is None
  assert published.trainer.train_steps == 5 * (3_888_919 // 160)

  demo = exp_factory.get_exp_config('yt8m_nextvlad_demo')
  dbof_demo = exp_factory.get_exp_config('yt8m_demo')
  demo.validate()
  assert demo.task.model.backbone.type == 'nextvlad'
  # Same generated data and validation videos as the DBoF demo; in training
  # 16 frames sampled per video instead of 32.
  for key in ('validation_data', 'demo_data'):
    assert demo.task.as_dict()[key] == dbof_demo.task.as_dict()[key], key
  train = demo.task.train_data.as_dict()
  assert train.pop('num_sample_frames') == 16
  dbof_train = dbof_demo.task.train_data.as_dict()
  assert dbof_train.pop('num_sample_frames') == 32
  assert train == dbof_train
  assert demo.trainer.train_steps == 7 * (4000 // 64)


def test_demo_task_trains():
  params = exp_factory.get_exp_config('yt8m_nextvlad_demo')
  params.override({'task': {
      'model': {'backbone': {'nextvlad': {
          'feature_sizes': FEATURE_SIZES, 'cluster_sizes': [4, 2],
          'groups': [2, 1], 'hidden_size': 16}}},
      'train_data': {'feature_sizes': FEATURE_SIZES},
      'jit_compile': False}}, is_strict=True)
  task = task_factory.get_task(params.task)
  model = task.build_model()
  rng = np.random.default_rng(3)
  batch = {
      'video_matrix': tf.constant(rng.normal(size=[4, 6, 8]), tf.float32),
      'num_frames': tf.constant([6, 3, 1, 6]),
      'labels': tf.one_hot([0, 1, 2, 3], 100),
  }
  optimizer = tf_keras.optimizers.legacy.Adam(1e-2)
  before = [v.numpy() for v in model.trainable_variables]
  logs = task.train_step(batch, model, optimizer, task.build_metrics())
  assert np.isfinite(logs['loss'].numpy())
  changed = [not np.array_equal(b, v.numpy())
             for b, v in zip(before, model.trainable_variables)]
  assert all(changed), [v.name for v, c in
                        zip(model.trainable_variables, changed) if not c]


def test_attention_and_assignment_as_one_matmul():
  """The group attention and the cluster assignment read the same expanded
  frames: one matmul of their concatenated kernels (the CPU kernel policy)
  gives the outputs and gradients of the two layers (the stock policy, as
  on a GPU) to float32 rounding, padding masked."""
  layer = nextvlad.NextVladAggregation(cluster_size=3, groups=2, expansion=2)
  rng = np.random.default_rng(4)
  x = tf.constant(rng.normal(size=(3, 5, 6)), tf.float32)
  valid = tf.sequence_mask([5, 3, 1], 5)
  layer(x, valid=valid, training=True)
  results = []
  matmuls = []
  for policy in (kernel_policy.resolve('stock', 'CPU'),
                 kernel_policy.resolve('auto', 'CPU')):

    def step():
      with tf.GradientTape() as tape:
        tape.watch(x)
        y = layer(x, valid=valid, training=True)
        loss = tf.reduce_sum(tf.square(y - 0.3))
      return [y] + tape.gradient(loss, layer.trainable_variables + [x])

    with kernel_policy.use(policy):
      fn = tf.function(step).get_concrete_function()
    joint = layer._attention.units + layer._assignment.units
    matmuls.append(any(op.type == 'MatMul' and op.outputs[0].shape[-1] == joint
                       for op in fn.graph.get_operations()))
    results.append(fn())
  assert len(results[1]) == len(layer.trainable_variables) + 2
  assert matmuls == [False, True]  # The joint matmul: CPU policy only.
  # The CPU policy also writes out the batch norms' gradients: float32
  # summation order, ~2e-5 relative on gradients of order 1 (a wrong
  # gradient is off by its own order).
  for want, got in zip(*results):
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)
