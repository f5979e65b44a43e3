"""README.md and docs/ hold true: a short guide whose links resolve and
whose figures live on the generated benchmark page only (its commands:
tests/test_doc_commands.py).

Each test checks one kind of statement that went wrong before: a README
that grew into a lab notebook, history (dates, commits, the state of a
machine) in user prose, a measured figure copied into prose where it drifts
from its source, a link that no longer matches the code, and a
statement about Model Garden's own driver.
"""
import glob
import inspect
import os
import re

import pytest

from official.vision import train as vision_train

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
