"""Read JMeter's results (.jtl, CSV as testing/jmeter/run.sh writes them) and tell whether every sample passed."""

from __future__ import annotations

import csv
import io
import sys
from dataclasses import dataclass
from pathlib import Path

from testing import cli
from testing.load import percentile

# JMeter 2.13's CSV columns when the file has no header line (jmeter.properties defaults).
_DEFAULT_CSV_COLUMNS = ("timeStamp", "elapsed", "label", "responseCode", "responseMessage", "threadName",
                        "dataType", "success", "bytes", "grpThreads", "allThreads", "Latency")


@dataclass(frozen=True)
class Sample:
    """One sample of a .jtl: when it started (ms since the epoch), how long it took, and whether it passed."""

    timestamp_ms: int
    elapsed_ms: int
    label: str
    code: str
    success: bool
    message: str


def read_jtl(path: Path) -> list[Sample]:
    """Read every sample of a .jtl file; a ToolError when the file cannot be read as one."""
    text = path.read_text(encoding="utf-8", errors="replace")
    if text.lstrip().startswith("<"):
        raise cli.ToolError("an XML .jtl: run JMeter through testing/jmeter/run.sh, which writes CSV")
    # A failure message may span lines inside its quotes: let the csv module see the newlines.
    rows = [row for row in csv.reader(io.StringIO(text, newline="")) if row]
    has_header = bool(rows) and "success" in rows[0]
    header = rows[0] if has_header else list(_DEFAULT_CSV_COLUMNS)
    samples = []
    for row in rows[1:] if has_header else rows:
        if len(row) < len(header):
            raise cli.ToolError(f"a .jtl row has {len(row)} columns, the header {len(header)}: {row}")
        fields = dict(zip(header, row, strict=False))
        samples.append(Sample(int(fields["timeStamp"]), int(fields["elapsed"]), fields["label"],
                              fields["responseCode"], fields["success"] == "true",
                              fields.get("failureMessage") or fields.get("responseMessage", "")))
    return samples


def summary(samples: list[Sample]) -> str:
    """Describe a run: samples, failures, throughput and latency percentiles."""
    if not samples:
        return "no samples"
    elapsed = [s.elapsed_ms for s in samples]
    span_s = max((max(s.timestamp_ms + s.elapsed_ms for s in samples) - min(s.timestamp_ms for s in samples)) / 1000,
                 1e-3)
    failed = [s for s in samples if not s.success]
    p50, p95, p99 = (percentile(elapsed, q) for q in (50, 95, 99))
    lines = [f"{len(samples)} samples in {span_s:.1f} s ({len(samples) / span_s:.1f}/s), {len(failed)} failed; "
             f"latency ms p50 {p50} p95 {p95} p99 {p99} max {max(elapsed)}"]
    lines += [f"  FAIL {s.label} {s.code}: {' '.join(s.message.split())}" for s in failed[:10]]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1:
        print("usage: python -m testing.jtl RESULTS.jtl", file=sys.stderr)
        return 2
    path = Path(args[0])
    if not path.is_file():
        raise cli.ToolError(f"no results file at {path}")
    samples = read_jtl(path)
    print(summary(samples))
    return 0 if samples and all(s.success for s in samples) else 1


if __name__ == "__main__":
    cli.run(main, "testing.jtl")
