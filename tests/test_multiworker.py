"""Multi-worker training on one machine: scripts/run_multiworker_local.sh.

Two worker processes (MultiWorkerMirroredStrategy, collective all-reduce over
127.0.0.1) train the YT8M demo, shrunk, and must give the same evaluation as
one process at the same global batch from the same checkpoint; a SIGTERM to
one worker stops both at one step, saved, and the same command resumes there.
"""
import glob
import json
import os
import re
import shutil
import signal
import subprocess
import time

import numpy as np
import pytest
import tensorflow as tf

from official.core import exp_factory
from official_ext.core.run import runner
from official_ext import registry_imports  # pylint: disable=unused-import
from official_ext import train
from official_ext.yt8m import demo_data

_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
_SCRIPT = os.path.join(_ROOT, 'scripts', 'run_multiworker_local.sh')
_METRICS = ('gap', 'map', 'map_all_classes', 'hit_at_one', 'perr',
            'model_loss', 'num_videos')


def _tiny_overrides(cache_dir):
  """The YT8M demo, tiny, with data that splits exactly over two workers.

  One train file and one validation file: Model Garden's InputReader then
  shards by record (worker i reads records i, i+2, ...), so with no shuffle
  (buffer 1) and no frame sampling the two workers' batches of 4 are together
  exactly the one-process batch of 8. Synchronized batch norm makes the batch
  statistics those of the global batch.
  """
  return {
      'task': {
          'model': {
              'backbone': {'dbof': {'cluster_size': 16, 'hidden_size': 16}},
              'head': {'moe': {'num_mixtures': 2}},
              'norm_activation': {'use_sync_bn': True},
          },
          'train_data': {'global_batch_size': 8, 'max_frames': 12,
                         'num_sample_frames': None, 'seed': 7,
                         'shuffle_buffer_size': 1},
          'validation_data': {'global_batch_size': 8, 'max_frames': 12},
          'demo_data': {'cache_dir': str(cache_dir), 'num_train_videos': 32,
                        'num_validation_videos': 32, 'num_shards': 1},
          # The subject is the equality of the runs, not XLA (an XLA
          # compilation per process).
          'jit_compile': False,
      },
      'trainer': {'train_steps': 2, 'steps_per_loop': 2,
                  'checkpoint_interval': 2, 'summary_interval': 2,
                  'validation_interval': 2, 'validation_steps': -1},
  }


def _yaml(path, overrides):
  import yaml  # pylint: disable=g-import-not-at-top
  with open(path, 'w') as f:
    yaml.safe_dump(overrides, f)
  return str(path)


def _run_workers(model_dir, config, mode, train_steps):
  return subprocess.run(
      ['bash', _SCRIPT, '2', 'yt8m_demo', str(model_dir), f'--mode={mode}',
       f'--config_file={config}',
       f'--params_override=trainer.train_steps={train_steps}'],
      capture_output=True, text=True, cwd=_ROOT, timeout=400, check=False,
      env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL='2',
               MULTIWORKER_KILL_GRACE_S='2'))


def _logs(model_dir):
  return [open(os.path.join(model_dir, 'logs', f'worker_{i}.log')).read()
          for i in range(2)]


def _summaries(directory, step):
  """{tag: value} of the scalar summaries written at `step`."""
  values = {}
  for path in glob.glob(os.path.join(directory, 'events.out.tfevents.*')):
    for event in tf.compat.v1.train.summary_iterator(path):
      if event.step != step:
        continue
      for v in event.summary.value:
        values[v.tag] = float(tf.make_ndarray(v.tensor))
  return values


def _worker_dir(log):
  match = re.search(r'writes checkpoints and summaries to (\S+) ', log)
  assert match, 'the non-chief worker did not log its directory'
  return match.group(1)


def _wait_for(predicate, proc, what, deadline_s=300):
  deadline = time.time() + deadline_s
  while not predicate():
    assert proc.poll() is None, f'the run ended before {what}'
    assert time.time() < deadline, f'no {what} within {deadline_s} s'
    time.sleep(0.05)


def _sigterm_to_worker_1(model_dir, config, train_steps, tmp_path):
  """Starts two workers training, sends SIGTERM to worker 1 (the non-chief)
  once the chief's first train loop ended; returns the script's status."""
  script_log = tmp_path / 'script.log'
  chief_log = model_dir / 'logs' / 'worker_0.log'
  with open(script_log, 'w') as err:
    proc = subprocess.Popen(
        ['bash', _SCRIPT, '2', 'yt8m_demo', str(model_dir), '--mode=train',
         f'--config_file={config}',
         f'--params_override=trainer.train_steps={train_steps}'],
        stdout=subprocess.DEVNULL, stderr=err, cwd=_ROOT,
        env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL='2',
                 MULTIWORKER_KILL_GRACE_S='30'))
    try:
      pids = []
      _wait_for(lambda: pids.extend(re.findall(
          r'2 workers \(pids \d+ (\d+)\)', script_log.read_text())) or pids,
                proc, 'the workers\' pids')
      _wait_for(lambda: chief_log.exists() and re.search(
          r'train \| step:\s+\d+ \| steps/sec', chief_log.read_text()),
                proc, 'the first train loop')
      os.kill(int(pids[0]), signal.SIGTERM)
      return proc.wait(timeout=120)
    finally:
      if proc.poll() is None:
        proc.kill()
        proc.wait()


def test_sigterm_to_one_worker_then_the_rerun_matches_one_process(tmp_path):
  """Two workers (the script) in one run:

  * A real SIGTERM to worker 1, the non-chief (docs/distributed.md,
    preemption): both workers stop at the same step N, the chief saves ckpt-N
    in model_dir (periodic checkpoints are off after the first loop, so only
    the signal can have saved it) and releases writer.lock, and the script
    exits with the signalled worker's 143.
  * The same command resumes from ckpt-N (the non-chief restores the chief's
    checkpoint too) to N + 2 with an evaluation, which must equal one
    process's at the same global batch from ckpt-N.
  """
  overrides = _tiny_overrides(tmp_path / 'cache')
  params = exp_factory.get_exp_config('yt8m_demo')
  params.override(overrides, is_strict=True)
  demo_data.ensure_demo_data(params.task)  # Generated once, for all runs.
  ref_dir, mw_dir = tmp_path / 'one_process', tmp_path / 'two_workers'

  total = 400  # Not reached: the signal stops the first run.
  config = _yaml(tmp_path / 'tiny.yaml', {**overrides, 'trainer': dict(
      overrides['trainer'], checkpoint_interval=10 * total,
      validation_interval=total)})
  status = _sigterm_to_worker_1(mw_dir, config, total, tmp_path)
  chief_log, worker_log = _logs(mw_dir)
  assert status == 143, (tmp_path / 'script.log').read_text()[-3000:]
  match = re.search(r'Training stopped by SIGTERM at step (\d+): saved the '
                    r'checkpoint (\S+)\.', worker_log)
  assert match, worker_log[-3000:]
  step = int(match.group(1))
  assert 2 <= step < total
  latest = tf.train.latest_checkpoint(str(mw_dir))
  assert latest == str(mw_dir / f'ckpt-{step}'), (latest, step)
  # The chief stops for worker 1's signal (or for the script's SIGTERM, when
  # worker 1's exit reaches the script while the chief still saves).
  assert re.search(
      rf'Training stopped by (a signal another worker received|SIGTERM) at '
      rf'step {step}: saved the checkpoint {re.escape(latest)}\.',
      chief_log), chief_log[-3000:]
  assert not (mw_dir / 'writer.lock').exists(), chief_log[-3000:]
  assert not os.path.exists(_worker_dir(worker_log))

  # The same command resumes from ckpt-N, to N + 2 and an evaluation; so
  # does one process (initial weights are random per job: both start from
  # ckpt-N).
  ref_dir.mkdir()
  for path in glob.glob(f'{latest}.*') + [str(mw_dir / 'checkpoint')]:
    shutil.copy(path, ref_dir)
  result = _run_workers(mw_dir, config, 'train_and_eval', step + 2)
  assert result.returncode == 0, result.stderr[-4000:]
  assert tf.train.latest_checkpoint(str(mw_dir)).endswith(f'ckpt-{step + 2}')
  chief_log, worker_log = _logs(mw_dir)
  assert re.search(rf'Resuming from: \S+ckpt-{step}\.', worker_log), (
      worker_log[-3000:])
  loops = [int(s) for s in re.findall(r'train \| step:\s+(\d+) \| steps/sec',
                                      chief_log)]
  assert loops == [step + 2], chief_log[-3000:]
  assert f'progress | step {step + 2}/{step + 2}' in chief_log
  # The non-chief wrote into its own directory, removed at exit; only the
  # chief wrote summaries and the gin config to model_dir.
  assert not os.path.exists(_worker_dir(worker_log))
  assert len(glob.glob(str(mw_dir / 'validation' / 'events.*'))) == 1
  assert (mw_dir / 'operative_config.train_and_eval.gin').exists()
  two = _summaries(str(mw_dir / 'validation'), step=step + 2)

  # The one-process run trains and evaluates eagerly (a traced step costs
  # more than running it); the workers run in graphs, as configured.
  params.override({'trainer': {
      'train_steps': step + 2, 'train_tf_function': False,
      'train_tf_while_loop': False, 'eval_tf_function': False,
      'eval_tf_while_loop': False}}, is_strict=True)
  _, one = train.run(params, 'train_and_eval', str(ref_dir),
                     strategy=tf.distribute.OneDeviceStrategy('/cpu:0'))
  assert tf.train.latest_checkpoint(str(ref_dir)).endswith(f'ckpt-{step + 2}')

  # Every validation video is counted once: the chief's AP metrics cover both
  # workers' shards.
  assert two['num_videos'] == float(one['num_videos']) == 32
  # Tolerance: the two jobs add the same numbers in a different order (two
  # half-batch means, all-reduced, against one full-batch mean), about 1e-7
  # relative in float32; after two Adam steps the predictions differ by ~1e-6,
  # far below rtol 1e-4. Ranking metrics (hit@1, PERR, AP) could only move by
  # a tie broken differently, which these scores do not have.
  for key in _METRICS:
    np.testing.assert_allclose(two[key], float(one[key]), rtol=1e-4,
                               atol=1e-6, err_msg=key)


_FAKE_WORKER = r"""#!/usr/bin/env bash
# Stands in for python: records its arguments and TF_CONFIG; worker 1 fails,
# worker 0 ignores SIGTERM (as a preemption handler may) and sleeps. The
# script's own use of python (picking free ports) goes to python3.
if [[ "$1" == "-" ]]; then exec python3 "$@"; fi
index=$(echo "$TF_CONFIG" | sed 's/.*"index":\([0-9]*\).*/\1/')
echo "$$" > "$FAKE_DIR/pid_$index"
echo "$TF_CONFIG" > "$FAKE_DIR/tf_config_$index"
printf '%s\n' "$@" > "$FAKE_DIR/args_$index"
if [[ "$index" == 1 ]]; then
  until [[ -s "$FAKE_DIR/args_0" ]]; do sleep 0.1; done  # Worker 0 is up.
  echo "worker 1: bad config key" >&2
  exit 3
fi
trap '' TERM
exec sleep 300
"""


def test_script_sets_tf_config_and_stops_all_when_one_fails(tmp_path):
  fake = tmp_path / 'fake_python'
  fake.write_text(_FAKE_WORKER)
  fake.chmod(0o755)
  result = subprocess.run(
      ['bash', _SCRIPT, '2', 'yt8m_demo', str(tmp_path / 'model'),
       '--mode=train', '--params_override=trainer.train_steps=3'],
      capture_output=True, text=True, cwd=_ROOT, timeout=120, check=False,
      env=dict(os.environ, PYTHON=str(fake), FAKE_DIR=str(tmp_path),
               MULTIWORKER_KILL_GRACE_S='1'))
  # The failed worker's status, and its log tail.
  assert result.returncode == 3, result.stderr
  assert 'worker 1' in result.stderr and 'bad config key' in result.stderr
  # Worker 0 ignored SIGTERM: the script killed it.
  pid = int((tmp_path / 'pid_0').read_text())
  with pytest.raises(ProcessLookupError):
    os.kill(pid, 0)
  configs = [json.loads((tmp_path / f'tf_config_{i}').read_text())
             for i in range(2)]
  cluster = configs[0]['cluster']['worker']
  assert len(cluster) == 2 and len(set(cluster)) == 2
  assert all(a.startswith('127.0.0.1:') for a in cluster)
  for i, config in enumerate(configs):
    assert config == {'cluster': {'worker': cluster},
                      'task': {'type': 'worker', 'index': i}}
    args = (tmp_path / f'args_{i}').read_text().splitlines()
    assert args[:2] == ['-m', 'official_ext.train']
    assert '--experiment=yt8m_demo' in args and '--mode=train' in args
    assert f'--model_dir={tmp_path / "model"}' in args
    strategy_config = [a for a in args if a.startswith('--config_file=')]
    assert len(strategy_config) == 1
    with open(strategy_config[0].split('=', 1)[1]) as f:
      assert 'distribution_strategy: multi_worker_mirrored' in f.read()
  assert (tmp_path / 'model' / 'logs' / 'worker_1.log').exists()


class _FakeWatcher:
  preemption_message = None
  blocked = 0

  def block_until_worker_exit(self):
    type(self).blocked += 1


class _FakeClusterStrategy:
  """Stands in for a 2-worker strategy (only what the helper reads)."""

  class _Resolver:

    def cluster_spec(self):
      return tf.train.ClusterSpec({'worker': ['a:1', 'b:2']})

  cluster_resolver = _Resolver()


def test_preemption_recovery_restarts_only_after_a_preemption(monkeypatch):
  watchers = []

  def make_watcher():
    watchers.append(_FakeWatcher())
    return watchers[-1]

  monkeypatch.setattr(tf.distribute.experimental, 'PreemptionWatcher',
                      make_watcher)
  attempts = []

  def run(strategy):
    attempts.append(strategy)
    if len(attempts) == 1:
      watchers[-1].preemption_message = 'worker 1 preempted'
      raise tf.errors.UnavailableError(None, None, 'peer went away')
    return 'done'

  strategy, result = runner.run_with_preemption_recovery(
      _FakeClusterStrategy, run)
  assert result == 'done' and isinstance(strategy, _FakeClusterStrategy)
  assert len(attempts) == 2 and len(watchers) == 2
  assert _FakeWatcher.blocked == 1

  # An error without a preemption message propagates.
  def fail(strategy):
    raise tf.errors.InternalError(None, None, 'a real bug')

  with pytest.raises(tf.errors.InternalError, match='a real bug'):
    runner.run_with_preemption_recovery(_FakeClusterStrategy, fail)

  # A single-process strategy gets no watcher.
  count = len(watchers)
  runner.run_with_preemption_recovery(
      lambda: tf.distribute.OneDeviceStrategy('/cpu:0'), lambda s: None)
  assert len(watchers) == count

