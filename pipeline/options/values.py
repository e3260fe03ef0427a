"""The values of options that name a task, its levels and signals, or a model: checked
before anything loads, each refusal a UsageError naming the option, the value and what to
do. A model's location is checked at once and without the download's retries."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from pipeline.options.errors import UsageError, usage_errors
from pipeline.options.parsing import peek_option


def check_task(name: str, config: Mapping[str, Any] | None = None):
    """The task `--task name` names (a family, a registered name or `module:Class`),
    configured with `--task_config`, whose rows at every level keep the Task API;
    UsageError otherwise."""
    from curriculum.tasks import check_task_rows, list_tasks, task_class

    if ":" not in name and name not in list_tasks():
        raise UsageError(
            "--task: unknown task",
            name,
            f"choose one of {', '.join(list_tasks())}, or give your own Task subclass as "
            "package.module:ClassName",
        )
    try:
        cls = task_class(name)
    except ValueError as err:
        raise UsageError("--task", name, str(err)) from err
    try:
        task = cls(**(config or {}))
        task.num_levels  # noqa: B018  (a dataset task reads its data here: its options' faults)
    except (TypeError, ValueError) as err:
        raise UsageError(
            f"--task_config: task {name!r} refuses it", dict(config or {}), str(err)
        ) from err
    try:
        check_task_rows(task)
    except Exception as err:  # the user's code, run once here rather than mid-training
        raise UsageError(
            "--task: the task does not keep the Task API", name, f"{type(err).__name__}: {err}"
        ) from err
    return task


def check_level(task, level: Any, option: str = "--level") -> None:
    """`level` is one of the task's levels; UsageError naming `option` otherwise."""
    if level not in task.levels:
        raise UsageError(
            f"{option} is not a level of task {task.name!r}",
            level,
            f"choose one in 1..{task.num_levels}",
        )


def check_signal_weights(task, weights: Mapping[str, Any], option: str) -> dict[str, float]:
    """Signal -> weight for `task`: every name a signal it reports, every weight finite."""
    from rewards.weights import check_weights, valid_signals

    valid = valid_signals(task)
    for name in weights:
        if name not in valid:
            raise UsageError(
                f"{option}: task {task.name!r} reports no signal {name!r}",
                name,
                f"weigh its signals, {', '.join(valid)} (e.g. {option} '{{\"correctness\": 1.0}}')",
            )
    with usage_errors():
        return check_weights(task, weights)


HUB_TIMEOUT_S = 10
"""How long the one look-up of a hub id may wait for the Hub before it counts as unreachable."""


def check_model_source(source: str, option: str = "--model_name_or_path", hub: bool = True) -> None:
    """Refuse, at once and without the download retries, a model that cannot load: a path
    that looks local and does not exist, or a hub id the Hub does not have, cannot be asked
    about, or (offline) that is not cached. UsageError `<option> (<source>): <why>: <fix>`.

    A hub id is looked up once, with a timeout of HUB_TIMEOUT_S seconds (`hub` False: not
    at all, only local paths are checked); a local folder is only checked to exist (what it
    holds, `from_pretrained` reports).
    """
    if Path(source).expanduser().exists():
        return
    from huggingface_hub import constants, snapshot_download
    from huggingface_hub.errors import (
        GatedRepoError,
        HFValidationError,
        LocalEntryNotFoundError,
        RepositoryNotFoundError,
    )
    from huggingface_hub.utils import validate_repo_id

    def refuse(why: str, fix: str) -> UsageError:
        return UsageError(option, source, f"{why}: {fix}")

    try:
        validate_repo_id(source)
    except HFValidationError:
        raise refuse("no such folder", "check the path (a hub id is namespace/name)") from None
    if not hub:
        return
    try:
        snapshot_download(source, local_files_only=True)
        cached = True
    except LocalEntryNotFoundError:
        cached = False
    if constants.HF_HUB_OFFLINE:
        if cached:
            return
        raise refuse(
            "no such folder here, and not in the Hub cache while HF_HUB_OFFLINE is set",
            "check the path, or download the model once with the Hub reachable",
        )
    import httpx
    from huggingface_hub import HfApi

    try:
        HfApi().model_info(source, timeout=HUB_TIMEOUT_S)
    except GatedRepoError:
        return  # it exists; whether this user may read it, the download says
    except RepositoryNotFoundError:
        raise refuse(
            "no such folder here, and no such model on the Hugging Face Hub",
            "check the path or the hub id (a private model needs `hf auth login`)",
        ) from None
    except (httpx.HTTPError, OSError) as err:  # no connection, a timeout, the Hub's own error
        reason = str(err).splitlines()[0] if str(err) else type(err).__name__
        if cached:
            raise refuse(
                f"the Hugging Face Hub cannot be reached ({reason})",
                "a copy is cached: set HF_HUB_OFFLINE=1 to load it without the Hub",
            ) from None
        raise refuse(
            f"no such folder here, and the Hugging Face Hub cannot be reached to fetch it ({reason})",
            "check the path, or the network (HF_ENDPOINT names the Hub)",
        ) from None


def check_local_model_early(argv: Sequence[str], *names: str) -> None:
    """The model the first of `names` gives (command line, else recipe), refused before the
    slow imports when it looks local and does not exist; hub ids wait for `check_model_source`."""
    for name in names:
        source = peek_option(argv, name)
        if source:
            check_model_source(source, "--model_name_or_path", hub=False)
            return


def check_output_path(path: str | Path, option: str, *, folder: bool = True) -> None:
    """Refuse, before anything touches the disk, an output that cannot be written there: a
    folder (`folder`) that is a file, a file that is a folder, or either under a file."""
    path = Path(path)
    if path.exists() and path.is_dir() != folder:
        kind = "a file, not a folder" if folder else "a folder, not a file"
        raise UsageError(f"{option} is {kind}", path, f"choose a {'folder' if folder else 'file'}")
    for parent in path.parents:
        if parent.exists() and not parent.is_dir():
            raise UsageError(f"{option} is inside {parent}, a file", path, "choose another path")
