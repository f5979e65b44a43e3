"""Unit-token models: the binned option unchanged, unit and session
embeddings, demo data over sessions of different unit counts, and
fine-tuning from a checkpoint with a grown vocabulary and frozen modules."""
import numpy as np
import pytest
import tensorflow as tf
import tf_keras

from official.core import config_definitions as cfg
from official.core import export_base
from official_ext.readout import configs
from official_ext.readout import demo_data
from official_ext.readout import export
from official_ext.readout import task as task_lib
from official_ext.readout import unit_vocabulary
from official_ext.readout.modeling import model as model_lib

TINY = configs.Encoder(hidden_size=8, num_heads=2, num_layers=1, num_latents=4,
                       intermediate_size=8)
# Outputs of the binned model below, computed with the code before unit
# tokens existed (same seed, same inputs): the binned option is unchanged.
BINNED_OUTPUTS = {
    'choice': [-0.07964], 'reward': [-1.516006],
    'stimulus': [0.624354, 0.654242, 0.820259, -0.819344, -1.49579],
    'wheel_speed': [-1.074387], 'paw_speed': [1.562843, -0.588389],
    'trial_events': [-0.238181, -1.568905, -1.191127]}


def test_binned_model_is_unchanged():
  tf_keras.utils.set_random_seed(0)
  t = configs.readout_demo_task()
  t.model = t.model.replace(encoder=TINY)
  t.train_data = t.train_data.replace(input_dim=3)
  assert t.model.tokenization == 'binned'
  model = model_lib.build_model(t)
  rng = np.random.default_rng(0)
  out = model({
      'input_values': tf.constant(rng.normal(size=[2, 5, 3]), tf.float32),
      'input_timestamps': tf.constant(rng.uniform(size=[2, 5]), tf.float32),
      'input_mask': tf.constant([[True] * 5, [True] * 3 + [False] * 2]),
      'output_readout_index': tf.constant([[1, 3, 4, 8], [2, 5, 0, 0]]),
      'output_timestamps': tf.constant(rng.uniform(size=[2, 4]), tf.float32)})
  assert len(model.variables) == 80
  assert not any('unit' in v.name or 'session' in v.name
                 for v in model.variables)
  for name, expected in BINNED_OUTPUTS.items():
    np.testing.assert_allclose(out[name].numpy().ravel(), expected,
                               atol=2e-6, err_msg=name)


def write_tiny_dataset(root):
  """(root, split patterns) of tiny unit-token data: 2 training sessions,
  1 held out."""
  patterns = demo_data.write_unit_token_dataset(
      str(root), num_train_trials=8, num_validation_trials=4, num_shards=1,
      seed=3, num_sessions=2, num_held_out_sessions=1,
      num_held_out_session_trials=2, num_held_out_train_trials=4,
      min_units=3, max_units=6, mean_rate_hz=4.0)
  return root, patterns


@pytest.fixture(scope='module')
def data(tmp_path_factory):
  return write_tiny_dataset(tmp_path_factory.mktemp('unit_tokens'))


def _task_config(root, patterns, vocab_file, train_split='train', **kwargs):
  t = configs.readout_units_demo_task()
  t.model = t.model.replace(encoder=TINY)
  t.vocabulary_file = str(root / vocab_file)
  t.demo_data = t.demo_data.replace(enabled=False)
  t.train_data = t.train_data.replace(input_path=patterns[train_split],
                                      global_batch_size=4,
                                      balance_sessions=False)
  t.validation_data = t.validation_data.replace(
      input_path=patterns['validation'], global_batch_size=4)
  t.evaluation = t.evaluation.replace(stitch=False)
  return t.replace(**kwargs)


def test_demo_sessions_differ_in_unit_count(data):
  root, _ = data
  small = unit_vocabulary.load(str(root / demo_data.VOCABULARY_FILE))
  grown = unit_vocabulary.load(str(root / demo_data.HELD_OUT_VOCABULARY_FILE))
  assert small.sessions == ('session-000', 'session-001')
  assert grown.sessions == small.sessions + ('session-002',)
  assert unit_vocabulary.is_prefix(small, grown) is None
  counts = [len(grown.units_of(s)) for s in grown.sessions]
  assert all(3 <= c <= 6 for c in counts) and len(set(counts)) > 1, counts


def test_unit_embeddings_and_modules(data):
  root, patterns = data
  task = task_lib.ReadoutTask(_task_config(root, patterns,
                                           demo_data.VOCABULARY_FILE))
  model = task.build_model()
  units = task.unit_vocabulary()
  assert model.unit_embedding.embeddings.shape == (units.num_unit_ids, 8)
  assert model.session_embedding.embeddings.shape == (3, 8)
  def parts(module):
    found = set()
    for v in model.module_variables(module):
      found |= {p for p in ('token_embedding', 'encoder', 'decoder',
                            'readout/', 'unit_embedding', 'session_embedding',
                            'latents') if p in v.name}
    return found
  assert parts('encoder') == {'token_embedding', 'encoder', 'latents'}
  assert parts('latents') == {'latents'}
  assert parts('encoder_except_latents') == {'token_embedding', 'encoder'}
  assert parts('unit_embedding') == {'unit_embedding'}
  assert parts('session_embedding') == {'session_embedding'}
  assert parts('readout') == {'readout/'}
  assert len(model.trainable_variables) == sum(
      len(model.module_variables(m)) for m in configs.FREEZABLE_MODULES
      if m != 'encoder')
  batch = next(iter(task.build_inputs(task.task_config.validation_data)))
  out = model(batch)
  other = dict(batch, input_unit_ids=tf.where(
      batch['input_unit_ids'] > 0, 1, 0))
  assert not np.allclose(model(other)['choice'], out['choice'])
  assert tf.strings.regex_full_match(model.unit_vocabulary,
                                     '.*session-001/unit.*').numpy()


def _pretrained(root, patterns, tmp_path):
  task = task_lib.ReadoutTask(_task_config(root, patterns,
                                           demo_data.VOCABULARY_FILE))
  model = task.build_model()
  path = tf.train.Checkpoint(model=model).save(str(tmp_path / 'ckpt'))
  return model, path


def test_finetune_grows_rows_and_freezes_modules(data, tmp_path):
  root, patterns = data
  old, path = _pretrained(root, patterns, tmp_path)
  t = _task_config(root, patterns, demo_data.HELD_OUT_VOCABULARY_FILE,
                   train_split='held_out_train', init_checkpoint=path,
                   freeze=configs.FREEZABLE_MODULES, unfreeze_step=2)
  task = task_lib.ReadoutTask(t)
  model = task.build_model()
  task.initialize(model)
  n_old = old.unit_embedding.embeddings.shape[0]
  new_rows = model.unit_embedding.embeddings.numpy()[n_old:].copy()
  assert new_rows.shape[0] > 0
  # Old rows bit-identical, every other variable restored exactly.
  np.testing.assert_array_equal(model.unit_embedding.embeddings[:n_old],
                                old.unit_embedding.embeddings)
  np.testing.assert_array_equal(model.session_embedding.embeddings[:3],
                                old.session_embedding.embeddings)
  for a, b in zip(old.trainable_variables, model.trainable_variables):
    if 'embedding/embeddings' not in a.name:
      np.testing.assert_array_equal(a.numpy(), b.numpy(), err_msg=a.name)
  before = [v.numpy().copy() for v in model.trainable_variables]
  batch = next(iter(task.build_inputs(t.train_data)))
  optimizer = tf_keras.optimizers.Adam(0.01)
  task.train_step(batch, model, optimizer, task.build_metrics())
  for v, b in zip(model.trainable_variables, before):
    if v is model.unit_embedding.embeddings:
      np.testing.assert_array_equal(v[:n_old], b[:n_old])
      assert not np.array_equal(v[n_old:], b[n_old:])  # The new unit rows.
    elif v is model.session_embedding.embeddings:
      np.testing.assert_array_equal(v[:3], b[:3])
      assert not np.array_equal(v[3:], b[3:])
    else:
      np.testing.assert_array_equal(v.numpy(), b, err_msg=v.name)
  optimizer.iterations.assign(2)  # unfreeze_step: everything trains.
  encoder_before = model.encoder.trainable_variables[0].numpy().copy()
  task.train_step(batch, model, optimizer, task.build_metrics())
  assert not np.array_equal(model.encoder.trainable_variables[0],
                            encoder_before)


def test_finetune_refuses_mismatched_checkpoints(data, tmp_path):
  root, patterns = data
  _, path = _pretrained(root, patterns, tmp_path)
  renumbered = unit_vocabulary.load(str(root / demo_data.VOCABULARY_FILE))
  renumbered = unit_vocabulary.from_names(renumbered.sessions,
                                          renumbered.units[::-1])
  unit_vocabulary.save(renumbered, str(tmp_path / 'renumbered.json'))
  t = _task_config(root, patterns, 'x', init_checkpoint=path)
  t.vocabulary_file = str(tmp_path / 'renumbered.json')
  task = task_lib.ReadoutTask(t)
  with pytest.raises(ValueError, match=r'not a prefix.*units\[0\]'):
    task.initialize(task.build_model())
  with pytest.raises(ValueError, match='task.init_checkpoint is empty'):
    task_lib.ReadoutTask(_task_config(root, patterns, 'x',
                                      freeze=('encoder',)))
  with pytest.raises(ValueError, match="task.freeze names \\['encoders'\\]"):
    task_lib.ReadoutTask(_task_config(root, patterns, 'x',
                                      init_checkpoint=path,
                                      freeze=('encoders',)))
  # A run's own checkpoint (resume, eval) must match the vocabulary file.
  run_task = task_lib.ReadoutTask(t.replace(init_checkpoint=''),
                                  logging_dir=str(tmp_path))
  with pytest.raises(ValueError, match='another unit vocabulary'):
    run_task.build_model()
  binned = configs.readout_demo_task()
  binned.model = binned.model.replace(encoder=TINY)
  binned.init_checkpoint = path
  binned_task = task_lib.ReadoutTask(binned)
  with pytest.raises(ValueError, match='has a unit vocabulary'):
    binned_task.initialize(binned_task.build_model())


def test_export_round_trip(data, tmp_path):
  root, patterns = data
  t = _task_config(root, patterns, demo_data.VOCABULARY_FILE)
  task = task_lib.ReadoutTask(t)
  model = task.build_model()
  module = export.ReadoutExportModule(cfg.ExperimentConfig(task=t), model)
  export_base.export(module, function_keys={k: k for k in export.SIGNATURES},
                     export_savedmodel_dir=str(tmp_path / 'sm'),
                     timestamped=False)
  loaded = tf.saved_model.load(str(tmp_path / 'sm'))
  assert (loaded.model.unit_vocabulary.numpy().decode() ==
          unit_vocabulary.to_json(task.unit_vocabulary()))
  records = list(tf.data.TFRecordDataset(tf.io.gfile.glob(
      patterns['validation'])).as_numpy_iterator())
  batch = next(iter(task.build_inputs(t.validation_data.replace(
      global_batch_size=len(records)))))
  expected = model(batch)
  served = loaded.signatures['serving_default'](examples=tf.constant(records))
  index = served['output_readout_index'].numpy()
  np.testing.assert_allclose(served['choice'].numpy()[index == 1],
                             expected['choice'], rtol=1e-4, atol=1e-5)
  keys = ('input_values', 'input_timestamps', 'input_mask',
          'output_readout_index', 'output_timestamps', 'input_unit_ids',
          'session_ids')
  tokens = loaded.signatures['serve_tokens'](**{k: batch[k] for k in keys})
  np.testing.assert_allclose(tokens['choice'], served['choice'], atol=1e-5)
  bad = dict({k: batch[k] for k in keys})
  bad['input_unit_ids'] = tf.tensor_scatter_nd_update(
      bad['input_unit_ids'], [[1, 0]], [99])
  with pytest.raises(tf.errors.InvalidArgumentError,
                     match='row 1 of input_unit_ids has unit id 99 at token '
                           '0, which is not in the unit vocabulary'):
    loaded.signatures['serve_tokens'](**bad)
  # A checkpoint of another vocabulary restored into the model is refused.
  model.unit_vocabulary.assign('{"sessions":[],"units":[]}')
  with pytest.raises(ValueError, match='another unit vocabulary'):
    export.ReadoutExportModule(cfg.ExperimentConfig(task=t), model)
