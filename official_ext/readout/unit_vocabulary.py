"""Unit and session vocabularies of unit-token readout models: the ids of
recording sessions and units, and their JSON file (docs/readout.md,
Vocabulary)."""
import dataclasses
import json
from typing import Dict, Iterable, List, Mapping, Optional, Sequence, Tuple

import tensorflow as tf, tf_keras  # pylint: disable=unused-import

from official_ext.core import output_files

PADDING_ID = 0


def unit_name(session: str, unit: str) -> str:
  """The vocabulary name of unit `unit` of session `session`."""
  return f'{session}/{unit}'


def session_of_unit(name: str) -> str:
  """The session part of a unit name (before its last '/'); '' if none."""
  return name.rpartition('/')[0]


@dataclasses.dataclass(frozen=True)
class Vocabulary:
  """The sessions and units a model knows; id = 1 + position (0: padding).

  Attributes:
    sessions: session names, in id order.
    units: unit names `<session>/<unit>`, in id order.
    fingerprints: {session: fingerprint of its recording} (`readout.nwb`);
      not part of the ids, equality or `to_json`.
  """
  sessions: Tuple[str, ...] = ()
  units: Tuple[str, ...] = ()
  fingerprints: Mapping[str, str] = dataclasses.field(
      default_factory=dict, compare=False)

  @property
  def num_session_ids(self) -> int:
    """Rows of a session table: the sessions + 1 (padding row 0)."""
    return len(self.sessions) + 1

  @property
  def num_unit_ids(self) -> int:
    """Rows of a unit table: the units + 1 (padding row 0)."""
    return len(self.units) + 1

  def session_id(self, name: str, where: str = 'the vocabulary') -> int:
    """The id of session `name`; KeyError naming it and `where` if absent."""
    try:
      return self.sessions.index(name) + 1
    except ValueError:
      raise KeyError(f'Session {name!r} is not in {where} '
                     f'({len(self.sessions)} sessions).') from None

  def unit_id(self, name: str, where: str = 'the vocabulary') -> int:
    """The id of unit `name` (`<session>/<unit>`); KeyError if absent."""
    try:
      return self.units.index(name) + 1
    except ValueError:
      raise KeyError(f'Unit {name!r} is not in {where} '
                     f'({len(self.units)} units).') from None

  def units_of(self, session: str) -> List[str]:
    """The unit names of `session`, in id order."""
    return [u for u in self.units if session_of_unit(u) == session]

  def unit_ids_of(self, session: str) -> List[int]:
    """The unit ids of `session`, ascending."""
    return [i + 1 for i, u in enumerate(self.units)
            if session_of_unit(u) == session]

  def as_dict(self) -> Dict[str, List[str]]:
    return {'sessions': list(self.sessions), 'units': list(self.units)}


def _check_names(names: Sequence[str], kind: str, where: str) -> None:
  seen = set()
  for i, name in enumerate(names):
    if not isinstance(name, str) or not name:
      raise ValueError(f'{where}: {kind}[{i}] is {name!r}; expected a '
                       'non-empty string.')
    if name in seen:
      raise ValueError(f'{where}: {kind} name {name!r} appears twice '
                       f'(again at position {i}); names are unique.')
    seen.add(name)


def from_names(sessions: Sequence[str], units: Sequence[str],
               where: str = 'Vocabulary',
               fingerprints: Optional[Mapping[str, str]] = None
               ) -> Vocabulary:
  """A checked `Vocabulary`; ValueError naming `where` and the name at fault.

  Names are unique and non-empty; a unit is `<session>/<unit>` of a listed
  session; fingerprints are non-empty strings of listed sessions.
  """
  sessions, units = tuple(sessions), tuple(units)
  _check_names(sessions, 'sessions', where)
  _check_names(units, 'units', where)
  known = set(sessions)
  for name in units:
    session = session_of_unit(name)
    if not session or not name.rpartition('/')[2]:
      raise ValueError(f'{where}: unit name {name!r} is not '
                       "'<session>/<unit>'.")
    if session not in known:
      raise ValueError(f'{where}: unit {name!r} belongs to session '
                       f'{session!r}, which is not among its sessions.')
  fingerprints = dict(fingerprints or {})
  for session, fingerprint in fingerprints.items():
    if session not in known:
      raise ValueError(f'{where}: a fingerprint of session {session!r}, '
                       'which is not among its sessions.')
    if not isinstance(fingerprint, str) or not fingerprint:
      raise ValueError(f'{where}: the fingerprint of session {session!r} is '
                       f'{fingerprint!r}; expected a non-empty string.')
  return Vocabulary(sessions=sessions, units=units, fingerprints=fingerprints)


def extend(vocabulary: Vocabulary, sessions: Iterable[str] = (),
           units: Iterable[str] = (),
           fingerprints: Optional[Mapping[str, str]] = None) -> Vocabulary:
  """`vocabulary` with new sessions, units and fingerprints appended (existing
  ids kept); ValueError for a bad name or a changed fingerprint."""
  new_sessions = list(vocabulary.sessions)
  for name in sessions:
    if name not in new_sessions:
      new_sessions.append(name)
  new_units = list(vocabulary.units)
  present = set(new_units)
  for name in units:
    if name not in present:
      new_units.append(name)
      present.add(name)
  new_fingerprints = dict(vocabulary.fingerprints)
  for session, fingerprint in (fingerprints or {}).items():
    known = new_fingerprints.setdefault(session, fingerprint)
    if known != fingerprint:
      raise ValueError(f'extend(vocabulary): session {session!r} is '
                       f'recording {known}, not {fingerprint}; another '
                       'recording needs another session name.')
  return from_names(new_sessions, new_units, where='extend(vocabulary)',
                    fingerprints=new_fingerprints)


def load(path: str) -> Vocabulary:
  """Reads a vocabulary file; FileNotFoundError or ValueError naming it."""
  if not tf.io.gfile.exists(path):
    raise FileNotFoundError(f'Vocabulary file {path} does not exist.')
  with tf.io.gfile.GFile(path, 'r') as f:
    text = f.read()
  try:
    data = json.loads(text)
  except json.JSONDecodeError as e:
    raise ValueError(f'Vocabulary file {path} is not JSON: {e}.') from None
  if not isinstance(data, dict) or not (
      {'sessions', 'units'} <= set(data) <=
      {'sessions', 'units', 'fingerprints'}):
    keys = sorted(data) if isinstance(data, dict) else type(data).__name__
    raise ValueError(f'Vocabulary file {path}: expected an object with the '
                     'keys "sessions" and "units" (and optionally '
                     f'"fingerprints"); got {keys}.')
  if not isinstance(data.get('fingerprints', {}), dict):
    raise ValueError(f'Vocabulary file {path}: "fingerprints" is a '
                     f'{type(data["fingerprints"]).__name__}; expected an '
                     'object {session: fingerprint}.')
  for key in ('sessions', 'units'):
    if not isinstance(data[key], list):
      raise ValueError(f'Vocabulary file {path}: "{key}" is a '
                       f'{type(data[key]).__name__}; expected a list of '
                       'names.')
  return from_names(data['sessions'], data['units'],
                    where=f'Vocabulary file {path}',
                    fingerprints=data.get('fingerprints'))


def save(vocabulary: Vocabulary, path: str) -> None:
  """Writes `vocabulary` to `path` as JSON, whole or not at all."""
  checked = from_names(vocabulary.sessions, vocabulary.units,
                       where=f'save(vocabulary, {path!r})',
                       fingerprints=vocabulary.fingerprints)
  data = checked.as_dict()
  if checked.fingerprints:
    data['fingerprints'] = {s: checked.fingerprints[s]
                            for s in checked.sessions
                            if s in checked.fingerprints}
  text = json.dumps(data, indent=1) + '\n'
  output_files.write_atomically(path, lambda f: f.write(text))


def to_json(vocabulary: Vocabulary) -> str:
  """The vocabulary as a compact JSON string (stored with checkpoints)."""
  return json.dumps(vocabulary.as_dict(), separators=(',', ':'))


def from_json(text: str, where: str) -> Vocabulary:
  """The vocabulary of `to_json`'s string; errors name `where`."""
  try:
    data = json.loads(text)
  except json.JSONDecodeError as e:
    raise ValueError(f'{where}: the stored vocabulary is not JSON: '
                     f'{e}.') from None
  return from_names(data.get('sessions', ()), data.get('units', ()),
                    where=where)


def is_prefix(old: Vocabulary, new: Vocabulary) -> Optional[str]:
  """None if `new` extends `old`; else what differs, for an error message."""
  for kind in ('sessions', 'units'):
    a, b = getattr(old, kind), getattr(new, kind)
    if len(b) < len(a):
      return f'{kind}: {len(a)} before, only {len(b)} now'
    for i, (x, y) in enumerate(zip(a, b)):
      if x != y:
        return f'{kind}[{i}] was {x!r}, is {y!r} now'
  return None
