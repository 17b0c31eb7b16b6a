"""The lab's results: one :class:`LabResult` per technique, and their table."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import Any


@dataclass
class LabResult:
    """One line of the lab's table."""

    technique: str
    kind: str
    claims: int = 0
    seconds: float = 0.0
    double_claims: int = 0
    never_claimed: int = 0
    retried_errors: int = 0
    lost: int = 0
    skipped: str = ""
    errors: list[str] = field(default_factory=list)

    @property
    def claims_per_s(self) -> float:
        """Rows handed out per second over the whole race, double claims included."""
        return self.claims / self.seconds if self.seconds > 0 else 0.0

    @property
    def verdict(self) -> str:
        """``ok``, ``UNSAFE``, ``UNSAFE (expected)`` (a broken recipe that showed its bug),
        ``no race seen`` (one that did not this run), ``error`` or ``skipped``."""
        if self.skipped:
            return "skipped"
        if self.errors:
            return "error"
        if self.double_claims or self.never_claimed:
            return "UNSAFE (expected)" if self.kind == "broken" else "UNSAFE"
        return "no race seen" if self.kind == "broken" else "ok"

    def as_dict(self) -> dict[str, Any]:
        """Every field plus ``claims_per_s`` and ``verdict``: what ``--json`` prints."""
        data = asdict(self)
        data["claims_per_s"] = round(self.claims_per_s, 1)
        data["verdict"] = self.verdict
        return data


#: The columns of :func:`format_table`.
HEADER = ("technique", "kind", "claims/s", "double claims", "never claimed", "retried", "verdict")


def format_table(results: Sequence[LabResult]) -> str:
    """The lab's result table as fixed-width text."""
    rows = [HEADER]
    for r in results:
        if r.skipped:
            rows.append((r.technique, r.kind, "-", "-", "-", "-", f"skipped: {r.skipped}"))
            continue
        verdict = r.verdict + (f" ({'; '.join(r.errors)})" if r.errors else "")
        rows.append(
            (
                r.technique,
                r.kind,
                f"{r.claims_per_s:,.0f}",
                str(r.double_claims),
                str(r.never_claimed),
                str(r.retried_errors),
                verdict,
            )
        )
    widths = [max(len(row[i]) for row in rows) for i in range(len(HEADER) - 1)]
    lines = []
    for row in rows:
        cells = [
            row[i].ljust(widths[i]) if i < 2 else row[i].rjust(widths[i])
            for i in range(len(widths))
        ]
        lines.append("  ".join([*cells, row[-1]]))
    return "\n".join(lines)
