"""The unit-token model as POYO builds it, ported from torch_brain's
behaviour: embeddings N(0, 0.02) with a zero, gradient-free padding row, the
session embedding on the decoder query only, unit identification that trains
the new unit and session rows and the Perceiver latents; and the earlier
variant ('session_per_token') kept as it was, each checkpoint refused by the
other."""
import numpy as np
import pytest
import tensorflow as tf
import tf_keras

from official_ext.core import experiment_params
from official_ext.core.run import model_dir as model_dir_lib
from official_ext.readout import configs
from official_ext.readout import demo_data
from official_ext.readout.modeling import model as model_lib
from official_ext.readout import task as task_lib
from official_ext.readout import unit_vocabulary
from tests.readout import test_unit_token_model

TINY = configs.Encoder(hidden_size=8, num_heads=2, num_layers=1, num_latents=4,
                       intermediate_size=8)
# Outputs of the unit-token model below, computed with the code before
# `unit_token_variant` existed (same seed, same inputs): 'session_per_token'
# is that model.
SESSION_PER_TOKEN_OUTPUTS = {
    'choice': [0.624204], 'reward': [-0.311379],
    'stimulus': [-0.490602, -0.020042, -0.514297, -1.554345, -0.242981],
    'wheel_speed': [1.808509], 'paw_speed': [-1.133042, -0.721557],
    'trial_events': [0.05544, -0.314238, -0.6295]}


@pytest.fixture(scope='module')
def data(tmp_path_factory):
  return test_unit_token_model.write_tiny_dataset(
      tmp_path_factory.mktemp('poyo'))


def _task_config(root, patterns, vocab_file, train_split='train',
                 variant=None, **kwargs):
  t = configs.readout_units_demo_task()
  t.model = t.model.replace(encoder=TINY)
  if variant:
    t.model = t.model.replace(unit_token_variant=variant)
  t.vocabulary_file = str(root / vocab_file)
  t.demo_data = t.demo_data.replace(enabled=False)
  t.train_data = t.train_data.replace(input_path=patterns[train_split],
                                      global_batch_size=4,
                                      balance_sessions=False)
  t.validation_data = t.validation_data.replace(
      input_path=patterns['validation'], global_batch_size=4)
  t.evaluation = t.evaluation.replace(stitch=False)
  return t.replace(**kwargs)


def _table_rows(gradient, rows):
  """The rows of a table gradient (dense or IndexedSlices) that are not 0."""
  dense = tf.convert_to_tensor(gradient).numpy()
  return set(np.flatnonzero(np.any(dense != 0, axis=1)).tolist()) & set(
      range(rows))


def test_embeddings_are_normal_with_a_zero_padding_row():
  """torch_brain `InfiniteVocabEmbedding.reset_parameters` (unit, session:
  N(0, 0.02), row 0 zero) and `Embedding(init_scale=0.02)` (task)."""
  tf_keras.utils.set_random_seed(1)
  t = configs.readout_units_demo_task()
  t.model = t.model.replace(encoder=TINY.replace(hidden_size=64,
                                                 num_heads=4))
  sessions = [f's{i}' for i in range(200)]
  units = unit_vocabulary.from_names(sessions, [f'{s}/u{j}' for s in sessions
                                           for j in range(2)])
  model = model_lib.build_model(t, units=units)
  tables = {'unit': model.unit_embedding.embeddings.numpy(),
            'session': model.session_embedding.embeddings.numpy()}
  for name, table in tables.items():
    np.testing.assert_array_equal(table[0], 0, err_msg=name)
    assert abs(np.std(table[1:]) - 0.02) < 1e-3, (name, np.std(table[1:]))
    assert abs(np.mean(table[1:])) < 1e-3, name
  task = model.decoder.task_embedding.embeddings.numpy()
  assert abs(np.std(task) - 0.02) < 3e-3, np.std(task)


def test_session_embedding_enters_only_the_decoder_query(data):
  """torch_brain HEAD `poyo.py:213,221`, v0.1.2 `poyo_plus.py:224,232`:
  input tokens are unit (+ token type) embeddings, the session embedding is
  added to the output queries."""
  root, patterns = data
  task = task_lib.ReadoutTask(_task_config(root, patterns,
                                           demo_data.VOCABULARY_FILE))
  model = task.build_model()
  batch = next(iter(task.build_inputs(task.task_config.validation_data)))
  swapped = dict(batch, session_ids=3 - batch['session_ids'])  # 1 <-> 2.
  table = model.session_embedding.embeddings

  def encode(inputs):
    return model.encoder(model.embed_tokens(inputs),
                         inputs['input_timestamps'], inputs['input_mask'])[0]

  with tf.GradientTape() as tape:
    encoded = encode(batch)
  # The input-token path does not see the session.
  assert tape.gradient(encoded, table) is None
  np.testing.assert_array_equal(encode(swapped), encoded)
  # The outputs do, through the queries: task + time + session embedding.
  assert not np.allclose(model(swapped)['choice'], model(batch)['choice'])
  session = tf.gather(table, batch['session_ids'])
  index = batch['output_readout_index']
  mask = tf.ones(tf.shape(encoded)[:2], tf.bool)
  by_hand = model.decoder(
      index, batch['output_timestamps'], encoded, mask,
      query_embedding=tf.broadcast_to(session[:, None, :],
                                      tf.shape(index).numpy().tolist() + [8]))
  np.testing.assert_allclose(model.output_embeddings(batch), by_hand,
                             atol=1e-6)
  # Chained queries: each takes its own sample's session.
  valid = tf.where(index > 0)
  chained = dict(batch, output_readout_index=tf.gather_nd(index, valid),
                 output_timestamps=tf.gather_nd(batch['output_timestamps'],
                                                valid),
                 output_batch_index=valid[:, 0])
  np.testing.assert_allclose(model.output_embeddings(chained),
                             tf.gather_nd(by_hand, valid), atol=1e-5)


def _pretrained(root, patterns, tmp_path, variant=None):
  task = task_lib.ReadoutTask(_task_config(root, patterns,
                                           demo_data.VOCABULARY_FILE,
                                           variant=variant))
  model = task.build_model()
  path = tf.train.Checkpoint(model=model).save(str(tmp_path / 'ckpt'))
  return model, path


def test_unit_identification_trains_new_rows_and_latents(data, tmp_path):
  """torch_brain v0.1.2 `examples/poyo_plus/finetune.py:46-84`
  (`GradualUnfreezing.freeze`): every module frozen but the unit and session
  embeddings and `latent_emb`, until the unfreeze step; `padding_idx` 0: row
  0 never has a gradient."""
  root, patterns = data
  old, path = _pretrained(root, patterns, tmp_path)
  shipped = configs.readout_units_finetune_demo().task
  t = _task_config(root, patterns, demo_data.HELD_OUT_VOCABULARY_FILE,
                   train_split='held_out_train', init_checkpoint=path,
                   freeze=shipped.freeze, unfreeze_step=2)
  task = task_lib.ReadoutTask(t)
  model = task.build_model()
  task.initialize(model)
  old_units = old.unit_embedding.embeddings.shape[0]
  old_sessions = old.session_embedding.embeddings.shape[0]
  new_units = set(range(old_units, model.unit_embedding.embeddings.shape[0]))
  batch = next(iter(task.build_inputs(t.train_data)))
  variables = model.trainable_variables
  with tf.GradientTape() as tape:
    loss = task.compute_losses(batch, model, training=True)[0]['total_loss']
  raw = tape.gradient(loss, variables)
  latents = model.encoder.latents
  unit_table = model.unit_embedding.embeddings
  session_table = model.session_embedding.embeddings

  def trained(step):
    grads = task.freeze_gradients(model, raw, variables, tf.constant(step))
    found = {}
    for g, v in zip(grads, variables):
      if v is unit_table or v is session_table:
        found[v.name] = _table_rows(g, v.shape[0])
      elif g is not None and np.any(tf.convert_to_tensor(g).numpy() != 0):
        found[v.name] = True
    return found

  identification = trained(0)
  assert identification.pop(latents.name) is True  # `latent_emb` trains.
  units = identification.pop(unit_table.name)
  assert units and units <= new_units, units  # Not row 0, no old unit.
  assert identification.pop(session_table.name) == {old_sessions}
  assert not identification, sorted(identification)  # Nothing else.
  finetuning = trained(2)  # From the unfreeze step on: every variable.
  assert finetuning.pop(unit_table.name) == units
  assert finetuning.pop(session_table.name) == {old_sessions}
  assert set(finetuning) == {
      v.name for g, v in zip(raw, variables)
      if g is not None and v is not unit_table and v is not session_table
      and np.any(tf.convert_to_tensor(g).numpy() != 0)}
  assert {v.name for v in model.decoder.trainable_variables} <= set(
      finetuning)
  # A step of identification: row 0 stays zero, the latents move.
  before = latents.numpy().copy()
  task.train_step(batch, model, tf_keras.optimizers.Adam(0.01),
                  task.build_metrics())
  assert not np.array_equal(latents.numpy(), before)
  np.testing.assert_array_equal(unit_table[0], 0)
  np.testing.assert_array_equal(session_table[0], 0)


def test_session_per_token_is_the_earlier_model():
  tf_keras.utils.set_random_seed(0)
  t = configs.readout_units_demo_task()
  t.model = t.model.replace(encoder=TINY,
                            unit_token_variant='session_per_token')
  units = unit_vocabulary.from_names(['a', 'b'],
                                ['a/0', 'a/1', 'a/2', 'b/0', 'b/1'])
  model = model_lib.build_model(t, units=units)
  rng = np.random.default_rng(0)
  out = model({
      'input_values': tf.ones([2, 5, 1]),
      'input_timestamps': tf.constant(rng.uniform(size=[2, 5]), tf.float32),
      'input_mask': tf.constant([[True] * 5, [True] * 3 + [False] * 2]),
      'input_unit_ids': tf.constant([[1, 2, 3, 1, 2], [4, 5, 4, 0, 0]]),
      'session_ids': tf.constant([1, 2]),
      'output_readout_index': tf.constant([[1, 3, 4, 8], [2, 5, 0, 0]]),
      'output_timestamps': tf.constant(rng.uniform(size=[2, 4]), tf.float32)})
  assert len(model.variables) == 83
  for name, expected in SESSION_PER_TOKEN_OUTPUTS.items():
    np.testing.assert_allclose(out[name].numpy().ravel(), expected,
                               atol=2e-6, err_msg=name)
  assert configs.UNIT_IDENTIFICATION_FREEZE['session_per_token'] == (
      'encoder', 'decoder', 'readout', 'unit_embedding', 'session_embedding')


def test_a_checkpoint_of_the_other_variant_is_refused(data, tmp_path):
  root, patterns = data
  _, earlier = _pretrained(root, patterns, tmp_path / 'earlier',
                           variant='session_per_token')
  _, poyo = _pretrained(root, patterns, tmp_path / 'poyo')
  for path, variant, stored in ((earlier, 'poyo', 'session_per_token'),
                                (poyo, 'session_per_token', 'poyo')):
    assert model_lib.checkpoint_variant(path) == stored
    t = _task_config(root, patterns, demo_data.VOCABULARY_FILE,
                     variant=variant, init_checkpoint=path)
    task = task_lib.ReadoutTask(t)
    with pytest.raises(ValueError, match=(
        f'task.init_checkpoint {path} was written by a unit-token model '
        f"with task.model.unit_token_variant '{stored}'; this model is "
        f"'{variant}'")):
      task.initialize(task.build_model())
    # A run resumed or evaluated from its model_dir.
    run_task = task_lib.ReadoutTask(t.replace(init_checkpoint=''),
                                    logging_dir=str(path.rsplit('/', 1)[0]))
    with pytest.raises(ValueError, match='task.model.unit_token_variant'):
      run_task.build_model()
    # Its own variant restores it.
    same = task_lib.ReadoutTask(t.replace(model=t.model.replace(
        unit_token_variant=stored)))
    same.initialize(same.build_model())


def test_a_params_yaml_without_the_variant_is_the_earlier_model(tmp_path):
  params = experiment_params.load_params('readout_units_demo', lock=False)
  assert params.task.model.unit_token_variant == 'poyo'
  model_dir_lib.write_params_yaml(params, str(tmp_path),
                                  experiment='readout_units_demo')
  path = tmp_path / 'params.yaml'
  lines = path.read_text().splitlines(keepends=True)
  kept = [l for l in lines if 'unit_token_variant' not in l]
  assert len(kept) == len(lines) - 1
  path.write_text(''.join(kept))  # As written before the key existed.
  loaded = experiment_params.load_params('readout_units_demo',
                                         checkpoint_path=str(tmp_path))
  assert loaded.task.model.unit_token_variant == 'session_per_token'
  # A new run of the default variant in that model_dir names the key.
  with pytest.raises(model_dir_lib.ModelDirInUseError,
                     match='task.model.unit_token_variant'):
    model_dir_lib.check_model_dir(params, str(tmp_path),
                                  experiment='readout_units_demo')
