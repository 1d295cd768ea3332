"""Two images benched in turn (`bench --baseline OLD --image NEW`): the schedule, planned before anything runs.

The machine drifts from one bench to the next (benchmarks/bench-drift.md); benching every baseline first and then
every candidate puts that drift on one side only, where it reads as a change of the image. Interleaved (the
default: A B A B ..., one server at a time), each image's benches are spread over the whole run and the drift
falls on both equally; `--no-interleave` runs the blocks (A A .. B B ..), as two benches run by hand one after the
other. Both images must be local (the engine has them): a run serves each image several times and never pulls.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from sparkforge.errors import InputError

ROLES = ("baseline", "candidate")
LETTERS = {"baseline": "A", "candidate": "B"}


@dataclass(frozen=True)
class Slot:
    """One bench of the run: its position, whose image, which of that image's benches."""

    position: int
    role: str
    image: str
    round: int


@dataclass(frozen=True)
class PairPlan:
    """The baseline and candidate images, the benches of each, and whether they alternate."""

    baseline: str
    candidate: str
    benches: int
    interleave: bool

    def schedule(self) -> tuple[Slot, ...]:
        """The benches in the order they run: A B A B ... interleaved, else A A ... B B ...."""
        images = {"baseline": self.baseline, "candidate": self.candidate}
        order = (
            [(role, n) for n in range(self.benches) for role in ROLES]
            if self.interleave
            else [(role, n) for role in ROLES for n in range(self.benches)]
        )
        return tuple(Slot(i + 1, role, images[role], n + 1) for i, (role, n) in enumerate(order))

    def order(self) -> str:
        """The schedule in letters (A: baseline, B: candidate), e.g. `ABAB`."""
        return "".join(LETTERS[s.role] for s in self.schedule())

    def record(self) -> dict[str, Any]:
        """What every result of the run and the comparison carry (`pairing`)."""
        return {
            "baseline": self.baseline,
            "candidate": self.candidate,
            "benches_each": self.benches,
            "interleaved": self.interleave,
            "order": self.order(),
        }

    def lines(self) -> list[str]:
        """The schedule as `bench --dry` prints it."""
        how = "interleaved" if self.interleave else "in blocks (--no-interleave)"
        return [
            f"two images, {self.benches} bench(es) each, {how}: order {self.order()} (A baseline, B candidate), "
            "one server at a time, each stopped before the next starts",
            *(
                f"  {s.position}. {LETTERS[s.role]} {s.role} {s.image} (its bench {s.round})"
                for s in self.schedule()
            ),
        ]


def plan_pairs(baseline: str, candidate: str, benches: int, *, interleave: bool = True) -> PairPlan:
    """The run's plan; the images are references already checked by the boundary (plan.check_reference)."""
    if baseline == candidate:
        raise InputError(
            f"bench: --baseline {baseline} is also the --image; fix: name the image to compare against as "
            "--baseline and the new one as --image"
        )
    if benches < 1:
        raise InputError(f"bench: --benches {benches}: at least 1; fix: pass e.g. --benches 3")
    return PairPlan(baseline, candidate, benches, interleave)


def missing_images(present: dict[str, bool]) -> str:
    """Why the run cannot start when an image is not on the engine ('' when both are)."""
    gone = [image for image, here in present.items() if not here]
    if not gone:
        return ""
    return (
        f"bench: {', '.join(gone)} not on this engine; a two-image bench serves each image several times and "
        "never pulls; fix: 'invoke build' or 'invoke pull' it first (or bench the images one at a time and "
        "'invoke bench.compare' the results)"
    )
