"""SavedModel export: both signatures reproduce the model's predictions."""
import glob
import os
import subprocess

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


def test_export_signatures_match_the_model(tmp_path):
  task = configs.readout_demo_task()
  task.model.encoder.override({'hidden_size': 8, 'num_heads': 2,
                               'num_layers': 1, 'intermediate_size': 8})
  params = cfg.ExperimentConfig(task=task)
  model = model_lib.build_model(task)
  module = export.ReadoutExportModule(params, model)
  export_base.export(module, function_keys={k: k for k in export.SIGNATURES},
                     export_savedmodel_dir=str(tmp_path), timestamped=False)
  loaded = tf.saved_model.load(str(tmp_path))
  records = list(demo_data.generate_trials(3, seed=0, split_id=2))
  served = loaded.signatures['serving_default'](examples=tf.constant(records))
  path = str(tmp_path / 'r.tfrecord')
  dataloader.write_records(path, records)
  data = task.validation_data.replace(input_path=path, global_batch_size=3)
  (batch,) = list(dataloader.build_dataset(data, task.readouts,
                                           task.task_vocabulary))
  expected = model(batch)
  index = served['output_readout_index'].numpy()
  np.testing.assert_array_equal(index, batch['output_readout_index'])
  for i, spec in enumerate(task.readouts, start=1):
    np.testing.assert_allclose(served[spec.name].numpy()[index == i],
                               expected[spec.name], rtol=1e-4, atol=1e-5)
  tokens = loaded.signatures['serve_tokens'](
      **{k: batch[k] for k in ('input_values', 'input_timestamps',
                               'input_mask', 'output_readout_index',
                               'output_timestamps')})
  np.testing.assert_allclose(tokens['wheel_speed'], served['wheel_speed'],
                             atol=1e-5)
  bad = dataloader.make_example('bad', np.zeros([1, task.train_data.input_dim]),
                                [0.0], [1], [0.0], [[2.0]])
  with pytest.raises(tf.errors.InvalidArgumentError,
                     match=r'Record `bad` in file `input examples\[1\]`'):
    loaded.signatures['serving_default'](
        examples=tf.constant([records[0], bad.SerializeToString()]))

  # TensorFlow's own server-side tool, in a fresh process, for both
  # signatures.
  np.save(tmp_path / 'examples.npy', np.array(records, dtype=object),
          allow_pickle=True)
  token_inputs = []
  for k in ('input_values', 'input_timestamps', 'input_mask',
            'output_readout_index', 'output_timestamps'):
    np.save(tmp_path / f'{k}.npy', batch[k].numpy())
    token_inputs.append(f'{k}={tmp_path / (k + ".npy")}')
  for signature, inputs, reference in (
      ('serving_default', f'examples={tmp_path / "examples.npy"}', served),
      ('serve_tokens', ';'.join(token_inputs), tokens)):
    outdir = tmp_path / f'cli_{signature}'
    result = subprocess.run(
        ['saved_model_cli', 'run', '--dir', str(tmp_path), '--tag_set',
         'serve', '--signature_def', signature, '--inputs', inputs,
         '--outdir', str(outdir)], capture_output=True, text=True,
        timeout=300, check=False,
        env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL='2'))
    assert result.returncode == 0, result.stderr[-3000:]
    for spec in task.readouts:
      cli = np.load(glob.glob(str(outdir / f'{spec.name}.npy'))[0])
      np.testing.assert_allclose(cli, reference[spec.name].numpy(),
                                 atol=1e-5, err_msg=f'{signature} {spec.name}')
