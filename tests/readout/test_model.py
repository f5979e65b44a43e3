"""Readout model: padded == chained, padding invariance, checkpoint keys,
head grafting."""
import numpy as np
import pytest
import tensorflow as tf

from official_ext.readout import configs
from official_ext.readout.modeling import model as model_lib

INPUT_DIM = 4
READOUTS = (
    configs.ReadoutSpec(name='speed', dim=2, type='continuous'),
    configs.ReadoutSpec(name='choice', dim=1, type='binary'),
    configs.ReadoutSpec(name='stim', dim=3, type='multinomial'),
)
VOCAB = ('speed', 'choice', 'stim')


def task_config(num_latents=0, static_shapes=False):
  config = configs.ReadoutTaskConfig(
      readouts=READOUTS, task_vocabulary=VOCAB,
      train_data=configs.DataConfig(input_dim=INPUT_DIM),
      validation_data=configs.DataConfig(input_dim=INPUT_DIM))
  config.model.encoder.override({'hidden_size': 8, 'num_heads': 2,
                                 'num_layers': 1, 'intermediate_size': 8,
                                 'num_latents': num_latents})
  config.model.static_shapes = static_shapes
  return config


def batch(seed=0):
  rng = np.random.default_rng(seed)
  index = np.array([[1, 2, 1, 0], [3, 3, 0, 0], [2, 1, 3, 1]], np.int32)
  return {
      'input_values': rng.normal(size=[3, 5, INPUT_DIM]).astype(np.float32),
      'input_timestamps': np.tile(np.arange(5, dtype=np.float32) * 0.1,
                                  [3, 1]),
      'input_mask': np.array([[1, 1, 1, 0, 0], [1, 1, 1, 1, 1],
                              [1, 1, 0, 0, 0]], bool),
      'output_readout_index': index,
      'output_timestamps': rng.uniform(0, 0.5, [3, 4]).astype(np.float32),
  }


def chained(padded):
  valid = padded['output_readout_index'] != 0
  out = {k: padded[k] for k in ('input_values', 'input_timestamps',
                                'input_mask')}
  out['output_readout_index'] = padded['output_readout_index'][valid]
  out['output_timestamps'] = padded['output_timestamps'][valid]
  out['output_batch_index'] = np.nonzero(valid)[0].astype(np.int32)
  return out


@pytest.mark.parametrize('num_latents', [0, 3])
def test_padded_and_chained_queries_agree(num_latents):
  model = model_lib.build_model(task_config(num_latents))
  b = batch()
  padded = model(b)
  varlen = model(chained(b))
  for name in VOCAB:
    assert padded[name].shape[0] == (b['output_readout_index'] ==
                                     VOCAB.index(name) + 1).sum()
    np.testing.assert_allclose(padded[name], varlen[name], atol=1e-5)


def test_padding_tokens_do_not_change_predictions():
  model = model_lib.build_model(task_config())
  b = batch()
  junk = dict(b)
  junk['input_values'] = np.where(b['input_mask'][..., None],
                                  b['input_values'], 100.0).astype(np.float32)
  a, c = model(b), model(junk)
  for name in VOCAB:
    np.testing.assert_allclose(a[name], c[name], atol=1e-5)


def test_static_shapes_model_outputs_masks():
  model = model_lib.build_model(task_config(static_shapes=True))
  b = batch()
  out = model(b)
  dynamic = model_lib.build_model(task_config())
  dynamic.set_weights(model.get_weights())
  ref = dynamic(b)
  for name in VOCAB:
    values, mask = out[name]
    np.testing.assert_allclose(tf.boolean_mask(values, mask), ref[name],
                               atol=1e-5)


def test_checkpoint_keys(tmp_path):
  model = model_lib.build_model(task_config())
  path = tf.train.Checkpoint(model=model).save(str(tmp_path / 'ckpt'))
  names = {n for n, _ in tf.train.list_variables(path)}
  for task_name in VOCAB:
    for w in ('kernel', 'bias'):
      assert (f'model/readout/projections/{task_name}/{w}/.ATTRIBUTES/'
              'VARIABLE_VALUE') in names
  assert any(n.startswith('model/encoder/') for n in names)
  assert any(n.startswith('model/decoder/task_embedding/') for n in names)


def _randomize(model, seed=3):
  rng = np.random.default_rng(seed)
  model.set_weights([rng.normal(0, 0.3, w.shape).astype(np.float32)
                     for w in model.get_weights()])


@pytest.mark.parametrize('prefix', [(), ('trainer_like', 'sub')])
def test_graft_single_task_head(tmp_path, prefix):
  config = task_config()
  model = model_lib.build_model(config)
  _randomize(model)
  root = model
  for part in reversed(('model',) + prefix):
    root = tf.train.Checkpoint(**{part: root})
  path = root.save(str(tmp_path / 'ckpt'))
  single = model_lib.graft_single_task_head(config, 'choice', str(tmp_path))
  assert list(single.readout.projections) == ['choice']
  b = batch()
  np.testing.assert_allclose(single(b)['choice'], model(b)['choice'],
                             atol=1e-6)
  # The grafted head is the multitask head, not a fresh one.
  np.testing.assert_allclose(single.readout.projections['choice'].kernel,
                             model.readout.projections['choice'].kernel)
  del path


def test_graft_errors(tmp_path):
  config = task_config()
  model = model_lib.build_model(config)
  tf.train.Checkpoint(model=model).save(str(tmp_path / 'ckpt'))
  with pytest.raises(ValueError, match="no ReadoutSpec"):
    model_lib.graft_single_task_head(config, 'nope', str(tmp_path))
  other = task_config()
  other.readouts = READOUTS[:1]
  other_model = model_lib.build_model(other)
  d = tmp_path / 'other'
  tf.train.Checkpoint(model=other_model).save(str(d / 'ckpt'))
  with pytest.raises(ValueError, match=r"no head `readout/projections/choice`"
                     r".*\['speed'\]"):
    model_lib.graft_single_task_head(config, 'choice', str(d))
  bigger = task_config()
  bigger.model.encoder.intermediate_size = 16
  with pytest.raises((AssertionError, ValueError)):
    model_lib.graft_single_task_head(bigger, 'choice', str(tmp_path))


def test_model_config_round_trip():
  model = model_lib.build_model(task_config())
  clone = model_lib.ReadoutModel.from_config(model.get_config())
  clone(batch())
  clone.set_weights(model.get_weights())
  np.testing.assert_allclose(clone(batch())['speed'], model(batch())['speed'],
                             atol=1e-6)


@pytest.fixture(scope='module')
def two_block_model():
  """Two decoder blocks, random weights (so every path carries signal)."""
  config = task_config()
  config.model.decoder.num_layers = 2
  model = model_lib.build_model(config)
  _randomize(model)
  return model


def _with_empty_sample(seed=0):
  """`batch()` plus a fourth sample without queries (second from the end)."""
  b = batch(seed)
  extra = batch(seed + 1)
  out = {k: np.concatenate([b[k][:2], extra[k][:1], b[k][2:]]) for k in b}
  out['output_readout_index'][2] = 0
  return out


def _outputs_and_gradients(model, inputs):
  with tf.GradientTape() as tape:
    out = model(inputs, training=True)
    loss = tf.add_n([tf.reduce_sum(tf.sin(o)) for o in out.values()])
  return out, tape.gradient(loss, model.trainable_variables)


def test_chained_decoder_equals_padded_outputs_and_gradients(two_block_model):
  model = two_block_model
  b = _with_empty_sample()
  assert not (b['output_readout_index'][2] != 0).any()
  padded, padded_grads = _outputs_and_gradients(model, b)
  varlen, varlen_grads = _outputs_and_gradients(model, chained(b))
  for name in VOCAB:
    np.testing.assert_allclose(padded[name], varlen[name], rtol=1e-5,
                               atol=1e-5, err_msg=name)
  for var, p, v in zip(model.trainable_variables, padded_grads,
                       varlen_grads):
    assert p is not None, var.name
    np.testing.assert_allclose(tf.convert_to_tensor(p),
                               tf.convert_to_tensor(v), rtol=1e-4,
                               atol=1e-5, err_msg=var.name)
  # A chain in another order (samples interleaved) decodes each query the
  # same: its embedding is the padded one of the same (sample, query).
  c = chained(b)
  order = np.random.default_rng(1).permutation(len(c['output_batch_index']))
  shuffled = dict(c, **{k: c[k][order] for k in (
      'output_readout_index', 'output_timestamps', 'output_batch_index')})
  assert (np.diff(shuffled['output_batch_index']) < 0).any()
  valid = b['output_readout_index'] != 0
  np.testing.assert_allclose(
      model.output_embeddings(shuffled),
      model.output_embeddings(b).numpy()[valid][order], atol=1e-5)


def test_chained_decoder_makes_no_per_query_copy_of_the_context(
    two_block_model):
  # The decoder attends in per-sample blocks: no tensor of its forward or
  # backward graph is [queries, context tokens, ...] (what a per-query
  # gather of the encoder output, or per-query keys and values, would be).
  decoder = two_block_model.decoder
  c = {k: tf.constant(v) for k, v in chained(_with_empty_sample()).items()}
  num_queries, num_tokens = (int(c['output_batch_index'].shape[0]),
                             int(c['input_mask'].shape[1]))
  assert num_queries not in (num_tokens, 4)  # Shapes tell them apart.
  encoded = tf.random.normal([4, num_tokens, 8], seed=0)

  @tf.function
  def step():
    with tf.GradientTape() as tape:
      out = decoder.call_varlen(c['output_readout_index'],
                                c['output_timestamps'],
                                c['output_batch_index'], encoded,
                                c['input_mask'], training=True)
      loss = tf.reduce_sum(tf.sin(out))
    return tape.gradient(loss, decoder.trainable_variables)

  graph = step.get_concrete_function().graph
  shapes = [t.shape for op in graph.get_operations() for t in op.outputs]
  # Keys and values: projected once per sample, [B, tokens, heads, dh].
  assert [4, num_tokens, 2, 4] in [s.as_list() for s in shapes
                                   if s.rank == 4]
  per_query = [s for s in shapes if s.rank is not None and s.rank >= 2 and
               s[:2].as_list() == [num_queries, num_tokens]]
  assert not per_query, per_query
