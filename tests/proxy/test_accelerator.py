"""Tests of the process's one Accelerator and the distributed timeout (geosearch/proxy/accelerator.py)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from geosearch.util.errors import ConfigError, SettingsError
from geosearch.proxy import accelerator as accelerator_mod
from geosearch.proxy.accelerator import check_precision, get_accelerator

REPO = Path(__file__).resolve().parents[2]


def test_one_device_and_precision_per_process():
    get_accelerator("cpu", "no")  # this process trains on CPU without mixed precision
    with pytest.raises(ConfigError, match="one device and precision per process"):
        get_accelerator("cpu", "bf16")


def test_distributed_timeout_comes_from_its_environment_variable(monkeypatch):
    monkeypatch.delenv(accelerator_mod.DIST_TIMEOUT_ENV, raising=False)
    # Rule: without the variable a rank waits 30 minutes in a collective.
    assert accelerator_mod._dist_timeout() == 1800.0
    monkeypatch.setenv(accelerator_mod.DIST_TIMEOUT_ENV, "90")
    assert accelerator_mod._dist_timeout() == 90.0
    # Rule: a value that is not a positive number is an error naming the variable.
    for bad in ("soon", "0", "-5"):
        monkeypatch.setenv(accelerator_mod.DIST_TIMEOUT_ENV, bad)
        with pytest.raises(ConfigError, match=r"GEOSEARCH_DIST_TIMEOUT: must be a positive number"):
            accelerator_mod._dist_timeout()


# --------------------------------------------------------------------------- precision
RUN = ["-m", "geosearch", "train", "--model", "tiny", "--model-arg", "n_layer=1",
       "--assign", "attn=stiefel,mlp=dgram", "--steps", "2", "--batch-size", "4",
       "--eval-every", "2", "--probe-every", "2", "--device", "cpu", "--quiet"]


def _cli_run(tmp_path, name: str, env_precision: str, *flags: str) -> dict:
    """``geosearch train`` in a new process (one Accelerator each) under
    ``ACCELERATE_MIXED_PRECISION``, as ``accelerate launch --mixed_precision`` sets it."""
    out = tmp_path / name
    env = {**os.environ, accelerator_mod.PRECISION_ENV: env_precision, "OMP_NUM_THREADS": "1",
           "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])}
    proc = subprocess.run([sys.executable, *RUN, *flags, "--out", str(out)], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return yaml.safe_load((out / "config.yaml").read_text())


@pytest.mark.slow
def test_accelerate_configuration_sets_the_precision_unless_the_run_does(tmp_path):
    # Rule: without --mixed-precision the launcher's bf16 is used, and recorded as used.
    config = _cli_run(tmp_path, "from_env", "bf16")
    assert config["mixed_precision"] == "bf16" and config["train"]["mixed_precision"] == "bf16"
    # Rule: an explicit value wins over Accelerate's configuration.
    config = _cli_run(tmp_path, "explicit", "bf16", "--mixed-precision", "no")
    assert config["mixed_precision"] == "no" and config["train"]["mixed_precision"] == "no"


def test_resolve_precision_reads_accelerates_variable(monkeypatch):
    monkeypatch.delenv(accelerator_mod.PRECISION_ENV, raising=False)
    assert accelerator_mod.resolve_precision(None) == "no"
    monkeypatch.setenv(accelerator_mod.PRECISION_ENV, "bf16")
    assert accelerator_mod.resolve_precision(None) == "bf16"
    assert accelerator_mod.resolve_precision("no") == "no"
    # Rule: a precision geosearch does not train in is refused, naming the variable.
    monkeypatch.setenv(accelerator_mod.PRECISION_ENV, "fp8")
    with pytest.raises(ConfigError, match=r"ACCELERATE_MIXED_PRECISION: unsupported .*'fp8'"):
        accelerator_mod.resolve_precision(None)


def test_check_precision_refuses_what_this_machine_cannot_train_in(monkeypatch):
    monkeypatch.delenv(accelerator_mod.PRECISION_ENV, raising=False)
    assert check_precision("cpu", "bf16") == "bf16" and check_precision("cpu", None) == "no"
    # Rule: fp16 needs CUDA: one line naming where the value came from and what is allowed.
    with pytest.raises(SettingsError) as e:
        check_precision("cpu", "fp16", source="s.yaml", key="proxy.mixed_precision")
    assert str(e.value) == ("s.yaml: proxy.mixed_precision: fp16 needs a CUDA device, and the device "
                            "is cpu; expected one of: no, bf16")
    # Rule: Accelerate's configuration is checked too, naming its variable.
    monkeypatch.setenv(accelerator_mod.PRECISION_ENV, "fp16")
    with pytest.raises(SettingsError, match=r"^ACCELERATE_MIXED_PRECISION: fp16 needs a CUDA device"):
        check_precision("cpu", None, source="s.yaml", key="proxy.mixed_precision")
    # Rule: bf16 on a GPU needs one that supports it (what Accelerate refuses later).
    monkeypatch.setattr(accelerator_mod.torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(accelerator_mod.torch.cuda, "is_bf16_supported", lambda *a, **k: False)
    with pytest.raises(SettingsError, match=r"key: bf16 needs a GPU that supports it.*expected one of: no, fp16"):
        check_precision("cuda", "bf16", key="key")
    assert check_precision("auto", "fp16") == "fp16"


@pytest.mark.parametrize("env, what", [("ACCELERATE_USE_FSDP", "FSDP"),
                                       ("ACCELERATE_USE_DEEPSPEED", "DeepSpeed")])
def test_fsdp_and_deepspeed_configurations_are_refused_in_one_line(monkeypatch, env, what):
    monkeypatch.setenv(env, "true")
    with pytest.raises(ConfigError) as info:
        get_accelerator("cpu", "no")
    assert str(info.value).startswith(f"{env}: {what} is not supported yet")
    assert len(str(info.value).splitlines()) == 1
    monkeypatch.setenv(env, "false")
    get_accelerator("cpu", "no")  # off again: accepted


# --------------------------------------------------------------------------- launch
# What `accelerate launch` (1.x) exports to its one process when asked for more (measured):
SIMPLE_LAUNCH = {"ACCELERATE_USE_CPU": "False", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29500"}
LAUNCHER = [sys.executable, "/venv/bin/accelerate", "launch"]


def test_a_launch_asking_for_more_processes_than_started_is_named(tmp_path):
    shortfall = accelerator_mod.launch_shortfall
    line = shortfall(1, SIMPLE_LAUNCH, [*LAUNCHER, "--num_processes", "2", "-m", "geosearch", "train",
                                        "--num_processes=9"])  # the script's own flags are its own
    # Rule: one line naming both numbers and the launches that start them
    assert line.startswith("warning: accelerate launch asked for 2 processes, but this run has 1")
    assert "--multi_gpu --num_processes 2" in line and "torchrun --nproc_per_node 2" in line
    assert len(line.splitlines()) == 1
    config = tmp_path / "accelerate.yaml"  # accelerate config's num_processes, on a CPU machine
    config.write_text(yaml.safe_dump({"compute_environment": "LOCAL_MACHINE", "distributed_type": "MULTI_CPU",
                                      "num_processes": 3, "num_machines": 1, "use_cpu": True}))
    assert "asked for 3 processes" in shortfall(1, SIMPLE_LAUNCH, [*LAUNCHER, "--config-file", str(config), "x.py"])
    # Rule: nothing when the launch started what it asked for, or was not this launcher's
    assert shortfall(2, SIMPLE_LAUNCH, [*LAUNCHER, "--num_processes", "2", "x.py"]) is None
    assert shortfall(1, {"ACCELERATE_USE_CPU": "False"}, [*LAUNCHER, "x.py"]) is None  # one asked for
    assert shortfall(1, {"MASTER_ADDR": "h", "WORLD_SIZE": "1"}, ["torchrun", "x.py"]) is None
    assert shortfall(1, SIMPLE_LAUNCH, [*LAUNCHER, "--num_processes", "1", "x.py"]) is None
    assert shortfall(1, SIMPLE_LAUNCH, ["python", "x.py"]) is None  # not readable: no guess


@pytest.mark.slow
def test_accelerate_launch_of_two_cpu_processes_warns_that_one_started(tmp_path):
    # (HF_HOME: no `accelerate config` file of this machine's may choose another launcher)
    env = {**os.environ, "OMP_NUM_THREADS": "1", "HF_HOME": str(tmp_path / "hf"),
           "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])}
    proc = subprocess.run([sys.executable, "-m", "accelerate.commands.launch", "--num_processes", "2",
                           "--num_machines", "1", "--mixed_precision", "no", "--dynamo_backend", "no",
                           *RUN, "--out", str(tmp_path / "run")], cwd=REPO, env=env, capture_output=True,
                          text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert yaml.safe_load((tmp_path / "run/config.yaml").read_text())["num_processes"] == 1
    warnings = [line for line in proc.stderr.splitlines() if line.startswith("warning: accelerate launch")]
    assert len(warnings) == 1 and "asked for 2 processes, but this run has 1" in warnings[0]
