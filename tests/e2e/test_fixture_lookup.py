"""Test binaries read the fixtures of the checkout they run in, found at run time
(tests/fixture_util.h), not of the tree they were built in: carried to the GPU machine, or run from
a clone at another path, they used to open the build machine's path. A copy of jinja_test inside a
stand-in tree passes with that tree's fixture and fails once the fixture is removed there, although
the build tree still has it."""

import os
import pathlib
import shutil
import subprocess

import pytest

from conftest import ROOT, binary

CASES = pathlib.Path("tests") / "fixtures" / "chat_templates" / "jinja_cases.json"
FILTER = "--gtest_filter=JinjaFixtures.MatchTransformersJinjaByteForByte"


def stand_in_tree(tmp_path):
    test_bin = pathlib.Path(binary()).parent / "tests" / "jinja_test"
    if not test_bin.exists():
        pytest.skip(f"{test_bin} is not built (scripts/test.sh builds every test binary)")
    tree = tmp_path / "tree"
    (tree / "build" / "tests").mkdir(parents=True)
    shutil.copy(test_bin, tree / "build" / "tests" / "jinja_test")
    (tree / CASES).parent.mkdir(parents=True)
    shutil.copy(ROOT / "tests" / "fixture_util.h", tree / "tests" / "fixture_util.h")  # the checkout's marker
    shutil.copy(ROOT / CASES, tree / CASES)
    return tree


def run_copy(tree, cwd, **env):
    e = {k: v for k, v in os.environ.items() if k != "MOEFOLD_SOURCE_DIR"}
    e.update(env)
    return subprocess.run([tree / "build" / "tests" / "jinja_test", FILTER], cwd=cwd, env=e, capture_output=True,
                          text=True, timeout=120)


def test_binary_uses_the_tree_it_sits_in(tmp_path):
    tree = stand_in_tree(tmp_path)
    r = run_copy(tree, cwd="/")
    assert r.returncode == 0, r.stdout + r.stderr
    (tree / CASES).unlink()
    r = run_copy(tree, cwd="/")
    assert r.returncode != 0, "the copy read a fixture outside its own tree:\n" + r.stdout


def test_environment_variable_names_the_checkout(tmp_path):
    tree = stand_in_tree(tmp_path)
    other = tmp_path / "elsewhere" / "bin"
    other.mkdir(parents=True)
    shutil.move(tree / "build" / "tests" / "jinja_test", other / "jinja_test")
    binary_path = other / "jinja_test"
    e = {k: v for k, v in os.environ.items() if k != "MOEFOLD_SOURCE_DIR"}
    r = subprocess.run([binary_path, FILTER], cwd="/", env=e, capture_output=True, text=True, timeout=120)
    assert r.returncode == 2 and "MOEFOLD_SOURCE_DIR" in r.stderr, r.stdout + r.stderr  # no checkout found: says so
    r = subprocess.run([binary_path, FILTER], cwd="/", env={**e, "MOEFOLD_SOURCE_DIR": str(tree)},
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stdout + r.stderr
