"""Name the processor of every committed record made before the tools recorded it.

A training record made by the launcher carries ``train.cpu`` (``common/reproducible.cpu_name``),
the demo's record and the serving reports ``machine.cpu``. The records committed before that
get the processor the repository's history names for them, from the table below: the record
files (``{a,b}`` expanded), the CPU and the commits whose messages or docs say so. Where the
history does not determine the processor, the value is "not recorded". A GPU record's
``train.cpu`` is its host's processor, which no GPU lease recorded.

    python scripts/mark_record_cpus.py          # write the key where it is missing
    python scripts/mark_record_cpus.py --check  # exit 1 if a record lacks it or disagrees

The key is inserted after ``device`` (the record schema's order) or, in an object without it,
as its first member; the rest of each file is unchanged.
A file is in one row only; a record that holds another value is an error, never overwritten;
``--check`` also fails on a committed record that is not in the table and names no CPU.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from fairseq_tying.common.atomic import write_text

REPO = Path(__file__).resolve().parent.parent
NOT_RECORDED = "not recorded"
XEON_25, XEON_22, EPYC = "Intel Xeon, 2.5 GHz", "Intel Xeon, 2.2 GHz", "AMD EPYC"
EQ = "docs/equal/records/bible.transformer_twwt"
DC = "docs/equal/records/bible.dynamicconv_twwt.three_way"
LM = "docs/lm/records/bible_en.transformer_lm_tied.decoder"
TW = "three_way.{dot,l2norm,sqnorm,distance,cosine}"
IWSLT = "bible.transformer_twwt_iwslt_de_en"

# (record files, {a,b} expanded, CPU, the commits that say so and what they say)
EVIDENCE: list[tuple[tuple[str, ...], str, str]] = [
    ((f"{EQ}.{TW}.s1.json", f"{EQ}.three_way.{{dot,l2norm,sqnorm}}.s2.json"), XEON_25,
     "66b4623 (E1 seed 1 dot, l2norm: 'the machine's CPU was then an Intel Xeon at 2.5 GHz'); "
     "f91b265, b3be574, c81ee49 (cost table: 'Intel Xeon, 2.5 GHz | E1 seed 1; seed 2 dot, "
     "l2norm, sqnorm | 282 epochs')"),
    ((f"{EQ}.three_way.{{distance,cosine}}.s2.json",), EPYC,
     "8d62b9c ('runs 9 and 10 (E1 seed 2 distance and cosine, from epoch 1) ... on an AMD "
     "EPYC'), c81ee49"),
    ((f"{EQ}.three_way.{{dot,l2norm}}.s3.json",), NOT_RECORDED,
     "dcdfcd3 names no machine; no cost-table row covers them"),
    ((f"{EQ}.three_way.{{sqnorm,distance}}.s3.json",), EPYC,
     "c81ee49 (cost table: 'AMD EPYC | E1 seed 3 sqnorm, distance | 76 epochs')"),
    ((f"{EQ}.three_way.cosine.s3.json", f"{DC}.dot.s1.json"), EPYC,
     "c81ee49, 0deb32c (cost table: 'AMD EPYC | E1 seed 3 cosine beside E2 dot seed 1, "
     "whole runs | 38 / 38')"),
    ((f"{DC}.l2norm.s{{1,2,3}}.json", f"{DC}.dot.s{{2,3}}.json"), NOT_RECORDED,
     "f637221, 89f44a9, 6cd9187, c741c9a name no machine; no cost-table row covers them"),
    ((f"{EQ}.none.dot.s1.json",), NOT_RECORDED,
     "c741c9a names no machine; e7d54ba: seed 1 was trained again 'on another machine than its "
     "record's (an Intel Xeon at 2.2 GHz)', the run the cost-table row of 7eef70d timed"),
    ((f"{EQ}.decoder.dot.s1.json", f"{EQ}.{{none,decoder}}.dot.s{{2,3}}.json"), XEON_22,
     "7eef70d, 9196d3b, 4c2d82e (cost table: 'Intel Xeon, 2.2 GHz | E3 seed 1/2/3 none and "
     "decoder | 77/75/76 epochs')"),
    (("docs/analysis/equal_e3/retrained/bible.transformer_twwt.none.dot.s1.json",), XEON_22,
     "e7d54ba ('trained by the same command on a second machine (an Intel Xeon at 2.2 GHz)'), "
     "7eef70d"),
    ((f"docs/converged/records/bible.transformer_twwt.{{none.dot,decoder.dot,{TW}}}"
      ".s{1,2,3}.json",), EPYC,
     "aafa13e ('Measured on the CPU (AMD EPYC, ...)', its first runs), 66b4623 ('P1's 4.1 "
     "minutes were measured on an AMD EPYC'), c81ee49 (cost table: 'AMD EPYC | P1 of the "
     "converged study'); a run moved to another machine started again from epoch 0 (144b00a)"),
    ((f"{LM}.{{l2norm,sqnorm}}.s{{1,2}}.json",
      f"{LM}.{{distance,cosine,dot.tiedL}}.s{{1,2,3}}.json"), EPYC,
     "d5ee0af, 6b3480f ('the four normalized layers, seed 1 (an AMD EPYC)'), dad692e, "
     "1f06b14 (their seed 2 'on that machine'), 6dbde7d ('the last five runs (seed 3 of "
     "distance and cosine, tied+L seeds 1-3) ... on that machine')"),
    ((f"{LM}.{{l2norm,sqnorm}}.s3.json",), NOT_RECORDED, "7b470c3 names no machine"),
    (("docs/lm/records/bible_en.transformer_lm_tied.{none,decoder}.dot.s{1,2,3}.json",),
     NOT_RECORDED,
     "fb8eb4a: seeds 1-2 and seed 3 'on two different machines of the same kind', no model "
     "named"),
    (("docs/study/records/bible.transformer_twwt.{none,decoder,three_way}."
      "{dot,l2norm,sqnorm,distance,cosine}.s{1,2,3}.json",), NOT_RECORDED,
     "af2677d: '2 CPU cores', no model named"),
    ((f"docs/converged_gpu/records/{IWSLT}.{{none,decoder}}.dot.s1.json",
      f"docs/converged_gpu/patience3/records/{IWSLT}.three_way.{{dot,l2norm}}.s{{1,2}}.json",
      f"docs/converged_gpu/patience3/records/{IWSLT}.three_way.{{sqnorm,distance,cosine}}"
      ".s1.json"), NOT_RECORDED,
     "594d388 (H200), 93626d8 (H100): the GPU leases recorded no host CPU"),
]
# where the processor goes: a machine report's ``machine``, a training record's ``train``
OBJECT = {"docs/demo/demo.json": "machine", "docs/serving/demo-": "machine"}
RECORDS = ("docs/*/records/*.json", "docs/*/*/records/*.json", "docs/analysis/*/retrained/*.json",
           "docs/demo/*.json", "docs/serving/*.json")


def expand(pattern: str) -> list[str]:
    """``pattern`` with each ``{a,b}`` group (nested or not) expanded, as a shell does."""
    start = pattern.find("{")
    if start < 0:
        return [pattern]
    depth, parts, last = 0, [], start + 1
    for i in range(start, len(pattern)):
        depth += {"{": 1, "}": -1}.get(pattern[i], 0)
        if depth == 1 and pattern[i] == ",":
            parts.append(pattern[last:i])
            last = i + 1
        elif depth == 0:
            parts.append(pattern[last:i])
            break
    head, tail = pattern[:start], pattern[i + 1:]
    return [out for part in parts for out in expand(head + part + tail)]


def table() -> dict[str, tuple[str, str]]:
    """Each record file of EVIDENCE: its CPU and the evidence."""
    out: dict[str, tuple[str, str]] = {}
    for patterns, cpu, why in EVIDENCE:
        for path in (p for pattern in patterns for p in expand(pattern)):
            if path in out or not (REPO / path).is_file():
                raise SystemExit(f"EVIDENCE: {path} is listed twice or is not a file")
            out[path] = (cpu, why)
    return out


def object_key(path: str) -> str:
    return next((key for prefix, key in OBJECT.items() if path.startswith(prefix)), "train")


def with_cpu(text: str, key: str, cpu: str) -> str:
    """``text`` with ``"cpu": cpu`` in its top-level object ``key``, the rest byte for byte (the
    file's own indentation). In a record's ``train`` the key goes where the record schema puts
    it (after ``device``, before ``continued_from``), so ``Record.save`` writes the file back
    unchanged; in the demo's and serving's ``machine`` it goes first."""
    lines = text.split("\n")
    unit = len(lines[1]) - len(lines[1].lstrip(" "))
    opening = f'{" " * unit}"{key}": {{'
    if lines.count(opening) != 1:
        raise SystemExit(f"expected one line {opening!r}")
    data = json.loads(text)
    names = list(data[key])
    if key == "train":
        after = [k for k in names if k != "continued_from"]
        position = names.index("device") + 1 if "device" in names else len(after)
    else:
        position = 0
    start = lines.index(opening) + 1
    # the line where each member of the object starts (its indentation is 2 units)
    starts = [i for i in range(start, len(lines))
              if lines[i].startswith(" " * 2 * unit + '"') and not lines[i][2 * unit + 1:]
              .startswith(" ")][:len(names)]
    member = f'{" " * 2 * unit}"cpu": {json.dumps(cpu, ensure_ascii=False)}'
    if position < len(names):
        lines.insert(starts[position], member + ",")
    else:  # after the last member: its closing line gets the comma
        close = next((i for i in range(start, len(lines))
                      if lines[i] in (f'{" " * unit}}}', f'{" " * unit}}},')), None)
        if close is None:
            raise SystemExit(f"no closing line of {key!r}")
        lines[close - 1] += ","
        lines.insert(close, member)
    items = list(data[key].items())
    data[key] = dict(items[:position] + [("cpu", cpu)] + items[position:])
    new = "\n".join(lines)
    if json.loads(new) != data or list(json.loads(new)[key]) != list(data[key]):
        raise SystemExit("the inserted line does not parse as the one new member")
    return new


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--check", action="store_true",
                        help="change nothing; exit 1 if a record lacks the key or disagrees")
    args = parser.parse_args(argv)
    wrong = []
    for path, (cpu, _) in table().items():
        key, text = object_key(path), (REPO / path).read_text(encoding="utf-8")
        have = json.loads(text)[key].get("cpu")
        if have == cpu:
            continue
        if have is not None or args.check:
            wrong.append(f"{path}: {key}.cpu is {have!r}, the evidence gives {cpu!r}")
            continue
        write_text(REPO / path, with_cpu(text, key, cpu))
        print(f"{path}: {key}.cpu = {cpu!r}")
    for path in sorted({p.relative_to(REPO).as_posix() for g in RECORDS for p in REPO.glob(g)}):
        if "cpu" not in json.loads((REPO / path).read_text())[object_key(path)]:
            wrong.append(f"{path}: no {object_key(path)}.cpu and not in EVIDENCE")
    if wrong:
        print("\n".join(wrong), file=sys.stderr)
    return 1 if wrong else 0


if __name__ == "__main__":
    sys.exit(main())
