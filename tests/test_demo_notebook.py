"""The Colab demo notebook runs top to bottom in one process, its install cell included, headless,
on CPU with a small token budget; only the Hub cell (tagged "network") is left out."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import sysconfig

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
NOTEBOOK = os.path.join(REPO, "infer", "demo.ipynb")
SOURCE_PARTS = ("pyproject.toml", "README.md", "eagle_jax", "infer", "kernels_pallas", "train")


def cells() -> list[dict]:
    return [c for c in json.load(open(NOTEBOOK))["cells"] if c["cell_type"] == "code"]


def python_without_eagle_jax(tmp_path) -> str:
    """A venv that sees this environment's packages (jax, flax, ...) but not its eagle-jax, whose
    editable install is a .pth hook that a path added by another .pth does not run."""
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    python = str(venv / "bin" / "python")
    site = subprocess.run([python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                          capture_output=True, text=True, check=True).stdout.strip()
    with open(os.path.join(site, "parent_environment.pth"), "w") as f:
        f.write(sysconfig.get_paths()["purelib"] + "\n")
    return python


def test_only_the_hub_cell_needs_a_network():
    tagged = [c for c in cells() if "network" in c.get("metadata", {}).get("tags", [])]
    assert len(tagged) == 1 and "HUB_MODEL" in "".join(tagged[0]["source"])
    assert all("github.com" not in "".join(c["source"]) for c in cells())  # no invented repository URL


@pytest.mark.slow
def test_demo_notebook_executes_in_one_process_install_included(tmp_path):
    """Runs in a copy of the checkout, from its infer/ folder, so that the install cell finds the
    checkout around the notebook and installs it (a regular install) before the next cells import it."""
    source = tmp_path / "eagle-jax"
    source.mkdir()
    for part in SOURCE_PARTS:
        if os.path.isdir(os.path.join(REPO, part)):
            shutil.copytree(os.path.join(REPO, part), source / part, ignore=shutil.ignore_patterns("__pycache__"))
        else:
            shutil.copy(os.path.join(REPO, part), source / part)
    python = python_without_eagle_jax(tmp_path)
    assert subprocess.run([python, "-c", "import eagle_jax"], capture_output=True, cwd=tmp_path).returncode != 0
    code = "\n\n".join("".join(c["source"]) for c in cells() if "network" not in c.get("metadata", {}).get("tags", []))
    script = tmp_path / "demo.py"
    script.write_text("import matplotlib\nmatplotlib.use('Agg')\n" + code
                      + "\nimport eagle_jax\nassert eagle_jax.__file__.startswith(sys.prefix), eagle_jax.__file__\n"
                      + "assert spec.tokens == plain.tokens\nprint('TAU', spec.tau)\n")
    env = {k: v for k, v in os.environ.items() if k not in ("EAGLE_JAX_SOURCE", "PYTHONPATH")}
    env |= dict(EAGLE_DEMO_TOKENS="24", JAX_PLATFORMS="cpu")
    done = subprocess.run([python, str(script)], capture_output=True, text=True, timeout=900, env=env, cwd=source / "infer")
    assert done.returncode == 0, done.stderr[-3000:]
    assert "identical to plain decoding: True" in done.stdout and "TAU" in done.stdout
    jax_before = subprocess.run([sys.executable, "-c", "import jax; print(jax.__file__)"], capture_output=True, text=True).stdout
    jax_after = subprocess.run([python, "-c", "import jax; print(jax.__file__)"], capture_output=True, text=True).stdout
    assert jax_before == jax_after  # the jax that was there is the jax the notebook used
