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


def test_a_file_url_is_the_local_path_it_names(tmp_path):
  """`file:///x` and `/x` are one file: an output given as a `file://` URL
  inside a model_dir is refused like the plain path."""
  run = tmp_path / 'run'
  run.mkdir()
  (run / 'checkpoint').write_text('x')
  with pytest.raises(ValueError, match='lies inside'):
    output_files.check_output_dir(f'file://{run}/out', overwrite=True)
  data = tmp_path / 'data.csv'
  data.write_text('a\n')
  with pytest.raises(ValueError, match='is the input file'):
    output_files.check_output_file(f'file://{data}', '--output_file',
                                   inputs=[('--input', str(data))])
  with pytest.raises(ValueError, match='lies inside'):
    output_files.check_output_file(str(tmp_path / 'other' / 'x.csv'),
                                   '--output_file', creates_folder=True,
                                   models=[('--model_dir',
                                            f'file://{tmp_path}/other')])
  assert output_files.local_path(f'file://{run}') == str(run)
  assert output_files.local_path('gs://bucket/run') is None


def test_write_together_moves_only_the_files_it_names(tmp_path):
  """A scratch file the caller writes beside the staged ones stays out."""
  out = tmp_path / 'out'
  with output_files.write_together([str(out / 'a.txt')]) as staged:
    with open(staged[str(out / 'a.txt')], 'w') as f:
      f.write('a')
    with open(staged[str(out / 'a.txt')][:-len('a.txt')] + 'scratch', 'w') as f:
      f.write('s')
  assert sorted(p.name for p in out.iterdir()) == ['a.txt']
