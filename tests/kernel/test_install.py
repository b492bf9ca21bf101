"""`python -m monarch_kernel install`: where the kernelspec goes and what it says."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from _kernel_helpers import ROOT
from monarch_kernel import install


def _spec(prefix, name="monarch") -> dict:
    with open(os.path.join(prefix, "share", "jupyter", "kernels", name, "kernel.json")) as f:
        return json.load(f)


@pytest.mark.timeout(60)
def test_cli_installs_into_a_prefix(tmp_path):
    env = dict(os.environ, PYTHONPATH=ROOT)
    r = subprocess.run([sys.executable, "-m", "monarch_kernel", "install", "--prefix",
                        str(tmp_path), "--name", "mk-test", "--display-name", "Monarch test",
                        "--env", "A=1=2"], capture_output=True, text=True, env=env, timeout=60)
    assert r.returncode == 0, r.stderr
    assert "Installed kernelspec mk-test (Monarch test)" in r.stdout
    spec = _spec(tmp_path, "mk-test")
    assert spec["argv"] == [sys.executable, "-m", "monarch_kernel", "-f", "{connection_file}"]
    assert spec["display_name"] == "Monarch test" and spec["language"] == "python"
    assert spec["env"] == {"A": "1=2"} and spec["interrupt_mode"] == "signal"


def test_defaults_and_sys_prefix(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(sys, "prefix", str(tmp_path))
    assert install.main(["--sys-prefix"]) == 0
    spec = _spec(tmp_path)
    assert spec["display_name"] == "Monarch (Python 3)" and "env" not in spec
    assert os.path.exists(os.path.join(tmp_path, "share", "jupyter", "kernels", "monarch",
                                       "logo-64x64.png"))
    assert install.main(["--sys-prefix"]) == 0  # re-installing replaces it
    assert "Installed kernelspec monarch" in capsys.readouterr().out


@pytest.mark.parametrize("argv", [["--user", "--sys-prefix"], ["--env", "NOEQUALS"],
                                  ["--bogus"]])
def test_bad_arguments(argv, capsys):
    with pytest.raises(SystemExit) as e:
        install.main(argv)
    assert e.value.code == 2
    assert "error:" in capsys.readouterr().err
