"""rollout.engine=vllm_server without vLLM: its settings, `thinkrl serve`'s flags, and the engine against a stand-in
server (tests/fake_vllm_server.py): adapter versions and lag, the pushed files, the answers parsed, and a server
that answers for another adapter, slowly, refuses, or stops (one error line naming the URL and the fix). The real
server's tests are tests/test_vllm_server.py (make test-vllm)."""

from __future__ import annotations

import pytest
import torch
from fake_vllm_server import FakeServer
from typer.testing import CliRunner

from thinkrl.cli import app
from thinkrl.errors import UserError
from thinkrl.rollout.completions import Request, Sampling
from thinkrl.rollout.engines.server_adapters import run_tag
from thinkrl.rollout.engines.server_http import ServerGone
from thinkrl.rollout.engines.vllm_server import VLLMServerEngine
from thinkrl.rollout.policy_copy import PolicySampler
from thinkrl.serve import server_command
from thinkrl.settings import load_config, resolve


@pytest.fixture
def fake():
    server = FakeServer()
    yield server
    server.stop()


def _config(*overrides: str):
    return resolve(load_config(None, ["rollout.engine=vllm_server", "rollout.server_url=http://127.0.0.1:8000", *overrides]))


@pytest.mark.parametrize(
    ("overrides", "said"),
    [
        (["rollout.server_url="], "rollout.engine=vllm_server needs server_url, e.g. -o rollout.server_url=http://127.0.0.1:8000"),
        (["rollout.server_url=localhost:8000"], "rollout.server_url must be http(s)://HOST:PORT"),
        (["rollout.server_timeout=0"], "rollout.server_timeout must be in (0, 86400] seconds, got 0"),
        (["model.lora.rank=0"], "rollout.engine=vllm_server with model.lora.rank=0 (full fine-tuning)"),
        (["seeds.enabled=true", "train.old_policy=recompute"], "rollout.engine=vllm_server with seeds.enabled"),
        (["rollout.precision=fp8"], "rollout.engine=vllm_server with rollout.precision=fp8"),
    ],
)
def test_bad_server_settings_are_refused_in_one_line(overrides, said):
    with pytest.raises(UserError, match=None) as e:
        _config(*overrides)
    assert said in str(e.value) and "\n" not in str(e.value)


def test_serve_passes_what_the_trainer_needs():
    command, env = server_command(_config("model.lora.rank=4", "rollout.server_url=http://127.0.0.1:8123"), trainers=2, cuda=False)
    flags = dict(zip(command[3::2], command[4::2]))  # after python -m MODULE: pairs, until the bare flags
    assert command[1:3] == ["-m", "vllm.entrypoints.openai.api_server"] and env == {"VLLM_ALLOW_RUNTIME_LORA_UPDATING": "True"}
    assert "--enable-lora" in command and "--enforce-eager" in command
    assert command[command.index("--max-lora-rank") + 1] == "8"  # vLLM's smallest allowed rank >= 4
    assert command[command.index("--max-loras") + 1] == "1"  # one run: rank 0 pushes its one adapter
    assert command[command.index("--logprobs-mode") + 1] == "processed_logprobs"
    assert flags["--port"] == "8123" and command[command.index("--dtype") + 1] == "float32"
    bf16, _ = server_command(_config("rollout.precision=bf16", "model.lora.rank=16"), cuda=True)
    assert bf16[bf16.index("--dtype") + 1] == "bfloat16" and bf16[bf16.index("--max-lora-rank") + 1] == "16"


def test_serve_print_shows_the_command_and_starts_nothing(tiny_model_dir):
    said = CliRunner().invoke(app, ["serve", "--model", str(tiny_model_dir), "--print", "--vllm-args", "--max-num-batched-tokens 64"])
    assert said.exit_code == 0, said.output
    assert said.output.startswith("VLLM_ALLOW_RUNTIME_LORA_UPDATING=True ") and said.output.rstrip().endswith("--max-num-batched-tokens 64")


def _engine(fake, timeout: float = 30.0) -> VLLMServerEngine:
    return VLLMServerEngine(4, url=fake.url, timeout=timeout, run_dir="runs/x")


V = f"policy-{run_tag('runs/x')}-v"  # _engine's adapters: this run's name, then the version


def _request(step: int | None, topk: int = 0, rows: int = 2) -> Request:
    return Request([[5, 6, 7]] * rows, 2, Sampling(6), [1], 0, torch.Generator().manual_seed(0), record_topk=topk, step=step)


def _policy_sampler(tiny_model_dir, staleness: int = 0):
    from tiny import tiny_lora_model

    return PolicySampler(tiny_lora_model(tiny_model_dir), "same", staleness)


def _update(sampler) -> None:
    with torch.no_grad():
        for name, p in sampler.policy.named_parameters():
            if "lora_B" in name:
                p.add_(0.01)


def test_each_version_is_pushed_once_and_the_one_before_unloaded(fake, tiny_model_dir):
    engine, sampler = _engine(fake), _policy_sampler(tiny_model_dir)
    engine.bind(sampler)
    engine.connect()
    for step in range(3):
        model = sampler.refresh()
        comp = engine.generate(model, _request(step))
        assert engine.stats == {"rollout/policy_version": step, "rollout/policy_lag": 0}
        assert list(fake.adapters) == [f"{V}{step}"]  # the server holds this version only
        pushed = fake.adapters[f"{V}{step}"]
        trained = {n.replace(".default.weight", ".weight"): p for n, p in sampler.policy.named_parameters() if p.requires_grad}
        assert pushed.keys() == trained.keys() and all(torch.equal(pushed[n], trained[n]) for n in trained)  # the trained weights
        asked = {body["model"] for path, body in fake.calls[-4:]}
        assert comp.tokens.shape[0] == 4 and asked == {f"{V}{step}"}  # every completion asks for this version
        if step < 2:
            _update(sampler)
    assert fake.configs[f"{V}2"]["r"] == 4 and fake.configs[f"{V}2"]["lora_alpha"] == 8
    engine.generate(sampler.restore(), _request(2))  # the same weights again: nothing loaded
    assert sum(path == "/v1/load_lora_adapter" for path, _ in fake.calls) == 3
    engine.close()


def test_staleness_samples_the_snapshot_of_k_steps_ago_and_says_so(fake, tiny_model_dir):
    engine, sampler = _engine(fake), _policy_sampler(tiny_model_dir, staleness=1)
    engine.bind(sampler)
    seen = []
    for step in range(3):
        engine.generate(sampler.refresh(), _request(step))
        seen.append((engine.stats["rollout/policy_version"], engine.stats["rollout/policy_lag"], list(fake.adapters)))
        _update(sampler)
    assert seen == [(0, 0, [f"{V}0"]), (0, 1, [f"{V}0"]), (1, 1, [f"{V}1"])]


def test_answers_come_back_as_the_ids_and_log_probs_the_server_gave(fake, tiny_model_dir):
    engine, sampler = _engine(fake), _policy_sampler(tiny_model_dir)
    engine.bind(sampler)
    comp = engine.generate(sampler.refresh(), _request(0, topk=2, rows=1))
    bodies = [b for p, b in fake.calls if p == "/v1/completions"]  # in the order they arrived, not row order
    given = sorted(fake.answer("/v1/completions", body)[1]["choices"][0]["token_ids"] for body in bodies)
    rows = [comp.tokens[i, : int(comp.lengths[i])].tolist() for i in range(comp.tokens.shape[0])]
    assert sorted(rows) == given  # each completion's ids as the server gave them
    for i, ids in enumerate(rows):
        assert bool(comp.truncated[i]) == (ids[-1] != 1)  # ended on the stop token or ran to the budget
        assert torch.allclose(comp.behav_logp[i, : len(ids)], torch.tensor(-1.5)) and not comp.mask[i, len(ids) :].any()
        assert comp.topk_ids[i, 0].tolist() == [3, 4]  # the K best by log-prob, the sampled token (-1.5) below them
    assert len({b["seed"] for b in bodies}) == len(bodies) and all(b["return_token_ids"] and b["prompt"] == [5, 6, 7] for b in bodies)


def test_an_adapter_unloaded_behind_the_runs_back_stops_it_in_one_line(fake, tiny_model_dir):
    engine, sampler = _engine(fake), _policy_sampler(tiny_model_dir)
    engine.bind(sampler)
    engine.generate(sampler.refresh(), _request(0))
    fake.adapters.clear()  # someone else unloaded it: vLLM answers 404, as the stand-in does
    with pytest.raises(UserError, match=f"refused sampling with adapter {V}0 .404.: The model `{V}0` does not exist"):
        engine.generate(sampler.restore(), _request(0))


def test_a_server_that_stops_answering_is_one_line_naming_the_url_and_the_fix(fake, tiny_model_dir):
    engine, sampler = _engine(fake), _policy_sampler(tiny_model_dir)
    engine.bind(sampler)
    engine.generate(sampler.refresh(), _request(0))
    fake.stop()
    with pytest.raises(ServerGone) as e:
        engine.generate(sampler.refresh(), _request(1))
    said = str(e.value)
    assert said.startswith(f"the vLLM server at {fake.url} stopped answering") and "\n" not in said
    assert "thinkrl serve runs/x/config.yaml" in said and "run the same thinkrl train command again" in said  # no checkpoint


def test_a_slow_answer_is_past_the_timeout(fake, tiny_model_dir):
    engine, sampler = _engine(fake, timeout=0.3), _policy_sampler(tiny_model_dir)
    engine.bind(sampler)
    fake.delay = 3.0
    with pytest.raises(ServerGone, match=r"no answer within 0\.3 s, rollout.server_timeout"):
        engine.generate(sampler.refresh(), _request(0))


def test_no_server_fails_the_health_check_at_start(fake):
    url = fake.url
    fake.stop()
    with pytest.raises(ServerGone, match=f"the vLLM server at {url} stopped answering during the health check at start"):
        _engine(fake).connect()


def test_a_server_without_runtime_lora_says_how_to_start_one(fake, tiny_model_dir):
    engine, sampler = _engine(fake), _policy_sampler(tiny_model_dir)
    engine.bind(sampler)
    fake.refuse_loads = True
    with pytest.raises(UserError, match=f"refused loading adapter {V}0 .400.: LoRA is not enabled; start the server with `thinkrl"):
        engine.generate(sampler.refresh(), _request(0))


@pytest.mark.plain  # a training run: the update goes through the CPU speed-ups' hooks
def test_a_run_whose_server_dies_stops_in_one_line_and_resumes_on_a_new_one(fake, tiny_model_dir, tmp_path, monkeypatch, capsys):
    from test_cli_e2e import tiny_args

    from thinkrl.cli import run

    def run_cli(args: list[str]) -> tuple[int, str]:
        monkeypatch.setattr("sys.argv", ["thinkrl", *args])
        with pytest.raises(SystemExit) as exit_:
            run()
        return exit_.value.code, capsys.readouterr().err

    out, server = tmp_path / "run", ["-o", "rollout.engine=vllm_server", "-o", "train.save_every=1", "-o", "model.lora.rank=4"]
    fake.die_after = 2 * 8  # two steps of 2 prompts x 4 completions, then no answer in step 3
    code, err = run_cli(tiny_args(tiny_model_dir, out, 4, *server, "-o", f"rollout.server_url={fake.url}"))
    errors = [line for line in err.splitlines() if line.startswith("error:")]
    assert code == 2 and len(errors) == 1 and "Traceback" not in err, err
    name = f"policy-{run_tag(out)}-v"
    assert f"the vLLM server at {fake.url} stopped answering during sampling with adapter {name}2" in errors[0]
    assert f"thinkrl train --resume {out}" in errors[0] and (out / "checkpoints" / "step-2" / "COMPLETE").is_file()

    again = FakeServer()  # a restarted server holds no adapter: the resumed trainer pushes its own first
    try:
        code, err = run_cli(["train", "--resume", str(out), "-o", f"rollout.server_url={again.url}"])
        assert code == 0, err
        loads = [body["lora_name"] for path, body in again.calls if path == "/v1/load_lora_adapter"]
        assert loads == [f"{name}2", f"{name}3"] and list(again.adapters) == [f"{name}3"]
    finally:
        again.stop()
