"""Resume and the run directory (thinkrl/run/resume.py, intact.verify, run/atomic.py):

- a resume that changes what makes the run (model, LoRA, method, data, prompts, group size, prompts per step,
  seeds) is refused in one line naming each key, unless --allow-changes, which records it in changes.jsonl;
- config.yaml is rewritten only once a resume has set up: a refused or failed one leaves it as it was;
- a damaged newest checkpoint is named in one line and the newest intact one is used (never one whose files
  disagree with its step); metrics.jsonl is cut back to it;
- a full disk while a resume rewrites config.yaml keeps the old one (atomic writes: test_atomic_writes.py);
- printed resume commands paste into a shell: test_resume_command.py; a new run's --output-dir: test_new_run_dir.py.
"""

import shutil
from pathlib import Path

import pytest
import yaml
from test_atomic_writes import config_for, fail_after_half
from test_cli_e2e import invoke
from test_faults import COMPARED, error_line, run_cli

from thinkrl.config.load import all_keys
from thinkrl.errors import UserError
from thinkrl.run import intact, resume
from thinkrl.run.jsonl import read_jsonl
from thinkrl.settings import save_config


@pytest.fixture
def run(checkpointed_run, tmp_path) -> Path:
    out = tmp_path / "run"
    shutil.copytree(checkpointed_run, out)
    return out


def steps(run: Path) -> list[int]:
    return [m["step"] for m in read_jsonl(run / "metrics.jsonl")]


def changes(run: Path) -> list[dict]:
    return read_jsonl(run / "changes.jsonl") if (run / "changes.jsonl").exists() else []


# --- 1. what a resume may change


@pytest.mark.parametrize(
    "args, shown",
    [
        (["-o", "rollout.group_size=8"], "rollout.group_size 4 -> 8"),
        (["-o", "rollout.prompts_per_step=4"], "rollout.prompts_per_step 2 -> 4"),
        (["--dataset", "other.jsonl"], "data.name 'arith' -> 'other.jsonl'"),
        (["-o", "data.limit=10"], "data.limit 0 -> 10"),
        (["-o", "data.arith.seed=7"], "data.arith.seed 1234 -> 7"),
        (["-o", "prompt.system=Be brief."], "prompt.system None -> 'Be brief.'"),
        (["-o", "method.name=dr_grpo"], "method.name 'grpo' -> 'dr_grpo'"),
        (["-o", "method.clip_high=0.28"], "method.clip_high 0.2 -> 0.28"),
        (["--model", "smollm2-135m"], "-> 'smollm2-135m'"),
        (["-o", "model.lora.rank=8"], "model.lora.rank 16 -> 8"),
        (["-o", "model.lora.alpha=8"], "model.lora.alpha 32.0 -> 8.0"),
        (["-o", "model.lora.target_modules=[q_proj]"], 'model.lora.target_modules ["all-linear"] -> ["q_proj"]'),
        (["-o", "train.seed=1"], "train.seed 0 -> 1"),
        # what the run optimises and the distribution it samples from
        (["-o", "verifier.grader=thinkrl.verifier:grade"], "verifier.grader 'helpers:length_reward' -> 'thinkrl.verifier:grade'"),
        (["-o", "reward.functions=[{name: correct, function: verifier, weight: 2.0}]"], 'reward.functions [{"name": "correct"'),
        (["-o", "reward.overlong_buffer=4"], "reward.overlong_buffer 0 -> 4"),
        (["-o", "reward.overlong_penalty=0.5"], "reward.overlong_penalty 1.0 -> 0.5"),
        (["-o", "rollout.temperature=0.7"], "rollout.temperature 1.0 -> 0.7"),
        (["-o", "rollout.top_p=0.9"], "rollout.top_p 1.0 -> 0.9"),
        (["-o", "rollout.top_k=5"], "rollout.top_k 0 -> 5"),
        (["-o", "rollout.max_new_tokens=16"], "rollout.max_new_tokens 8 -> 16"),
        (["-o", "rollout.min_new_tokens=2"], "rollout.min_new_tokens 0 -> 2"),
        (["-o", "rollout.mask_truncated=true"], "rollout.mask_truncated False -> True"),
        (["-o", "rollout.dynamic_sampling=true"], "rollout.dynamic_sampling False -> True"),
        (["-o", "correction.mode=tis"], "correction.mode 'none' -> 'tis'"),
        (["-o", "correction.c_max=3.0"], "correction.c_max 2.0 -> 3.0"),
        (["-o", "advantage.estimator=rloo"], "advantage.estimator 'auto' -> 'rloo'"),
        (["-o", "method.beta=0.04"], "method.beta 0.0 -> 0.04"),
        (["-o", "train.entropy_coef=0.01"], "train.entropy_coef 0.0 -> 0.01"),
        (["-o", "train.epochs=2"], "train.epochs 1 -> 2"),
        pytest.param(["-o", "rollout.staleness=1"], "rollout.staleness 0 -> 1", marks=pytest.mark.plain),  # refused after the model loads
        (["-o", "seeds.per_group=1"], "seeds.per_group 2 -> 1"),
    ],
)
def test_a_resume_that_changes_what_makes_the_run_is_refused_in_one_line(run, capsys, args, shown):
    config = (run / "config.yaml").read_bytes()
    code, err = run_cli(["train", "--resume", run, "-o", "train.steps=3", *args], capsys)
    line = error_line(err)
    assert code == 2 and f"error: --resume {run} changes what makes the run: " in line and shown in line, line
    assert "--allow-changes" in line and "another --output-dir" in line and "train.steps" not in line, line
    assert "model:" not in err  # refused before anything loads
    assert (run / "config.yaml").read_bytes() == config and not (run / "changes.jsonl").exists() and steps(run) == [1, 2]


@pytest.mark.plain
def test_refused_and_failed_resumes_leave_config_yaml_and_a_plain_resume_works(run, capsys):
    config = (run / "config.yaml").read_bytes()
    attempts = [
        (["--model", "smollm2-135m"], "model.name"),
        (["-o", "model.lora.rank=8"], "model.lora.rank 16 -> 8"),
        (["-o", "model.lora.rank=8", "--allow-changes"], "checkpoints/step-2 does not fit this run (RuntimeError: size mismatch"),
        (["-o", "verifier.grader=nope:nope"], "verifier.grader 'helpers:length_reward' -> 'nope:nope'"),
        (["-o", "verifier.grader=nope:nope", "--allow-changes"], "verifier.grader='nope:nope' could not be loaded"),
        (["-o", "verifier.grader=helpers:nothing", "--allow-changes"], "verifier.grader='helpers:nothing' could not be loaded"),
    ]
    for args, part in attempts:
        code, err = run_cli(["train", "--resume", run, "-o", "train.steps=3", *args], capsys)
        line = error_line(err)
        assert code == 2 and part in line, (args, line)
        assert (run / "config.yaml").read_bytes() == config, args  # never rewritten with settings that failed
    # what is meant to change on resume needs no flag; the change and its step are recorded
    allowed = ["train.steps=3", "train.lr=0.02", "train.keep_last=3", "verifier.workers=2"]
    result = invoke(["train", "--resume", str(run), *(a for o in allowed for a in ("-o", o))])
    assert steps(run) == [1, 2, 3]
    printed = [line for line in result.output.splitlines() if line.startswith("resume: ")]  # each change once, on the console
    assert printed == [
        "resume: changed verifier.workers 1 -> 2",
        "resume: changed train.steps 2 -> 3",
        "resume: changed train.lr 0.05 -> 0.02",
        "resume: changed train.keep_last 2 -> 3",
    ], result.output
    saved = yaml.safe_load((run / "config.yaml").read_text())
    assert saved["train"]["steps"] == 3 and saved["train"]["lr"] == 0.02 and saved["verifier"]["workers"] == 2
    [entry] = changes(run)
    assert entry["step"] == 2 and entry["allowed"] == []
    assert entry["changed"] == {"verifier.workers": [1, 2], "train.steps": [2, 3], "train.lr": [0.05, 0.02], "train.keep_last": [2, 3]}


@pytest.mark.plain
def test_allow_changes_continues_and_records_the_change_and_its_step(run):
    args = ["-o", "train.steps=3", "-o", "rollout.group_size=2", "-o", "rollout.temperature=0.7", "--allow-changes"]
    result = invoke(["train", "--resume", str(run), *args])
    assert steps(run) == [1, 2, 3]
    saved = yaml.safe_load((run / "config.yaml").read_text())
    assert saved["rollout"]["group_size"] == 2 and saved["rollout"]["temperature"] == 0.7
    assert len([r for r in read_jsonl(run / "rollouts.jsonl") if r["step"] == 3]) == 2 * 2  # the new group size took effect
    [entry] = changes(run)
    assert entry["step"] == 2
    assert entry["changed"] == {"rollout.group_size": [4, 2], "rollout.temperature": [1.0, 0.7], "train.steps": [2, 3]}
    assert entry["allowed"] == ["rollout.group_size", "rollout.temperature"]
    printed = [line for line in result.output.splitlines() if line.startswith("resume: ")]  # once each, said to be allowed
    assert printed == [
        "resume: changed rollout.group_size 4 -> 2 (allowed)",
        "resume: changed rollout.temperature 1.0 -> 0.7 (allowed)",
        "resume: changed train.steps 2 -> 3",
    ], result.output
    invoke(["train", "--resume", str(run), "-o", "train.steps=4"])  # config.yaml holds the change: no flag needed again
    assert steps(run) == [1, 2, 3, 4] and [e["step"] for e in changes(run)] == [2, 3]


def test_allow_changes_without_resume_is_refused(capsys):
    code, err = run_cli(["train", "--allow-changes"], capsys)
    assert code == 2 and error_line(err) == "error: --allow-changes applies only with --resume RUN_DIR; drop it for a new run"


def test_train_help_documents_allow_changes():
    from typer.testing import CliRunner

    from thinkrl.cli import app

    text = " ".join(CliRunner().invoke(app, ["train", "--help"], terminal_width=300).output.split())
    assert "--allow-changes" in text and "changes.jsonl" in text


def test_changes_are_compared_with_the_settings_of_the_checkpoint_resumed(tmp_path):
    """A resume from an older checkpoint undoes the changes recorded after it; two resumes from one step
    (the first failed after writing changes.jsonl) make one line."""
    four, eight = config_for(tmp_path, "rollout.group_size=4"), config_for(tmp_path, "rollout.group_size=8")
    save_config(four, tmp_path / "config.yaml")
    resume.record(tmp_path, 2, eight)  # written; config.yaml then failed: it still says 4
    resume.record(tmp_path, 2, four)  # the same step again, without the change
    assert changes(tmp_path) == []
    resume.record(tmp_path, 4, eight)
    save_config(eight, tmp_path / "config.yaml")
    resume.check(tmp_path, eight, False, 4)  # resumed from step-4 or later: 8 is the run's own setting
    with pytest.raises(UserError, match="rollout.group_size 4 -> 8"):
        resume.check(tmp_path, eight, False, 2)  # step-2 was made with 4
    resume.record(tmp_path, 2, four)
    assert changes(tmp_path) == []  # the step-4 change is gone with the steps after step 2


def test_every_config_key_is_classified_as_guarded_or_harmless():
    """A new config key fails here until it is put in resume.GUARDED (a resume changes it only with
    --allow-changes) or resume.HARMLESS (a resume changes it freely): a decision, never a default."""
    keys = (set(all_keys()) - {"method"}) | {"method.name", "method.recipe"}
    assert not resume.GUARDED & resume.HARMLESS and not (resume.GUARDED | resume.HARMLESS) & resume.IGNORED
    assert sorted(keys - (resume.GUARDED | resume.HARMLESS | resume.IGNORED)) == []  # unclassified
    assert sorted((resume.GUARDED | resume.HARMLESS | resume.IGNORED) - keys) == []  # no longer config keys
    objective = ["verifier.grader", "reward.functions", "reward.overlong_buffer", "rollout.temperature", "rollout.top_p",
                 "rollout.top_k", "rollout.max_new_tokens", "rollout.min_new_tokens", "rollout.mask_truncated",
                 "rollout.dynamic_sampling", "correction.mode", "correction.c_max", "advantage.estimator"]  # fmt: skip
    assert all(resume.makes_the_run(k) for k in objective)
    assert resume.makes_the_run("method.beta") and resume.makes_the_run("method.clip_low")  # a method's own parameters
    assert resume.makes_the_run("rollout.a_key_not_classified_yet")  # guarded until decided
    assert not any(resume.makes_the_run(k) for k in ("train.steps", "train.lr", "verifier.workers", "log.project", "eval.every"))


# --- 2. a full disk during a resume (atomic writes themselves: test_atomic_writes.py)


def test_a_full_disk_on_config_yaml_during_a_resume_keeps_the_old_one(run, monkeypatch, capsys):
    config = (run / "config.yaml").read_bytes()
    fail_after_half(monkeypatch, "config.yaml")
    code, err = run_cli(["train", "--resume", run, "-o", "train.steps=3"], capsys)
    line = error_line(err)
    assert code == 2 and "No space left on device" in line and f"continue with: thinkrl train --resume {run}" in line, line
    assert (run / "config.yaml").read_bytes() == config and not [p for p in run.iterdir() if ".tmp" in p.name]


# --- 3. damaged checkpoints


def _truncate(path: Path) -> None:
    path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])


DAMAGE = {
    "truncated adapter": (lambda c: _truncate(c / "adapter" / "adapter_model.safetensors"), "adapter_model.safetensors is damaged"),
    "no adapter": (lambda c: shutil.rmtree(c / "adapter"), "adapter is missing"),
    "no optimizer.pt": (lambda c: (c / "optimizer.pt").unlink(), "optimizer.pt is missing"),
    "no scheduler.pt": (lambda c: (c / "scheduler.pt").unlink(), "scheduler.pt is missing"),
    "truncated optimizer.pt": (lambda c: _truncate(c / "optimizer.pt"), "optimizer.pt is damaged (BadZipFile"),
    "no trainer_state.json": (lambda c: (c / "trainer_state.json").unlink(), "trainer_state.json is missing"),
    "bad JSON": (lambda c: (c / "trainer_state.json").write_text('{"step": 2,'), "trainer_state.json is not readable JSON"),
    "step two": (lambda c: (c / "trainer_state.json").write_text('{"step": "two"}'), "trainer_state.json gives step 'two', not an integer"),
    "step 5": (lambda c: (c / "trainer_state.json").write_text('{"step": 5}'), "trainer_state.json gives step 5, but its directory is"),
}


@pytest.mark.parametrize("damage", DAMAGE)
def test_a_damaged_checkpoint_is_named_and_the_one_before_is_used(run, damage, capsys):
    ckpts = run / "checkpoints"
    harm, problem = DAMAGE[damage]
    harm(ckpts / "step-2")
    found = intact.verify(ckpts / "step-2")
    assert found is not None and found.startswith(str(ckpts / "step-2")) and problem in found, found
    assert intact.verify(ckpts / "step-1") is None
    assert intact.latest_intact(run) == (ckpts / "step-1", [(ckpts / "step-2", found)])
    assert intact.find_checkpoint(str(run)) == (run, ckpts / "step-1")  # eval and export too
    with pytest.raises(UserError, match="is damaged"):
        intact.find_checkpoint(str(ckpts / "step-2"))
    (ckpts / "step-1" / "method.pt").unlink()  # none intact: one line naming each
    code, err = run_cli(["train", "--resume", run], capsys)
    line = error_line(err)
    assert code == 2 and f"no intact checkpoint in {ckpts}: {found}; {ckpts / 'step-1' / 'method.pt'} is missing" in line, line


@pytest.mark.parametrize("damage", ["step 5", "truncated adapter"])
@pytest.mark.plain
def test_resume_skips_a_damaged_newest_checkpoint_and_cuts_the_metrics_back(run, damage):
    logged = read_jsonl(run / "metrics.jsonl")
    DAMAGE[damage][0](run / "checkpoints" / "step-2")
    result = invoke(["train", "--resume", str(run), "-o", "train.steps=3"])
    output = " ".join(result.output.split())
    assert f"note: {run / 'checkpoints' / 'step-2'}/" in output and "step-2 is damaged, so the run resumes from step-1" in output
    assert "resuming" in output and "from step-1" in output
    resumed = read_jsonl(run / "metrics.jsonl")
    assert [m["step"] for m in resumed] == [1, 2, 3]  # never 1, 2, 6, 7: step 2 was trained again, once
    assert [{k: m.get(k) for k in COMPARED} for m in resumed[:2]] == [{k: m.get(k) for k in COMPARED} for m in logged]
    names = sorted(p.name for p in (run / "checkpoints").iterdir())
    assert names == ["damaged-step-2", "step-2", "step-3"]  # set aside, never rotated or used again
    assert intact.verify(run / "checkpoints" / "step-2") is None
