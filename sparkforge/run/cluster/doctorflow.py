"""The doctor's executor: one immutable plan, the stages of a registry run in the registry's order into the report,
each reading only the typed results of the earlier stages it declares it needs; the first that fails makes the
rest skip, naming it (a later stage's answer would only restate the cause, or hang on it).

A stage is one `Entry` of the doctor's registry whose `run` is a `DoctorStage`: its function, the result type it
gives, the result types it needs and whether it is expensive (a torch import per node, the ranks themselves:
`--quick` leaves those out). The order is the registry's, checked here against what each stage needs. Nothing
is shared but the plan (frozen) and the results (frozen, each given by one stage); results that hold containers
or background probes are released when the doctor ends, whatever happened.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any, Generic, Protocol, TypeVar, cast, runtime_checkable

from sparkforge.context import Session
from sparkforge.errors import RunError
from sparkforge.extensions import Entry, Registry
from sparkforge.report import Check, Report
from sparkforge.run.facts import DoctorOptions, NodeFacts
from sparkforge.run.nodes import NodeEngine

R = TypeVar("R")
QUICK = "--quick stops after the cheap stages"


@dataclass(frozen=True)
class DoctorPlan:
    """What one doctor run is asked: the nodes (head first) and the options, decided once before it starts."""

    engines: tuple[NodeEngine, ...]
    options: DoctorOptions

    @property
    def expensive(self) -> bool:
        """The expensive stages run (not --quick, and the sanity run asked for)."""
        return self.options.sanity and not self.options.quick

    @property
    def held(self) -> bool:
        """The sanity ranks start early and report the image's libnccl themselves (one torch import per node)."""
        return self.expensive and self.options.nccl_source == "image"


@runtime_checkable
class Releases(Protocol):
    """A result holding containers or a background probe: `release()` removes them (once; safe to repeat)."""

    def release(self) -> None: ...


@runtime_checkable
class Contributes(Protocol):
    """A result that adds to what the launch uses on each node (address, env, mounts): `onto` gives the facts
    with its part applied (new objects; the earlier ones are left as they were)."""

    def onto(self, facts: tuple[NodeFacts, ...]) -> tuple[NodeFacts, ...]: ...


class Found:
    """The results a stage may read: those of the stages it declared it needs, by result type."""

    def __init__(self, results: Mapping[type, object]) -> None:
        self._results = MappingProxyType(dict(results))

    def __getitem__(self, kind: type[R]) -> R:
        try:
            return cast(R, self._results[kind])
        except KeyError:
            raise KeyError(f"{kind.__name__} is not among the results this stage declared it needs") from None

    def results(self) -> tuple[object, ...]:
        return tuple(self._results.values())

    def facts(self) -> tuple[NodeFacts, ...]:
        """Each node's facts as the launch would use them, from the results that contribute (in stage order)."""
        facts: tuple[NodeFacts, ...] = ()
        for result in self._results.values():
            if isinstance(result, Contributes):
                facts = result.onto(facts)
        return facts


@dataclass(frozen=True)
class DoctorStage(Generic[R]):
    """One doctor stage: it fills in the Check it is given from the plan and the results it `needs`, and returns
    its own result (an instance of `gives`; None where it gives nothing a later stage reads)."""

    call: Callable[[Check, DoctorPlan, Found], R]
    gives: type[R] | None = None
    needs: tuple[type, ...] = ()
    expensive: bool = False  # a torch import per node or the ranks themselves: after every cheap stage passed

    def __call__(self, check: Check, plan: DoctorPlan, found: Found) -> R:
        return self.call(check, plan, found)


Stages = Registry[DoctorStage[Any]]


def check_order(stages: Iterable[Entry[DoctorStage[Any]]]) -> None:
    """The registry's order holds: every result a stage needs is given by an earlier stage, and no cheap stage
    needs an expensive one's (--quick leaves those out). ValueError naming the stage otherwise."""
    given: dict[type, Entry[DoctorStage[Any]]] = {}
    for entry in stages:
        for kind in entry.run.needs:
            giver = given.get(kind)
            if giver is None:
                raise ValueError(
                    f"doctor stage {entry.name!r} needs {kind.__name__}, which no earlier stage gives"
                )
            if giver.run.expensive and not entry.run.expensive:
                raise ValueError(
                    f"doctor stage {entry.name!r} is cheap but needs {kind.__name__} of the expensive {giver.name!r}"
                )
        if entry.run.gives is not None:
            if entry.run.gives in given:
                raise ValueError(f"{entry.run.gives.__name__} is given by two doctor stages")
            given[entry.run.gives] = entry


def run_stages(session: Session, report: Report, plan: DoctorPlan, stages: Stages) -> Found:
    """Run `stages` in order into `report`: each gets the plan and the results it needs; the first that fails
    makes the rest skip, naming it. The expensive stages run only when the plan asks for them (with --quick they
    are reported as not run). Every result is released before this returns or raises; returns them all."""
    check_order(stages)
    echo = session.echo
    chosen = [e for e in stages if plan.expensive or not e.run.expensive]
    shown = [e for e in stages if e in chosen or (plan.options.quick and e.run.expensive)]
    results: dict[type, object] = {}
    held: list[object] = []  # every result, for the release (a failed stage's too: its containers exist)
    blocked: str | None = None
    try:
        index = 0
        for entry in shown:
            if blocked or entry not in chosen:
                why = f"stage '{blocked}' failed" if blocked else f"{QUICK} ({_cheap_span(chosen)})"
                report.add(Check(entry.name, "skipped", f"not run: {why}"))
                continue
            index += 1
            echo(
                f"doctor: {index}/{len(chosen)} {entry.name} ..."
            )  # the stage count: how far the wait has come
            with report.timed(entry.name) as check:
                result = _run_one(entry, check, plan, results)
            if result is not None:
                held.append(result)
                results[type(result)] = result
            echo(f"doctor: {entry.name} {check.status} ({check.duration_s:.1f}s) {check.reason}")
            if check.status == "failed":
                blocked = entry.name
    finally:
        release(held)
    return Found(results)


def _run_one(
    entry: Entry[DoctorStage[Any]], check: Check, plan: DoctorPlan, results: Mapping[type, object]
) -> Any:
    stage = entry.run
    lacking = [k.__name__ for k in stage.needs if k not in results]
    if lacking:  # an earlier stage passed without giving it (nothing of that kind to look at)
        check.status, check.reason = "skipped", f"not run: no {', '.join(lacking)} from the earlier stages"
        return None
    try:
        result = stage(check, plan, Found({k: results[k] for k in stage.needs}))
    except RunError as exc:  # a node that stops answering mid-stage fails the stage, named
        check.status, check.reason = "failed", str(exc)
        return None
    if result is not None and (stage.gives is None or not isinstance(result, stage.gives)):
        raise TypeError(
            f"doctor stage {entry.name!r} returned a {type(result).__name__}, not what it declares"
        )
    return result


def _cheap_span(chosen: Sequence[Entry[DoctorStage[Any]]]) -> str:
    return f"{chosen[0].name} to {chosen[-1].name}" if chosen else "none"


def release(results: Iterable[object]) -> None:
    """Release every result that holds something, the latest first; each is tried even when one raises."""
    errors: list[BaseException] = []
    for result in reversed(list(results)):
        if isinstance(result, Releases):
            try:
                result.release()
            except Exception as exc:  # a node gone mid-removal: the others are still removed
                errors.append(exc)
    if errors:
        raise errors[0]
