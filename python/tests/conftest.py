"""Fixtures of the Python binding tests (run by tests/python-check.sh in ctest).

Models are made by this build's CLI (`pagekv mkmodel`, PKV_CLI), never downloaded."""
import os
import subprocess
import sys

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
SOURCE = os.path.normpath(os.path.join(HERE, "..", ".."))


def _cli():
    cli = os.environ.get("PKV_CLI") or os.path.join(SOURCE, "build", "bin", "pagekv")
    if not os.path.exists(cli):
        pytest.skip("no pagekv CLI (set PKV_CLI)")
    return cli


@pytest.fixture(scope="session")
def cli():
    return _cli()


@pytest.fixture(scope="session")
def source_dir():
    return SOURCE


@pytest.fixture(scope="session")
def tmp_models(tmp_path_factory):
    return tmp_path_factory.mktemp("models")


def mkmodel(cli, path, *args):
    if not os.path.exists(path):
        subprocess.run([cli, "mkmodel", *args, "-o", str(path)], check=True, capture_output=True)
    return str(path)


@pytest.fixture(scope="session")
def model_path(cli, tmp_models):
    """A 2-layer llama f16 model with a ChatML template (mkmodel's defaults)."""
    return mkmodel(cli, tmp_models / "llama.gguf")


@pytest.fixture(scope="session")
def shift_model_path(cli, tmp_models):
    """One layer: context shift is exact only where K/V do not depend on removed tokens."""
    return mkmodel(cli, tmp_models / "one-layer.gguf", "--layers", "1", "--type", "f32")


@pytest.fixture(scope="session")
def model(model_path):
    import pagekv
    m = pagekv.Model(model_path)
    yield m
    m.close()


def run_py(args, **kw):
    """Run a Python script with this interpreter and the package's PYTHONPATH."""
    env = dict(os.environ)
    env.setdefault("PYTHONPATH", os.pathsep.join(p for p in sys.path if p))
    return subprocess.run([sys.executable, *args], capture_output=True, text=True, env=env, **kw)
