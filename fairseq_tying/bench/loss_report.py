"""The tables of the loss benchmark (:mod:`.loss`): one per setup in docs/performance.md's
``loss_bench`` block, the peers' (``--peers``) in its ``loss_peers`` block, the README's summary
in its ``loss_summary`` block; read from the JSON reports alone (``--report-only``), so they
need neither torch nor a measurement."""

from __future__ import annotations

import os
from pathlib import Path

from fairseq_tying.common import blocks

MODELS = ("builtin", "chunked_old", "chunked")
LABELS = {"builtin": "built-in", "chunked_old": "torch's op", "chunked": "chunked"}
MIB = 2**20  # the tables give memory in MiB
TABLE_BLOCK, SUMMARY_BLOCK = "loss_bench", "loss_summary"  # --report's and --readme's blocks
PEER_BLOCK = "loss_peers"  # --report's block of the peers
PEERS = ("cross_entropy", "cce", "chunked")
PEER_LABELS = {"cross_entropy": "F.linear + cross_entropy", "cce": "CCE (torch_compile)",
               "chunked": "chunked"}
SUMMARY_TOKENS = "4096"  # the README's batch


def setups(report: dict) -> dict[str, dict]:
    """The report's setups by name ("cpu:fp32", ...), each with results by tokens, V and model.
    A report of the earlier layout (one setup and batch, its ``chunked`` computed by torch's op)
    is read into this one."""
    if "setups" in report:
        return report["setups"]
    config = report["config"]
    rename = {"builtin": "builtin", "chunked": "chunked_old"}
    results = {vocab: {new: res[old] for old, new in rename.items()}
               for vocab, res in report["results"].items()}
    entry = {"device": config["device"], "dtype": "fp16" if config["fp16"] else "fp32",
             "steps": config["steps"], "results": {str(config["tokens"]): results},
             "note": "This report measured --chunked-loss as torch's op computed it then; the "
                     "chunked column is not in it."}
    if "gpu" in report["machine"]:
        entry["gpu"] = report["machine"]["gpu"]
    if "max_tokens" in report:
        entry["max_tokens"] = {rename.get(k, k): v for k, v in report["max_tokens"].items()
                               if k != "ratio"}
    return {f"{entry['device']}:{entry['dtype']}": entry}


def _v(vocab: str | int) -> str:
    return f"{int(vocab) // 1000}k" if int(vocab) >= 1000 else str(vocab)


def _clock(entry: dict) -> tuple[str, str]:
    return ("CPU", "cpu_s") if entry["device"] == "cpu" else ("wall", "wall_s")


def _cells(res: dict, field: str, scale: float = MIB, fmt: str = "{:,.0f}") -> str:
    return " / ".join(fmt.format(res[m][field] / scale) if field in res.get(m, {}) else "—"
                      for m in MODELS)


def _ratio(res: dict, model: str, field: str, fmt: str = "{:.2f}") -> str:
    if field not in res.get(model, {}) or field not in res.get("builtin", {}):
        return "—"
    return fmt.format(res[model][field] / res["builtin"][field])


def _skipped(entry: dict) -> list[str]:
    """Each model's reason for not measuring, once, with the configurations it applies to
    (``every batch and V`` when it applies to all)."""
    configs = [(t, v, r) for t, by_vocab in entry["results"].items() for v, r in by_vocab.items()]
    notes = []
    for m in MODELS:
        reasons: dict[str, list[str]] = {}
        for t, v, r in configs:
            if "skipped" in r.get(m, {}):
                reasons.setdefault(r[m]["skipped"], []).append(f"{int(t):,} tokens, V = {_v(v)}")
        for reason, where in reasons.items():
            at = "every batch and V" if len(where) == len(configs) else "; ".join(where)
            notes.append(f"{LABELS[m]} ({at}): {reason}")
    return notes


def _unreached(report: dict, entry: dict) -> list[str]:
    """Configurations of the run's ``--tokens`` × ``--vocab`` that its report does not hold
    (the run ended before them)."""
    def listed(key: str) -> list:  # the first reports held one batch size, not a list
        value = report["config"].get(key, [])
        return value if isinstance(value, list) else [value]

    return [f"{int(t):,} tokens, V = {_v(v)}" for t in listed("tokens") for v in listed("vocab")
            if str(v) not in entry["results"].get(str(t), {})]


def setup_table(entry: dict, report: dict | None = None) -> str:
    """The markdown table of one setup: loss memory and step time by batch and V."""
    clock, key = _clock(entry)
    names = " / ".join(LABELS[m] for m in MODELS)
    rows = [f"| target tokens | V | loss extra MiB: {names} | chunked ÷ built-in memory "
            f"| step {clock} ms: {names} | torch's op ÷ built-in time "
            "| chunked ÷ built-in time |",
            "|---:|---:|---|---:|---|---:|---:|"]
    for tokens, by_vocab in entry["results"].items():
        for vocab, res in by_vocab.items():
            rows.append(f"| {int(tokens):,} | {_v(vocab)} | {_cells(res, 'loss_extra')} "
                        f"| {_ratio(res, 'chunked', 'loss_extra', '{:.3f}')} "
                        f"| {_cells(res, key, scale=1e-3, fmt='{:.1f}')} "
                        f"| {_ratio(res, 'chunked_old', key)} | {_ratio(res, 'chunked', key)} |")
    skipped = _skipped(entry)
    unreached = _unreached(report, entry) if report else []
    lines = ["\n".join(rows)]
    if "note" in entry:
        lines.append(entry["note"])
    if skipped:
        lines.append("Not measured: " + "; ".join(skipped) + ".")
    if report and "max_tokens" not in entry and not report["config"].get("no_max_tokens"):
        unreached.append("the largest-batch fit")
    if unreached:
        lines.append("Not in this report: " + "; ".join(unreached) + ".")
    if "max_tokens" in entry:
        mt = entry["max_tokens"]
        memory = "resident memory" if entry["device"] == "cpu" else "CUDA memory allocated"
        fitted = [m for m in MODELS if m in mt]
        points = ", ".join(str(t) for t, _ in mt[fitted[-1]]["points"])
        lines.append(
            f"Largest batch within {mt['budget_bytes'] / 2**30:g} GiB of peak {memory} at "
            f"V = {_v(mt['vocab'])}: "
            + ", ".join(f"{LABELS[m]} {mt[m]['max_tokens']:,} target tokens "
                        f"({mt[m]['bytes_per_token'] / 1024:.0f} KiB per token)" for m in fitted)
            + f" (fitted to {points} tokens).")
    return "\n\n".join(lines) + "\n"


def _heading(report: dict, entry: dict, link: str) -> str:
    machine = report["machine"]
    cores = f"{machine['cpu_count']} CPU cores"
    where = entry.get("gpu") or (f"{machine['cpu']}, {cores}" if "cpu" in machine else cores)
    clock, _ = _clock(entry)
    load = ""
    if "load_avg_start" in machine and "load_avg_end" in machine:
        load = (f", load average {machine['load_avg_start'][0]:.1f} at the start and "
                f"{machine['load_avg_end'][0]:.1f} at the end")
    threads = f", {report['config'].get('threads', 1)} torch thread" if clock == "CPU" else ""
    steps = entry["steps"]
    return (f"**{entry['device'].upper()} {entry['dtype']}** ({where}, torch {machine['torch']}"
            f"{threads}; the fastest of {steps} step{'s' * (steps != 1)}, {clock} time{load}; "
            f"[JSON]({link}))")


def tables(reports: list[tuple[Path, dict]], base: Path) -> str:
    """Every setup of the reports: a heading (machine, clock, link to the JSON relative to
    ``base``) and its table."""
    parts = []
    for path, report in reports:
        link = os.path.relpath(path, base)
        for entry in setups(report).values():
            parts.append(_heading(report, entry, link) + "\n\n" + setup_table(entry, report))
    return "\n".join(parts)


def peer_table(report: dict, link: str) -> str:
    """The peers' table of one report: the loss and backward of ``dot`` without smoothing, CPU
    time and memory, the chunked loss's over CCE's."""
    entry, machine = report["peers"], report["machine"]
    names = " / ".join(PEER_LABELS[m] for m in PEERS)
    lines = [f"**CPU fp32, loss and backward alone, ε = 0, D = {entry['dim']}** "
             f"({machine['cpu']}, {machine['cpu_count']} CPU cores, torch {machine['torch']}, "
             f"{report['config'].get('threads', 1)} torch thread; the fastest of "
             f"{entry['steps']} steps, CPU time, and the highest memory; [JSON]({link}))", "",
             f"| target tokens | V | CPU s: {names} | extra MiB: {names} "
             "| chunked ÷ CCE time | chunked ÷ CCE memory |", "|---:|---:|---|---|---:|---:|"]
    notes = []
    for tokens, by_vocab in entry["results"].items():
        for vocab, res in by_vocab.items():
            time = " / ".join(f"{res[m]['cpu_s']:.2f}" if "cpu_s" in res[m] else "—"
                              for m in PEERS)
            memory = " / ".join(f"{res[m]['loss_extra'] / MIB:,.0f}"
                                if "loss_extra" in res[m] else "—" for m in PEERS)
            ratios = [f"{res['chunked'][k] / res['cce'][k]:.2f}"
                      if k in res["chunked"] and k in res["cce"] else "—"
                      for k in ("cpu_s", "loss_extra")]
            lines.append(f"| {int(tokens):,} | {_v(vocab)} | {time} | {memory} | "
                         + " | ".join(ratios) + " |")
            notes += [f"{PEER_LABELS[m]} at {int(tokens):,} tokens, V = {_v(vocab)}: "
                      f"{res[m].get('skipped') or res[m]['error']}"
                      for m in PEERS if "cpu_s" not in res[m]]
    if notes:
        lines += ["", "Not measured: " + "; ".join(notes) + "."]
    return "\n".join(lines) + "\n"


def peer_tables(reports: list[tuple[Path, dict]], base: Path) -> str:
    return "\n".join(peer_table(report, os.path.relpath(path, base))
                     for path, report in reports if "peers" in report)


def summary(reports: list[dict]) -> str:
    """The README's table at 4,096 target tokens: by V, each setup that measured the chunked
    loss (the product's; torch's op alone is in the tables), its loss extra memory (built-in →
    torch's op → chunked) and step time over the built-in's."""
    entries = [e for r in reports for e in setups(r).values()
               if any("loss" in res.get("chunked", {})
                      for res in e["results"].get(SUMMARY_TOKENS, {}).values())]
    head, rule = ["V"], ["---:"]
    for e in entries:
        name = f"{e['device'].upper()} {e['dtype']}"
        head += [f"{name}: loss extra MiB, built-in → torch's op → chunked",
                 f"{name} time ÷ built-in: torch's op / chunked"]
        rule += ["---", "---"]
    rows = ["| " + " | ".join(head) + " |", "|" + "|".join(rule) + "|"]
    vocabs = sorted({v for e in entries for v in e["results"][SUMMARY_TOKENS]}, key=int)
    for vocab in vocabs:
        cells = [_v(vocab)]
        for e in entries:
            res = e["results"][SUMMARY_TOKENS].get(vocab)
            if res is None:
                cells += ["—", "—"]
                continue
            _, key = _clock(e)
            memory = [f"{res[m]['loss_extra'] / MIB:,.0f}" if "loss_extra" in res.get(m, {})
                      else "not measured" for m in MODELS]
            cells += [" → ".join(memory),
                      f"{_ratio(res, 'chunked_old', key)} / {_ratio(res, 'chunked', key)}"]
        rows.append("| " + " | ".join(cells) + " |")
    return "\n".join(rows) + "\n"


def publish(reports: list[tuple[Path, dict]], report_file: Path | None,
            readme: Path | None) -> None:
    """Write the tables into ``report_file``'s and the summary into ``readme``'s block, each
    from the reports that hold its measurements (the setups', the peers')."""
    with_setups = [(path, r) for path, r in reports if setups(r)]
    if report_file and with_setups:
        blocks.replace_block(report_file, TABLE_BLOCK, tables(with_setups, report_file.parent))
        print(f"wrote the {TABLE_BLOCK} block of {report_file}")
    if report_file and any("peers" in r for _, r in reports):
        blocks.replace_block(report_file, PEER_BLOCK, peer_tables(reports, report_file.parent))
        print(f"wrote the {PEER_BLOCK} block of {report_file}")
    reports = with_setups
    if readme and reports:
        blocks.replace_block(readme, SUMMARY_BLOCK, summary([r for _, r in reports]))
        print(f"wrote the {SUMMARY_BLOCK} block of {readme}")
