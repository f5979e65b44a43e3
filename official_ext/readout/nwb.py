"""Neurodata Without Borders (NWB) files into readout records, readout.yaml
and conversion.json (the command: scripts/nwb_to_readout.py; formats and
rules: docs/readout.md#real-recordings-nwb-files-in)."""
import dataclasses
import hashlib
import json
import math
import os
import re
import shlex
from typing import Any, Dict, List, Optional, Sequence, Tuple

import numpy as np
import yaml

from official_ext.core import output_files
from official_ext.readout import configs
from official_ext.readout import dataloader
from official_ext.readout import unit_vocabulary as vocabulary_lib

# Readout types a trials column can be converted to; time series are
# continuous.
COLUMN_TYPES = ('binary', 'multinomial', 'continuous', 'event_rate')
_NAME = re.compile(r'^[A-Za-z0-9_.\-]+$')
EXPERIMENT = 'readout_demo'
_CONFIG, _SUMMARY = 'readout.yaml', 'conversion.json'
_VOCABULARY = 'vocabulary.json'
# `--tokens`: 'binned' (one file: a vector of every unit's counts per bin) or
# 'spikes' (one token per spike: unit id, value 1, time; several files).
TOKENS = ('binned', 'spikes')


class NWBConversionError(ValueError):
  """The NWB file lacks what the conversion needs (the message names it)."""


@dataclasses.dataclass
class Readout:
  """One readout of the conversion.

  Attributes:
    name: task name.
    source: `trials/<column>`, or the time series' path.
    type: readout type.
    dim: head width.
    classes: multinomial: the original value of each class id.
    reason: why the type was chosen, for the summary.
    targets: a trials column's float [n_trials] targets (class ids for
      multinomial), NaN where a trial has no value.
  """
  name: str
  source: str
  type: str
  dim: int
  classes: Optional[List[Any]] = None
  reason: str = ''
  targets: Optional[np.ndarray] = None

  def spec(self) -> configs.ReadoutSpec:
    return configs.ReadoutSpec(name=self.name, type=self.type, dim=self.dim)


@dataclasses.dataclass
class Session:
  """What the conversion reads from one NWB file: unit ids, sorted spike
  times per unit, the trials' ids and times, {column: [n_trials] values},
  {readout: (location, timestamps [n], data [n, channels])}, fingerprint."""
  path: str
  identifier: str
  unit_ids: np.ndarray
  spike_times: List[np.ndarray]
  trial_ids: np.ndarray
  start_time: np.ndarray
  stop_time: np.ndarray
  columns: Dict[str, np.ndarray]
  series: Dict[str, Tuple[str, np.ndarray, np.ndarray]]
  fingerprint: str = ''


def recording_fingerprint(session_start_time: str, unit_ids: np.ndarray,
                          spike_times: Sequence[np.ndarray]) -> str:
  """'sha256:' + the SHA-256 of a recording's start time and units table
  (each unit's id and spike times): what tells recordings under one
  identifier apart."""
  digest = hashlib.sha256(session_start_time.encode())
  for unit, times in zip(unit_ids, spike_times):
    times = np.asarray(times, '<f8')
    digest.update(np.asarray([unit, times.size], '<i8').tobytes())
    digest.update(times.tobytes())
  return 'sha256:' + digest.hexdigest()


def parse_names(text: str, flag: str) -> List[Tuple[str, Optional[str]]]:
  """'a,b:type' -> [('a', None), ('b', 'type')]; ValueError naming `flag`."""
  out = []
  for item in (text or '').split(','):
    item = item.strip()
    if not item:
      continue
    name, _, kind = item.partition(':')
    if kind and kind not in COLUMN_TYPES:
      raise ValueError(f'{flag}: {item!r} asks for type {kind!r}; expected '
                       f'one of {COLUMN_TYPES}.')
    out.append((name, kind or None))
  return out


def _file_contents(nwbfile) -> str:
  """What the file holds, for error messages."""
  intervals = sorted(nwbfile.intervals or {})
  return (f'acquisition {sorted(nwbfile.acquisition)}, processing modules '
          f'{sorted(nwbfile.processing)}, intervals {intervals}, units table '
          f'{"yes" if nwbfile.units is not None else "no"}')


def _time_series(nwbfile) -> Dict[str, Any]:
  """{path: TimeSeries} in acquisition, processing modules, their containers."""
  import pynwb  # pylint: disable=g-import-not-at-top
  found = {}
  for name, obj in nwbfile.acquisition.items():
    if isinstance(obj, pynwb.TimeSeries):
      found[f'acquisition/{name}'] = obj
  for module_name, module in nwbfile.processing.items():
    for name, obj in module.data_interfaces.items():
      if isinstance(obj, pynwb.TimeSeries):
        found[f'processing/{module_name}/{name}'] = obj
      else:  # A container: BehavioralTimeSeries, Position, ...
        for ts in obj.children:
          if isinstance(ts, pynwb.TimeSeries):
            found[f'processing/{module_name}/{name}/{ts.name}'] = ts
  return found


def _find_series(nwbfile, path: str, wanted: str):
  """(path, TimeSeries) named `wanted` (a name or a path)."""
  available = _time_series(nwbfile)
  if '/' in wanted:
    matches = [p for p in available if p == wanted.strip('/')]
  else:
    matches = [p for p in available if p.rsplit('/', 1)[-1] == wanted]
  if not matches:
    raise NWBConversionError(
        f'{path}: no TimeSeries {wanted!r} (--timeseries); looked in '
        'acquisition, processing modules and their containers, which hold '
        f'the time series {sorted(available) or "(none)"}.')
  if len(matches) > 1:
    raise NWBConversionError(
        f'{path}: TimeSeries {wanted!r} (--timeseries) is at {matches}; give '
        'its path instead of its name.')
  return matches[0], available[matches[0]]


def read_session(path: str, trial_columns: Sequence[str],
                 timeseries: Sequence[str],
                 trial_query_time: str = 'stop_time') -> Session:
  """Reads the units, trials, named trials columns and time series of `path`.

  Raises:
    NWBConversionError: the file cannot be read, or lacks or holds badly
      what is asked for (naming it and listing what the file has).
    ImportError: pynwb is not installed.
  """
  io, nwbfile = _open(path)
  with io:
    for table, what in (('units', 'spike times of units, the input tokens'),
                        ('trials', 'trial intervals, the samples')):
      if getattr(nwbfile, table) is None:
        raise NWBConversionError(
            f'{path} has no {table} table (nwbfile.{table}; the {what}); the '
            f'file has {_file_contents(nwbfile)}.')
    units, trials = nwbfile.units, nwbfile.trials
    if 'spike_times' not in units.colnames or not len(units):
      raise NWBConversionError(
          f'{path}: the units table has {len(units)} units and the columns '
          f'{list(units.colnames)}; expected units with spike_times.')
    columns = _read_columns(path, trials, trial_columns, trial_query_time)
    series = _read_series(nwbfile, path, timeseries)
    unit_ids, spike_times = _read_units(path, units)
    return Session(
        path=path, identifier=str(nwbfile.identifier),
        fingerprint=recording_fingerprint(
            nwbfile.session_start_time.isoformat(), unit_ids, spike_times),
        unit_ids=unit_ids, spike_times=spike_times,
        trial_ids=np.asarray(trials.id[:]),
        start_time=np.asarray(trials['start_time'].data[:], np.float64),
        stop_time=np.asarray(trials['stop_time'].data[:], np.float64),
        columns=columns, series=series)


def _open(path: str):
  """(pynwb's reader, the NWBFile) of `path`; NWBConversionError if not NWB."""
  try:
    import pynwb  # pylint: disable=g-import-not-at-top
  except ImportError as e:
    raise ImportError('official_ext.readout.nwb (scripts/nwb_to_readout.py) '
                      'needs pynwb: pip install -e ".[nwb]" (or pip install '
                      'pynwb).') from e
  if not os.path.isfile(path):
    raise NWBConversionError(f'--nwb: {path} is not a file.')
  try:
    io = pynwb.NWBHDF5IO(path, 'r')
    nwbfile = io.read()
  except Exception as e:  # pylint: disable=broad-except
    # h5py's OSError for a file that is not HDF5; pynwb's errors for an
    # HDF5 file that is not NWB. Neither names the file.
    raise NWBConversionError(
        f'--nwb: {path} is not an NWB file pynwb can read '
        f'({type(e).__name__}: {e}); expected an NWB 2 (HDF5) file.') from e
  return io, nwbfile


def _read_units(path: str, units) -> Tuple[np.ndarray, List[np.ndarray]]:
  """(unit ids, each unit's sorted spike times) of the units table."""
  unit_ids = np.asarray(units.id[:])
  spike_times = []
  for i, unit in enumerate(unit_ids):
    times = np.asarray(units.get_unit_spike_times(i), np.float64)
    bad = np.flatnonzero(~np.isfinite(times))
    if bad.size:
      raise NWBConversionError(
          f'{path}: unit {unit} (row {i} of the units table) has spike '
          f'time {times[bad[0]]} (index {bad[0]}); expected finite session '
          f'seconds ({bad.size} non-finite in this unit).')
    spike_times.append(np.sort(times))
  return unit_ids, spike_times


def _read_columns(path: str, trials, trial_columns: Sequence[str],
                  trial_query_time: str) -> Dict[str, np.ndarray]:
  """{column: [n_trials] values} of the named and trial_query_time columns."""
  wanted = list(trial_columns)
  if trial_query_time != 'stop_time':
    wanted.append(trial_query_time)
  for column in wanted:
    if column not in trials.colnames:
      flag = ('--trial_query_time' if column == trial_query_time and
              column not in trial_columns else '--trial_columns')
      raise NWBConversionError(
          f'{path}: the trials table has no column {column!r} ({flag}); '
          f'its columns are {list(trials.colnames)}.')
  columns = {}
  for column in wanted:
    values = np.asarray(trials[column].data[:])
    if values.ndim != 1:
      raise NWBConversionError(
          f'{path}: trials column {column!r} holds values of shape '
          f'{values.shape[1:]} per trial; expected one scalar per trial.')
    columns[column] = values
  return columns


def _read_series(nwbfile, path: str, timeseries: Sequence[str]
                 ) -> Dict[str, Tuple[str, np.ndarray, np.ndarray]]:
  """{readout name: (location, timestamps [n], data [n, channels])}."""
  series = {}
  for name in timeseries:
    location, ts = _find_series(nwbfile, path, name)
    times = np.asarray(ts.get_timestamps(), np.float64)
    data = np.asarray(ts.get_data_in_units(), np.float64)
    data = data.reshape([data.shape[0], -1])
    if len(times) != len(data) or len(times) < 2 or not np.all(
        np.diff(times) > 0):
      raise NWBConversionError(
          f'{path}: TimeSeries {location} has {len(times)} timestamps for '
          f'{len(data)} samples; expected one strictly increasing '
          'timestamp per sample, at least 2.')
    readout = name.rsplit('/', 1)[-1]
    if readout in series:
      raise NWBConversionError(
          f'{path}: --timeseries names two series called {readout!r} '
          f'({series[readout][0]} and {location}); a readout name is '
          'the last part of the path, so convert one of them.')
    series[readout] = (location, times, data)
  return series


def _is_number(values: np.ndarray) -> bool:
  return values.dtype.kind in 'biuf'


def column_readout(path: str, name: str, values: np.ndarray,
                   kind: Optional[str], max_classes: int) -> Readout:
  """The readout of trials column `name` (`values` [n_trials]), with targets;
  `kind`: the type asked for, None: inferred.

  Raises:
    NWBConversionError: the column has no value, or values that do not fit
      the type.
  """
  where = f'{path}: trials column {name!r}'
  numeric = _is_number(values)
  missing = np.isnan(values) if numeric else np.zeros(values.shape, bool)
  present = values[~missing]
  if not present.size:
    raise NWBConversionError(f'{where} has no value (all NaN).')
  distinct = sorted(set(present.tolist()))
  integral = numeric and bool(np.all(present == np.round(present)))
  labels = numeric and bool(np.all((present == 0) | (present == 1)))
  if kind is not None:
    reason = 'given'
  elif labels:
    kind, reason = 'binary', 'values in {0, 1}'
  elif not numeric:
    kind, reason = 'multinomial', f'{len(distinct)} distinct strings'
  elif integral and len(distinct) <= max_classes:
    kind, reason = 'multinomial', (
        f'{len(distinct)} distinct integers, <= --max_classes {max_classes}')
  else:
    kind, reason = 'continuous', 'numbers'
  if kind != 'multinomial' and not numeric:
    raise NWBConversionError(f'{where} holds {values.dtype} values; type '
                             f'{kind} needs numbers.')
  if kind == 'binary' and not labels:
    raise NWBConversionError(f'{where}: type binary needs values in {{0, 1}}; '
                             f'the column has {distinct[:10]}.')
  if kind == 'event_rate' and not (integral and min(distinct) >= 0):
    raise NWBConversionError(f'{where}: type event_rate needs counts >= 0; '
                             f'the column has {distinct[:10]}.')
  targets = np.full(values.shape, np.nan)
  if kind == 'multinomial':
    if len(distinct) < 2:
      raise NWBConversionError(f'{where}: type multinomial needs >= 2 '
                               f'classes; the column has {distinct}.')
    class_id = {value: i for i, value in enumerate(distinct)}
    targets[~missing] = [class_id[v] for v in present.tolist()]
    return Readout(name, f'trials/{name}', kind, len(distinct),
                   classes=distinct, reason=reason, targets=targets)
  targets[~missing] = present.astype(np.float64)
  return Readout(name, f'trials/{name}', kind, 1, reason=reason,
                 targets=targets)


def bin_spikes(spike_times: Sequence[np.ndarray], window_start: float,
               n_bins: int, bin_size: float) -> np.ndarray:
  """Spike counts float32 [n_bins, n_units] of [lo, hi) bins from the start."""
  edges = window_start + bin_size * np.arange(n_bins + 1)
  return np.stack([np.diff(np.searchsorted(s, edges, side='left'))
                   for s in spike_times], 1).astype(np.float32)


def spike_tokens(spike_times: Sequence[np.ndarray], unit_ids: Sequence[int],
                 window_start: float, duration: float
                 ) -> Tuple[np.ndarray, np.ndarray, np.ndarray]:
  """One token per spike in `[window_start, window_start + duration)`.

  Returns:
    (values float32 [n, 1] of 1.0, timestamps [n] from the window start,
    unit ids int64 [n]), by time, then by the unit's row.
  """
  end = window_start + duration
  times, ids = [], []
  for spikes, unit_id in zip(spike_times, unit_ids):
    lo, hi = np.searchsorted(spikes, [window_start, end], side='left')
    times.append(spikes[lo:hi] - window_start)
    ids.append(np.full([hi - lo], unit_id, np.int64))
  times, ids = np.concatenate(times), np.concatenate(ids)
  order = np.argsort(times, kind='stable')
  return (np.ones([times.size, 1], np.float32), times[order], ids[order])


def interpolate(times: np.ndarray, data: np.ndarray, at: np.ndarray
                ) -> np.ndarray:
  """`data` [n, c] linearly interpolated at `at` [m] -> [m, c]; NaN outside the
  samples' times or next to a NaN sample."""
  hi = np.clip(np.searchsorted(times, at, side='left'), 1, len(times) - 1)
  lo = hi - 1
  w = ((at - times[lo]) / (times[hi] - times[lo]))[:, None]
  out = data[lo] * (1 - w) + data[hi] * w
  outside = (at < times[0]) | (at > times[-1])
  out[outside] = np.nan
  return out


def _query_times(duration: float, interval: float) -> np.ndarray:
  n = int(math.floor(duration / interval - 0.5 + 1e-9)) + 1
  return (np.arange(max(n, 0)) + 0.5) * interval


def trial_queries(session: Session, readouts: Sequence[Readout],
                  window_start: float, duration: float, query_time: float,
                  query_interval: float, trial: int,
                  left_out: Dict[str, int]) -> List[Tuple[str, float, list]]:
  """[(readout, time from the window start, target)] of trial row `trial`;
  counts the queries left out in `left_out`."""
  queries = []
  for r in readouts:
    if r.targets is not None:  # A trials column.
      if np.isnan(r.targets[trial]):
        left_out[r.name] += 1
      else:
        queries.append((r.name, float(query_time), [r.targets[trial]]))
      continue
    _, times, data = session.series[r.name]
    at = _query_times(duration, query_interval)
    values = interpolate(times, data, window_start + at)
    keep = ~np.any(np.isnan(values), 1)
    left_out[r.name] += int(np.sum(~keep))
    queries += [(r.name, float(t), list(v))
                for t, v in zip(at[keep], values[keep])]
  return queries


def _paths(nwb) -> List[str]:
  """The files of `--nwb`: a comma-separated string or a sequence."""
  items = nwb.split(',') if isinstance(nwb, str) else list(nwb)
  paths = [str(p).strip() for p in items if str(p).strip()]
  if not paths:
    raise ValueError('--nwb is empty; expected one NWB file, or several '
                     '(comma-separated) with --tokens=spikes.')
  return paths


def _load_vocabulary(vocabulary: str, tokens: str,
                     output_dir: str) -> vocabulary_lib.Vocabulary:
  """The vocabulary the conversion extends: `--vocabulary`'s, else empty.

  Raises:
    ValueError: `--vocabulary` without spike tokens, or naming the file the
      conversion writes.
  """
  if not vocabulary:
    return vocabulary_lib.Vocabulary()
  if tokens != 'spikes':
    raise ValueError(f'--vocabulary={vocabulary}: a unit and session '
                     'vocabulary applies to --tokens=spikes; binned tokens '
                     f'have none (--tokens={tokens}).')
  written = os.path.join(output_dir, _VOCABULARY)
  if os.path.realpath(vocabulary) == os.path.realpath(written):
    raise ValueError(f'--vocabulary={vocabulary} is the file this conversion '
                     f'writes ({written}); nothing was written. Convert into '
                     'another --output_dir: the extended vocabulary is '
                     'written beside the new records.')
  return vocabulary_lib.load(vocabulary)


def _check_same_recording(session: Session,
                          base: vocabulary_lib.Vocabulary,
                          vocabulary: str) -> None:
  """NWBConversionError unless `session`'s identifier is new to `base` or
  names this same recording there."""
  if session.identifier not in base.sessions:
    return
  known = base.fingerprints.get(session.identifier)
  if known is None:
    raise NWBConversionError(
        f'--vocabulary={vocabulary} has no fingerprint of session '
        f'{session.identifier!r}, so whether {session.path} is that '
        'recording cannot be told (its units would take that session\'s '
        'rows); give the file a new identifier, or extend a vocabulary this '
        'converter wrote.')
  if known != session.fingerprint:
    raise NWBConversionError(
        f'{session.path}: identifier {session.identifier!r} already names '
        f'another recording in --vocabulary={vocabulary} (its start time or '
        f'units table differ: {known} there, {session.fingerprint} here); a '
        "vocabulary row is one unit of one recording, so give this file's "
        'recording a new identifier.')


def _windows(session: Session, pre_time: float, post_time: float,
             trial_query_time: str, has_columns: bool
             ) -> Tuple[np.ndarray, np.ndarray, np.ndarray]:
  """(window starts, durations, query times from the window start) [n_trials].

  Raises:
    NWBConversionError: a window is empty or its query time outside it.
  """
  window_start = session.start_time - pre_time
  duration = session.stop_time + post_time - window_start
  bad = np.flatnonzero(~(np.isfinite(duration) & (duration > 0)))
  if bad.size:
    i = bad[0]
    raise NWBConversionError(
        f'{session.path}: trial {session.trial_ids[i]} has start_time '
        f'{session.start_time[i]} and stop_time {session.stop_time[i]}: its '
        'window is empty.')
  if trial_query_time == 'stop_time':
    query_time = session.stop_time - window_start
  else:
    query_time = session.columns[trial_query_time].astype(
        np.float64) - window_start
  outside = np.flatnonzero(~((query_time >= 0) & (query_time <= duration)))
  if has_columns and outside.size:
    i = outside[0]
    raise NWBConversionError(
        f'{session.path}: trial {session.trial_ids[i]}: --trial_query_time '
        f'{trial_query_time} is {query_time[i] + window_start[i]:.6g} s, '
        f'outside its window [{window_start[i]:.6g}, '
        f'{window_start[i] + duration[i]:.6g}] s '
        '(widen it with --pre_time / --post_time).')
  return window_start, duration, query_time


def _split(session: Session, validation_fraction: float,
           split_seed: int) -> np.ndarray:
  """bool [n_trials]: the validation trials (seeded; both splits non-empty)."""
  n_trials = len(session.trial_ids)
  n_val = int(round(validation_fraction * n_trials))
  if not 1 <= n_val <= n_trials - 1:
    raise ValueError(f'{session.path} has {n_trials} trials: '
                     f'--validation_fraction {validation_fraction} gives '
                     f'{n_val} validation trials; both splits need at least '
                     'one.')
  is_val = np.zeros([n_trials], bool)
  is_val[np.random.default_rng(split_seed).permutation(n_trials)[:n_val]] = (
      True)
  return is_val


def convert(nwb, output_dir: str, *, tokens: str = 'binned',
            vocabulary: str = '', trial_columns: str = '',
            timeseries: str = '', bin_size: float = 0.1,
            pre_time: float = 0.0, post_time: float = 0.0,
            trial_query_time: str = 'stop_time', query_interval: float = 0.1,
            max_classes: int = 16, validation_fraction: float = 0.2,
            split_seed: int = 0, batch_size: int = 32,
            train_epochs: int = 20, overwrite: bool = False
            ) -> Dict[str, Any]:
  """Converts `nwb` into readout records, readout.yaml and conversion.json.

  Args:
    nwb: one NWB file, or with `tokens='spikes'` several (a comma-separated
      string or a sequence).
    output_dir: where to write; one that holds files is refused before any
      file is read, unless `overwrite`.
    The others: the flags of scripts/nwb_to_readout.py of the same names.

  Returns:
    The summary written to conversion.json, plus the written paths (`files`).
  """
  output_files.check_output_dir(output_dir, overwrite)
  paths = _paths(nwb)
  _check_tokens(tokens, paths)
  base_vocabulary = _load_vocabulary(vocabulary, tokens, output_dir)
  columns = parse_names(trial_columns, '--trial_columns')
  series_names = [n.strip() for n in timeseries.split(',') if n.strip()]
  _check_options(columns, series_names, bin_size=bin_size,
                 query_interval=query_interval, pre_time=pre_time,
                 post_time=post_time,
                 validation_fraction=validation_fraction)
  sessions = _read_sessions(
      paths, columns, series_names, trial_query_time,
      base_vocabulary if tokens == 'spikes' else None, vocabulary)
  readouts = _readouts(sessions, paths, columns, max_classes)
  units = (_extend_vocabulary(base_vocabulary, sessions)
           if tokens == 'spikes' else None)
  windows = dict(bin_size=bin_size, pre_time=pre_time, post_time=post_time,
                 trial_query_time=trial_query_time,
                 query_interval=query_interval)
  records = _records(sessions, readouts, units, bool(columns),
                     validation_fraction, split_seed, **windows)
  train_trials = len(records.split_of['train'])
  if batch_size < 1 or batch_size > train_trials:
    raise ValueError(f'--batch_size {batch_size}: the training split has '
                     f'{train_trials} trials; expected 1..that.')
  summary = _summary(sessions, records.trial_session, readouts,
                     records.split_of, records.queries, records.left_out,
                     tokens=tokens, **windows)
  return _write(output_dir, overwrite, records, summary, readouts,
                input_dim=1 if units is not None else len(
                    sessions[0].unit_ids),
                units=units, vocabulary=vocabulary, batch_size=batch_size,
                train_epochs=train_epochs)


def _check_tokens(tokens: str, paths: List[str]) -> None:
  """ValueError unless `--tokens` is known and fits the number of files."""
  if tokens not in TOKENS:
    raise ValueError(f'--tokens is {tokens!r}; expected one of {TOKENS}.')
  if tokens == 'binned' and len(paths) > 1:
    raise ValueError(
        f'--nwb names {len(paths)} files; binned tokens (--tokens=binned) '
        "are one recording's units. Convert several files with "
        '--tokens=spikes (one unit and session vocabulary).')


def _check_options(columns, series_names, *, bin_size: float,
                   query_interval: float, pre_time: float, post_time: float,
                   validation_fraction: float) -> None:
  """ValueError naming the flag whose value cannot convert anything."""
  for flag, value in (('--bin_size', bin_size),
                      ('--query_interval', query_interval)):
    if not value > 0:
      raise ValueError(f'{flag} is {value}; expected > 0 seconds.')
  if not (pre_time >= 0 and post_time >= 0):
    raise ValueError(f'--pre_time {pre_time} / --post_time {post_time}: '
                     'expected >= 0 seconds.')
  if not 0 < validation_fraction < 1:
    raise ValueError(f'--validation_fraction is {validation_fraction}; '
                     'expected in (0, 1).')
  if not columns and not series_names:
    raise ValueError('Nothing to read out: give --trial_columns and/or '
                     '--timeseries.')


def _read_sessions(paths: List[str], columns, series_names: List[str],
                   trial_query_time: str,
                   base: Optional[vocabulary_lib.Vocabulary],
                   vocabulary: str) -> List[Session]:
  """Every file's `Session`; identifiers unique and, with a `base`
  vocabulary (spike tokens), new to it or naming the same recording."""
  sessions = [read_session(p, [n for n, _ in columns], series_names,
                           trial_query_time) for p in paths]
  first = {}
  for session in sessions:
    if session.identifier in first:
      raise NWBConversionError(
          f'{session.path} and {first[session.identifier]} have the same '
          f'identifier {session.identifier!r}; a session is named by its '
          "file's identifier, so convert them separately or give one a new "
          'identifier.')
    first[session.identifier] = session.path
    if base is not None:
      _check_same_recording(session, base, vocabulary)
  return sessions


def _readouts(sessions: List[Session], paths: List[str], columns,
              max_classes: int) -> List[Readout]:
  """The readouts of the trials columns and time series, checked."""
  source = paths[0] if len(paths) == 1 else ', '.join(paths)
  readouts = [column_readout(source, n, np.concatenate(
      [s.columns[n] for s in sessions]), kind, max_classes)
              for n, kind in columns]
  for name, (location, _, data) in sessions[0].series.items():
    for other in sessions[1:]:
      channels = other.series[name][2].shape[1]
      if channels != data.shape[1]:
        raise NWBConversionError(
            f'{other.path}: TimeSeries {other.series[name][0]} has '
            f'{channels} channels, {sessions[0].path}\'s {location} '
            f'{data.shape[1]}; one readout needs the same channels in every '
            'file.')
    readouts.append(Readout(name, location, 'continuous', data.shape[1],
                            reason='time series'))
  for r in readouts:
    if not _NAME.match(r.name):
      raise ValueError(f'Readout {r.name!r} (from {r.source}): a readout name '
                       "has letters, digits, '_', '.', '-' only.")
  configs.validate_readouts([r.spec() for r in readouts],
                            [r.name for r in readouts])
  return readouts


def _extend_vocabulary(base: vocabulary_lib.Vocabulary,
                       sessions: List[Session]) -> vocabulary_lib.Vocabulary:
  """`base` with the files' sessions, units and fingerprints appended."""
  return vocabulary_lib.extend(
      base, sessions=[s.identifier for s in sessions],
      units=[vocabulary_lib.unit_name(s.identifier, str(u))
             for s in sessions for u in s.unit_ids],
      fingerprints={s.identifier: s.fingerprint for s in sessions})


@dataclasses.dataclass
class _Records:
  """The converted trials, file after file: serialized `examples`, their
  `queries` [(readout, time, target)], `left_out` {readout: count},
  `split_of` {split: record positions}, each record's `trial_session`."""
  examples: List[bytes]
  queries: List[List[Tuple[str, float, list]]]
  left_out: Dict[str, int]
  split_of: Dict[str, np.ndarray]
  trial_session: np.ndarray


def _records(sessions: List[Session], readouts: List[Readout],
             units: Optional[vocabulary_lib.Vocabulary], has_columns: bool,
             validation_fraction: float, split_seed: int,
             **windows) -> _Records:
  """Every file's trials tokenized and split."""
  ids = configs.task_index([r.name for r in readouts])
  left_out = {r.name: 0 for r in readouts}
  examples, queries, is_val, trial_session = [], [], [], []
  for k, session in enumerate(sessions):
    unit_ids = None if units is None else [
        units.unit_id(vocabulary_lib.unit_name(session.identifier, str(u)))
        for u in session.unit_ids]
    session_examples, session_queries = _trial_records(
        session, readouts, ids, unit_ids, len(examples), left_out,
        has_columns, **windows)
    examples += session_examples
    queries += session_queries
    is_val.append(_split(session, validation_fraction, split_seed))
    trial_session += [k] * len(session.trial_ids)
  is_val = np.concatenate(is_val)
  return _Records(examples, queries, left_out,
                  {'train': np.flatnonzero(~is_val),
                   'validation': np.flatnonzero(is_val)},
                  np.asarray(trial_session))


def _trial_records(session: Session, readouts: List[Readout],
                   ids: Dict[str, int], unit_ids: Optional[List[int]],
                   offset: int, left_out: Dict[str, int], has_columns: bool,
                   *, bin_size: float, pre_time: float, post_time: float,
                   trial_query_time: str, query_interval: float
                   ) -> Tuple[List[bytes], List[list]]:
  """(serialized records, their queries) of one file's trials.

  `unit_ids`: spike tokens' vocabulary id per unit (None: binned tokens);
  `offset`: the trials of the files before (rows of the readouts' targets);
  `left_out` is incremented here.
  """
  window_start, duration, query_time = _windows(
      session, pre_time, post_time, trial_query_time, has_columns)
  examples, queries_by_trial = [], []
  for i in range(len(session.trial_ids)):
    values, times, token_units = _trial_tokens(
        session, i, window_start[i], duration[i], bin_size, unit_ids)
    queries = trial_queries(session, readouts, window_start[i], duration[i],
                            query_time[i], query_interval, offset + i,
                            left_out)
    queries_by_trial.append(queries)
    example = dataloader.make_example(
        f'{session.identifier}/trial{session.trial_ids[i]}', values, times,
        output_task_ids=[ids[q[0]] for q in queries],
        output_timestamps=[q[1] for q in queries],
        output_targets=[q[2] for q in queries],
        session_id=session.identifier, window_start=float(window_start[i]),
        input_unit_ids=token_units)
    # Map keys sorted: the same bytes in every process (the default order
    # follows Python's per-process string hash).
    examples.append(example.SerializeToString(deterministic=True))
  return examples, queries_by_trial


def _trial_tokens(session: Session, i: int, window_start: float,
                  duration: float, bin_size: float,
                  unit_ids: Optional[List[int]]):
  """(values, timestamps, unit ids or None) of trial row `i`'s input tokens."""
  if unit_ids is None:
    n_bins = max(1, int(math.ceil(duration / bin_size - 1e-9)))
    values = bin_spikes(session.spike_times, window_start, n_bins, bin_size)
    return values, (np.arange(n_bins) + 0.5) * bin_size, None
  values, times, token_units = spike_tokens(
      session.spike_times, unit_ids, window_start, duration)
  if not times.size:
    raise NWBConversionError(
        f'{session.path}: trial {session.trial_ids[i]} has no spike in '
        f'its window [{window_start:.6g}, {window_start + duration:.6g}) s; '
        'a record needs at least one token (widen it with --pre_time / '
        '--post_time).')
  return values, times, token_units


def _write(output_dir: str, overwrite: bool, records: _Records,
           summary: Dict[str, Any], readouts: List[Readout], *,
           input_dim: int, units: Optional[vocabulary_lib.Vocabulary],
           vocabulary: str, batch_size: int, train_epochs: int
           ) -> Dict[str, Any]:
  """Writes every file whole or not at all; returns `summary` with `files`."""
  files = {split: os.path.abspath(os.path.join(output_dir,
                                               f'{split}.tfrecord'))
           for split in records.split_of}
  vocabulary_path = (os.path.abspath(os.path.join(output_dir, _VOCABULARY))
                     if units is not None else None)
  if units is not None:
    summary['vocabulary'] = vocabulary_path
    summary['extended_vocabulary'] = (os.path.abspath(vocabulary)
                                      if vocabulary else None)
  config_path = os.path.join(output_dir, _CONFIG)
  text = _config_yaml(summary, readouts, files, config_path, input_dim,
                      batch_size, train_epochs, vocabulary_path)

  def write(staging: str) -> None:
    for split, rows in records.split_of.items():
      dataloader.write_records(os.path.join(staging, f'{split}.tfrecord'),
                               (records.examples[i] for i in rows))
    if units is not None:
      vocabulary_lib.save(units, os.path.join(staging, _VOCABULARY))
    with open(os.path.join(staging, _CONFIG), 'w') as f:
      f.write(text)
    with open(os.path.join(staging, _SUMMARY), 'w') as f:
      json.dump(summary, f, indent=1)

  # readout.yaml names the other files: it goes first and comes back last.
  output_files.write_directory(output_dir, write, overwrite,
                               last=(_CONFIG,))
  summary['files'] = dict(files, config=config_path,
                          summary=os.path.join(output_dir, _SUMMARY))
  if vocabulary_path:
    summary['files']['vocabulary'] = vocabulary_path
  return summary


def _summary(sessions: List[Session], trial_session: np.ndarray,
             readouts: List[Readout], split_of: Dict[str, np.ndarray],
             targets_by_trial, left_out, tokens: str,
             **options) -> Dict[str, Any]:
  """conversion.json's contents (spike tokens: each file under `sessions`)."""
  out_readouts = []
  for r in readouts:
    entry = {'name': r.name, 'source': r.source, 'type': r.type, 'dim': r.dim,
             'type_from': r.reason, 'left_out_queries': left_out[r.name]}
    if r.classes is not None:
      entry['classes'] = r.classes  # Class id i is classes[i].
    for split, rows in split_of.items():
      entry[f'{split}_queries'] = sum(
          1 for i in rows for q in targets_by_trial[i] if q[0] == r.name)
    if r.type == 'continuous':
      train = np.array([q[2] for i in split_of['train']
                        for q in targets_by_trial[i] if q[0] == r.name])
      if train.size:
        entry['train_mean'] = train.mean(0).tolist()
        entry['train_std'] = train.std(0).tolist()
    out_readouts.append(entry)
  offsets = np.cumsum([0] + [len(s.trial_ids) for s in sessions])
  entries = []
  for k, session in enumerate(sessions):
    entries.append({
        'nwb': os.path.abspath(session.path),
        'session_id': session.identifier,
        'unit_ids': session.unit_ids.tolist(),
        'num_trials': len(session.trial_ids),
        'trial_ids': {split: session.trial_ids[
            rows[trial_session[rows] == k] - offsets[k]].tolist()
                      for split, rows in split_of.items()},
    })
  described = (entries[0] if tokens == 'binned' else
               {'sessions': entries,
                'num_trials': int(offsets[-1]),
                'num_split_trials': {split: len(rows) for split, rows
                                     in split_of.items()}})
  return {**{k: v for k, v in described.items() if k != 'trial_ids'},
          'tokens': tokens, **options, 'readouts': out_readouts,
          **({'trial_ids': described['trial_ids']}
             if 'trial_ids' in described else {})}


def _spec_entry(readout: Readout, summary_entry: Dict[str, Any]
                ) -> Dict[str, Any]:
  """readout.yaml's ReadoutSpec of a readout; a continuous one normalised by
  its training queries' mean and std (std 0 kept as 1)."""
  spec = {'name': readout.name, 'type': readout.type, 'dim': readout.dim}
  if 'train_mean' in summary_entry:
    spec['normalize_mean'] = summary_entry['train_mean']
    spec['normalize_std'] = [s if s > 0 else 1.0
                             for s in summary_entry['train_std']]
  return spec


def _split_sizes(summary: Dict[str, Any]) -> Dict[str, int]:
  """{split: trials} of a conversion's summary."""
  if 'trial_ids' in summary:
    return {k: len(v) for k, v in summary['trial_ids'].items()}
  return dict(summary['num_split_trials'])


def _config_yaml(summary: Dict[str, Any], readouts: List[Readout],
                 files: Dict[str, str], config_path: str, input_dim: int,
                 batch_size: int, train_epochs: int,
                 vocabulary_path: Optional[str] = None) -> str:
  """readout.yaml for `--experiment=readout_demo` (spike tokens: with the
  vocabulary); read back to check it holds the config and nothing else."""
  sizes = _split_sizes(summary)
  steps_per_epoch = sizes['train'] // batch_size
  train_steps = steps_per_epoch * train_epochs
  every = steps_per_epoch * max(1, -(-train_epochs // 4))
  data = lambda split: {'input_path': files[split], 'input_dim': input_dim,
                        'num_examples': sizes[split]}
  model = ({'model': {'tokenization': 'unit_tokens'},
            'vocabulary_file': vocabulary_path} if vocabulary_path else {})
  config = {
      'task': {
          **model,
          'readouts': [_spec_entry(r, entry)
                       for r, entry in zip(readouts, summary['readouts'])],
          'task_vocabulary': [r.name for r in readouts],
          'demo_data': {'enabled': False},
          'train_data': dict(data('train'), global_batch_size=batch_size),
          'validation_data': data('validation'),
      },
      'trainer': {
          'train_steps': train_steps, 'steps_per_loop': steps_per_epoch,
          'summary_interval': steps_per_epoch,
          'validation_interval': every, 'checkpoint_interval': every,
          'optimizer_config': {
              'learning_rate': {'cosine': {'decay_steps': train_steps}},
              'warmup': {'linear': {'warmup_steps': steps_per_epoch}}},
      },
  }
  # What the file and the command line supplied (identifier, paths, class
  # values) goes through the YAML emitter, and every line of it is commented.
  if 'sessions' in summary:
    source = {'nwb': [s['nwb'] for s in summary['sessions']],
              'sessions': [s['session_id'] for s in summary['sessions']]}
  else:
    source = {'nwb': summary['nwb'], 'session': summary['session_id']}
  classes = {r.name: {'source': r.source, 'values': r.classes}
             for r in readouts if r.classes is not None}
  if classes:
    source['multinomial classes (class id i is values[i])'] = classes
  source['train with'] = (
      f'python -m official_ext.train --experiment={EXPERIMENT} '
      '--mode=train_and_eval --config_file='
      f'{shlex.quote(os.path.abspath(config_path))} --model_dir=...')
  text = (
      '# Written by scripts/nwb_to_readout.py; conversion.json beside this '
      'file says what the records hold.\n'
      f'# schedule: epochs={train_epochs} lr=2e-3 decay_epochs={train_epochs} '
      'warmup_epochs=1\n'
      + _commented_yaml(source) +
      yaml.safe_dump(config, sort_keys=False))
  if yaml.safe_load(text) != config:
    raise NWBConversionError(
        f'{source["nwb"]}: readout.yaml would not read back as the config '
        'written (a value from the file could not be represented safely); '
        'nothing was written.')
  return text


class _Dumper(yaml.SafeDumper):
  """A safe YAML emitter that writes unprintable strings double-quoted."""


def _represent_str(dumper: yaml.SafeDumper, value: str):
  style = None if value.isprintable() else '"'
  return dumper.represent_scalar('tag:yaml.org,2002:str', value, style=style)


_Dumper.add_representer(str, _represent_str)


def _commented_yaml(data: Dict[str, Any]) -> str:
  """`data` as YAML (`_Dumper`, ASCII), every line a comment."""
  text = yaml.dump(data, Dumper=_Dumper, sort_keys=False, allow_unicode=False,
                   width=float('inf'), default_flow_style=None)
  # str.splitlines splits at every character YAML takes for a line break.
  return ''.join(f'# {line}\n' for line in text.splitlines())


def format_summary(summary: Dict[str, Any]) -> str:
  """What the command prints after a conversion (`summary`: `convert`'s)."""
  files = summary['files']
  queries = (f'trial-column queries at {summary["trial_query_time"]}, '
             f'time-series queries every {summary["query_interval"]} s.')
  if 'sessions' in summary:
    lines = [f'{len(summary["sessions"])} sessions, '
             f'{summary["num_trials"]} trials, spike tokens (unit id, time) '
             f'over [start_time - {summary["pre_time"]}, stop_time + '
             f'{summary["post_time"]}] s; {queries}']
    lines += [f'  session {s["session_id"]} ({s["nwb"]}): {s["num_trials"]} '
              f'trials, {len(s["unit_ids"])} units'
              for s in summary['sessions']]
  else:
    lines = [
        f'Session {summary["session_id"]} ({summary["nwb"]}): '
        f'{summary["num_trials"]} trials, {len(summary["unit_ids"])} units '
        f'(input_dim), {summary["bin_size"]} s bins over [start_time - '
        f'{summary["pre_time"]}, stop_time + {summary["post_time"]}] s; '
        + queries]
  for split, size in _split_sizes(summary).items():
    lines.append(f'  {split}: {files[split]} ({size} trials)')
  lines.append(f'  config: {files["config"]}\n  summary: {files["summary"]}')
  if 'vocabulary' in files:
    extended = summary.get('extended_vocabulary')
    lines.append(f'  vocabulary: {files["vocabulary"]}' +
                 (f' (extends {extended})' if extended else ''))
  lines.append('Readouts:')
  for r in summary['readouts']:
    extra = f' classes {r["classes"]}' if 'classes' in r else ''
    if 'train_mean' in r:
      extra += (f' mean {np.round(r["train_mean"], 4).tolist()} std '
                f'{np.round(r["train_std"], 4).tolist()}')
    lines.append(f'  {r["name"]}: {r["type"]} dim {r["dim"]} '
                 f'({r["type_from"]}) from {r["source"]}; queries train '
                 f'{r["train_queries"]} / validation '
                 f'{r["validation_queries"]}, left out '
                 f'{r["left_out_queries"]}{extra}')
  lines.append(f'Train: python -m official_ext.train --experiment={EXPERIMENT} '
               f'--mode=train_and_eval --config_file={files["config"]} '
               '--model_dir=/tmp/nwb_readout')
  return '\n'.join(lines)
