"""What the README and the tutorials write works as written: every `tsl.<name>...` they use
resolves after a bare `import tsl` (submodules are PEP 562 lazy attributes), and the README's
Python examples run on a CPU-only host."""

import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
DOCS = [ROOT / "README.md", *sorted((ROOT / "tutorials").glob("*.py"))]
# A dotted name from `tsl.` on; import statements and `python -m` name modules, which resolve
# by importing, not as attributes, so they are left out.
NAME = re.compile(r"(?<![\w./-])tsl(?:\.[A-Za-z_]\w*)+")
IMPORT = re.compile(r"^\s*(from|import)\s|python -m ")


def documented_names() -> list[str]:
    names = set()
    for path in DOCS:
        for line in path.read_text().splitlines():
            if not IMPORT.search(line):
                names.update(NAME.findall(line))
    return sorted(names)


def python_snippets() -> list[str]:
    return re.findall(r"```python\n(.*?)```", (ROOT / "README.md").read_text(), re.S)


def run(code: str, timeout: int = 240) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True,
                          text=True, timeout=timeout)


def test_every_documented_name_resolves_after_a_bare_import():
    names = documented_names()
    assert "tsl.tune.Database" in names and "tsl.relax.pipeline" in names  # the extraction
    code = ("import tsl\nmissing = []\n"
            f"for name in {names!r}:\n"
            "    obj = tsl\n"
            "    try:\n"
            "        for part in name.split('.')[1:]:\n"
            "            obj = getattr(obj, part)\n"
            "    except AttributeError as e:\n"
            "        missing.append(f'{name}: {e}')\n"
            "print('\\n'.join(missing))\n")
    r = run(code)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "", f"names the docs use that do not resolve:\n{r.stdout}"


def test_import_tsl_imports_neither_tvm_nor_the_tuner():
    r = run("import sys, tsl\nprint(sorted(m for m in ('tvm', 'xgboost', 'jax', 'torch', "
            "'tsl.tune', 'tsl.relax') if m in sys.modules))")
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "[]"


def test_an_unknown_attribute_is_still_an_attribute_error():
    import tsl

    with pytest.raises(AttributeError, match="no attribute 'tunes'"):
        tsl.tunes  # noqa: B018


@pytest.mark.parametrize("i", range(len(python_snippets())))
def test_readme_python_snippet_runs(i):
    r = run(python_snippets()[i])
    assert r.returncode == 0, f"README snippet {i} failed:\n{python_snippets()[i]}\n{r.stderr}"
