"""SavedModel export: both signatures reproduce the model's predictions."""
import glob

import numpy as np
import pytest
import tensorflow as tf

from official.core import config_definitions as cfg
from official.core import export_base
from official_ext.readout import configs
from official_ext.readout import dataloader
from official_ext.readout import demo_data
from official_ext.readout import export
from official_ext.readout.modeling import model as model_lib
from tests import cli


TOKEN_INPUTS = ('input_values', 'input_timestamps', 'input_mask',
                'output_readout_index', 'output_timestamps')

@pytest.fixture(scope='module')
def exported(tmp_path_factory):
  """A tiny model exported once, its SavedModel loaded, and a padded batch
  of three demo records."""
  tmp_path = tmp_path_factory.mktemp('readout_export')
  task = configs.readout_demo_task()
  task.model.encoder.override({'hidden_size': 8, 'num_heads': 2,
                               'num_layers': 1, 'intermediate_size': 8})
  params = cfg.ExperimentConfig(task=task)
  model = model_lib.build_model(task)
  module = export.ReadoutExportModule(params, model)
  export_dir = tmp_path / 'saved_model'
  export_base.export(module, function_keys={k: k for k in export.SIGNATURES},
                     export_savedmodel_dir=str(export_dir), timestamped=False)
  records = list(demo_data.generate_trials(3, seed=0, split_id=2))
  path = str(tmp_path / 'r.tfrecord')
  dataloader.write_records(path, records)
  data = task.validation_data.replace(input_path=path, global_batch_size=3)
  (batch,) = list(dataloader.build_dataset(data, task.readouts,
                                           task.task_vocabulary))
  return dict(task=task, model=model, export_dir=str(export_dir),
              loaded=tf.saved_model.load(str(export_dir)), records=records,
              batch=batch)


def test_export_signatures_match_the_model(exported, tmp_path):
  task, model, batch = exported['task'], exported['model'], exported['batch']
  loaded, records = exported['loaded'], exported['records']
  export_dir = exported['export_dir']
  served = loaded.signatures['serving_default'](examples=tf.constant(records))
  expected = model(batch)
  index = served['output_readout_index'].numpy()
  np.testing.assert_array_equal(index, batch['output_readout_index'])
  for i, spec in enumerate(task.readouts, start=1):
    np.testing.assert_allclose(served[spec.name].numpy()[index == i],
                               expected[spec.name], rtol=1e-4, atol=1e-5)
  tokens = loaded.signatures['serve_tokens'](
      **{k: batch[k] for k in TOKEN_INPUTS})
  np.testing.assert_allclose(tokens['wheel_speed'], served['wheel_speed'],
                             atol=1e-5)
  bad = dataloader.make_example('bad', np.zeros([1, task.train_data.input_dim]),
                                [0.0], [1], [0.0], [[2.0]])
  with pytest.raises(tf.errors.InvalidArgumentError,
                     match=r'Record `bad` in file `input examples\[1\]`'):
    loaded.signatures['serving_default'](
        examples=tf.constant([records[0], bad.SerializeToString()]))

  # TensorFlow's own server-side tool (the `saved_model_cli` command's entry
  # point, `saved_model_cli.main`), in a fresh process, for both signatures:
  # one process runs both commands (its TensorFlow import is most of a
  # command's time).
  np.save(tmp_path / 'examples.npy', np.array(records, dtype=object),
          allow_pickle=True)
  token_inputs = []
  for k in TOKEN_INPUTS:
    np.save(tmp_path / f'{k}.npy', batch[k].numpy())
    token_inputs.append(f'{k}={tmp_path / (k + ".npy")}')
  runs = [
      ('serving_default', f'examples={tmp_path / "examples.npy"}', served),
      ('serve_tokens', ';'.join(token_inputs), tokens)]
  commands = [['run', '--dir', export_dir, '--tag_set', 'serve',
               '--signature_def', signature, '--inputs', inputs, '--outdir',
               str(tmp_path / f'cli_{signature}')]
              for signature, inputs, _ in runs]
  cli.saved_model_cli(*commands)
  for signature, _, reference in runs:
    outdir = tmp_path / f'cli_{signature}'
    for spec in task.readouts:
      from_cli = np.load(glob.glob(str(outdir / f'{spec.name}.npy'))[0])
      np.testing.assert_allclose(from_cli, reference[spec.name].numpy(),
                                 atol=1e-5, err_msg=f'{signature} {spec.name}')


def test_serve_tokens_refuses_what_it_cannot_score(exported):
  # Before: a NaN or Inf in a masked (padding) input token, or in the
  # timestamp of a padding query, made outputs NaN (attention masks by adding
  # -1e9, and NaN + -1e9 is NaN); NaN in an unmasked token came back as NaN
  # outputs; a row without an unmasked token, a routing id without a head,
  # and inputs of different lengths were not refused (or failed deep in the
  # model).
  fn = exported['loaded'].signatures['serve_tokens']
  batch = {k: exported['batch'][k].numpy() for k in TOKEN_INPUTS}
  # Two more masked input tokens and one more padding query in every row.
  b, n_in, dim = batch['input_values'].shape
  zero = dict(batch)
  zero['input_values'] = np.concatenate(
      [batch['input_values'], np.zeros([b, 2, dim], np.float32)], 1)
  zero['input_timestamps'] = np.concatenate(
      [batch['input_timestamps'], np.zeros([b, 2], np.float32)], 1)
  zero['input_mask'] = np.concatenate(
      [batch['input_mask'], np.zeros([b, 2], bool)], 1)
  zero['output_readout_index'] = np.concatenate(
      [batch['output_readout_index'], np.zeros([b, 1], np.int32)], 1)
  zero['output_timestamps'] = np.concatenate(
      [batch['output_timestamps'], np.zeros([b, 1], np.float32)], 1)
  want = fn(**zero)
  junk = {k: v.copy() for k, v in zero.items()}
  junk['input_values'][0, n_in:] = np.nan
  junk['input_values'][1, n_in + 1, 3] = np.inf
  junk['input_timestamps'][2, n_in:] = [-np.inf, np.nan]
  junk['output_timestamps'][:, -1] = [np.nan, np.inf, 1e38]
  got = fn(**junk)
  for spec in exported['task'].readouts:
    assert np.isfinite(got[spec.name].numpy()).all(), spec.name
    np.testing.assert_allclose(got[spec.name], want[spec.name], atol=1e-5,
                               err_msg=spec.name)

  def refused(match, **changes):
    inputs = dict(zero, **changes)
    with pytest.raises(tf.errors.InvalidArgumentError, match=match):
      fn(**{k: tf.constant(v) for k, v in inputs.items()})

  bad = zero['input_values'].copy()
  bad[1, 2, 5] = np.nan
  refused(r'row 1 of input_values has a NaN or infinite value \(nan\) in '
          r'token 2, an unmasked token', input_values=bad)
  bad = zero['input_timestamps'].copy()
  bad[2, 0] = np.inf
  refused(r'row 2 of input_timestamps has a NaN or infinite value \(inf\) '
          'in token 0, an unmasked token', input_timestamps=bad)
  bad = zero['output_timestamps'].copy()
  bad[0, 1] = np.nan
  refused(r'row 0 of output_timestamps has a NaN or infinite value \(nan\) '
          'at query 1', output_timestamps=bad)
  mask = zero['input_mask'].copy()
  mask[1] = False
  refused(r'row 1 has no unmasked input token \(input_mask is all False\)',
          input_mask=mask)
  index = zero['output_readout_index'].copy()
  index[2, 1] = 99
  refused(r'row 2 of output_readout_index has id 99 at query 1',
          output_readout_index=index)
  refused(r'input_timestamps has 2 rows but input_values has 3',
          input_timestamps=zero['input_timestamps'][:2])
  refused(rf'input_mask has {n_in + 1} tokens \(dimension 1\) but '
          rf'input_values has {n_in + 2}',
          input_mask=zero['input_mask'][:, :-1])
  n_out = zero['output_readout_index'].shape[1]
  refused(rf'output_timestamps has {n_out - 1} queries \(dimension 1\) but '
          rf'output_readout_index has {n_out}',
          output_timestamps=zero['output_timestamps'][:, 1:])
  refused(r'output_readout_index has 4 rows but input_values has 3',
          output_readout_index=np.zeros([4, n_out], np.int32))
  refused(r'input_mask has shape \[3\]; expected \[batch, tokens\]',
          input_mask=zero['input_mask'][:, 0])
