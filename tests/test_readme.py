"""README.md and docs/ hold true: a short guide whose links resolve and
whose figures live on the generated benchmark page only (its commands:
tests/test_doc_commands.py); the library's docstrings and comments and the
YAMLs' comments hold neither history nor measured figures.

Each test checks one kind of statement that went wrong before: a README
that grew into a lab notebook, history (dates, commits, issue numbers, the
state of a machine) in user prose or the library's, a measured figure
copied into prose where it drifts from its source, a link that no longer
matches the code, and a statement about Model Garden's own driver.
"""
import ast
import functools
import glob
import inspect
import io
import os
import re
import tokenize

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
    ('YouTube-8M', 'yt8m'), ('AssembleNet', 'assemblenet'),
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


# The library's own prose: docstrings and comments of official_ext/**/*.py
# and the comments of configs/**/*.yaml. It says what a thing is for and its
# contract; history and measured figures live in git, docs/ and the
# generated benchmark page.
_DATE = re.compile(
    r'\b(?:19|20)\d\d-[01]\d(?:-[0-3]\d)?\b|'
    r'\b(?:Jan(?:uary)?|Feb(?:ruary)?|Mar(?:ch)?|Apr(?:il)?|May|June?|July?|'
    r'Aug(?:ust)?|Sep(?:t(?:ember)?)?|Oct(?:ober)?|Nov(?:ember)?|'
    r'Dec(?:ember)?)\.? (?:[0-3]?\d,? )?(?:19|20)\d\d\b|'
    r'\b(?:on|last|this|next|since) '
    r'(?:Mon|Tues|Wednes|Thurs|Fri|Satur|Sun)day\b|'
    r'\b(?:this|last) (?:morning|afternoon|evening|night|week|month)\b|'
    r'\b(?:yesterday|tonight)\b', re.I)
_COMMIT = re.compile(
    r'(?<![\w/.-])(?=[0-9a-f]*\d)(?=[0-9a-f]*[a-f])[0-9a-f]{7,40}(?![\w/.-])')
_ISSUE = re.compile(
    r'\b(?:issue|PR|pull request)s? #?\d+\b|(?<![\w&#])#\d+\b|'
    r'\bin the issue\b', re.I)

# A measured figure: a number with a unit of time, memory or speed where the
# words around it make it a measurement (a decimal, "about", a comparison,
# "took"), not a size or constant the code defines ("every 2 s", "1 MiB
# threshold"), a version (2.20), a tolerance (1e-5) or a shape (32x224).
_N = r'(?<![\w.,/^-])(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d+)?'
_DEC = r'(?<![\w.,/^-])\d+\.\d+'
_RANGE = _N + r'(?:\s*[-\u2013]\s*\d+(?:\.\d+)?)?'
_ABOUT = r'(?:~\s*|\u2248\s*|\b(?:about|around|roughly|nearly|almost) )'
_TIME = (r'\s*(?:s|secs?|seconds?|ms|\u00b5s|us|ns|min|mins|minutes?|h|hrs?|'
         r'hours?)\b')
_MEMORY = r'\s*(?:[KMGT]i?B|bytes)\b'
_UNIT = f'(?:{_TIME}|{_MEMORY})'
_VERSUS = r'\s+(?:against|vs\.?|versus|compared with|->|\u2192)\s+'
_MEASURED_BY = (r'\b(?:took|takes|taking|spent|spends|costs?|costing|saves?|'
                r'saved|ran in|runs in|measured|peaks? at|by) ')
_RATE = (r'\s*(?:[KMGT]i?B|[GT]?FLOP|examples|clips|steps|rows|videos|frames|'
         r'records|samples|it|images|tokens|trials|batches)/s(?:ec)?\b')
# What a measured ratio says; an integer ratio must speak of speed (a count
# of classes makes a loss "3,862x larger": arithmetic, not a measurement).
_SPEED = (r'(?:faster|slower|quicker|longer|shorter|as (?:fast|slow|long)|'
          r'speed-?ups?)\b')
_FASTER = r'(?:' + _SPEED + r'|(?:less|more|fewer|lower|higher|cheaper)\b)'
_SHARE_OF = (r'\s+of\s+(?:(?:the|a|an|its|each|one)\s+)?(?:[\w\'-]+\s+){0,3}?'
             r'(?:time|step|steps|run|runtime|peak|memory|wall|CPU|suite)\b')
_FIGURE = re.compile('|'.join([
    _DEC + _UNIT, _ABOUT + _N + _UNIT,
    _N + f'(?:{_UNIT})?' + _VERSUS + _N + _UNIT, _N + _UNIT + _VERSUS + _N,
    _MEASURED_BY + f'(?:{_ABOUT})?' + _N + _UNIT,
    _N + _RATE,
    # 1.4x, 15x faster, 3 times slower; never a shape (2 x 16) or a product
    # (0.1 x batch).
    _DEC + r'\s*[x\u00d7](?=\s*(?:[;:,.)\]]|\Z|' + _FASTER + '))',
    _N + r'\s*[x\u00d7](?=\s*(?:[;:,.)\]]|\Z|' + _SPEED + '))',
    _ABOUT + _N + r'\s*[x\u00d7](?!\s*[\w(])',
    _N + r'\s+times\s+' + _SPEED,
    _DEC + r'\s*%', _RANGE + r'\s*%\s*' + _FASTER, _RANGE + r'\s*%' + _SHARE_OF,
    _MEASURED_BY + f'(?:{_ABOUT})?' + _RANGE + r'\s*%',
]), re.I | re.M)


@pytest.mark.parametrize('text,found', [
    ('a step took 12.3 s', True), ('peak RSS 5.8 GB', True),
    ('the step 1.4x;', True), ('15\u00d7 faster', True),
    ('about 15 times slower', True), ('37 % faster', True),
    ('took 37 %', True), ('37 % of the step time', True),
    ('3.0 vs 8.9 ms', True), ('697 s against 626 s', True),
    ('~16 GB', True), ('about 10 MB/s', True), ('120 examples/s', True),
    ('TF 2.20', False), ('tf-models-official 2.20.0', False),
    ('rtol=1e-5 s', False), ('32x224 frames', False),
    ('2 x 16 x 112^2 clips', False), ('a 3x3x3 conv', False),
    ('scores of every 2 s window', False), ('a 1 MiB mmap threshold', False),
    ('0.1 x batch / 64', False), ('3,862x larger on YouTube-8M', False),
    ('cosine decay to 5%', False), ('~15% of trials', False),
    ('2 bytes a class', False), ('30 s by default', False),
])
def test_figure_pattern(text, found):
  """Measurements match; versions, tolerances, shapes, formulas and the
  constants a contract names do not."""
  assert bool(_FIGURE.search(text)) == found, _FIGURE.search(text)


@pytest.mark.parametrize('text,found', [
    ('measured 2026-12-05', True), ('as run on Tuesday', True),
    ('this evening', True), ('see issue 42', True), ('fixed in #42', True),
    ('since commit 32208df', True), ('figures quoted in the issue', True),
    ('bfloat16 and float16', False), ('a sha256 of the file', False),
    ('0x7f3a9c1d', False), ('an issue of scale', False),
    ('step 42 of 2026 steps', False),
])
def test_history_patterns(text, found):
  hit = [m for p in (_DATE, _HISTORY, _COMMIT, _ISSUE) for m in [p.search(text)]
         if m]
  assert bool(hit) == found, hit


def _python_prose(path):
  """(line, text) of each comment and docstring of a Python file."""
  with open(path, encoding='utf-8') as f:
    source = f.read()
  found = [(t.start[0], t.string) for t in tokenize.generate_tokens(
      io.StringIO(source).readline) if t.type == tokenize.COMMENT]
  for node in ast.walk(ast.parse(source)):
    if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef,
                         ast.AsyncFunctionDef)) and node.body:
      first = node.body[0]
      if (isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant)
          and isinstance(first.value.value, str)):
        found.append((first.lineno, first.value.value))
  return found


def _yaml_prose(path):
  """(line, text) of each comment of a YAML file."""
  with open(path, encoding='utf-8') as f:
    return [(i, m.group(1)) for i, line in enumerate(f, 1)
            for m in [re.search(r'(?:^|\s)(#.*)$', line)] if m]


def _library_prose_files():
  return sorted(os.path.relpath(p, REPO) for pattern in (
      os.path.join('official_ext', '**', '*.py'),
      os.path.join('configs', '**', '*.yaml'))
                for p in glob.glob(os.path.join(REPO, pattern), recursive=True))


@functools.lru_cache(maxsize=None)
def _library_prose(path):
  """(line, text) of each docstring and comment of `path` (read once)."""
  full = os.path.join(REPO, path)
  return _yaml_prose(full) if path.endswith('.yaml') else _python_prose(full)


def library_prose_hits(path, pattern):
  """['path:line: match', ...] of `pattern` in the prose of `path`."""
  prose = _library_prose(path)
  return [f'{path}:{line + text[:m.start()].count(chr(10))}: {m.group(0)!r}'
          for line, text in prose for m in pattern.finditer(text)]


@pytest.mark.parametrize('path', _library_prose_files())
def test_library_prose_holds_no_history(path):
  """No dates, times of day, commits or issue numbers in a docstring or
  comment: git holds when and why."""
  found = [hit for pattern in (_DATE, _HISTORY, _COMMIT, _ISSUE)
           for hit in library_prose_hits(path, pattern)]
  assert not found, found


@pytest.mark.parametrize('path', _library_prose_files())
def test_library_prose_holds_no_measured_figures(path):
  """No measured time, memory, speed-up or share in a docstring or comment:
  they drift from the code; the benchmark JSON and docs/benchmarks.md hold
  them."""
  found = library_prose_hits(path, _FIGURE)
  assert not found, found


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
