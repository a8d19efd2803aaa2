"""The files a study reads, fingerprinted: a rerun or resume in the same study directory must read the same bytes.

A study reads its `config:` file, the data files its runs name (data.name and eval.datasets, in the config or the
overrides, when they are files) and the method files of its `plugins:` directory. Their sha256 is written to
STUDY_DIR/inputs.json when the study starts; a later `thinkrl study` in that directory recomputes them and refuses,
naming the first file that changed, appeared or vanished, before anything runs: the runs already finished were
made from the old bytes, and mixing them with new ones would compare two different studies.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

from thinkrl.errors import UserError
from thinkrl.study.spec import Study

INPUTS = "inputs.json"


def read_files(study: Study) -> list[Path]:
    """Every file the study's runs read besides the model: config, named data files, plugin files (sorted, unique)."""
    from thinkrl.study.known import arm_config

    files = [Path(study.config)] if study.config else []
    if study.plugins and Path(study.plugins).is_dir():
        files += sorted(p for p in Path(study.plugins).glob("*.py") if not p.name.startswith(("_", "test_")))
    for arm in study.arms:
        cfg = arm_config(study, arm)
        for name in [cfg.data.name, *cfg.eval.datasets] if cfg is not None else []:
            if isinstance(name, str) and Path(name).is_file():
                files.append(Path(name))
    return list(dict.fromkeys(files))


def fingerprint(study: Study) -> dict[str, str]:
    """{path as the study names it: sha256 of its bytes}."""
    return {str(p): hashlib.sha256(p.read_bytes()).hexdigest() for p in read_files(study)}


def record(study: Study, study_dir: Path) -> None:
    (study_dir / INPUTS).write_text(json.dumps(fingerprint(study), indent=1) + "\n")


def check(study: Study, study_dir: Path) -> None:
    """Refuse (one UserError naming the file and the fix) when an input differs from what inputs.json recorded. A
    study directory from before inputs.json existed gets one now."""
    path = study_dir / INPUTS
    if not path.is_file():
        record(study, study_dir)
        return
    try:
        before = json.loads(path.read_text())
        assert isinstance(before, dict)
    except (ValueError, AssertionError, UnicodeDecodeError):
        raise UserError(f"{path} is damaged: restore it, or start the study again in a new --output-dir") from None
    now = fingerprint(study)
    fix = "restore it, or run the changed study with a new --output-dir"
    for name in sorted(set(before) | set(now)):
        if name not in now:
            raise UserError(f"{name}, an input of the study in {study_dir}, is gone (or no longer read): {fix}")
        if name not in before:
            raise UserError(f"{name} is a new input of the study in {study_dir} (not read when it started): {fix}")
        if before[name] != now[name]:
            raise UserError(f"{name} changed since the study in {study_dir} started (its sha256 differs from {INPUTS}): {fix}")
