"""Unit and session vocabularies: ids, growth without renumbering, files."""
import json
import os

import pytest

from official_ext.readout import unit_vocabulary


def _vocab():
  return unit_vocabulary.from_names(['s1', 's2'], ['s1/0', 's1/1', 's2/a'])


def test_ids_start_at_one():
  v = _vocab()
  assert v.session_id('s1') == 1 and v.session_id('s2') == 2
  assert v.unit_id('s2/a') == 3
  assert v.num_unit_ids == 4 and v.num_session_ids == 3
  assert v.units_of('s1') == ['s1/0', 's1/1']
  assert v.unit_ids_of('s2') == [3]
  with pytest.raises(KeyError, match="'s3'"):
    v.session_id('s3')
  with pytest.raises(KeyError, match="'s1/9'"):
    v.unit_id('s1/9')


def test_extend_appends_without_renumbering():
  v = _vocab()
  grown = unit_vocabulary.extend(v, sessions=['s3', 's1'],
                            units=['s3/0', 's1/1', 's3/1', 's3/0'])
  assert grown.sessions == ('s1', 's2', 's3')
  assert grown.units == ('s1/0', 's1/1', 's2/a', 's3/0', 's3/1')
  for name in v.units:
    assert grown.unit_id(name) == v.unit_id(name)
  assert unit_vocabulary.is_prefix(v, grown) is None
  assert 'units[0]' in unit_vocabulary.is_prefix(
      v, unit_vocabulary.from_names(['s1', 's2'], ['s1/1', 's1/0', 's2/a']))
  with pytest.raises(ValueError, match="'s4/0'.*'s4'"):
    unit_vocabulary.extend(v, units=['s4/0'])


def test_save_load_round_trip_and_errors(tmp_path):
  path = str(tmp_path / 'vocab.json')
  unit_vocabulary.save(_vocab(), path)
  assert unit_vocabulary.load(path) == _vocab()
  assert json.load(open(path)) == {'sessions': ['s1', 's2'],
                                   'units': ['s1/0', 's1/1', 's2/a']}
  assert os.listdir(tmp_path) == ['vocab.json']  # No temporary left.
  bad = tmp_path / 'bad.json'
  bad.write_text(json.dumps({'sessions': ['s1', 's1'], 'units': []}))
  with pytest.raises(ValueError, match=f"{bad}.*'s1' appears twice"):
    unit_vocabulary.load(str(bad))
  bad.write_text(json.dumps({'sessions': ['s1'], 'units': ['s2/0']}))
  with pytest.raises(ValueError, match=f"{bad}.*'s2/0'.*'s2'"):
    unit_vocabulary.load(str(bad))
  bad.write_text(json.dumps({'sessions': ['s1'], 'units': ['nounit']}))
  with pytest.raises(ValueError, match="'nounit'"):
    unit_vocabulary.load(str(bad))
  bad.write_text('{"sessions": []}')
  with pytest.raises(ValueError, match=f'{bad}.*"units"'):
    unit_vocabulary.load(str(bad))
  bad.write_text('not json')
  with pytest.raises(ValueError, match=f'{bad} is not JSON'):
    unit_vocabulary.load(str(bad))
  with pytest.raises(FileNotFoundError, match='missing.json'):
    unit_vocabulary.load(str(tmp_path / 'missing.json'))
  text = unit_vocabulary.to_json(_vocab())
  assert unit_vocabulary.from_json(text, 'x') == _vocab()


def test_fingerprints_are_kept_and_never_change(tmp_path):
  """A session's recorded fingerprint survives save / load and extend; a
  different one for it is an error; ids, equality and the checkpoint's
  `to_json` do not depend on them."""
  v = unit_vocabulary.extend(_vocab(), fingerprints={'s1': 'sha256:a'})
  grown = unit_vocabulary.extend(v, sessions=['s3'], units=['s3/0'],
                            fingerprints={'s1': 'sha256:a', 's3': 'sha256:c'})
  assert dict(grown.fingerprints) == {'s1': 'sha256:a', 's3': 'sha256:c'}
  path = str(tmp_path / 'vocab.json')
  unit_vocabulary.save(grown, path)
  loaded = unit_vocabulary.load(path)
  assert loaded == grown and dict(loaded.fingerprints) == dict(
      grown.fingerprints)
  assert 'fingerprints' not in unit_vocabulary.to_json(grown)
  with pytest.raises(ValueError, match="session 's1' is recording sha256:a, "
                     'not sha256:b'):
    unit_vocabulary.extend(grown, fingerprints={'s1': 'sha256:b'})
  bad = tmp_path / 'bad.json'
  bad.write_text(json.dumps({'sessions': ['s1'], 'units': [],
                             'fingerprints': {'s9': 'sha256:a'}}))
  with pytest.raises(ValueError, match=f"{bad}: a fingerprint of session "
                     "'s9'"):
    unit_vocabulary.load(str(bad))
