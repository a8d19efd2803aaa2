"""The server layout's multi-process and shared-server rules, against the stand-in server (no vLLM needed): rank 0
alone pushes each version into rollout.adapter_dir, with a marker written last, and the other ranks take its name;
an evaluation on rank 0 calls no collective; adapters carry the run's name, so one run's cleanup leaves another's
alone; the advice after a lost server fits whether a checkpoint exists; `thinkrl serve` sizes the server from the
trainers and runs it serves, and says in one line when vLLM is missing."""

from __future__ import annotations

import pytest
from fake_vllm_server import FakeServer
from test_engines import HAS_VLLM
from test_server_engine import _config, _policy_sampler, _request, _update

from thinkrl import distributed
from thinkrl.errors import UserError
from thinkrl.rollout.engines.server_adapters import MARKER, run_tag
from thinkrl.rollout.engines.server_http import ServerGone
from thinkrl.rollout.engines.vllm_server import VLLMServerEngine
from thinkrl.serve import server_command


@pytest.fixture
def fake():
    server = FakeServer()
    yield server
    server.stop()


def _ranks(monkeypatch, rank: int, world: int, from_rank0=None) -> list:
    """Pretend to be `rank` of `world` processes; all_gather answers rank 0's part (`from_rank0`, or this process's
    own when it is rank 0). Returns the list of what was gathered, one entry per collective."""
    gathered: list = []

    def all_gather(obj):
        gathered.append(obj)
        return [obj if rank == 0 else from_rank0, *([obj] * (world - 1))]

    monkeypatch.setattr(distributed, "world", lambda: (rank, world))
    monkeypatch.setattr(distributed, "all_gather", all_gather)
    return gathered


def _cli(monkeypatch, capsys, args: list[str]) -> tuple[int, str]:
    """`thinkrl ARGS` as the console script runs it (errors become one `error:` line): exit status, all output."""
    from thinkrl.cli import run

    monkeypatch.setattr("sys.argv", ["thinkrl", *args])
    with pytest.raises(SystemExit) as exit_:
        run()
    out = capsys.readouterr()
    return exit_.value.code or 0, out.out + out.err


def _loads(fake) -> list[str]:
    return [body["lora_name"] for path, body in fake.calls if path == "/v1/load_lora_adapter"]


def test_rank_0_pushes_each_version_once_into_the_adapter_dir(fake, tiny_model_dir, tmp_path, monkeypatch):
    gathered = _ranks(monkeypatch, 0, 2)
    engine, sampler = (
        VLLMServerEngine(4, url=fake.url, run_dir=str(tmp_path / "run"), adapter_dir=str(tmp_path / "shared")),
        _policy_sampler(tiny_model_dir),
    )
    engine.bind(sampler)
    name = f"policy-{run_tag(tmp_path / 'run')}-v"
    for step in range(2):
        model = sampler.refresh()
        engine.generate(model, _request(step))
        engine.generate(model, _request(step))  # a second sampling round of the step (dynamic sampling): no collective
        _update(sampler)
    assert _loads(fake) == [f"{name}0", f"{name}1"] and list(fake.adapters) == [f"{name}1"]
    assert gathered == [(f"{name}0", ""), (f"{name}1", "")]  # one collective per step, carrying the name
    written = list((tmp_path / "shared" / f"thinkrl-{run_tag(tmp_path / 'run')}").iterdir())
    assert [p.name for p in written] == [f"{name}1-2"] and (written[0] / MARKER).is_file()  # the older one is gone
    engine.close()


def test_other_ranks_push_nothing_and_sample_with_rank_0s_adapter(fake, tiny_model_dir, tmp_path, monkeypatch):
    lead = VLLMServerEngine(4, url=fake.url, run_dir=str(tmp_path / "run"))  # rank 0's push, made here directly
    lead.bind(_policy_sampler(tiny_model_dir))
    pushed = lead._pusher().push(0, lead.sampler.snapshot())
    _ranks(monkeypatch, 1, 2, from_rank0=(pushed, ""))
    engine, sampler = VLLMServerEngine(4, url=fake.url, run_dir=str(tmp_path / "run")), _policy_sampler(tiny_model_dir)
    engine.bind(sampler)
    engine.generate(sampler.refresh(), _request(0))
    assert _loads(fake) == [pushed] and engine.push is None  # rank 1 loaded nothing and wrote no files
    assert {body["model"] for path, body in fake.calls if path == "/v1/completions"} == {pushed}


def test_rank_0s_failure_stops_the_other_ranks_too(fake, tiny_model_dir, tmp_path, monkeypatch):
    _ranks(monkeypatch, 1, 2, from_rank0=("", "the vLLM server at X refused loading adapter p (400): no"))
    engine, sampler = VLLMServerEngine(4, url=fake.url, run_dir=str(tmp_path / "run")), _policy_sampler(tiny_model_dir)
    engine.bind(sampler)
    with pytest.raises(UserError, match="refused loading adapter p"):
        engine.generate(sampler.refresh(), _request(0))


def test_an_evaluation_on_rank_0_calls_no_collective(fake, tiny_model_dir, tmp_path, monkeypatch):
    gathered = _ranks(monkeypatch, 0, 2)
    engine, sampler = VLLMServerEngine(4, url=fake.url, run_dir=str(tmp_path / "run")), _policy_sampler(tiny_model_dir)
    engine.bind(sampler)
    engine.generate(sampler.refresh(), _request(0))
    _update(sampler)
    sampler.refresh(current=True)  # every rank, as train.py does before evaluating
    monkeypatch.setattr(sampler, "snapshot", lambda: pytest.fail("a snapshot gathers from every rank"))
    engine.generate(sampler.model, _request(None))
    assert len(gathered) == 1 and _loads(fake)[-1].endswith("-v1")  # the training step's only; eval pushed alone
    sampler._built = None  # no adapters held: refused rather than gathered from rank 0 alone
    with pytest.raises(RuntimeError, match="evaluation on rank 0"):
        engine.generate(sampler.model, _request(None))


def test_a_runs_cleanup_leaves_another_runs_adapters_alone(fake, tiny_model_dir, tmp_path):
    names = []
    for run in ("a", "b"):
        engine, sampler = VLLMServerEngine(4, url=fake.url, run_dir=str(tmp_path / run)), _policy_sampler(tiny_model_dir)
        engine.bind(sampler)
        engine.generate(sampler.refresh(), _request(0))
        names.append(f"policy-{run_tag(tmp_path / run)}-v0")
    assert sorted(fake.adapters) == sorted(names) and names[0] != names[1]
    again = VLLMServerEngine(4, url=fake.url, run_dir=str(tmp_path / "a"))  # run a resumed: its own leftover goes
    again.bind(_policy_sampler(tiny_model_dir))
    again.generate(again.sampler.refresh(), _request(1))
    assert sorted(fake.adapters) == sorted([names[1], f"policy-{run_tag(tmp_path / 'a')}-v1"])


def test_a_bad_adapter_dir_is_one_line(fake, tiny_model_dir, tmp_path):
    (tmp_path / "file").write_text("")
    engine, sampler = (
        VLLMServerEngine(4, url=fake.url, run_dir=str(tmp_path / "run"), adapter_dir=str(tmp_path / "file")),
        _policy_sampler(tiny_model_dir),
    )
    engine.bind(sampler)
    with pytest.raises(UserError, match=f"rollout.adapter_dir={tmp_path / 'file'}: cannot create"):
        engine.generate(sampler.refresh(), _request(0))


def test_a_server_lost_before_any_checkpoint_advises_the_plain_rerun(fake, tmp_path):
    url = fake.url
    fake.stop()
    with pytest.raises(ServerGone) as e:
        VLLMServerEngine(4, url=url, run_dir=str(tmp_path / "never")).connect()
    assert "--resume" not in str(e.value) and "run the same thinkrl train command again (no checkpoint was saved yet)" in str(e.value)
    (tmp_path / "run" / "checkpoints" / "step-2").mkdir(parents=True)
    (tmp_path / "run" / "checkpoints" / "step-2" / "COMPLETE").write_text("")
    with pytest.raises(ServerGone, match=f"then continue with: thinkrl train --resume {tmp_path / 'run'} .the last checkpoint stands."):
        VLLMServerEngine(4, url=url, run_dir=str(tmp_path / "run")).connect()


def test_serve_sizes_the_server_from_its_trainers_and_runs():
    command, _ = server_command(_config("model.lora.rank=4", "rollout.batch_size=16"), trainers=4, cuda=False, runs=2)
    flags = dict(zip(command, command[1:]))
    assert flags["--max-num-seqs"] == str(2 * 4 * 16) and flags["--max-loras"] == "2"  # each run holds one adapter


def test_serve_devices_set_the_tensor_parallel_size(tiny_model_dir, monkeypatch, capsys):
    serve = ["serve", "--model", str(tiny_model_dir), "--print", "--devices"]
    code, said = _cli(monkeypatch, capsys, [*serve, "6,7"])
    assert code == 0 and "CUDA_VISIBLE_DEVICES=6,7 " in said and "--tensor-parallel-size 2" in said, said
    code, said = _cli(monkeypatch, capsys, [*serve, "6,7", "--vllm-args", "-tp 1"])  # theirs wins
    assert code == 0 and said.count("-tp") == 1 and "--tensor-parallel-size" not in said, said
    code, said = _cli(monkeypatch, capsys, [*serve, "cuda:1"])
    assert code == 2 and "error: --devices 'cuda:1': must be CUDA device numbers" in said, said


@pytest.mark.skipif(HAS_VLLM, reason="vLLM is installed here: serve would start it")
def test_serve_without_vllm_is_one_line_naming_the_install(tiny_model_dir, monkeypatch, capsys):
    def execvpe(*args):  # what the exec'd `python -m vllm...` ends in without vLLM, without replacing pytest
        raise ModuleNotFoundError("No module named 'vllm'")

    monkeypatch.setattr("thinkrl.serve.os.execvpe", execvpe)
    code, said = _cli(monkeypatch, capsys, ["serve", "--model", str(tiny_model_dir)])
    errors = [line for line in said.splitlines() if line.startswith("error:")]
    assert code == 2 and len(errors) == 1 and 'pip install -e ".[vllm]"' in errors[0] and "Traceback" not in said, said
