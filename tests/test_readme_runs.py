"""The README's commands on the bundled model, run for real as a user runs them (slow).

`make demo` runs through make itself, shortened by its variables (DEMO_STEPS, DEMO_LIMIT) and pointed at the
test's own environment. Every `thinkrl` line of README.md's bash blocks is either run here, as the real
`thinkrl` executable in a scratch directory, shortened (2 steps of 16 tokens, a few problems; the example study
on that budget), or listed in
NOT_HERE with the reason (it needs a hub model). A README line in neither table fails the test, so a new
command is run as soon as it is documented. test_readme.py checks every documented line up to the work
(options, keys, values); this file does the work.
"""

from __future__ import annotations

import json
import os
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from test_readme import ROOT, documented_commands

pytestmark = pytest.mark.slow

BIN = Path(sys.executable).parent  # the environment these tests run in: its thinkrl and python
SHORT = "-o train.steps=2 -o rollout.max_new_tokens=16 -o rollout.group_size=4 -o verifier.workers=1"

# README line (after `thinkrl`) -> the line as run here; in order, since later lines read the runs of earlier ones
RUN_HERE = {
    "--help": "--help",
    "train": f"train --output-dir runs/a {SHORT}",
    "train --plugins examples/custom_method --method vanilla_pg": f"train --plugins examples/custom_method --method vanilla_pg "
    f"--output-dir runs/b {SHORT}",
    "config --method ctpo": "config --method ctpo",
    "config my_run.yaml": "config my_run.yaml",  # the README's own my_run.yaml (a hub model: previewed, never loaded)
    "methods grpo": "methods grpo",
    "train --dry-run --processes 2 --sharding fsdp2 --device cuda": "train --dry-run --processes 2 --sharding fsdp2 --device cuda",
    "eval --model runs/try": "eval --model runs/try --limit 3 --max-new-tokens 16",
    "plot runs/a runs/b --out fig.png --smooth 5": "plot runs/a runs/b --out fig.png --smooth 5",
    "compare runs/a runs/b": "compare runs/a runs/b",
    "show runs/a --step 40": "show runs/a --step 2",
    "export runs/a --out exported --merge": "export runs/a --out exported --merge",
    "train --method grpo --recipe ctpo": f"train --method grpo --recipe ctpo --output-dir runs/c {SHORT} -o rollout.group_size=8",
    # the example study's arms, seeds and metrics on the budget above (the file as it is trains 8 x 6 full demo steps:
    # minutes, for nothing test_study.py's tiny runs do not check)
    "study examples/study/grpo_vs_dr_grpo.yaml --jobs 2": "study short_study.yaml --jobs 2",
    "probe --from runs/demo -o rollout.group_size=4": "probe --from runs/a -o rollout.group_size=4 --replicates 3 --stale-prompts 2 "
    "--reference-prompts 2 -o verifier.workers=1",
}
NOT_HERE = {
    "train my_run.yaml --output-dir runs/mine": "trains Qwen/Qwen2.5-Math-1.5B, a hub model",
    "train --method dapo --model Qwen/Qwen2.5-Math-1.5B --dataset data/train.jsonl -o rollout.max_new_tokens=3000": "a hub model",
    "train --resume runs/mine -o train.steps=600": "continues the Qwen run above (test_bundled_slow.py resumes a bundled-model run)",
    "train my_run.yaml": "the Qwen run on several GPUs (tests/test_fsdp.py runs the FSDP config on the CPU, bundled model)",
    "eval --model runs/mine --dataset aime24,aime25 --preset reasoning --n 16": "evaluates the Qwen run above",
    "eval --model Qwen/Qwen2.5-Math-1.5B --dataset aime24 --preset greedy --json": "a hub model",
}


def run(args: list[str], cwd: Path) -> str:
    env = {**os.environ, "COLUMNS": "160"}  # rich's tables at a terminal's width, not a pipe's 80 columns
    proc = subprocess.run(args, cwd=cwd, capture_output=True, text=True, stdin=subprocess.DEVNULL, env=env)
    assert proc.returncode == 0, f"{shlex.join(args)} exited {proc.returncode}\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
    return proc.stdout + proc.stderr


def steps(run_dir: Path) -> list[int]:
    return [json.loads(line)["step"] for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


def test_make_demo_runs_and_prints_accuracy_before_and_after(tmp_path):
    demo = tmp_path / "demo"
    venv = BIN.parent
    # -o: the environment is installed already (make's install step would make a venv there)
    make = ["make", "-C", str(ROOT), "demo", f"VENV={venv}", "-o", f"{venv}/.installed-stamp", f"DEMO_DIR={demo}"]
    out = run([*make, "DEMO_STEPS=2", "DEMO_LIMIT=4"], tmp_path)
    assert "held-out arith (4 problems, greedy):" in out and " before -> " in out, out[-2000:]
    assert "training: 2 steps in" in out and "the whole demo" in out, out[-2000:]
    assert steps(demo) == [1, 2]
    for step in (0, 2):  # the starting model is the run's step 0; the trained one its last step
        summary = json.loads((demo / "eval" / f"step-{step}" / "arith" / "summary.json").read_text())
        assert summary["problems"] == 4
    assert json.loads((demo / "eval" / "step-0" / "arith" / "settings.json").read_text())["model"] == "smollm2-135m"


def test_every_readme_command_is_run_here_or_says_why_not():
    readme = [shlex.join(c.args) for c in documented_commands([ROOT / "README.md"])]
    assert sorted(readme) == sorted([*RUN_HERE, *NOT_HERE])


def test_the_readme_commands_on_the_bundled_model_run(tmp_path):
    for name in ("configs", "examples"):
        (tmp_path / name).symlink_to(ROOT / name)
    block = (ROOT / "README.md").read_text().split("# my_run.yaml")[1].split("```")[0]
    (tmp_path / "my_run.yaml").write_text(block.split("\n", 1)[1])
    study = yaml.safe_load((ROOT / "examples" / "study" / "grpo_vs_dr_grpo.yaml").read_text())
    budget = ["train.steps=3", "rollout.max_new_tokens=16", "rollout.group_size=4", "verifier.workers=1"]  # its metrics: the last 3 steps
    study["overrides"] = [o for o in study["overrides"] if not o.startswith("train.steps=")] + budget
    (tmp_path / "short_study.yaml").write_text(yaml.safe_dump(study))
    outputs = {}
    for line, shortened in RUN_HERE.items():
        if "runs/try" in line:  # the README's name for any run: the one trained above
            shutil.copytree(tmp_path / "runs" / "a", tmp_path / "runs" / "try")
        outputs[line] = run([str(BIN / "thinkrl"), *shlex.split(shortened)], tmp_path)
    assert "train" in outputs["--help"] and "eval" in outputs["--help"]
    assert steps(tmp_path / "runs" / "a") == steps(tmp_path / "runs" / "b") == [1, 2]
    metrics = [json.loads(line) for line in (tmp_path / "runs" / "a" / "metrics.jsonl").read_text().splitlines()]
    assert all(m["length/mean"] > 0 and m["time/generate"] > 0 for m in metrics)
    assert (tmp_path / "runs" / "a" / "config.yaml").is_file() and (tmp_path / "runs" / "a" / "rollouts.jsonl").stat().st_size > 0
    assert "vanilla_pg" in (tmp_path / "runs" / "b" / "config.yaml").read_text()
    assert "method.name = 'ctpo'" in outputs["config --method ctpo"]
    assert "model.name = 'Qwen/Qwen2.5-Math-1.5B'  (my_run.yaml:" in outputs["config my_run.yaml"]
    assert outputs["methods grpo"].startswith("GRPO")
    planned = outputs["train --dry-run --processes 2 --sharding fsdp2 --device cuda"]
    assert "memory estimate per trainer device (x2), GPU memory" in planned and "FSDP2 unsharded" in planned, planned
    summary = json.loads((tmp_path / "runs" / "try" / "eval" / "step-2" / "arith" / "summary.json").read_text())
    assert summary["problems"] == 3 and summary["settings"]["checkpoint_step"] == 2  # the run's newest checkpoint
    assert (tmp_path / "fig.png").stat().st_size > 0
    compared = outputs["compare runs/a runs/b"]
    assert "grpo" in compared and "vanilla_pg" in compared and "reward final" in compared, compared  # a column per run
    assert "step 2" in outputs["show runs/a --step 40"].lower()
    assert (tmp_path / "exported" / "config.json").is_file() and list((tmp_path / "exported").glob("*.safetensors"))
    assert (
        "recipe ctpo (the regime of ctpo, applied to grpo): rollout.group_size=8 (recipe: 16, yours wins), train.mini_batches=4"
        in (outputs["train --method grpo --recipe ctpo"])
    )
    report = json.loads((tmp_path / "studies" / "grpo_vs_dr_grpo" / "report.json").read_text())
    assert report["missing"] == [] and [len(c["seeds"]) for c in report["comparisons"]] == [4, 4]
    assert all(c["mde"] is not None for c in report["comparisons"])
    probe = json.loads((tmp_path / "probe" / "probe.json").read_text())
    assert probe["replicates"] == [3] and set(probe["methods"]) == {"grpo", "gspo", "cispo"}
