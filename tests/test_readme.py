"""README.md agrees with itself, with the code and with Model Garden.

Each test checks one kind of statement that drifted before: a figure stated
in two places with two values, a claim the same page lists as not yet shown,
a method ("side by side") that one section does not follow, and a statement
about Model Garden's own driver.
"""
import inspect
import os
import re

from official.vision import train as vision_train

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _read(*path):
  with open(os.path.join(REPO, *path)) as f:
    return f.read()


README = _read('README.md')
_CLIP = '8 × 32 × 224²'


def _paragraphs(text):
  return [p for p in re.split(r'\n\s*\n|\n(?=[-|] )', text) if p.strip()]


def test_published_clip_memory_is_one_host_ram_figure_everywhere():
  """Every statement of the 8 x 32 x 224^2 step's peak memory leads with the
  same figure (or range), and says it is host RAM (measured on CPU), not GPU
  memory."""
  statements = [p for p in _paragraphs(README)
                if _CLIP in p and re.search(r'\d GB', p)]
  assert len(statements) >= 3
  figures = set()
  for p in statements:
    if 'Not yet shown' in p:
      continue  # States the bar that is not met, and its worst run.
    found = re.findall(r'(\d+\.\d(?:–\d+\.\d)?) GB', p)
    assert found, f'no peak-memory figure in: {p[:200]}'
    figures.add(found[0])
    assert 'host RAM' in p, f'not said to be host RAM: {p[:200]}'
  assert len(figures) == 1, figures


def test_status_table_claims_nothing_listed_as_not_yet_shown():
  status = {m.group(1): m.group(0) for m in re.finditer(
      r'^\| [^|]*\(`official_ext/(\w+)`\) \|.*$', README, re.MULTILINE)}
  assert set(status) == {'yt8m', 'assemblenet', 'readout'}
  sections = re.split(r'^## ', README, flags=re.MULTILINE)
  for section in sections:
    match = re.search(r'Not yet shown:(.*?)(?:\n\n|\n- |\Z)', section, re.S)
    if not match:
      continue
    family = re.search(r'`official_ext/(\w+)[/`]', section)
    assert family, section[:80]
    name = family.group(1)
    not_shown = match.group(1)
    for claim in re.findall(r'under \d+ GB|\d+(?:\.\d+)?×', not_shown):
      assert claim not in status[name], (
          f'the status of {name} claims "{claim}", listed as not yet shown')


def test_side_by_side_is_claimed_only_for_what_is_measured_so():
  benchmarks = README.split('## Benchmarks', 1)[1].split('\n## ', 1)[0]
  if 'quoted' in benchmarks:
    intro = benchmarks.split('\n\n', 2)[1]
    assert not re.search(r'every speed is measured', intro, re.I), intro


def test_model_garden_driver_statements_hold():
  """Model Garden's public official/vision/train.py never creates a
  PreemptionWatcher; nothing here may say we do it "as it does"."""
  source = inspect.getsource(vision_train)
  creates_watcher = re.search(r'preemption_watcher\s*=\s*tf\.distribute',
                              source)
  sources = [README, _read('official_ext', 'train.py'),
             _read('official_ext', 'core', 'multiworker.py')]
  for text in sources:
    says_same = re.search(r'as `?official/vision/train\.py`? does', text)
    assert creates_watcher or not says_same, says_same.group(0)


def test_assemblenet_demo_time_agrees_with_the_readme():
  minutes = r'(\d+) min (\d+) s'
  readme = re.search(r'AssembleNet\+\+lite demo \(400 steps\).*?' + minutes,
                     README, re.S)
  config = re.search(r'train_steps = 400 .*?' + minutes,
                     _read('official_ext', 'assemblenet', 'configs.py'))
  assert readme and config
  assert readme.groups() == config.groups()
