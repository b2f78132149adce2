"""Parameter counts per tying mode, like Press & Wolf (2017), Table 8.

    python -m fairseq_tying.core.params --arch transformer_twwt_wmt_en_de_big --src-vocab 32000 \
        --tgt-vocab 32000 [model flags]
    python -m fairseq_tying.core.params --arch dynamicconv_dwt_iwslt_de_en --data data-bin/iwslt14
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch
from fairseq.data import Dictionary
from fairseq.models import ARCH_CONFIG_REGISTRY, ARCH_MODEL_REGISTRY

import fairseq_tying.core  # noqa: F401  (registration)
from fairseq_tying.core.models.tying import TYING_MODES, UNTIED, tying_mode


class _Task:
    def __init__(self, src: Dictionary, tgt: Dictionary):
        self.source_dictionary, self.target_dictionary = src, tgt


def dummy_dictionary(size: int) -> Dictionary:
    d = Dictionary()
    for i in range(size - len(d)):
        d.add_symbol(f"tok{i}")
    return d


def dictionaries(args: argparse.Namespace) -> tuple[Dictionary, Dictionary]:
    if args.data:
        found = sorted(Path(args.data).glob("dict.*.txt"))
        if len(found) != 2:
            raise SystemExit(f"--data {args.data}: expected dict.SRC.txt and dict.TGT.txt "
                             f"from fairseq-preprocess, found {[p.name for p in found]}")
        src, tgt = (Dictionary.load(str(p)) for p in found)
        return src, tgt
    if not (args.src_vocab and args.tgt_vocab):
        raise SystemExit("give --data DIR or both --src-vocab N and --tgt-vocab M")
    src = dummy_dictionary(args.src_vocab)
    return src, src if args.tgt_vocab == args.src_vocab else dummy_dictionary(args.tgt_vocab)


def count(arch: str, model_argv: list[str], tying: str, task: _Task) -> tuple[int, int]:
    """(total, embedding) parameters of ``arch`` under ``tying``, built on the meta device."""
    model_cls = ARCH_MODEL_REGISTRY[arch]
    parser = argparse.ArgumentParser(argument_default=argparse.SUPPRESS)
    model_cls.add_args(parser)
    args = parser.parse_args([*model_argv, "--tying", tying])
    args.arch = arch
    ARCH_CONFIG_REGISTRY[arch](args)
    with torch.device("meta"):
        model = model_cls.build_model(args, task)
    embeddings = {id(m.weight): m.weight.numel() for m in (
        model.encoder.embed_tokens, model.decoder.embed_tokens, model.decoder.scorer)}
    return sum(p.numel() for p in model.parameters()), sum(embeddings.values())


def table(arch: str, model_argv: list[str], task: _Task) -> str:
    joined = task.source_dictionary == task.target_dictionary
    rows = {t: count(arch, model_argv, t, task) for t in TYING_MODES
            if not tying_mode(t).joined_dictionary or joined}
    untied_total = rows[UNTIED.name][0]
    lines = [f"{arch}: source vocabulary {len(task.source_dictionary)}, "
             f"target vocabulary {len(task.target_dictionary)}",
             "| tying | total parameters | embedding parameters | saving vs untied |",
             "|---|---:|---:|---:|"]
    for tying, (total, emb) in rows.items():
        saving = 1 - total / untied_total
        lines.append(f"| {tying} | {total:,} | {emb:,} | {saving:.1%} |")
    if not joined:
        lines.append("| three_way | needs a joined dictionary | | |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m fairseq_tying.core.params",
                                     description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--arch", required=True, choices=sorted(
        a for a, m in ARCH_MODEL_REGISTRY.items() if m.__module__.startswith("fairseq_tying")))
    parser.add_argument("--data", help="a fairseq-preprocess output dir (reads its dict files)")
    parser.add_argument("--src-vocab", type=int)
    parser.add_argument("--tgt-vocab", type=int)
    args, model_argv = parser.parse_known_args(argv)
    model_argv = [a for i, a in enumerate(model_argv)
                  if a != "--tying" and (i == 0 or model_argv[i - 1] != "--tying")]
    print(table(args.arch, model_argv, _Task(*dictionaries(args))))


if __name__ == "__main__":
    main(sys.argv[1:])
