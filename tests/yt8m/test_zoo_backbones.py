"""The model zoo's backbones: the starter's frame logistic and LSTM, WILLOW's
NetVLAD / NetRVLAD / Soft-DBoF / NetFV. Per model: its parameter count at the
published size derived by hand from the authors' architecture, a training
step at tiny sizes (every variable learns, padding changes nothing), the
pooling against the authors' equations in numpy, and the demo experiment
trained and evaluated through `official_ext.train`."""
import os

import numpy as np
import pytest
import tensorflow as tf, tf_keras

from official.core import exp_factory
from official_ext.yt8m import configs
from official_ext.yt8m.modeling import model as yt8m_model
from official_ext.yt8m.modeling import starter
from official_ext.yt8m.modeling import willow
from tests import shipped_configs

MODELS = ('frame_logistic', 'lstm', 'netvlad', 'netrvlad', 'soft_dbof',
          'netfv')
C = 3862       # YouTube-8M classes.
F = 1152       # rgb + audio features per frame.
RGB, AUDIO = 1024, 128


def _moe(hidden, mixtures=2, prob_gating=False, classes=C):
  """MoE on `hidden` inputs: gates (no bias) over M + 1 experts, experts
  with biases; the probability gate (`--moe_prob_gating`): C x C, no bias,
  batch norm gamma and beta."""
  count = hidden * classes * (mixtures + 1) + (hidden + 1) * classes * mixtures
  if prob_gating:
    count += classes * classes + 2 * classes
  return count


def _willow_count(method, k_rgb, k_audio, hidden=1024, gating=True,
                  prob_gating=True):
  """WILLOW's NetVLADModelLF / SoftDbofModelLF / NetFVModelLF, counted from
  their layers (frame_level_models.py)."""
  count = 2 * F                               # input_bn gamma, beta
  width = 0
  for n, k in ((RGB, k_rgb), (AUDIO, k_audio)):
    count += n * k + 2 * k                    # cluster_weights, cluster_bn
    if method in ('netvlad', 'netfv'):
      count += n * k                          # cluster_weights2 (centers)
    if method == 'netfv':
      count += n * k                          # covar_weights
    width += {'netvlad': n * k, 'netrvlad': n * k, 'soft_dbof': k,
              'netfv': 2 * n * k}[method]
  count += width * hidden + hidden            # hidden1_weights, _biases
  if gating:
    count += hidden * hidden + 2 * hidden     # gating_weights_2, gating_bn
  return count + _moe(hidden, prob_gating=prob_gating)


def _lstm_layer(inputs, cells):
  """BasicLSTMCell: [inputs + cells, 4 cells] kernel and 4 cells biases."""
  return 4 * cells * (inputs + cells) + 4 * cells


BY_HAND = {
    # FrameLevelLogisticModel: one fully connected layer on the frame mean.
    'frame_logistic': F * C + C,
    # LstmModel: 2 x 1024 cells, MoE with 2 mixtures on the last output.
    'lstm': _lstm_layer(F, 1024) + _lstm_layer(1024, 1024) + _moe(1024),
    'netvlad': _willow_count('netvlad', 256, 128),
    'netrvlad': _willow_count('netrvlad', 256, 128),
    'soft_dbof': _willow_count('soft_dbof', 8000, 1000, gating=False,
                               prob_gating=False),
    'netfv': _willow_count('netfv', 128, 64),
}


@pytest.mark.parametrize('name', MODELS)
def test_parameter_count_at_published_size_by_hand(name):
  params = exp_factory.get_exp_config(f'yt8m_{name}')
  params.validate()
  task = params.task
  assert task.train_data.num_classes == C
  assert sum(task.train_data.feature_sizes) == F
  # Built in a graph: the variables get their shapes, their initial values
  # are never drawn.
  with tf.Graph().as_default():
    model = yt8m_model.build_model(task.model, num_classes=C,
                                   input_feature_size=F)
    count = sum(int(np.prod(v.shape)) for v in model.trainable_variables)
  assert count == BY_HAND[name]


@pytest.mark.parametrize('name', MODELS)
def test_published_experiment_has_the_authors_recipe(name):
  """The starter's train.py recipe, which WILLOW's keeps."""
  params = exp_factory.get_exp_config(f'yt8m_{name}')
  task = params.task
  assert task.losses.class_reduction == 'sum'
  assert task.gradient_clip_norm == 1.0 and task.gradient_clip_per_variable
  assert task.model.norm_activation.norm_momentum == 0.999
  assert params.trainer.optimizer_config.optimizer.adam.epsilon == 1e-8
  assert params.runtime.mixed_precision_dtype == 'float32'
  assert task.train_data.reverse_whitening_feature == ''
  lr = params.trainer.optimizer_config.learning_rate.exponential
  assert lr.staircase and params.trainer.optimizer_config.warmup.type is None
  willow_method = name not in ('frame_logistic', 'lstm')
  batch = 80 if willow_method else 1024
  assert task.train_data.global_batch_size == batch
  assert lr.decay_steps == 4_000_000 // batch
  assert task.train_data.num_sample_frames == (300 if willow_method else None)


def test_published_sizes_are_the_authors():
  """The figures the counts above are for."""
  assert BY_HAND['frame_logistic'] == 4_452_886
  netvlad = exp_factory.get_exp_config('yt8m_netvlad')
  assert netvlad.task.model.backbone.netvlad.cluster_sizes == (256, 128)
  assert netvlad.task.train_data.global_batch_size == 80
  assert netvlad.task.train_data.num_sample_frames == 300
  assert netvlad.task.losses.l2_weight_decay == 1e-6
  assert netvlad.task.model.norm_activation.norm_momentum == 0.999
  assert netvlad.trainer.optimizer_config.optimizer.adam.epsilon == 1e-8
  lr = netvlad.trainer.optimizer_config.learning_rate.exponential
  assert (lr.initial_learning_rate, lr.decay_rate, lr.decay_steps,
          lr.staircase) == (2e-4, 0.8, 4_000_000 // 80, True)
  assert netvlad.trainer.train_steps == 700_000
  soft = exp_factory.get_exp_config('yt8m_soft_dbof').task.model
  assert soft.backbone.soft_dbof.cluster_sizes == (8000, 1000)
  assert not soft.backbone.soft_dbof.context_gating
  assert not soft.head.moe.use_output_context_gate
  lstm = exp_factory.get_exp_config('yt8m_lstm')
  assert lstm.task.train_data.global_batch_size == 1024
  assert lstm.task.train_data.num_sample_frames is None
  assert (lstm.task.model.backbone.lstm.cells,
          lstm.task.model.backbone.lstm.layers) == (1024, 2)


def _tiny_model(name, feature_sizes=(6, 2), classes=5):
  c = exp_factory.get_exp_config(f'yt8m_{name}_demo').task.model
  if name == 'lstm':
    c.backbone.lstm.override({'cells': 4, 'layers': 2})
  elif name != 'frame_logistic':
    c.backbone.get().override({'feature_sizes': feature_sizes,
                               'cluster_sizes': (3, 2), 'hidden_size': 8})
  return yt8m_model.build_model(c, classes, sum(feature_sizes),
                                l2_weight_decay=1e-5)


@pytest.mark.parametrize('name', MODELS)
def test_training_step_learns_every_variable_and_ignores_padding(name):
  tf_keras.utils.set_random_seed(1)
  model = _tiny_model(name)
  rng = np.random.default_rng(2)
  valid = rng.normal(size=[3, 4, 8]).astype(np.float32)
  junk = np.concatenate([valid, 50 * rng.normal(size=[3, 3, 8])],
                        axis=1).astype(np.float32)
  junk[0, 5] = np.nan
  junk[2, 4, 1] = np.inf
  num_frames = tf.constant([4, 4, 4])
  for training in (False, True):  # training: masked batch-norm statistics.
    a = model(valid, training=training)['predictions']
    b = model(junk, num_frames=num_frames, training=training)['predictions']
    np.testing.assert_allclose(a, b, atol=1e-5, err_msg=str(training))
  labels = tf.one_hot([0, 1, 4], 5)
  with tf.GradientTape() as tape:
    predictions = model(junk, num_frames=num_frames,
                        training=True)['predictions']
    loss = tf.reduce_mean(tf_keras.losses.binary_crossentropy(
        labels, predictions)) + tf.add_n(model.losses)
  grads = tape.gradient(loss, model.trainable_variables)
  for grad, var in zip(grads, model.trainable_variables):
    assert grad is not None, var.name
    grad = tf.convert_to_tensor(grad).numpy()
    assert np.isfinite(grad).all() and np.abs(grad).max() > 0, var.name
  # The authors regularize only the classifier: the head's kernels.
  assert len(model.losses) == len(
      [v for v in model.head.trainable_variables if 'kernel' in v.name])
  # The config rebuilds the same model.
  clone = yt8m_model.VideoClassificationModel.from_config(model.get_config())
  clone(valid[:1], num_frames=tf.constant([1]))
  clone.set_weights(model.get_weights())
  np.testing.assert_allclose(clone(valid)['predictions'],
                             model(valid)['predictions'], atol=1e-6)


def _basic_lstm_cell(x, h, c, kernel, bias):
  """TF1's BasicLSTMCell(forget_bias=1.0) in numpy: gates i, j, f, o."""
  sigmoid = lambda z: 1 / (1 + np.exp(-z))
  i, j, f, o = np.split(np.concatenate([x, h], 1) @ kernel + bias, 4, 1)
  c = c * sigmoid(f + 1.0) + sigmoid(i) * np.tanh(j)
  return np.tanh(c) * sigmoid(o), c


def test_lstm_is_the_starters_basic_lstm_cell():
  """Each layer is one Glorot-uniform kernel over [inputs + cells, 4 cells]
  and a zero bias (so per-variable clipping clips one kernel per layer, as
  the starter's), computing BasicLSTMCell up to each video's last valid
  frame (tf.nn.dynamic_rnn with sequence_length)."""
  tf_keras.utils.set_random_seed(3)
  inputs, cells = 96, 64
  lstm = starter.Lstm(cells=cells, layers=2)
  rng = np.random.default_rng(4)
  x = rng.normal(size=[2, 5, inputs]).astype(np.float32)
  num_frames = np.array([5, 3])
  got = lstm(x, num_frames=tf.constant(num_frames)).numpy()
  shapes = [(v.name.split('/', 1)[1], tuple(v.shape))
            for v in lstm.trainable_variables]
  assert shapes == [
      ('lstm_0/basic_lstm_cell/kernel:0', (inputs + cells, 4 * cells)),
      ('lstm_0/basic_lstm_cell/bias:0', (4 * cells,)),
      ('lstm_1/basic_lstm_cell/kernel:0', (2 * cells, 4 * cells)),
      ('lstm_1/basic_lstm_cell/bias:0', (4 * cells,))]
  kernel, bias = lstm.trainable_variables[0].numpy(), lstm.trainable_variables[1]
  limit = np.sqrt(6 / (inputs + cells + 4 * cells))  # Glorot uniform.
  assert np.abs(kernel).max() <= limit and np.abs(kernel).max() > 0.99 * limit
  np.testing.assert_allclose(kernel.std(), limit / np.sqrt(3), rtol=0.03)
  assert not np.any(bias.numpy())
  weights = [v.numpy() for v in lstm.trainable_variables]
  frames = x / np.linalg.norm(x, axis=-1, keepdims=True)
  for b, n in enumerate(num_frames):
    state = [(np.zeros([1, cells]), np.zeros([1, cells]))] * 2
    for t in range(n):
      layer_input = frames[b, t][None]
      for layer in range(2):
        state[layer] = _basic_lstm_cell(layer_input, *state[layer],
                                        *weights[2 * layer:2 * layer + 2])
        layer_input = state[layer][0]
    np.testing.assert_allclose(got[b], state[1][0][0], rtol=1e-5, atol=1e-6)


def _reference_pooling(layer, x):
  """The authors' NetVLAD / LightVLAD / SoftDBoF / NetFV `forward` in numpy
  (frame_level_models.py), batch norm in inference mode. x: [B, T, N]."""
  norm = layer._assignment_bn
  w, = layer._assignment.get_weights()
  logits = ((x @ w - norm.moving_mean.numpy()) /
            np.sqrt(norm.moving_variance.numpy() + norm.epsilon) *
            norm.gamma.numpy() + norm.beta.numpy())
  a = np.exp(logits) / np.exp(logits).sum(-1, keepdims=True)  # [B, T, K]
  l2 = lambda v, axis: v / np.linalg.norm(v, axis=axis, keepdims=True)
  method = layer._config['method']
  if method == 'soft_dbof':
    return l2(a.sum(1), -1)
  a_sum = a.sum(1)[:, None, :]                                # [B, 1, K]
  first = np.einsum('btk,btn->bnk', a, x)
  batch = x.shape[0]
  if method == 'netrvlad':
    return l2(l2(first, 1).reshape(batch, -1), -1)
  c = layer.cluster_centers.numpy()[None]
  if method == 'netvlad':
    return l2(l2(first - a_sum * c, 1).reshape(batch, -1), -1)
  covar = layer.covariances.numpy()[None] ** 2 + 1e-6
  fv2 = a_sum * c**2 + np.einsum('btk,btn->bnk', a, x**2) - 2 * first * c
  fv2 = fv2 / covar**2 - a_sum
  fv1 = (first - a_sum * c) / covar
  return np.concatenate([l2(l2(fv1, 1).reshape(batch, -1), -1),
                         l2(fv2.reshape(batch, -1), -1)], axis=-1)


@pytest.mark.parametrize('method', willow.METHODS)
def test_pooling_is_the_authors_forward_pass(method):
  layer = willow.LearnablePooling(method, cluster_size=3)
  rng = np.random.default_rng(3)
  x = rng.normal(size=[2, 5, 4])
  layer(tf.constant(x, tf.float32), training=False)
  norm = layer._assignment_bn
  norm.moving_mean.assign(rng.normal(size=[3]))
  norm.moving_variance.assign(rng.uniform(0.5, 2, [3]))
  norm.gamma.assign(rng.uniform(0.5, 2, [3]))
  norm.beta.assign(rng.normal(size=[3]))
  out = layer(tf.constant(x, tf.float32), training=False).numpy()
  assert out.shape == (2, layer.output_width(4))
  np.testing.assert_allclose(out, _reference_pooling(layer, x), rtol=2e-4,
                             atol=2e-5)


def test_feature_sizes_must_match_the_input():
  c = configs.VideoClassificationModel()
  c.backbone.type = 'netfv'
  with pytest.raises(ValueError, match=r'netfv\.feature_sizes=\(1024, 128\) '
                     r'add up to 1152.*10 features'):
    yt8m_model.build_model(c, 5, 10)


# The demos through official_ext.train: a YAML naming each demo, tiny sizes
# around it (tests/shipped_configs.py), 2 training steps and 1 evaluation.
@pytest.fixture(scope='module')
def cache(tmp_path_factory):
  return tmp_path_factory.mktemp('yt8m_zoo_cache')


def demo_yaml(name, folder):
  path = os.path.join(str(folder), f'{name}_demo.yaml')
  with open(path, 'w') as f:
    # Eager steps: tracing (and XLA, see test_accelerator_paths.py) cost
    # more than the two steps they would speed up.
    f.write(f'# --experiment=yt8m_{name}_demo\n'
            'task: {jit_compile: false}\n'
            'trainer: {train_tf_function: false, train_tf_while_loop: false, '
            'eval_tf_function: false, eval_tf_while_loop: false}\n')
  return path


@pytest.mark.parametrize('name', MODELS)
def test_demo_trains_and_evaluates_through_train(name, cache, tmp_path):
  metrics = shipped_configs.start(demo_yaml(name, cache), cache,
                                  tmp_path / 'model')
  assert 0 <= float(metrics['gap']) <= 1, metrics
