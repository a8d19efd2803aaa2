"""Rows of a Hugging Face Hub dataset, failing fast in one line when the hub cannot be reached.

`datasets` retries an unreachable hub for about half a minute per file before it gives up. thinkrl asks the
hub once first (one request, no retries) and stops at once when that fails, saying how to go on offline.
With HF_HUB_OFFLINE=1 (or HF_DATASETS_OFFLINE=1) the network is not tried at all: only a copy already in the
Hugging Face cache is read.
"""

from __future__ import annotations

import os
from typing import Any

from thinkrl.errors import UserError

PROBE_TIMEOUT_S = 10  # one request; an unreachable name fails at once, a silent network after this long
_TRUE = {"1", "on", "yes", "true"}


def hub_offline() -> bool:
    """HF_HUB_OFFLINE / HF_DATASETS_OFFLINE set to a true value, as huggingface_hub reads them."""
    return any(os.environ.get(k, "").strip().lower() in _TRUE for k in ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE"))


def offline_fix(name: str, flag: str, alias: bool) -> str:
    """How to go on without the hub, in the terms of the command that asked (flag: --dataset, data.name, eval.datasets)."""
    given = "--dataset FILE" if flag == "--dataset" else f"{flag}=FILE"
    here = f"set THINKRL_DATA_DIR to a folder holding {name}.jsonl" if alias else "THINKRL_DATA_DIR holds copies of the aliases only"
    return f"offline, pass {given} (a local .jsonl/.parquet/.csv copy) or {here}"


def unreachable(path: str, split: str, why: str, fix: str) -> UserError:
    return UserError(f"could not load dataset '{path}' (split {split!r}) from the Hugging Face Hub: {why}; {fix}")


def probe_hub(path: str, split: str, fix: str) -> None:
    """One request for the dataset's card: fails at once, without retries, when the hub cannot be reached. A hub
    that answers (even 'not found' or 'gated') passes: load_dataset then gives its own, specific error."""
    from huggingface_hub import HfApi
    from huggingface_hub.errors import HfHubHTTPError

    try:
        HfApi().dataset_info(path, timeout=PROBE_TIMEOUT_S)
    except HfHubHTTPError:  # the hub answered
        return
    except ValueError:  # not a hub id at all (huggingface_hub's validation): load_dataset says what is wrong
        return
    except Exception as e:  # DNS, refused connection, timeout, proxy, TLS: nothing a retry would fix soon
        first = (str(e).strip().splitlines() or [""])[0][:200]
        why = f"the hub is unreachable ({type(e).__name__}: {first}; tried once)"
        raise unreachable(path, split, why, f"{fix}; a copy in the Hugging Face cache is used with HF_HUB_OFFLINE=1") from None


def read_hub(path: str, subset: str | None, split: str, name: str, flag: str = "data.name", alias: bool = False) -> list[dict[str, Any]]:
    """Rows of hub dataset `path` (`subset`, `split`). name: what the user asked for (an alias or the id);
    flag: the option that names datasets in the command that asks (for the fix in the message)."""
    fix = offline_fix(name, flag, alias)
    offline = hub_offline()
    if not offline:
        probe_hub(path, split, fix)
    try:
        import datasets

        datasets.disable_progress_bars()  # thinkrl's own display says what it loads
        ds = datasets.load_dataset(path, subset, split=split)
    except Exception as e:  # network, missing split, private repo: all end up here
        first = str(e).strip().splitlines()[0][:200] if str(e).strip() else type(e).__name__
        if offline:
            first = f"HF_HUB_OFFLINE is set, so the hub was not tried, and the Hugging Face cache has no usable copy ({first})"
        raise unreachable(path, split, first, fix) from None
    return list(ds)
