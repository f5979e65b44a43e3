"""Every command of README.md's and docs/*.md's ```bash blocks holds, checked
without running it: its module or script exists, every flag is one it
defines (parsed as its command line parses it), every config file and
`--params_override` key applies strictly to its experiment, and the shell
expands each `$VARIABLE` (none inside single quotes, where it would reach
the program as written).

The blocks are those `scripts/run_doc_commands.py` runs (its `doc_blocks`);
the multi-step workflows run end to end at tiny sizes in their families'
tests (the connectivity search: tests/assemblenet/test_derive_structure.py;
the feature bridge: tests/assemblenet/test_extract_features.py; NWB to
readout: tests/readout/test_nwb_to_readout.py; ensembles:
tests/yt8m/test_ensemble.py).
"""
import argparse
import contextlib
import dataclasses
import importlib.util
import inspect
import io
import json
import os
import re
from typing import Dict, List, Tuple
from unittest import mock

import pytest

from official.core import exp_factory
from official.modeling.hyperparams import params_dict
from official_ext import registry_imports  # pylint: disable=unused-import
from official_ext.benchmarks import harness
from tests import cli

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _load_script(name: str):
  path = os.path.join(REPO, 'scripts', name)
  spec = importlib.util.spec_from_file_location(
      os.path.splitext(name)[0], path)
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  return module


run_doc_commands = _load_script('run_doc_commands.py')
BLOCKS = run_doc_commands.doc_blocks(REPO)


# The shell's reading of a block ---------------------------------------------


@dataclasses.dataclass
class Command:
  """One simple command of a block: its words after quote removal and
  expansion, its `NAME=value` prefix and the line it starts on."""
  words: List[str]
  env: Dict[str, str]
  line: int


_NAME = re.compile(r'[A-Za-z_][A-Za-z0-9_]*')
_ASSIGNMENT = re.compile(r'^([A-Za-z_][A-Za-z0-9_]*)=(.*)$', re.S)


def shell_commands(text: str) -> Tuple[List[Command], List[str]]:
  """The simple commands of `text` as a POSIX shell reads them, and the
  problems found: a `$NAME` inside single quotes (the shell passes it on
  unexpanded).

  Quotes, backslashes, comments, line continuations, `;`, `&&`, `||`, `|`,
  `&` and newlines as a shell reads them; `$NAME` / `${NAME}` expand to a
  value the block assigned (`NAME=value` alone on a command), else to the
  placeholder `name` (the reader's own value, e.g. `$BUCKET`). No word
  splitting, globbing, command substitution or here-documents (no block
  uses them).
  """
  variables: Dict[str, str] = {}
  commands, problems = [], []
  words: List[str] = []
  word, in_word = [], False
  line, start_line, i, n = 1, 1, 0, len(text)

  def expand(j):
    """(value, next index) of the expansion at text[j] == '$'."""
    if text.startswith('${', j):
      end = text.index('}', j)
      name = text[j + 2:end]
      return variables.get(name, name.lower()), end + 1
    m = _NAME.match(text, j + 1)
    if not m:
      return '$', j + 1
    return variables.get(m.group(0), m.group(0).lower()), m.end()

  def end_word():
    nonlocal word, in_word
    if in_word:
      words.append(''.join(word))
    word, in_word = [], False

  def end_command():
    nonlocal words, start_line
    end_word()
    env = {}
    while words and _ASSIGNMENT.match(words[0]):
      name, value = _ASSIGNMENT.match(words.pop(0)).groups()
      env[name] = value
    if words:
      commands.append(Command(words, env, start_line))
    else:
      variables.update(env)
    words = []
    start_line = line

  while i < n:
    c = text[i]
    if c == '\\' and i + 1 < n:
      if text[i + 1] == '\n':
        line += 1
      else:
        word.append(text[i + 1])
        in_word = True
      i += 2
    elif c == "'":
      end = text.index("'", i + 1)
      quoted = text[i + 1:end]
      for m in re.finditer(r'\$\{?[A-Za-z_]\w*\}?', quoted):
        problems.append(f'line {line + quoted.count(chr(10), 0, m.start())}:'
                        f' {m.group(0)} inside single quotes reaches the '
                        'program unexpanded; use double quotes')
      word.append(quoted)
      line += quoted.count('\n')
      in_word, i = True, end + 1
    elif c == '"':
      i += 1
      while text[i] != '"':
        if text[i] == '\\' and text[i + 1] in '$`"\\\n':
          if text[i + 1] != '\n':
            word.append(text[i + 1])
          i += 2
        elif text[i] == '$':
          value, i = expand(i)
          word.append(value)
        else:
          line += text[i] == '\n'
          word.append(text[i])
          i += 1
      in_word, i = True, i + 1
    elif c == '$':
      value, i = expand(i)
      word.append(value)
      in_word = True
    elif c == '#' and not in_word:
      while i < n and text[i] != '\n':
        i += 1
    elif c in ' \t':
      end_word()
      i += 1
    elif c == '\n' or c in ';|&':
      end_command()
      if c == '\n':
        line += 1
        start_line = line
      i += 2 if text[i:i + 2] in ('&&', '||') else 1
    else:
      word.append(c)
      in_word = True
      i += 1
  end_command()
  return commands, problems


# The checks of one command --------------------------------------------------


def _flags(words):
  """{name: [value, ...]} of `--name=value` words (value None for `--name`)."""
  out = {}
  for w in words:
    if w.startswith('--'):
      name, eq, value = w[2:].partition('=')
      out.setdefault(name, []).append(value if eq else None)
  return out


_TRAIN_FLAGS = set(re.findall(
    r"DEFINE_\w+\(\s*'(\w+)'",
    inspect.getsource(__import__('official.common.flags',
                                 fromlist=['flags']))))


def _check_train(words, where):
  """`python -m official_ext.train` flags: defined, the experiment
  registered, the mode one of train.py's, config files and overrides
  applied strictly."""
  flags = _flags(words)
  unknown = set(flags) - _TRAIN_FLAGS
  assert not unknown, f'{where}: unknown flags {sorted(unknown)}'
  positional = [w for w in words if not w.startswith('--')]
  assert not positional, f'{where}: stray words {positional}'
  for required in ('experiment', 'mode', 'model_dir'):
    assert flags.get(required, [None])[0], f'{where}: no --{required}'
  params = exp_factory.get_exp_config(flags['experiment'][0])
  assert flags['mode'][0] in ('train', 'eval', 'train_and_eval',
                              'continuous_eval'), where
  for config_file in flags.get('config_file', []):
    if config_file.startswith('/data/'):
      continue  # A file the user's conversion writes (e.g. readout.yaml).
    path = os.path.join(REPO, config_file)
    assert os.path.isfile(path), f'{where}: no file {config_file}'
    params = params_dict.override_params_dict(params, path, is_strict=True)
  for override in flags.get('params_override', []):
    params = params_dict.override_params_dict(params, override,
                                              is_strict=True)


class _Parsed(Exception):
  """Raised by the patched `ArgumentParser.parse_args` once parsing
  succeeded: the script's work never starts."""


def _check_argparse_script(script, args, where):
  """`python scripts/X.py ARGS` of a script without absl flags: parsed by
  its own parser (its `main(argv)`), stopped right after."""
  module = _load_script(os.path.basename(script))
  parse = argparse.ArgumentParser.parse_args

  def parse_args(self, argv=None, namespace=None):
    parse(self, argv, namespace)
    raise _Parsed()

  stderr = io.StringIO()
  with mock.patch.object(argparse.ArgumentParser, 'parse_args', parse_args):
    try:
      with contextlib.redirect_stderr(stderr):
        module.main(list(args))
    except _Parsed:
      return
    except SystemExit:
      pytest.fail(f'{where}: {script} refuses its arguments: '
                  f'{stderr.getvalue()}')
  pytest.fail(f'{where}: {script} did not parse its arguments with argparse')


def _check_shell_script(script, args, where):
  source = _read(script)
  if script.endswith('run_multiworker_local.sh'):
    # N EXPERIMENT MODEL_DIR [train.py ARGS...]
    assert len(args) >= 3 and args[0].isdigit(), where
    _check_train(['--experiment=' + args[1], '--model_dir=' + args[2],
                  *args[3:]], where)
    return
  cases = set(re.findall(r'^\s*(--\w+)(?:=\*)?\)', source, re.M))
  assert cases, f'{where}: {script} has no `--flag)` cases to check'
  for w in args:
    flag = w.partition('=')[0]
    assert flag in cases, f'{where}: {script} has no flag {flag}'


def _read(path):
  with open(os.path.join(REPO, path), encoding='utf-8') as f:
    return f.read()


_EXTRAS = set(re.findall(r'^\s*"(\w+)":', _read('setup.py'), re.M))
# Modules whose command takes one positional argument from a fixed set.
_POSITIONAL = {
    'official_ext.assemblenet.beam_pipelines': {'convert',
                                                'extract_features'},
    'official_ext.benchmark': set(harness.FAMILIES) | {'report'},
}


def check_command(command: Command, where: str) -> None:
  """AssertionError (or the parser's error) naming `where` unless
  `command` holds (module docstring)."""
  words = command.words
  if 'TF_CONFIG' in command.env:
    json.loads(command.env['TF_CONFIG'])
  if words[:2] == ['python', '-m'] and words[2] == 'pytest' or (
      words[0] == 'pytest'):
    for arg in words[3 if words[0] == 'python' else 1:]:
      assert os.path.exists(os.path.join(REPO, arg.split('::')[0])), (
          f'{where}: no {arg}')
  elif words[:2] == ['python', '-m'] and words[2] == 'official_ext.train':
    _check_train(words[3:], where)
  elif words[:2] == ['python', '-m']:
    assert importlib.util.find_spec(words[2]) is not None, (
        f'{where}: no module {words[2]}')
    module = __import__(words[2], fromlist=['main'])
    assert hasattr(module, 'define_flags'), (
        f'{where}: {words[2]} defines no flags this test can parse')
    # Parsed as the command line is (`--name value` too): unknown flags,
    # bad values and missing required flags raise.
    positional = cli._parse(module, words[3:])[1][1:]  # pylint: disable=protected-access
    allowed = _POSITIONAL.get(words[2])
    if allowed is None:
      assert not positional, f'{where}: stray words {positional}'
    else:
      assert positional and positional[0] in allowed, (
          f'{where}: {positional} not one of {sorted(allowed)}')
  elif words[0] == 'python' and words[1].startswith('scripts/'):
    assert os.path.isfile(os.path.join(REPO, words[1])), (
        f'{where}: no {words[1]}')
    module = _load_script(os.path.basename(words[1]))
    if hasattr(module, 'define_flags'):  # absl flags, as the modules'.
      positional = cli._parse(module, words[2:])[1][1:]  # pylint: disable=protected-access
      assert not positional, f'{where}: stray words {positional}'
    else:
      _check_argparse_script(words[1], words[2:], where)
  elif words[0].startswith('scripts/'):
    assert os.access(os.path.join(REPO, words[0]), os.X_OK), (
        f'{where}: {words[0]} is not an executable file')
    _check_shell_script(words[0], words[1:], where)
  elif words[:2] == ['pip', 'install']:
    for w in words[2:]:
      m = re.match(r'^\.\[(\w+)\]$', w)
      if m:
        assert m.group(1) in _EXTRAS, (
            f'{where}: setup.py has no extra {m.group(1)!r}')
  elif words[0] in ('saved_model_cli', 'git'):
    pass
  else:
    raise AssertionError(f'{where}: a command this test cannot check: '
                         f'{" ".join(words)}')


# The tests ------------------------------------------------------------------


@pytest.mark.parametrize('block', BLOCKS, ids=[b.where for b in BLOCKS])
def test_documented_command_block_holds(block):
  commands, problems = shell_commands(block.text)
  assert not problems, f'{block.where}: {problems}'
  assert commands, f'{block.where}: no command'
  for command in commands:
    check_command(command, f'{block.path}:{block.line + command.line}')


def test_every_page_with_commands_is_read():
  assert {'README.md', 'docs/assemblenet.md', 'docs/distributed.md',
          'docs/readout.md', 'docs/yt8m.md', 'docs/benchmarks.md'} <= {
              b.path for b in BLOCKS}


def test_the_shell_reading():
  commands, problems = shell_commands(
      'K=task.a  # a comment\n'
      'python -m m --x="$K.b=\'\',c" \\\n  --y=\'$K\' --z=$BUCKET/${K}\n'
      'A=1 b "two words" && c; d | e\n')
  assert [c.words for c in commands] == [
      ['python', '-m', 'm', "--x=task.a.b='',c", '--y=$K',
       '--z=bucket/task.a'], ['b', 'two words'], ['c'], ['d'], ['e']]
  assert commands[1].env == {'A': '1'}
  assert [c.line for c in commands] == [2, 4, 4, 4, 4]
  assert problems == ['line 3: $K inside single quotes reaches the program '
                      'unexpanded; use double quotes']


@pytest.mark.parametrize('text, message', [
    ("python -m official_ext.train --experiment=yt8m --mode=train "
     "--model_dir=gs://$B/m --params_override='a=gs://$B/x'",
     r'\$B inside single quotes'),
    ('python -m official_ext.train --experiment=yt8m_demo --mode=train '
     '--model_dir=/tmp/m --params_override=task.nope=1', "'nope'"),
    ('python -m official_ext.train --experiment=yt8m_demo --mode=train '
     '--model_dir=/tmp/m --bogus=1', "unknown flags \\['bogus'\\]"),
    ('python -m official_ext.train --experiment=nope --mode=train '
     '--model_dir=/tmp/m', 'nope'),
    ('python -m official_ext.nope --x=1', 'no module official_ext.nope'),
    ('python -m official_ext.benchmark yt8m --bogus', 'bogus'),
    ('python -m official_ext.benchmark nope', 'not one of'),
    ('python scripts/nwb_to_readout.py --nwb=a.nwb --output_dir=/tmp/o '
     '--bogus=1', 'bogus'),
    ('python scripts/nwb_to_readout.py --nwb=a.nwb', 'output_dir'),
    ('python scripts/nope.py', 'no scripts/nope.py'),
    ('python scripts/assemblenet_videos_to_tfrecord.py --video_dir=/v '
     '--output=/o --bogus=1', 'bogus'),
    ('python scripts/assemblenet_videos_to_tfrecord.py --video_dir=/v',
     'output'),
    ('scripts/launch_cloud_tpu.sh --tpu_name=t --bogus=1',
     'has no flag --bogus'),
    ('scripts/run_multiworker_local.sh 2 nope /tmp/m --mode=train', 'nope'),
    ('pip install -e ".[nope]"', "no extra 'nope'"),
    ('curl http://x', 'cannot check'),
])
def test_a_command_that_does_not_hold_is_named(text, message):
  """The checks can fail: each of these is a documented command gone
  wrong."""
  block = run_doc_commands.Block('docs/x.md', 10, text)
  with pytest.raises(BaseException, match=message) as e:
    test_documented_command_block_holds(block)
  assert e.type not in (KeyboardInterrupt, SystemExit)
