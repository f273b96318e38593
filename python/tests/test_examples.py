"""The examples of python/examples run as written and pass their own checks
(each compares its result with a from-scratch replay and prints an 'ok:' line)."""
import os

import pytest

from conftest import SOURCE, run_py

EXAMPLES = os.path.join(SOURCE, "python", "examples")


@pytest.mark.parametrize("script,args", [("best_of_n.py", ["-n", "3", "--tokens", "8"]),
                                         ("tree_search.py", ["--width", "2", "--depth", "3", "--branch", "2"]),
                                         ("system_prompt_cache.py", [])])
def test_example(script, args, model_path, tmp_path):
    if script == "system_prompt_cache.py":
        f = str(tmp_path / "sys.pkv")
        r = run_py([os.path.join(EXAMPLES, script), model_path, "--file", f, "--save-only"], timeout=300)
        assert r.returncode == 0, r.stderr
        assert os.path.getsize(f) > 0
        args = ["--file", f, "--load-only"]  # a second process loads what the first saved
    r = run_py([os.path.join(EXAMPLES, script), model_path] + args, timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "\nok: " in "\n" + r.stdout, r.stdout


def test_example_builtin_model():
    r = run_py([os.path.join(EXAMPLES, "best_of_n.py"), "-n", "2", "--tokens", "4"], timeout=300)
    assert r.returncode == 0 and "ok: " in r.stdout, r.stdout + r.stderr
