"""scripts/test.sh (the README's test command) on a stand-in project: a build folder configured with
MOEFOLD_TESTS=OFF (as scripts/quickstart.sh once did) must still run the C++ tests, and a run that
finds no tests must fail instead of reporting success. The stand-in CMake project has no compiler
languages and at most one trivial test, so each case takes about a second; setup.sh is replaced by
a no-op and the model conversion is skipped (the real ones ran before these tests). And
scripts/cuda_arch.sh: Hopper code where nvidia-smi finds a GPU, PTX only where it does not."""

import os
import shutil
import subprocess

from conftest import ROOT

PROJECT = """cmake_minimum_required(VERSION 3.20)
project(stand_in NONE)
option(MOEFOLD_TESTS "Build tests" ON)
if(MOEFOLD_TESTS)
  enable_testing()
  {tests}
endif()
"""


def stand_in(tmp_path, tests):
    (tmp_path / "scripts").mkdir()
    shutil.copy(ROOT / "scripts" / "test.sh", tmp_path / "scripts" / "test.sh")
    shutil.copy(ROOT / "scripts" / "cuda_arch.sh", tmp_path / "scripts" / "cuda_arch.sh")
    (tmp_path / "scripts" / "setup.sh").write_text("exit 0\n")
    (tmp_path / "CMakeLists.txt").write_text(PROJECT.format(tests=tests))
    model = tmp_path / "models" / "smollm2-135m-instruct"
    model.mkdir(parents=True)
    (model / "model.safetensors").write_bytes(b"")
    env = {k: v for k, v in os.environ.items() if k != "MOEFOLD_BUILD_DIR"}
    # The build folder as scripts/quickstart.sh used to leave it: tests configured off.
    subprocess.run(["cmake", "-S", tmp_path, "-B", tmp_path / "build", "-G", "Ninja", "-DMOEFOLD_TESTS=OFF"],
                   check=True, capture_output=True, env=env)
    return env


def run_test_sh(tmp_path, env):
    return subprocess.run(["bash", tmp_path / "scripts" / "test.sh"], capture_output=True, text=True, env=env,
                          timeout=300)


def test_turns_tests_on_in_a_build_configured_without_them(tmp_path):
    env = stand_in(tmp_path, "add_test(NAME stand_in_test COMMAND ${CMAKE_COMMAND} -E true)")
    r = run_test_sh(tmp_path, env)
    assert "MOEFOLD_TESTS:BOOL=ON" in (tmp_path / "build" / "CMakeCache.txt").read_text()
    assert "0 tests failed out of 1" in r.stdout, r.stdout + r.stderr


def test_fails_when_ctest_finds_no_tests(tmp_path):
    env = stand_in(tmp_path, "")
    r = run_test_sh(tmp_path, env)
    assert r.returncode != 0, r.stdout + r.stderr
    assert "No tests were found" in r.stdout + r.stderr


def cuda_arch(tmp_path, smi_status, override=None):
    """scripts/cuda_arch.sh with a stand-in nvidia-smi that exits with smi_status (None: no nvidia-smi)."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    smi = bin_dir / "nvidia-smi"
    if smi_status is None:
        smi.unlink(missing_ok=True)
    else:
        smi.write_text(f"#!/bin/sh\nexit {smi_status}\n")
        smi.chmod(0o755)
    env = {"PATH": f"{bin_dir}:/usr/bin:/bin"}
    if override:
        env["MOEFOLD_CUDA_ARCHITECTURES"] = override
    r = subprocess.run(["bash", ROOT / "scripts" / "cuda_arch.sh"], capture_output=True, text=True, env=env, check=True)
    return r.stdout.strip()


def test_cuda_arch_is_ptx_only_without_a_gpu(tmp_path):
    assert cuda_arch(tmp_path, 0) == "90a"                 # nvidia-smi lists a GPU: Hopper code
    assert cuda_arch(tmp_path, 9) == "90a-virtual"         # nvidia-smi finds none: PTX only
    assert cuda_arch(tmp_path, 0, "90a;100a") == "90a;100a"  # the override wins
