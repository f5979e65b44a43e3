"""`python -m official_ext.readout.demo_data`: whole or nothing, never over
another dataset or inside a model_dir."""
import glob

import pytest

from official_ext.core import output_files
from official_ext.readout import demo_data
from tests import cli

TINY = ('--num_train_trials=6', '--num_validation_trials=4',
        '--num_shards=1', '--num_sessions=2', '--num_held_out_sessions=1',
        '--num_held_out_session_trials=2')


def test_writes_the_splits_and_refuses_what_is_not_its_own(tmp_path, capsys):
  out = tmp_path / 'demo'
  cli.run_main(demo_data, f'--output_dir={out}', *TINY)
  printed = capsys.readouterr().out
  for split in ('train', 'validation'):
    (pattern,) = [line.split(': ', 1)[1] for line in printed.splitlines()
                  if line.startswith(f'{split}: ')]
    assert pattern.startswith(str(out)) and glob.glob(pattern), pattern
  assert not glob.glob(str(out / '.staging-*'))
  with pytest.raises(output_files.OutputExistsError, match='--overwrite'):
    cli.run_main(demo_data, f'--output_dir={out}', *TINY)
  cli.run_main(demo_data, f'--output_dir={out}', *TINY, '--overwrite')
  run = tmp_path / 'run'
  run.mkdir()
  (run / 'checkpoint').write_text('model_checkpoint_path: "ckpt-2"')
  with pytest.raises(ValueError, match=r'lies inside the model_dir'):
    cli.run_main(demo_data, f'--output_dir={run / "data"}', *TINY,
                 '--overwrite')
  assert [p.name for p in run.iterdir()] == ['checkpoint']
