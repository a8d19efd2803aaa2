"""rollout.engine=vllm_server against a real vLLM server on the CPU (make test-vllm): `thinkrl serve` starts it in its
own process, once for the module; the trainer runs in this process or in a child.

Three GRPO steps push the LoRA adapters after each update (versions 0, 1, 2) and the sampler-trainer agreement
check passes on each, after updates too: a stale adapter is off by about 0.2 in mean |log ratio| here, 1e-7 is
rounding. Killing the server mid-run ends the trainer with one error line, and `--resume` after a restart
continues from the last checkpoint, pushing its adapter before the first rollout. Two FSDP2 trainer processes
share one adapter, which rank 0 alone pushes once per version into rollout.adapter_dir. Two runs on the one
server leave each other's adapters loaded. The server starts twice (about 30 s each on 2 cores); the trainers
run a few seconds.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest
from test_cli_e2e import invoke, tiny_args
from test_engines import HAS_VLLM

from thinkrl.rollout.engines.server_adapters import run_tag
from thinkrl.run.jsonl import read_jsonl

pytestmark = [pytest.mark.vllm, pytest.mark.skipif(not HAS_VLLM, reason="vLLM is not installed")]
TESTS = Path(__file__).resolve().parent
ENGINE = ["-o", "rollout.engine=vllm_server", "-o", "model.lora.rank=4", "-o", "model.lora.alpha=8", "-o", "rollout.agreement_every=1"]


class Server:
    """A `thinkrl serve` process (vLLM's API server after the exec) in its own process group, so that a kill takes
    vLLM's engine-core child with it."""

    def __init__(self, model: Path, port: int, log: Path) -> None:
        self.model, self.port, self.log, self.proc = model, port, log, None
        self.url = f"http://127.0.0.1:{port}"

    def start(self, wait: float = 240.0) -> None:
        command = [sys.executable, "-m", "thinkrl", "serve", "--model", str(self.model), "-o", "model.lora.rank=4", "--trainers", "2"]
        command += ["-o", f"rollout.server_url={self.url}", "-o", "rollout.max_new_tokens=8", "-o", "rollout.batch_size=16"]
        with open(self.log, "ab") as log:
            self.proc = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        deadline = time.monotonic() + wait
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                pytest.fail(f"the server exited ({self.proc.returncode}): {self.log.read_text()[-3000:]}")
            try:
                with urllib.request.urlopen(self.url + "/health", timeout=2):
                    return
            except OSError:
                time.sleep(1)
        pytest.fail(f"the server did not answer /health within {wait:g} s: {self.log.read_text()[-3000:]}")

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()

    def adapters(self, run: Path | None = None) -> list[str]:
        """The adapters the server holds (of the run in directory `run` only, when given)."""
        with urllib.request.urlopen(self.url + "/v1/models", timeout=10) as answer:
            held = sorted(m["id"] for m in json.load(answer)["data"] if m.get("parent") is not None)
        return [n for n in held if run is None or n.startswith(_prefix(run))]


def _prefix(run: Path) -> str:
    return f"policy-{run_tag(run)}-v"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    from tiny import build_tiny_model

    root = tmp_path_factory.mktemp("vllm-server")
    served = Server(build_tiny_model(root / "model", heads=2, head_dim=32), _free_port(), root / "server.log")
    served.start()
    yield served
    served.kill()


def test_three_steps_push_each_update_and_agree_with_the_trainer(server, tmp_path):
    out = tmp_path / "run"
    said = invoke(tiny_args(server.model, out, 3, *ENGINE, "-o", f"rollout.server_url={server.url}")).output
    assert f"sampling: engine vllm_server (set by rollout.engine): vLLM server at {server.url}" in said, said
    metrics = read_jsonl(out / "metrics.jsonl")
    assert [m["step"] for m in metrics] == [1, 2, 3]
    assert [m["rollout/policy_version"] for m in metrics] == [0, 1, 2]  # the trainer's step: no lag
    assert [m["rollout/policy_lag"] for m in metrics] == [0, 0, 0]
    assert metrics[0]["grad_norm"] > 0 and metrics[1]["grad_norm"] > 0  # steps 2 and 3 sample updated adapters
    assert all(m["mismatch/agreement_gap"] < 1e-3 for m in metrics), metrics  # float32: the server's log-probs are the trainer's
    assert "sampler and trainer disagree" not in said
    assert server.adapters(out) == [f"{_prefix(out)}2"]  # each push unloads the one before


def test_staleness_is_the_lag_the_server_samples_with(server, tmp_path):
    out = tmp_path / "run"
    invoke(tiny_args(server.model, out, 3, *ENGINE, "-o", f"rollout.server_url={server.url}", "-o", "rollout.staleness=1"))
    metrics = read_jsonl(out / "metrics.jsonl")
    assert [m["rollout/policy_version"] for m in metrics] == [0, 0, 1]
    assert [m["rollout/policy_lag"] for m in metrics] == [0, 1, 1]
    assert metrics[1]["mismatch/abs_log_ratio"] > 1e-2  # the stale adapter differs from the trainer's, as it should


def test_a_killed_server_stops_the_run_in_one_line_and_resume_continues(server, tmp_path):
    out = tmp_path / "run"
    args = tiny_args(server.model, out, 500, *ENGINE, "-o", f"rollout.server_url={server.url}", "-o", "train.save_every=1")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(TESTS), os.environ.get("PYTHONPATH", "")])}  # the test grader
    trainer = subprocess.Popen(
        [sys.executable, "-m", "thinkrl", *args, "-o", "rollout.server_timeout=60"],
        env=env,
        text=True,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    deadline = time.monotonic() + 180
    while time.monotonic() < deadline and trainer.poll() is None and len(_lines(out / "metrics.jsonl")) < 2:
        time.sleep(0.2)
    server.kill()
    _, err = trainer.communicate(timeout=180)
    assert trainer.returncode == 2, err
    errors = [line for line in err.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and "Traceback" not in err, err
    assert f"the vLLM server at {server.url} stopped answering" in errors[0] and f"thinkrl train --resume {out}" in errors[0]
    saved = sorted(int(p.name.removeprefix("step-")) for p in (out / "checkpoints").glob("step-*") if (p / "COMPLETE").is_file())
    assert saved and saved[-1] >= 1, saved

    server.start()  # what the error line says to do, then resume: one step past the last checkpoint
    last = saved[-1]
    said = invoke(["train", "--resume", str(out), "-o", f"train.steps={last + 1}"]).output
    metrics = read_jsonl(out / "metrics.jsonl")
    assert [m["step"] for m in metrics] == list(range(1, last + 2))
    assert metrics[-1]["rollout/policy_version"] == last  # the resumed trainer pushed its own adapter first
    assert metrics[-1]["mismatch/agreement_gap"] < 1e-3 and "sampler and trainer disagree" not in said
    assert server.adapters(out) == [f"{_prefix(out)}{last}"]


def test_two_fsdp2_trainers_share_the_adapter_rank_0_pushes_once_per_version(server, tmp_path):
    """Layout 3 with sharded trainers: `accelerate launch --config_file configs/accelerate/fsdp.yaml`, two ranks
    against one server. Every rank gathers the whole adapter from the shards (the weights are the same on all);
    rank 0 alone writes it into rollout.adapter_dir and loads it, once per version, and the agreement over every
    rank's completions holds after an update, so both sample what they train."""
    from launch import fsdp_cmd, ranks, thinkrl_script

    out, shared = tmp_path / "run", tmp_path / "shared"
    args = tiny_args(server.model, out, 2, *ENGINE, "-o", f"rollout.server_url={server.url}", "-o", f"rollout.adapter_dir={shared}")
    ranks([*fsdp_cmd(), *thinkrl_script(), *args], env={"PYTHONPATH": os.pathsep.join([str(TESTS), os.environ.get("PYTHONPATH", "")])})
    metrics = read_jsonl(out / "metrics.jsonl")
    assert [m["rollout/policy_version"] for m in metrics] == [0, 1]
    assert metrics[0]["grad_norm"] > 0 and all(m["mismatch/agreement_gap"] < 1e-3 for m in metrics), metrics
    assert server.adapters(out) == [f"{_prefix(out)}1"]
    said = f"Loaded new LoRA adapter: name '{_prefix(out)}"  # vLLM's line for each load
    loads = [line.split("name '")[1] for line in server.log.read_text().splitlines() if said in line]
    assert [load.split("'")[0] for load in loads] == [f"{_prefix(out)}0", f"{_prefix(out)}1"], loads  # once per version
    assert all(load.split("path '")[1].startswith(str(shared / f"thinkrl-{run_tag(out)}")) for load in loads), loads


def test_two_runs_on_one_server_leave_each_others_adapters_alone(server, tmp_path):
    """A second run's first push unloads its own run's leftovers only: the first run's adapter stays loaded."""
    first, second = tmp_path / "first", tmp_path / "second"
    for out in (first, second):
        invoke(tiny_args(server.model, out, 1, *ENGINE, "-o", f"rollout.server_url={server.url}"))
    assert server.adapters(first) == [f"{_prefix(first)}0"] and server.adapters(second) == [f"{_prefix(second)}0"]


def _lines(path: Path) -> list[str]:
    return path.read_text().splitlines() if path.is_file() else []
