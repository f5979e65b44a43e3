"""The Cloud TPU launcher, scripts/launch_cloud_tpu.sh.

Its dry run prints the commands exactly as they run; every value reaches the
program on the TPU hosts as one argument, whatever characters it holds; names
are checked against what they may contain before anything runs.

Pure subprocess: stand-in `pip`, `gcloud` and `python3` scripts record the
argv they are called with. Nothing here imports TensorFlow or reaches GCP.
"""
import glob
import os
import re
import shutil
import subprocess

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
LAUNCHER = os.path.join(REPO, 'scripts', 'launch_cloud_tpu.sh')
TPU_YAML = os.path.join(REPO, 'configs', 'yt8m', 'yt8m_tpu.yaml')
BASE = ['--zone=us-central1-a', '--experiment=yt8m',
        '--config_file=configs/yt8m/yt8m_tpu.yaml', '--model_dir=gs://b/yt8m']

# Records its argv: the count, its name, then each argument, each ending in
# NUL (an argument cannot hold one). Exits 0, as the real programs would.
_STAND_IN = '#!/bin/sh\nprintf \'%s\\0\' "$#" "${0##*/}" "$@" >> "$ARGV_LOG"\n'


def _stand_ins(tmp_path):
  bin_dir = tmp_path / 'bin'
  if not bin_dir.exists():
    bin_dir.mkdir()
    for name in ('pip', 'gcloud', 'python3'):
      (bin_dir / name).write_text(_STAND_IN)
      (bin_dir / name).chmod(0o755)
  return bin_dir


def _calls(log):
  """The recorded calls, each as [program, arg, ...]."""
  if not log.exists():
    return []
  fields = log.read_bytes().split(b'\0')[:-1]
  calls, i = [], 0
  while i < len(fields):
    n = int(fields[i])
    calls.append([f.decode() for f in fields[i + 1:i + 2 + n]])
    i += 2 + n
  return calls


def _run(tmp_path, argv, log_name, cwd, home=None):
  """Runs argv with the stand-ins first on PATH; returns (result, calls)."""
  log = tmp_path / log_name
  env = dict(os.environ, PATH=f'{_stand_ins(tmp_path)}:{os.environ["PATH"]}',
             ARGV_LOG=str(log), TMPDIR=str(tmp_path))
  if home:
    env['HOME'] = str(home)
  result = subprocess.run(argv, capture_output=True, text=True, env=env,
                          cwd=cwd, timeout=60, check=False)
  return result, _calls(log)


def _launch(tmp_path, *args):
  """The launcher's result and the calls it made (pip, gcloud)."""
  return _run(tmp_path, ['bash', LAUNCHER, *args], 'launcher_calls', REPO)


def _scratch(tmp_path):
  """The working directory and HOME of a host, in which the unquoted words
  `--model_dir=gs://b/*` and `--config_file=$HOME/gs:__*.yaml` would expand."""
  scratch = tmp_path / 'scratch'
  (scratch / '--model_dir=gs:' / 'b' / 'expanded').mkdir(parents=True,
                                                         exist_ok=True)
  (scratch / 'home').mkdir(exist_ok=True)
  (scratch / 'home' / 'gs:__expanded.yaml').touch()
  return scratch


def _replay(tmp_path, printed, shell='bash'):
  """Runs what a dry run printed, as a user pasting it into `shell` would."""
  scratch = _scratch(tmp_path)
  result, calls = _run(tmp_path, [shell, '-c', printed], f'replay_{shell}',
                       scratch)
  assert result.returncode == 0, result.stderr
  return calls


def _remote_command(calls):
  ssh = [c for c in calls if c[:5] == ['gcloud', 'compute', 'tpus', 'tpu-vm',
                                       'ssh']]
  assert len(ssh) == 1, calls
  command = [a for a in ssh[0] if a.startswith('--command=')]
  assert len(command) == 1, ssh[0]
  return command[0][len('--command='):]


def _run_on_host(tmp_path, remote, shell):
  """Runs the remote command as a TPU host's login shell would."""
  scratch = _scratch(tmp_path)
  result, calls = _run(tmp_path, [shell, '-c', remote], f'host_{shell}',
                       scratch, home=scratch / 'home')
  assert result.returncode == 0, (remote, result.stderr)
  return calls, scratch / 'home'


def _hostile(marker):
  """Values that run `touch marker` (or split, or expand) if a shell reads
  them as code."""
  return {
      'command_substitution': f'gs://b/$(touch {marker})',
      'backticks': f'gs://b/`touch {marker}`',
      'semicolon': f'gs://b/x; touch {marker} #',
      'single_quote': f"gs://b/it's'; touch {marker}; echo '",
      'double_quote_backslash': f'gs://b/"$(touch {marker})"\\" \\',
      'newline': f'gs://b/a\ntouch {marker}\n#',
      'trailing_newlines': 'gs://b/x\n\n',
      'spaces_tab': 'gs://b/a  b\tc',
      'glob': 'gs://b/*',
      'variables': 'gs://b/${HOME}$IFS$0',
      'ampersand_pipe_redirect': f'gs://b/x & touch {marker} | cat > {marker}',
  }


HOSTILE_IDS = list(_hostile('/m'))


@pytest.mark.parametrize('shell', ['bash', 'sh'])
@pytest.mark.parametrize('kind', HOSTILE_IDS)
def test_hostile_values_reach_the_tpu_hosts_as_single_arguments(
    tmp_path, kind, shell):
  """The dry run's remote command, run by a host's shell (bash; sh for any
  POSIX shell), calls python3 with each value as exactly one argument."""
  marker = tmp_path / 'marker'
  value = _hostile(marker)[kind]
  # A config whose file name holds the value too (no '/' in a file name).
  config_name = value.replace('/', '_') + '.yaml'
  config = tmp_path / 'configs' / config_name
  config.parent.mkdir()
  shutil.copy(TPU_YAML, config)
  result, calls = _launch(
      tmp_path, '--tpu_name=t1', '--accelerator_type=v3-8',
      '--zone=us-central1-a', '--experiment=yt8m', f'--config_file={config}',
      f'--model_dir={value}', f'--train_data={value}/train*',
      f'--validation_data={value}/validate*',
      f'--params_override=task.init_checkpoint={value}', '--dry_run')
  assert result.returncode == 0, result.stderr
  assert not calls  # A dry run runs nothing.
  remote = _remote_command(_replay(tmp_path, result.stdout))
  host_calls, home = _run_on_host(tmp_path, remote, shell)
  assert not marker.exists(), f'{shell} -c {remote!r} ran a command'
  assert [c[:2] for c in host_calls] == [['python3', '-c'], ['pip', 'install'],
                                         ['python3', '-m']], host_calls
  check, install, train = host_calls
  assert 'tf.__version__' in check[2] and len(check) == 3
  assert len(install) == 4 and install[2] == '--quiet'
  assert install[3].startswith(f'{home}/official_ext-')
  assert install[3].endswith('-py3-none-any.whl')
  assert train == [
      'python3', '-m', 'official_ext.train', '--tpu=local', '--experiment=yt8m',
      '--mode=train_and_eval', f'--model_dir={value}',
      f'--config_file={home}/{config_name}',
      f'--params_override=task.train_data.input_path={value}/train*,'
      f'task.validation_data.input_path={value}/validate*,'
      f'task.init_checkpoint={value}']


@pytest.mark.parametrize('shell', ['bash', 'sh'])
@pytest.mark.parametrize('kind', ['single_quote', 'newline', 'glob',
                                  'command_substitution'])
def test_dry_run_prints_the_commands_exactly_as_they_run(tmp_path, kind,
                                                          shell):
  """Pasting the dry run's output into a shell makes the very calls (argv for
  argv) that the launcher makes when it runs them; it shows the command the
  hosts' shell runs verbatim, not only quoted inside --command=."""
  marker = tmp_path / 'marker'
  hostile = _hostile(marker)
  args = ['--tpu_name=pod1', '--accelerator_type=v3-32', *BASE[:3],
          f'--model_dir={hostile[kind]}', '--project=my-project',
          f'--params_override=task.init_checkpoint={hostile[kind]}',
          '--delete_after']
  dry, none = _launch(tmp_path, *args, '--dry_run')
  assert dry.returncode == 0, dry.stderr
  assert not none
  real, ran = _launch(tmp_path, *args)
  assert real.returncode == 0, real.stderr
  assert real.stdout == dry.stdout
  assert [c[:2] for c in ran] == [['pip', 'wheel']] + [['gcloud',
                                                        'compute']] * 4
  assert _replay(tmp_path, dry.stdout, shell) == ran
  assert not marker.exists()
  prefix = '# on every host: '
  shown = [l[len(prefix):] for l in dry.stdout.split('\n')
           if l.startswith(prefix)]
  assert '\n'.join(shown) == _remote_command(ran)


def test_dry_run_prints_the_commands(tmp_path):
  result, calls = _launch(
      tmp_path, '--tpu_name=pod1', '--accelerator_type=v3-32', *BASE,
      '--train_data=gs://b/train*.tfrecord',
      '--validation_data=gs://b/validate*.tfrecord',
      '--params_override=trainer.train_steps=100', '--delete_after',
      '--dry_run')
  assert result.returncode == 0, result.stderr
  assert not calls
  commands = _replay(tmp_path, result.stdout)
  assert [c[:2] for c in commands] == [['pip', 'wheel']] + [
      ['gcloud', 'compute']] * 4
  create, scp, ssh, delete = commands[1:]
  assert create[3:5] == ['tpu-vm', 'create'] and create[5] == 'pod1'
  assert '--accelerator-type=v3-32' in create
  # More than 8 cores: several hosts, the pod runtime.
  assert '--version=tpu-vm-tf-2.20.0-pod-pjrt' in create
  assert scp[4] == 'scp' and '--worker=all' in scp
  assert any(a.endswith('.whl') for a in scp)
  assert 'configs/yt8m/yt8m_tpu.yaml' in scp
  assert ssh[4] == 'ssh' and '--worker=all' in ssh
  train = _run_on_host(tmp_path, _remote_command(commands), 'bash')[0][-1]
  assert train[:3] == ['python3', '-m', 'official_ext.train']
  assert '--tpu=pod1' in train and '--experiment=yt8m' in train
  assert '--model_dir=gs://b/yt8m' in train
  assert ('--params_override=task.train_data.input_path=gs://b/train*.tfrecord,'
          'task.validation_data.input_path=gs://b/validate*.tfrecord,'
          'trainer.train_steps=100') in train
  assert delete[4] == 'delete' and '--quiet' in delete


def test_single_host_uses_local_tpu(tmp_path):
  result, _ = _launch(tmp_path, '--tpu_name=t1', '--accelerator_type=v3-8',
                      *BASE, '--dry_run')
  assert result.returncode == 0, result.stderr
  assert '--version=tpu-vm-tf-2.20.0-pjrt' in result.stdout
  assert '--tpu=local' in result.stdout
  assert 'delete' not in result.stdout


def _with(args):
  base = {a.split('=')[0]: a for a in
          ['--tpu_name=t1', '--accelerator_type=v3-8', *BASE]}
  for a in args:
    base[a.split('=')[0]] = a
  return list(base.values())


@pytest.mark.parametrize('args,message', [
    (['--model_dir=/tmp/m'], 'expected gs://'),
    (['--config_file=configs/yt8m/yt8m_gpu.yaml'],
     'does not set runtime.distribution_strategy: tpu'),
    (['--train_data=/data/train*'], 'expected gs://'),
    (['--accelerator_type=tpu'], 'expected e.g. v3-8'),
    (['--bogus=1'], "unknown argument '--bogus=1'"),
    # A variable in single quotes, as pasted from '--train_data=gs://$B/..':
    # the bucket would be named '$BUCKET' on every host.
    (['--train_data=gs://$BUCKET/train*'],
     "--train_data='gs://$BUCKET/train*': bucket '$BUCKET' holds '$'"),
    (['--validation_data=gs://${BUCKET}/v*'],
     "--validation_data='gs://${BUCKET}/v*': bucket '${BUCKET}' holds '$'"),
    (['--model_dir=gs://$BUCKET/yt8m'],
     "--model_dir='gs://$BUCKET/yt8m': bucket '$BUCKET' holds '$'"),
])
def test_rejects_bad_arguments(tmp_path, args, message):
  result, _ = _launch(tmp_path, *_with(args), '--dry_run')
  assert result.returncode == 2
  assert message in result.stderr
  assert not result.stdout


@pytest.mark.parametrize('flag,value', [
    ('--tpu_name', 'My-tpu'),
    ('--tpu_name', '1tpu'),
    ('--tpu_name', 'tpu-'),
    ('--tpu_name', 'a' * 64),
    ('--tpu_name', 't1; touch {marker}'),
    ('--zone', 'us-central2'),
    ('--zone', 'US-CENTRAL2-B'),
    ('--zone', 'us-central2-b; touch {marker}'),
    ('--project', 'my project'),
    ('--project', '-proj1234'),
    ('--project', '$(touch {marker})'),
    ('--experiment', 'yt8m; touch {marker} #'),
    ('--experiment', 'yt8m demo'),
    ('--experiment', 'yt8m-demo'),
    ('--mode', 'evaluate'),
    ('--mode', 'Train'),
    ('--mode', 'train;touch {marker}'),
    ('--accelerator_type', 'v3;touch {marker};-8'),
    ('--runtime_version', 'tpu-vm-tf-2.20.0-pjrt $(touch {marker})'),
])
def test_refuses_a_bad_name_before_running_anything(tmp_path, flag, value):
  """Not a dry run: the stand-ins record any call; there must be none."""
  marker = tmp_path / 'marker'
  value = value.format(marker=marker)
  result, calls = _launch(tmp_path, *_with([f'{flag}={value}']))
  assert result.returncode == 2, result.stdout
  assert f'{flag}=' in result.stderr and value in result.stderr, result.stderr
  assert 'expected' in result.stderr
  assert not result.stdout
  assert not calls
  assert not marker.exists()


@pytest.mark.parametrize('args', [
    ['--tpu_name=' + 'a' * 63, '--zone=northamerica-northeast1-a',
     '--project=my-project-123', '--mode=train'],
    ['--tpu_name=yt8m-v4-8', '--zone=us-central2-b',
     '--project=example.com:my-project', '--mode=continuous_eval',
     '--experiment=assemblenet_plus_lite_kinetics',
     '--accelerator_type=v5litepod-8'],
    ['--mode=eval', '--runtime_version=tpu-vm-tf-2.20.0-pod-pjrt'],
    ['--mode=train_and_eval', '--experiment=readout_yt8m_joint'],
])
def test_accepts_valid_names(tmp_path, args):
  result, _ = _launch(tmp_path, *_with(args), '--dry_run')
  assert result.returncode == 0, result.stderr


def _registered_experiments():
  names = set()
  for path in glob.glob(os.path.join(REPO, 'official_ext', '**', '*.py'),
                        recursive=True):
    with open(path) as f:
      names.update(re.findall(r"register_config_factory\(\s*'([^']+)'",
                              f.read()))
  return sorted(names)


def test_accepts_every_registered_experiment_name(tmp_path):
  names = _registered_experiments()
  assert 'yt8m' in names and 'readout_yt8m_joint' in names, names
  for name in names:
    result, _ = _launch(tmp_path, *_with([f'--experiment={name}']),
                        '--dry_run')
    assert result.returncode == 0, (name, result.stderr)
    assert f'--experiment={name} ' in result.stdout


def test_names_a_missing_flag(tmp_path):
  result, _ = _launch(tmp_path, '--tpu_name=t1', *BASE, '--dry_run')
  assert result.returncode == 2
  assert '--accelerator_type is required' in result.stderr
