"""Generated readout data: simulated trials of a behavioural task, binned or
as spike-event unit tokens (docs/readout.md#generated-data).

    python -m official_ext.readout.demo_data --output_dir=/tmp/readout_demo
"""
import os
from typing import Dict, Iterator, List, Optional, Sequence, Tuple

from absl import app
from absl import flags
import numpy as np

from official_ext.core.input import demo_cache
from official_ext.core import output_files
from official_ext.readout import configs
from official_ext.readout import dataloader
from official_ext.readout import unit_vocabulary as vocabulary_lib

FORMAT_VERSION = 4  # 4: the splits of a session follow each other.
BIN_SECONDS = 0.1
# Session time between the end of a trial and the start of the next one of
# its session (`window_start`).
INTER_TRIAL_SECONDS = 1.0
_NUM_LATENTS = 12  # stimulus one-hot (5), choice, reward, wheel, paw (2),
# whisker, lick log-rate.
_SPLITS = ('train', 'validation', 'held_out_sessions', 'held_out_train')
# The example_id prefix of each split's records.
_ID_PREFIXES = {'train': 'tr', 'validation': 'va', 'held_out_sessions': 'he',
                'held_out_train': 'ht'}
# Unit-token data: the vocabulary of the training sessions, and that
# vocabulary extended by the held-out sessions (their ids appended).
VOCABULARY_FILE = 'vocabulary.json'
HELD_OUT_VOCABULARY_FILE = 'vocabulary_with_held_out.json'


def _smooth(rng: np.random.Generator, times: np.ndarray, scale: float,
            n_waves: int = 3) -> np.ndarray:
  """A smooth random signal: a sum of sinusoids of 0.3-2 Hz."""
  freq = rng.uniform(0.3, 2.0, n_waves)
  phase = rng.uniform(0, 2 * np.pi, n_waves)
  amp = rng.normal(0, scale / np.sqrt(n_waves), n_waves)
  return np.sum(amp[:, None] * np.sin(2 * np.pi * freq[:, None] * times +
                                      phase[:, None]), 0)


def _binned_encoder(mixing: np.ndarray, noise_std: float):
  """encode(rng, latents [bins, latents], bin centres [bins]) of binned
  tokens: each bin's units, a linear mix of the latents plus noise."""
  def encode(rng, latents, t):
    values = latents @ mixing + rng.normal(0, noise_std,
                                           [len(t), mixing.shape[1]])
    return dict(input_values=values, input_timestamps=t)
  return encode


def _spike_encoder(tuning: np.ndarray, log_base_rate: np.ndarray,
                   unit_ids: np.ndarray):
  """encode(...) of spike-event unit tokens: each unit a Poisson process of
  rate exp(log_base_rate + latents @ tuning) Hz; one token per spike."""
  def encode(rng, latents, t):
    log_rate = np.clip(log_base_rate[None, :] + latents @ tuning, -10, 5)
    counts = rng.poisson(np.exp(log_rate) * BIN_SECONDS)  # [bins, units]
    bins, units = np.nonzero(counts)
    repeat = counts[bins, units]
    bins, units = np.repeat(bins, repeat), np.repeat(units, repeat)
    times = (bins + rng.random(bins.size)) * BIN_SECONDS
    order = np.argsort(times, kind='stable')
    if not order.size:  # No spike at all: one silent token of unit 0.
      return dict(input_values=np.zeros([1, 1]), input_timestamps=t[:1],
                  input_unit_ids=unit_ids[:1])
    return dict(input_values=np.ones([order.size, 1]),
                input_timestamps=times[order],
                input_unit_ids=unit_ids[units[order]])
  return encode


def _trial(rng: np.random.Generator, encode, trial_noise_std: float,
           ids: Dict[str, int], example_id: str, session_id: str,
           window_start: float):
  """One trial's record and its duration (seconds); `encode` turns its
  latents into input tokens (`_binned_encoder`, `_spike_encoder`)."""
  n_bins = int(rng.integers(16, 25))
  t = (np.arange(n_bins) + 0.5) * BIN_SECONDS
  t_stim = rng.uniform(0.2, 0.5)
  t_move = t_stim + rng.uniform(0.2, 0.4)
  t_fb = t_move + rng.uniform(0.3, 0.5)
  s = int(rng.integers(0, 5))
  c = int(rng.random() < 1 / (1 + np.exp(-2.0 * (s - 2))))
  r = int(c == (s > 2)) if s != 2 else int(rng.random() < 0.5)
  stim_on = (t >= t_stim).astype(float)
  moving = ((t >= t_move) & (t < t_move + 0.4)).astype(float)
  fb = (t >= t_fb).astype(float)
  wheel = np.abs((2 * c - 1) * 1.5 * np.exp(-(t - t_move - 0.2) ** 2 / 0.02)
                 + _smooth(rng, t, 0.6))
  paw = np.stack([_smooth(rng, t, 1.0) + 0.8 * moving for _ in range(2)], 1)
  whisker = np.log1p(np.exp(_smooth(rng, t, 1.2) + 0.5))
  # Per-trial encoding errors of the task variables (`trial_noise_std`).
  err = rng.normal(0, trial_noise_std, 8)
  lick_boost = max(0.0, 1.0 + r + err[7])  # Rewarded: ~2, else ~1.
  lick_log_rate = -1.0 + lick_boost * fb + 0.3 * _smooth(rng, t, 1.0)
  latents = np.concatenate([
      (np.eye(5)[s] + err[:5])[None, :] * stim_on[:, None],
      ((2 * c - 1 + err[5]) * (t >= t_move))[:, None],
      ((2 * r - 1 + err[6]) * fb)[:, None],
      wheel[:, None], paw, whisker[:, None], lick_log_rate[:, None]], 1)
  inputs = encode(rng, latents, t)
  lick_counts = rng.poisson(np.exp(lick_log_rate))

  queries: List[Tuple[str, float, List[float]]] = [
      ('choice', t_move + 0.3, [c]), ('reward', t_fb + 0.2, [r])]
  if rng.random() > 0.15:
    queries.append(('stimulus', t_stim + 0.15, [s]))
  per_bin = {
      'wheel_speed': lambda k: [wheel[k]],
      'paw_speed': lambda k: list(paw[k]),
      'whisker_energy': lambda k: [whisker[k]],
      'lick_rate': lambda k: [lick_counts[k]],
      'trial_events': lambda k: [stim_on[k], moving[k], fb[k]],
  }
  for name, fn in per_bin.items():
    low, high = (1, 4) if name == 'trial_events' else (2, 6)
    for k in rng.choice(n_bins, int(rng.integers(low, high)), replace=False):
      queries.append((name, t[k], fn(k)))
  order = rng.permutation(len(queries))
  queries = [queries[i] for i in order]
  weights = np.where(rng.random(len(queries)) < 0.05, 0.0, 1.0)
  return dataloader.make_example(
      example_id, inputs['input_values'], inputs['input_timestamps'],
      input_unit_ids=inputs.get('input_unit_ids'),
      output_task_ids=[ids[q[0]] for q in queries],
      output_timestamps=[q[1] for q in queries],
      output_targets=[q[2] for q in queries],
      output_weights=weights, session_id=session_id,
      window_start=window_start), n_bins * BIN_SECONDS


def session_mixing(mixing: np.ndarray, seed: int, session: int,
                   gain_std: float) -> np.ndarray:
  """`mixing` [latents, units] with each unit scaled by session `session`'s
  log-normal gain (session 0: unscaled)."""
  if session == 0:
    return mixing
  gains = np.exp(np.random.default_rng([seed, 1, session]).normal(
      0, gain_std, mixing.shape[1]))
  return mixing * gains[None, :]


def session_name(session: int) -> str:
  """The `session_id` of session number `session`."""
  return f'session-{session:03d}'


def generate_trials(num_trials: int, *, seed: int, split_id: int,
                    input_dim: int = configs.DEMO_INPUT_DIM,
                    noise_std: float = 0.5,
                    trial_noise_std: float = 0.7,
                    task_vocabulary=configs.DEMO_VOCABULARY,
                    sessions: Sequence[int] = (0,),
                    session_gain_std: float = 0.5,
                    clock: Optional[Dict[int, float]] = None
                    ) -> Iterator[bytes]:
  """Yields `num_trials` serialized records (split `split_id` of `seed`).

  Args:
    clock: {session: the session time (s) of its next trial}, advanced in
      place, so a later split continues each session's clock; None: every
      session starts at 0 s.
  """
  ids = configs.task_index(task_vocabulary)
  missing = sorted(set(configs.DEMO_VOCABULARY) - set(ids))
  if missing:
    raise ValueError(f'task_vocabulary lacks the demo readouts {missing}.')
  mixing = np.random.default_rng([seed, 0]).normal(
      0, 1.0 / np.sqrt(_NUM_LATENTS), [_NUM_LATENTS, input_dim])
  encoders = {k: _binned_encoder(
      session_mixing(mixing, seed, k, session_gain_std), noise_std)
              for k in sessions}
  return _generate(num_trials, seed, split_id, encoders, sessions,
                   trial_noise_std, ids, clock)


def _generate(num_trials: int, seed: int, split_id: int, encoders,
              sessions: Sequence[int], trial_noise_std: float,
              ids: Dict[str, int], clock: Optional[Dict[int, float]]
              ) -> Iterator[bytes]:
  """The trials of `generate_trials`, each session's tokens from its
  `encoders[session]`."""
  clock = {} if clock is None else clock
  for k in sessions:
    clock.setdefault(k, 0.0)
  rng = np.random.default_rng([seed, split_id])
  for i in range(num_trials):
    k = sessions[i % len(sessions)]
    example, seconds = _trial(
        rng, encoders[k], trial_noise_std, ids,
        f'{_ID_PREFIXES[_SPLITS[split_id - 1]]}{i:06d}', session_name(k),
        clock[k])
    clock[k] += seconds + INTER_TRIAL_SECONDS
    yield example.SerializeToString()


def unit_session(seed: int, session: int, min_units: int, max_units: int,
                 mean_rate_hz: float, gain_std: float, tuning_std: float = 0.5
                 ) -> Tuple[np.ndarray, np.ndarray]:
  """(tuning [latents, n_units], log_base_rate [n_units]) of session
  `session`'s units, n_units drawn in [min_units, max_units]."""
  rng = np.random.default_rng([seed, 2, session])
  n_units = int(rng.integers(min_units, max_units + 1))
  tuning = rng.normal(0, tuning_std, [_NUM_LATENTS, n_units])
  log_base = np.log(mean_rate_hz) + rng.normal(0, gain_std, n_units)
  return tuning, log_base


def unit_name(session: int, unit: int) -> str:
  """The vocabulary name of generated unit `unit` of session `session`."""
  return vocabulary_lib.unit_name(session_name(session), f'unit{unit:03d}')


def write_unit_token_dataset(output_dir: str, *, num_train_trials: int,
                             num_validation_trials: int, num_shards: int,
                             seed: int, trial_noise_std: float = 0.7,
                             task_vocabulary=configs.DEMO_VOCABULARY,
                             num_sessions: int = 4,
                             num_held_out_sessions: int = 0,
                             num_held_out_session_trials: int = 0,
                             num_held_out_train_trials: int = 0,
                             min_units: int = 8, max_units: int = 32,
                             mean_rate_hz: float = 5.0,
                             session_gain_std: float = 0.5,
                             tuning_std: float = 0.5
                             ) -> Dict[str, str]:
  """Writes the unit-token splits and the two vocabularies.

  Returns:
    {split: glob pattern} of the splits written.
  """
  if min(num_train_trials, num_validation_trials, num_shards) < 1:
    raise ValueError('num_train_trials, num_validation_trials and num_shards '
                     f'must be >= 1; got {num_train_trials}, '
                     f'{num_validation_trials}, {num_shards}.')
  if num_sessions < 1 or not 1 <= min_units <= max_units:
    raise ValueError(f'num_sessions {num_sessions} (>= 1), min_units '
                     f'{min_units} <= max_units {max_units} (>= 1) expected.')
  held_out = num_held_out_session_trials + num_held_out_train_trials
  if (min(num_held_out_session_trials, num_held_out_train_trials,
          num_held_out_sessions) < 0 or
      (held_out > 0) != (num_held_out_sessions > 0)):
    raise ValueError(
        f'num_held_out_sessions {num_held_out_sessions}, trials '
        f'{num_held_out_session_trials} + {num_held_out_train_trials}: '
        'held-out sessions need trials and trials need held-out sessions.')
  training = tuple(range(num_sessions))
  held = tuple(range(num_sessions, num_sessions + num_held_out_sessions))
  units = vocabulary_lib.Vocabulary()
  encoders = {}
  for group in (training, held):
    for k in group:
      tuning, log_base = unit_session(seed, k, min_units, max_units,
                                      mean_rate_hz, session_gain_std,
                                      tuning_std)
      names = [unit_name(k, j) for j in range(tuning.shape[1])]
      units = vocabulary_lib.extend(units, [session_name(k)], names)
      encoders[k] = _spike_encoder(tuning, log_base, np.asarray(
          [units.unit_id(n) for n in names], np.int64))
    if group is training:
      training_units = units
  os.makedirs(output_dir, exist_ok=True)
  vocabulary_lib.save(training_units,
                      os.path.join(output_dir, VOCABULARY_FILE))
  vocabulary_lib.save(units, os.path.join(output_dir,
                                          HELD_OUT_VOCABULARY_FILE))
  plan = {'train': (num_train_trials, training),
          'validation': (num_validation_trials, training),
          'held_out_sessions': (num_held_out_session_trials, held),
          'held_out_train': (num_held_out_train_trials, held)}
  ids = configs.task_index(task_vocabulary)
  clock: Dict[int, float] = {}
  patterns = {}
  for split_id, split in enumerate(_SPLITS, start=1):
    count, sessions = plan[split]
    if not count:
      continue
    records = _generate(count, seed, split_id, encoders, sessions,
                        trial_noise_std, ids, clock)
    patterns[split] = _write_shards(output_dir, split, count, num_shards,
                                    records)
  return patterns


def _shard_pattern(directory: str, split: str, num_shards: int) -> str:
  """The file pattern of a split's shards (as `_write_shards` names them)."""
  return os.path.join(directory, f'{split}-*-of-{num_shards:05d}.tfrecord')


def _write_shards(output_dir: str, split: str, count: int, num_shards: int,
                  records: Iterator[bytes]) -> str:
  """Writes `count` records in `num_shards` files; returns their pattern."""
  bounds = np.linspace(0, count, num_shards + 1).astype(int)
  for shard in range(num_shards):
    path = os.path.join(
        output_dir, f'{split}-{shard:05d}-of-{num_shards:05d}.tfrecord')
    dataloader.write_records(
        path, (next(records) for _ in range(bounds[shard + 1] -
                                            bounds[shard])))
  return _shard_pattern(output_dir, split, num_shards)


def write_demo_dataset(output_dir: str, *, num_train_trials: int,
                       num_validation_trials: int, num_shards: int, seed: int,
                       input_dim: int = configs.DEMO_INPUT_DIM,
                       noise_std: float = 0.5,
                       trial_noise_std: float = 0.7,
                       task_vocabulary=configs.DEMO_VOCABULARY,
                       num_sessions: int = 1,
                       num_held_out_sessions: int = 0,
                       num_held_out_session_trials: int = 0,
                       session_gain_std: float = 0.5
                       ) -> Dict[str, str]:
  """Writes the binned `train`, `validation` (and `held_out_sessions`) shards.

  Returns:
    {split: glob pattern} of the splits written.
  """
  if num_train_trials < 1 or num_validation_trials < 1 or num_shards < 1:
    raise ValueError('num_train_trials, num_validation_trials and num_shards '
                     f'must be >= 1; got {num_train_trials}, '
                     f'{num_validation_trials}, {num_shards}.')
  if num_sessions < 1:
    raise ValueError(f'num_sessions is {num_sessions}; expected >= 1.')
  if (num_held_out_session_trials < 0 or num_held_out_sessions < 0 or
      (num_held_out_session_trials > 0) != (num_held_out_sessions > 0)):
    raise ValueError(
        'num_held_out_sessions and num_held_out_session_trials are '
        f'{num_held_out_sessions} and {num_held_out_session_trials}; '
        'expected both 0 (no held-out sessions) or both >= 1.')
  os.makedirs(output_dir, exist_ok=True)
  training_sessions = tuple(range(num_sessions))
  plan = {'train': (num_train_trials, training_sessions),
          'validation': (num_validation_trials, training_sessions)}
  if num_held_out_session_trials:
    plan['held_out_sessions'] = (num_held_out_session_trials, tuple(range(
        num_sessions, num_sessions + num_held_out_sessions)))
  patterns = {}
  clock: Dict[int, float] = {}  # Each session's clock, over the splits.
  for split_id, split in enumerate(_SPLITS, start=1):
    if split not in plan:
      continue
    count, sessions = plan[split]
    records = generate_trials(count, seed=seed, split_id=split_id,
                              input_dim=input_dim, noise_std=noise_std,
                              trial_noise_std=trial_noise_std,
                              task_vocabulary=task_vocabulary,
                              sessions=sessions,
                              session_gain_std=session_gain_std, clock=clock)
    patterns[split] = _write_shards(output_dir, split, count, num_shards,
                                    records)
  return patterns


def demo_data_params(task_config: configs.ReadoutTaskConfig
                     ) -> Dict[str, object]:
  """Every parameter that determines the generated data (its cache key)."""
  demo = task_config.demo_data
  input_dim = int(task_config.train_data.input_dim)
  if int(task_config.validation_data.input_dim) != input_dim:
    raise ValueError('task.validation_data.input_dim differs from '
                     'task.train_data.input_dim.')
  return {
      'format_version': FORMAT_VERSION,
      'input_dim': input_dim,
      'task_vocabulary': list(task_config.task_vocabulary),
      'num_train_trials': int(demo.num_train_trials),
      'num_validation_trials': int(demo.num_validation_trials),
      'num_shards': int(demo.num_shards),
      'seed': int(demo.seed),
      'noise_std': float(demo.noise_std),
      'trial_noise_std': float(demo.trial_noise_std),
      'num_sessions': int(demo.num_sessions),
      'num_held_out_sessions': int(demo.num_held_out_sessions),
      'num_held_out_session_trials': int(demo.num_held_out_session_trials),
      'session_gain_std': float(demo.session_gain_std),
      **({} if task_config.model.tokenization == 'binned' else {
          'tokenization': task_config.model.tokenization,
          'num_held_out_train_trials': int(demo.num_held_out_train_trials),
          'min_units': int(demo.min_units),
          'max_units': int(demo.max_units),
          'mean_rate_hz': float(demo.mean_rate_hz),
          'tuning_std': float(demo.tuning_std)}),
  }


def ensure_demo_data(task_config: configs.ReadoutTaskConfig
                     ) -> Tuple[str, str]:
  """Generates the demo data once (cached, `core.input.demo_cache`).

  Returns:
    (train glob pattern, validation glob pattern).
  """
  return (demo_split_pattern(task_config, 'train'),
          demo_split_pattern(task_config, 'validation'))


def demo_split_pattern(task_config: configs.ReadoutTaskConfig,
                       split: str) -> str:
  """The glob pattern of one generated split, generated first if needed.

  Raises:
    ValueError: demo data is disabled; `split` is unknown or not written.
  """
  if not task_config.demo_data.enabled:
    raise ValueError('task.demo_data.enabled is False: set it, or set '
                     'task.train_data.input_path and '
                     'task.validation_data.input_path.')
  if split not in _SPLITS:
    raise ValueError(f'Unknown demo split {split!r}; expected one of '
                     f'{_SPLITS}.')
  params = demo_data_params(task_config)
  if split == 'held_out_sessions' and not params[
      'num_held_out_session_trials']:
    raise ValueError(
        "The demo split 'held_out_sessions' is not generated: "
        'task.demo_data.num_held_out_session_trials is 0 (set it and '
        'task.demo_data.num_held_out_sessions).')
  if split == 'held_out_train' and not params.get(
      'num_held_out_train_trials'):
    raise ValueError(
        "The demo split 'held_out_train' is not generated: it is written "
        'for unit tokens (task.model.tokenization unit_tokens) with '
        'task.demo_data.num_held_out_train_trials > 0.')
  return _shard_pattern(_ensure(task_config, params), split,
                        params['num_shards'])


def demo_vocabulary_file(task_config: configs.ReadoutTaskConfig) -> str:
  """The unit vocabulary of the generated unit-token data (generated first
  if needed); with `train_split` 'held_out_train' the extended one."""
  params = demo_data_params(task_config)
  if 'tokenization' not in params:
    raise ValueError('demo_vocabulary_file: the demo data of binned tokens '
                     'has no unit vocabulary.')
  name = (HELD_OUT_VOCABULARY_FILE if task_config.demo_data.train_split ==
          'held_out_train' else VOCABULARY_FILE)
  return os.path.join(_ensure(task_config, params), name)


def _ensure(task_config: configs.ReadoutTaskConfig,
            params: Dict[str, object]) -> str:
  """The cached directory of the data `params` describe (written once)."""
  root = os.path.join(demo_cache.cache_root(task_config.demo_data.cache_dir),
                      'readout_demo')
  common = dict(
      num_train_trials=params['num_train_trials'],
      num_validation_trials=params['num_validation_trials'],
      num_shards=params['num_shards'], seed=params['seed'],
      trial_noise_std=params['trial_noise_std'],
      task_vocabulary=params['task_vocabulary'],
      num_sessions=params['num_sessions'],
      num_held_out_sessions=params['num_held_out_sessions'],
      num_held_out_session_trials=params['num_held_out_session_trials'],
      session_gain_std=params['session_gain_std'])
  if 'tokenization' in params:
    write = lambda directory: write_unit_token_dataset(
        directory, num_held_out_train_trials=params[
            'num_held_out_train_trials'], min_units=params['min_units'],
        max_units=params['max_units'], mean_rate_hz=params['mean_rate_hz'],
        tuning_std=params['tuning_std'], **common)
  else:
    write = lambda directory: write_demo_dataset(
        directory, input_dim=params['input_dim'],
        noise_std=params['noise_std'], **common)
  return demo_cache.ensure(root, params, write, 'readout')


def define_flags(flag_values: flags.FlagValues = flags.FLAGS) -> None:
  """Defines the CLI's flags in `flag_values` (tests: a fresh FlagValues)."""
  define = dict(flag_values=flag_values)
  demo = configs.readout_demo().task.demo_data
  flags.DEFINE_string('output_dir', None, 'Directory for the shards.',
                      **define)
  flags.DEFINE_bool('overwrite', False, 'Replace the files of the same names '
                    'in a non-empty --output_dir.', **define)
  flags.DEFINE_integer('num_train_trials', demo.num_train_trials, 'Trials.',
                       **define)
  flags.DEFINE_integer('num_validation_trials', demo.num_validation_trials,
                       'Validation trials.', **define)
  flags.DEFINE_integer('num_shards', demo.num_shards, 'Files per split.',
                       **define)
  flags.DEFINE_integer('seed', demo.seed, 'Random seed.', **define)
  flags.DEFINE_float('noise_std', demo.noise_std, 'Unit noise std.', **define)
  flags.DEFINE_float('trial_noise_std', demo.trial_noise_std,
                     'Per-trial encoding error of the task variables.',
                     **define)
  flags.DEFINE_integer('num_sessions', demo.num_sessions,
                       'Sessions of the train and validation trials.',
                       **define)
  flags.DEFINE_integer('num_held_out_sessions', demo.num_held_out_sessions,
                       'Sessions of the held_out_sessions split.', **define)
  flags.DEFINE_integer('num_held_out_session_trials',
                       demo.num_held_out_session_trials,
                       'Trials of the held_out_sessions split (0: none).',
                       **define)
  flags.DEFINE_float('session_gain_std', demo.session_gain_std,
                     'Std of the log per-unit gains of a session.', **define)
  flags.mark_flag_as_required('output_dir', flag_values=flag_values)


def main(argv: Sequence[str],
         flag_values: flags.FlagValues = flags.FLAGS) -> None:
  """Writes the demo dataset the parsed `flag_values` describe, whole or
  not at all (`core.output_files.write_directory`)."""
  del argv
  f = flag_values
  patterns = output_files.write_directory(
      f.output_dir, lambda staging: write_demo_dataset(
          staging, num_train_trials=f.num_train_trials,
          num_validation_trials=f.num_validation_trials,
          num_shards=f.num_shards, seed=f.seed, noise_std=f.noise_std,
          trial_noise_std=f.trial_noise_std, num_sessions=f.num_sessions,
          num_held_out_sessions=f.num_held_out_sessions,
          num_held_out_session_trials=f.num_held_out_session_trials,
          session_gain_std=f.session_gain_std), overwrite=f.overwrite)
  for split, pattern in patterns.items():
    print(f'{split}: {os.path.join(f.output_dir, os.path.basename(pattern))}')


if __name__ == '__main__':
  define_flags()
  app.run(main)
