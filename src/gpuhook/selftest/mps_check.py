"""``mps <group>``: a client container of each MPS share group (granted all of the group's
GPUs, as a client must be) gets the limits its decision record states, and the group's control
daemon answers it through the pipe folder gpuhook mounted; with ``--cuda`` the CUDA program runs
as an MPS client there (its SM count shows the thread limit)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from gpuhook.errors import GpuhookError
from gpuhook.pipeline import sharing
from gpuhook.selftest import bundle
from gpuhook.selftest.checks import CAPABILITIES, CDI_KEY, cuda_result, record_problem
from gpuhook.selftest.report import FAIL, PASS, SKIP, Result

if TYPE_CHECKING:
    from gpuhook.pipeline.sharing import Group
    from gpuhook.selftest.session import Container, Session

LIMITS = ("CUDA_MPS_ACTIVE_THREAD_PERCENTAGE", "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT")


def check_mps(session: Session, gpus: set[int]) -> list[Result]:
    """One line per share group that has a GPU among ``gpus`` (the devices under test)."""

    config = session.config
    if not config.mps.enabled:
        return [Result("mps", SKIP, "MPS not configured (no mps.gpus or mps.groups)")]
    if session.inventory is None:
        return [Result("mps", SKIP, "no inventory")]
    try:
        groups = sharing.resolve_groups(config.mps, session.inventory, config.source)
    except GpuhookError as exc:
        return [Result("mps", FAIL, str(exc), f"fix mps.* in {config.source}")]
    results: list[Result] = []
    for group in groups:
        if any(g.index in gpus for g in group.gpus):
            results += check_group(session, group)
    return results or [Result("mps", SKIP, "no MPS-shared GPU among the devices tested")]


def check_group(session: Session, group: Group) -> list[Result]:
    label = f"mps {group.name}"
    annotations = {f"{CDI_KEY}-{i}": f"nvidia.com/gpu={g.uuid}" for i, g in enumerate(group.gpus)}
    c = session.container(label, annotations, [CAPABILITIES])
    failed = session.failed(label, c)
    results = [failed or judge_group(group, c)]
    if session.cuda is not None and session.cuda.path:
        if failed is not None:
            results.append(Result(f"cuda {label}", SKIP, f"its container failed (see {label})"))
        else:
            pct = c.seen.env.get(LIMITS[0])
            note = f"MPS active thread percentage {pct}" if pct else "MPS client"
            uuid = group.gpus[0].uuid if len(group.gpus) == 1 else ""
            results.append(cuda_result(f"cuda {label}", c, uuid, note))
    return results


def judge_group(group: Group, c: Container) -> Result:
    label = f"mps {group.name}"
    problem = record_problem(c, [g.uuid for g in group.gpus])
    if problem:
        return Result(label, FAIL, problem, "gpuhook doctor (state dir)")
    plan = c.record.view.mps if c.record is not None else None
    if plan is None:
        return Result(
            label,
            FAIL,
            f"the record of {c.container_id} holds no MPS plan: the container was not made a "
            "client of the group's daemon",
            "gpuhook doctor (mps)",
        )
    wanted = dict(e.split("=", 1) for e in plan.env if "=" in e)
    for key in bundle.ENV_NAMES:
        if key in wanted and c.seen.env.get(key) != wanted[key]:
            return Result(
                label,
                FAIL,
                f"the client's {key} is {c.seen.env.get(key, 'unset')}; its record says "
                f"{wanted[key]}",
                "gpuhook doctor (mps)",
            )
    answer = _daemon_answer(c)
    if answer.startswith("!"):
        return Result(
            label,
            FAIL,
            f"the control daemon did not answer the client: {answer[1:]}",
            f"gpuhook mps status {group.name}; gpuhook mps start {group.name}",
        )
    limits = [f"{k}={c.seen.env[k]}" for k in LIMITS if k in c.seen.env] or ["no limits"]
    gpus = ",".join(str(g.index) for g in group.gpus)
    return Result(
        label,
        PASS,
        f"GPU {gpus}: the client got {', '.join(limits)}, pipe "
        f"{c.seen.env.get('CUDA_MPS_PIPE_DIRECTORY', '?')}; {answer}",
    )


def _daemon_answer(c: Container) -> str:
    """What the daemon said to ``get_default_active_thread_percentage`` from inside, or why it
    said nothing (prefixed ``!``)."""
    section = c.seen.sections.get(bundle.MPS)
    if section is None:
        return "the daemon was not asked (the driver has no nvidia-cuda-mps-control)"
    if section.code != 0 or not section.last():
        said = section.last() or "no output"
        return f"!nvidia-cuda-mps-control exited with {section.code}: {said}"
    return f"the control daemon answered {bundle.MPS_QUESTION}: {section.last()}"
