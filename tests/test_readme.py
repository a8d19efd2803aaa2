"""Every `thinkrl ...` command in the bash blocks of README.md and docs/*.md runs as written, up to the work.

Each line goes through the real CLI (thinkrl.cli.app) with the function that does the work replaced by a stub:
`thinkrl train`'s stub resolves the config (every option, -o key and method field checked, reward functions
imported); `thinkrl eval`'s resolves the preset for each dataset; plot, compare, show and export get empty
runs and write nothing. `thinkrl config` and `thinkrl methods` run for real. So a misspelt option, config key,
choice or value in the documentation fails here, and nothing is downloaded, loaded or trained (lines that need
a GPU, the hub or an existing run are checked the same way).

A yaml block whose first line is a comment naming a file (`# my_run.yaml: ...`) is written to that file in the
working directory first, so `thinkrl train my_run.yaml` checks the block's keys too. Commands run in a
temporary directory that links configs/ and examples/; a `--resume DIR` that does not exist gets a default
run config there. Every relative link in those documents must name a file of this repository (and, for a
markdown file, one of its headings).
"""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass, replace
from pathlib import Path

import pytest
from typer.testing import CliRunner

from thinkrl.cli import app
from thinkrl.config import Config
from thinkrl.settings import load_config, resolve, save_config

ROOT = Path(__file__).resolve().parent.parent
DOCUMENTS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
FENCE = re.compile(r"^[ \t]*```(\w*)[ \t]*\n(.*?)^[ \t]*```", re.M | re.S)
ENV = re.compile(r"[A-Za-z_][A-Za-z0-9_]*=\S*")
COMMAND_NAMES = ("train", "config", "eval", "methods", "plot", "compare", "show", "export")


@dataclass
class Command:
    where: str  # file:line
    args: list[str]  # after `thinkrl`


def fenced(path: Path, lang: str) -> list[tuple[int, str]]:
    """(first line number, body) of each ```lang block in `path`."""
    text = path.read_text()
    return [(text.count("\n", 0, m.start(2)) + 1, m.group(2)) for m in FENCE.finditer(text) if m.group(1) == lang]


def thinkrl_args(line: str) -> list[str] | None:
    """The arguments after `thinkrl` on a shell line (`thinkrl ...`, `VAR=x thinkrl ...` or `... $(which thinkrl) ...`)."""
    tokens = shlex.split(line, comments=True)
    for i, token in enumerate(tokens):
        if token == "thinkrl" and all(ENV.fullmatch(t) for t in tokens[:i]):
            return tokens[i + 1 :]
        if token == "thinkrl)" and i > 0 and tokens[i - 1] == "$(which":
            return tokens[i + 1 :]
    return None


def documented_commands(paths: list[Path] = DOCUMENTS) -> list[Command]:
    found = []
    for path in paths:
        shown = path.relative_to(ROOT) if path.is_relative_to(ROOT) else path.name
        for start, body in fenced(path, "bash"):
            first, text = None, ""
            for offset, line in enumerate(body.splitlines()):
                first = start + offset if first is None else first  # a continued command is numbered by its first line
                if line.endswith("\\"):
                    text += line[:-1] + " "
                    continue
                args = thinkrl_args(text + line)
                if args is not None:
                    found.append(Command(f"{shown}:{first}", args))
                first, text = None, ""
    return found


def named_yaml_files(paths: list[Path] = DOCUMENTS) -> dict[str, str]:
    """{file name: text} of the yaml blocks whose first line is `# NAME.yaml...`."""
    out = {}
    for path in paths:
        for _, body in fenced(path, "yaml"):
            m = re.match(r"#\s*([\w.-]+\.ya?ml)\b", body)
            if m:
                out[m.group(1)] = body
    return out


def subcommand(args: list[str]) -> str | None:
    """The command a line runs (`train`, `eval`, ...), or None for `thinkrl --help`."""
    return next((a for a in args if not a.startswith("-")), None)


@pytest.fixture
def workdir(tmp_path, monkeypatch) -> Path:
    for name in ("configs", "examples"):
        (tmp_path / name).symlink_to(ROOT / name)
    for name, text in named_yaml_files().items():
        (tmp_path / name).write_text(text)
    monkeypatch.chdir(tmp_path)
    return tmp_path


@pytest.fixture
def trained(monkeypatch) -> list:
    """Stub out the work of every command; returns the resolved train configs, in call order."""
    import thinkrl.evaluation.evaluate
    import thinkrl.probe.session
    import thinkrl.run.export
    import thinkrl.run.intact
    import thinkrl.run.plot
    import thinkrl.run.readers
    import thinkrl.serve
    import thinkrl.study.command
    import thinkrl.study.grid
    import thinkrl.study.report
    import thinkrl.train
    from thinkrl.evaluation.settings import resolve_settings
    from thinkrl.study.spec import load_study
    from thinkrl.verifier.rewards import RewardSet

    calls = []

    def train(cfg, resume: bool = False, **options):
        cfg = resolve(cfg)
        RewardSet(cfg.reward.functions)  # imports each module:function and checks it takes (completion, answer, **options)
        calls.append(cfg)
        return Path(cfg.output_dir)

    def evaluate(settings, datasets, output, cfg=None):
        resolved = [resolve_settings(replace(settings, dataset=d), cfg or Config()) for d in datasets or [""]]
        return [{"dataset": s.dataset, "problems": 0, "metrics": {}, "settings": {}} for s in resolved]

    monkeypatch.setattr(thinkrl.train, "train", train)
    monkeypatch.setattr(thinkrl.evaluation.evaluate, "evaluate", evaluate)
    monkeypatch.setattr(thinkrl.run.readers, "load_runs", lambda paths: [])
    monkeypatch.setattr(thinkrl.run.readers, "compare_rows", lambda runs, tail: ([""], []))
    monkeypatch.setattr(thinkrl.run.readers, "rollout_groups", lambda path, step: (step or 1, []))
    monkeypatch.setattr(thinkrl.run.plot, "plot_runs", lambda runs, out, smooth, title, metrics: out)
    monkeypatch.setattr(thinkrl.run.export, "export", lambda source, out, merge, dtype: out)
    # a study's grid and a probe's measurements are real runs: stubbed like training (their files are checked)
    monkeypatch.setattr(thinkrl.study.grid, "run_grid", lambda study, study_dir, jobs: [])
    monkeypatch.setattr(
        thinkrl.study.report, "write_report", lambda study, study_dir: {"comparisons": [], "missing": [], "arms": {}, "threads": {}}
    )
    monkeypatch.setattr(
        thinkrl.study.command, "_declared", lambda directory: load_study(ROOT / "examples" / "study" / f"{directory.name}.yaml")
    )
    monkeypatch.setattr(thinkrl.probe.session, "run_probe", lambda cfg, ps, ckpt=None, renyi=False: ([], {"seconds": 0.0}))
    monkeypatch.setattr(thinkrl.run.intact, "find_checkpoint", lambda arg: (Path(arg), Path(arg) / "checkpoints" / "step-1"))
    monkeypatch.setattr(thinkrl.serve, "start", lambda command, env: None)  # thinkrl serve: the command built, no vLLM started
    return calls


def check(command: Command, trained: list) -> None:
    """Run one documented command through the CLI (work stubbed out); fail naming the line and the error."""
    args, name = command.args, subcommand(command.args)
    flag = "--resume" if name == "train" else "--from" if name == "probe" else None  # a run the command reads
    if flag and flag in args:
        run_dir = Path(args[args.index(flag) + 1])
        if not (run_dir / "config.yaml").is_file():
            run_dir.mkdir(parents=True, exist_ok=True)
            save_config(resolve(load_config()), run_dir / "config.yaml")
    before = len(trained)
    result = CliRunner().invoke(app, args)
    error = f"{result.exception!r}\n" if result.exception and not isinstance(result.exception, SystemExit) else ""
    assert result.exit_code == 0, f"{command.where}: thinkrl {shlex.join(args)}\n{error}{result.output}"
    if name == "train" and "--help" not in args:  # a dry run resolves everything and stops short of training
        dry = "--dry-run" in args
        assert len(trained) == before + (not dry), f"{command.where}: the command {'trained' if dry else 'did not reach training'}"


COMMANDS = documented_commands()


def test_the_documents_hold_commands_to_check():
    readme = [c for c in COMMANDS if c.where.startswith("README.md")]
    assert len(readme) >= 10, readme
    names = {subcommand(c.args) for c in COMMANDS}
    assert set(COMMAND_NAMES) <= names, names
    assert any("-o" in c.args for c in readme), "README's train lines set config keys with -o"


README_LINES = 120  # a newcomer's five minutes: measurements and their machines live in docs/benchmarks.md


def test_the_readme_is_short_and_holds_no_measurement_log():
    text = (ROOT / "README.md").read_text()
    assert len(text.splitlines()) <= README_LINES, f"README.md has {len(text.splitlines())} lines; move detail to docs/"
    commit = re.search(r"\b(?=[0-9]*[a-f])(?=[a-f]*[0-9])[0-9a-f]{7,40}\b", text)  # hex with a letter and a digit
    assert not commit, f"a commit hash in README.md ({commit and commit.group()}): measurements go to docs/benchmarks.md"
    links = re.findall(r"\]\((docs/benchmarks\.md[^)]*)\)", text)
    assert len(links) == 1, f"README.md links docs/benchmarks.md once (its one speed claim), not {links}"


@pytest.mark.parametrize("command", COMMANDS, ids=[c.where for c in COMMANDS])
@pytest.mark.plain
def test_documented_command_runs_as_written(command, workdir, trained):
    check(command, trained)


def test_the_yaml_files_a_command_trains_from_are_written(workdir, trained):
    for name in named_yaml_files():
        check(Command(f"yaml block {name}", ["train", name]), trained)
        assert trained[-1].model.name  # resolved from the block


@pytest.mark.parametrize(
    "line",
    [
        "thinkrl train --no-such-option",
        "thinkrl train -o train.no_such_key=1",
        "thinkrl train --method grpo -o method.no_such_field=1",
        "thinkrl train -o rollout.engine=warp",
        "thinkrl train -o 'reward.functions=[{name: f, function: \"thinkrl.rewards:no_such_function\"}]'",
        "thinkrl eval --model runs/a --no-such-flag 1",
        "thinkrl eval --preset no_such_preset",
        "thinkrl eval --dataset aime24 --n 0",
        "thinkrl plot runs/a --smooth five",
        "thinkrl plot runs/a --out fig.gif",
        "thinkrl show runs/a --step last",
        "thinkrl export runs/a",
        "thinkrl methods no_such_method",
        "thinkrl no-such-command",
        "thinkrl --no-such-global train",
    ],
)
def test_a_wrong_option_or_key_in_a_document_fails(line, workdir, trained):
    args = thinkrl_args(line)
    assert args is not None
    with pytest.raises(AssertionError):
        check(Command("synthetic", args), trained)


def test_extraction_reads_continued_prefixed_and_launched_lines(tmp_path):
    doc = tmp_path / "doc.md"
    doc.write_text(
        "```bash\n"
        "thinkrl train \\\n  -o train.lr=1e-4   # a comment\n"
        "THINKRL_DATA_DIR=data thinkrl eval --dataset aime24\n"
        "torchrun --nproc_per_node 2 $(which thinkrl) train -o rollout.prompts_per_step=4\n"
        "make demo   # thinkrl train is in a comment here\n"
        "```\n"
        "```yaml\n# run.yaml: a file\ntrain: {steps: 1}\n```\n"
    )
    found = documented_commands([doc])
    assert [c.args for c in found] == [
        ["train", "-o", "train.lr=1e-4"],
        ["eval", "--dataset", "aime24"],
        ["train", "-o", "rollout.prompts_per_step=4"],
    ]
    assert [c.where.rsplit(":", 1)[1] for c in found] == ["2", "4", "5"]
    assert named_yaml_files([doc]) == {"run.yaml": "# run.yaml: a file\ntrain: {steps: 1}\n"}


LINK = re.compile(r"\]\(([^)\s]+)\)")


def anchors(path: Path) -> set[str]:
    """GitHub's anchors for the headings of a markdown file."""
    out = set()
    for line in path.read_text().splitlines():
        m = re.match(r"#+\s+(.*)", line)
        if m:
            out.add(re.sub(r"[^\w\- ]", "", m.group(1).strip().lower()).replace(" ", "-"))
    return out


def test_every_link_in_the_documents_points_at_a_file_and_heading_here():
    broken = []
    for path in DOCUMENTS:
        text = FENCE.sub("", path.read_text())  # not inside code blocks
        for target in LINK.findall(text):
            if re.match(r"[a-z]+:", target):  # https:, mailto:
                continue
            file, _, anchor = target.partition("#")
            resolved = (path.parent / file).resolve() if file else path
            if not resolved.exists() or not resolved.is_relative_to(ROOT):
                broken.append(f"{path.relative_to(ROOT)}: {target}")
            elif anchor and resolved.suffix == ".md" and anchor not in anchors(resolved):
                broken.append(f"{path.relative_to(ROOT)}: {target} (no such heading)")
    assert not broken, broken
