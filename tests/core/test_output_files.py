"""`core.output_files`: what an output directory may be."""
import pytest

from official_ext.core import output_files


@pytest.mark.parametrize('marker', ['checkpoint', 'saved_model.pb'])
@pytest.mark.parametrize('where', ['run', 'run/sub', 'run/new/deeper'])
def test_no_output_directory_inside_a_model_dir_or_saved_model(
    tmp_path, marker, where):
  """Not even with --overwrite, and not a new folder inside one."""
  run = tmp_path / 'run'
  (run / 'sub').mkdir(parents=True)
  (run / marker).write_text('x')
  with pytest.raises(ValueError, match=r'lies inside the (model_dir|'
                     r'SavedModel directory) .*run.*Nothing was written'):
    output_files.check_output_dir(str(tmp_path / where), overwrite=True)
  with pytest.raises(ValueError, match='lies inside'):
    output_files.write_directory(str(tmp_path / where),
                                 lambda d: None, overwrite=True)
  assert sorted(p.name for p in run.iterdir()) == sorted([marker, 'sub'])


def test_an_output_directory_elsewhere_is_written(tmp_path):
  (tmp_path / 'run').mkdir()
  (tmp_path / 'run' / 'checkpoint').write_text('x')
  out = tmp_path / 'data'
  output_files.write_directory(
      str(out), lambda d: open(f'{d}/a.txt', 'w').close())
  assert [p.name for p in out.iterdir()] == ['a.txt']
