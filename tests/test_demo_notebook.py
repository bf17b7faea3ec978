"""The Colab demo notebook runs top to bottom, headless, on CPU with a small token budget."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

NOTEBOOK = os.path.join(os.path.dirname(os.path.dirname(__file__)), "infer", "demo.ipynb")


@pytest.mark.slow
def test_demo_notebook_executes(tmp_path):
    cells = json.load(open(NOTEBOOK))["cells"]
    code = "\n\n".join("".join(c["source"]) for c in cells if c["cell_type"] == "code")
    script = tmp_path / "demo.py"
    script.write_text("import matplotlib\nmatplotlib.use('Agg')\n" + code + "\nassert spec.tokens == plain.tokens\nprint('TAU', spec.tau)\n")
    env = dict(os.environ, EAGLE_DEMO_TOKENS="24", JAX_PLATFORMS="cpu")
    done = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=900, env=env, cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "identical to plain decoding: True" in done.stdout and "TAU" in done.stdout
