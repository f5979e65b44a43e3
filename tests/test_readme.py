"""README.md and docs/ hold true: a short guide whose commands run, links
resolve, and figures live on the generated benchmark page only.

Each test checks one kind of statement that went wrong before: a README
that grew into a lab notebook, history (dates, commits, the state of a
machine) in user prose, a measured figure copied into prose where it drifts
from its source, a command or link that no longer matches the code, and a
statement about Model Garden's own driver.
"""
import glob
import inspect
import os
import re
import shlex

import pytest

from official.core import exp_factory
from official.modeling.hyperparams import params_dict
from official.vision import train as vision_train
from official_ext import registry_imports  # pylint: disable=unused-import
from official_ext.benchmarks import harness
from tests import cli

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TEST_COMMAND = 'pip install -e ".[test]" && pytest tests'
DOCS = ('yt8m', 'assemblenet', 'readout', 'distributed', 'bad_input',
        'benchmarks', 'architecture')
# The page generated from the benchmark JSON may hold dates and machines.
GENERATED = os.path.join('docs', 'benchmarks.md')


def _read(*path):
  with open(os.path.join(REPO, *path), encoding='utf-8') as f:
    return f.read()


README = _read('README.md')


def _pages():
  """README.md and every docs/*.md, as paths relative to the repository."""
  return ['README.md'] + sorted(
      os.path.relpath(p, REPO)
      for p in glob.glob(os.path.join(REPO, 'docs', '*.md')))


def _prose_files():
  """Hand-written pages and the shipped YAMLs (their comments are prose)."""
  yamls = sorted(os.path.relpath(p, REPO) for p in
                 glob.glob(os.path.join(REPO, 'configs', '*', '*.yaml')))
  return [p for p in _pages() if p != GENERATED] + yamls


def test_readme_starts_with_the_two_commands_and_ci_runs_the_second():
  first_block = re.search(r'```bash\n(.*?)```', README, re.S).group(1)
  lines = first_block.strip().splitlines()
  assert lines == [
      'pip install -e . && python -m official_ext.train --experiment=yt8m_demo '
      '--mode=train_and_eval --model_dir=/tmp/yt8m_demo',
      TEST_COMMAND]
  assert README.index('```bash') < 20
  ci = _read('.ci', 'run')
  assert TEST_COMMAND in ci.splitlines()


def test_readme_is_a_short_guide():
  assert len(README.splitlines()) <= 250


def test_every_docs_page_exists_and_the_readme_links_it():
  for name in DOCS:
    assert os.path.exists(os.path.join(REPO, 'docs', f'{name}.md')), name
    assert f'](docs/{name}.md' in README, f'README does not link docs/{name}.md'


@pytest.mark.parametrize('title,page', [
    ('YouTube-8M', 'yt8m'), ('AssembleNet++lite', 'assemblenet'),
    ('Multitask readout', 'readout')])
def test_each_family_section_shows_command_results_and_link_first(title,
                                                                  page):
  """Within its first screen (40 lines): the command, a results table and
  the link to the family's page."""
  section = README.split(f'\n## {title}\n', 1)[1].split('\n## ', 1)[0]
  screen = '\n'.join(section.splitlines()[:40])
  assert re.search(r'```bash\npython -m official_ext\.train --experiment=\w+',
                   screen), title
  assert re.search(r'^\|.*\|\n\|[-| ]+\|\n\|', screen, re.M), title
  assert f'](docs/{page}.md)' in screen, title


_HISTORY = re.compile(
    r'\b20\d\d-\d\d-\d\d\b|evening|afternoon|load average|\bissue \d+|'
    r'tried on the way|before this round|\bat (?=[0-9a-f]*\d)'
    r'(?=[0-9a-f]*[a-f])[0-9a-f]{7,40}\b|not (re-)?measured again',
    re.I)


@pytest.mark.parametrize('path', _prose_files())
def test_prose_holds_no_history(path):
  """Dates, commits, times of day, machine load and issue numbers belong to
  git and the benchmark JSON, not to user prose."""
  found = [m.group(0) for m in _HISTORY.finditer(_read(path))]
  assert not found, f'{path}: {found}'


# A measured speed or memory figure in prose: it belongs on the generated
# page (docs/benchmarks.md), which the prose links instead.
_MEASURED = re.compile(
    r'\d[\d,.]*\s*(?:examples/s(?:ec)?|GFLOP/s|clips/s|rows/s|'
    r'GB of host RAM|GiB of host RAM)\b|\d+(?:\.\d+)?\s*% of the (?:fp32 )?'
    r'matmul peak')


@pytest.mark.parametrize('path', _prose_files())
def test_measured_figures_are_not_copied_into_prose(path):
  found = [m.group(0) for m in _MEASURED.finditer(_read(path))]
  assert not found, (f'{path}: {found}: link docs/benchmarks.md instead of '
                     'copying its figures')


def _slug(heading: str) -> str:
  """GitHub's anchor for a markdown heading."""
  text = re.sub(r'`', '', heading.strip().lower())
  return re.sub(r'[^\w\- ]', '', text).replace(' ', '-')


def _anchors(path: str):
  text = re.sub(r'```.*?```', '', _read(path), flags=re.S)
  anchors, seen = set(), {}
  for heading in re.findall(r'^#{1,6} (.+)$', text, re.M):
    slug = _slug(heading)
    n = seen.get(slug, 0)
    seen[slug] = n + 1
    anchors.add(slug if n == 0 else f'{slug}-{n}')
  return anchors


@pytest.mark.parametrize('path', _pages())
def test_links_resolve(path):
  text = re.sub(r'```.*?```', '', _read(path), flags=re.S)
  base = os.path.dirname(os.path.join(REPO, path))
  for target in re.findall(r'\]\(([^)\s]+)\)', text):
    if re.match(r'[a-z]+://', target):
      continue
    file_part, _, anchor = target.partition('#')
    resolved = (os.path.normpath(os.path.join(base, file_part)) if file_part
                else os.path.join(REPO, path))
    assert os.path.exists(resolved), f'{path}: {target} does not exist'
    if anchor:
      assert resolved.endswith('.md'), f'{path}: {target}'
      assert anchor in _anchors(os.path.relpath(resolved, REPO)), (
          f'{path}: {target}: no heading with that anchor')


def _commands(path: str):
  """The shell commands of the ```bash blocks of `path`, each a list of
  words: continuation lines joined, `&&` chains split, comments dropped,
  NAME=value assignments applied to the later commands of the block."""
  text = _read(path)
  for block in re.findall(r'```bash\n(.*?)```', text, re.S):
    variables = {}
    for line in block.replace('\\\n', ' ').splitlines():
      for part in line.split(' && '):
        words = shlex.split(part, comments=True)
        while words and re.match(r'^[A-Z_]+=', words[0]):
          name, _, value = words.pop(0).partition('=')
          variables[name] = value
        if words:
          yield [re.sub(r'\$([A-Z]\w*)',
                        lambda m: variables.get(m.group(1), m.group(0)), w)
                 for w in words]


def _flags(words):
  """{name: value} of `--name=value` words (value None for `--name`)."""
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


def _check_train(words, path):
  flags = _flags(words)
  unknown = set(flags) - _TRAIN_FLAGS
  assert not unknown, f'{path}: {" ".join(words)}: unknown flags {unknown}'
  experiment = flags['experiment'][0]
  params = exp_factory.get_exp_config(experiment)
  assert flags['mode'][0] in ('train', 'eval', 'train_and_eval',
                              'continuous_eval')
  assert flags['model_dir'][0]
  for config_file in flags.get('config_file', []):
    if config_file.startswith('/data/'):
      continue  # A file the user's conversion writes (e.g. readout.yaml).
    params = params_dict.override_params_dict(
        params, os.path.join(REPO, config_file), is_strict=True)
  for override in flags.get('params_override', []):
    params = params_dict.override_params_dict(params, override,
                                              is_strict=True)


_MODULES = {
    'official_ext.export_saved_model', 'official_ext.export_tflite',
    'official_ext.benchmark', 'official_ext.yt8m.predict',
    'official_ext.yt8m.demo_data', 'official_ext.yt8m.segment_eval',
    'official_ext.yt8m.ensemble',
    'official_ext.assemblenet.derive_structure',
    'official_ext.assemblenet.predict',
    'official_ext.assemblenet.extract_features',
    'official_ext.assemblenet.videos'}
# Modules whose command takes one positional argument from a fixed set.
_POSITIONAL = {
    'official_ext.assemblenet.beam_pipelines': (
        'convert', 'extract_features')}


def _check_command(words, path):
  if words[:2] == ['python', '-m'] and words[2] == 'official_ext.train':
    _check_train(words[3:], path)
  elif words[:2] == ['python', '-m'] and words[2] in _POSITIONAL:
    module = __import__(words[2], fromlist=['main'])
    positional = cli._parse(module, words[3:])[1][1:]  # pylint: disable=protected-access
    assert len(positional) == 1 and positional[0] in _POSITIONAL[words[2]], (
        words)
  elif words[:2] == ['python', '-m'] and words[2] in _MODULES:
    module = __import__(words[2], fromlist=['main'])
    # Parsed as the command line is (`--name value` too): unknown flags and
    # bad values raise.
    positional = cli._parse(module, words[3:])[1][1:]  # pylint: disable=protected-access
    if words[2] == 'official_ext.benchmark':
      assert positional and positional[0] in (
          set(harness.FAMILIES) | {'report'}), words
    else:
      assert not positional, words
  elif words[:2] == ['python', '-m'] and words[2] == 'pytest':
    for arg in words[3:]:
      assert os.path.exists(os.path.join(REPO, arg.split('::')[0])), arg
  elif words[0].startswith('scripts/') or (
      words[0] == 'python' and words[1].startswith('scripts/')):
    script = words[0] if words[0].startswith('scripts/') else words[1]
    source = _read(script)
    for name in _flags(words):
      assert f'--{name}' in source or f"'{name}'" in source, (
          f'{path}: {script} has no flag --{name}')
  elif words[0] in ('pip', 'pytest', 'saved_model_cli', 'git'):
    pass
  else:
    raise AssertionError(f'{path}: a command this test cannot check: '
                         f'{" ".join(words)}')


@pytest.mark.parametrize('path', _pages())
def test_commands_parse(path):
  """Every command of a ```bash block: experiments exist, flags exist,
  config files and overrides apply strictly to the experiment."""
  for words in _commands(path):
    _check_command(words, path)


def test_model_garden_driver_statements_hold():
  """Model Garden's public official/vision/train.py never creates a
  PreemptionWatcher; nothing here may say we do it "as it does"."""
  source = inspect.getsource(vision_train)
  creates_watcher = re.search(r'preemption_watcher\s*=\s*tf\.distribute',
                              source)
  sources = [_read(p) for p in _pages()] + [
      _read(os.path.relpath(p, REPO)) for p in
      glob.glob(os.path.join(REPO, 'official_ext', '**', '*.py'),
                recursive=True)]
  for text in sources:
    says_same = re.search(r'as `?official/vision/train\.py`? does', text)
    assert creates_watcher or not says_same, says_same.group(0)
