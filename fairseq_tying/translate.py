"""Translate raw text with a model exported by ``python -m fairseq_tying.export --format
ctranslate2``.

``python -m fairseq_tying.translate --model DIR [--input FILE] [--output FILE]`` reads one
source sentence per line (stdin by default), applies the subword model carried in DIR
(sentencepiece, or Moses tokenization + subword-nmt codes), decodes with CTranslate2 in batches
and writes one detokenized translation per line (stdout by default; a file is written
atomically). CTranslate2 appends ``</s>`` to each source and starts decoding from ``</s>``, as
fairseq does (set at export time), so the input is plain text without special tokens.

fairseq-generate's decoding flags map to CTranslate2's ``translate_batch`` options as follows
(``ct2_options``): ``--beam`` → ``beam_size``, ``--lenpen`` → ``length_penalty``,
``--max-len-b N`` (with ``--max-len-a 0``) → ``max_decoding_length=N`` (both count the tokens
before ``</s>``; at the bound fairseq forces ``</s>`` and scores it, CTranslate2 stops),
``--min-len`` →
``min_decoding_length``, ``--unkpen inf`` → ``disable_unk``, ``--no-repeat-ngram-size`` →
``no_repeat_ngram_size``, ``--nbest`` → ``num_hypotheses``.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import sentencepiece as spm
from subword_nmt.apply_bpe import BPE
from tqdm import tqdm

from fairseq_tying.common import LM_TASK
from fairseq_tying.common.atomic import write_lines
from fairseq_tying.common.extras import MissingExtra, require, run_main

META_FILE = "fairseq_tying.json"


class TranslateError(ValueError):
    """Bad input to the translate command (named flag or file)."""


def cuda_library_error(error: RuntimeError) -> RuntimeError:
    """CTranslate2's message for a CUDA library it cannot open, with what to do about it: its
    wheels open CUDA 12's cuBLAS by name, which a machine with only CUDA 13 lacks
    (OpenNMT/CTranslate2#1933)."""
    if "libcublas" not in str(error):
        return error
    return RuntimeError(f"{error}: CTranslate2's wheels need CUDA 12's cuBLAS. Install it "
                        "(pip install nvidia-cublas-cu12) and put its lib folder on "
                        "LD_LIBRARY_PATH, or decode with --device cpu")


def read_meta(model: Path) -> dict:
    meta = model / META_FILE
    if not (model / "model.bin").is_file():
        raise TranslateError(f"--model {model} is not a CTranslate2 model directory (no "
                             "model.bin); make one with python -m fairseq_tying.export CKPT "
                             f"{model} --format ctranslate2")
    if not meta.is_file():
        raise TranslateError(f"--model {model} has no {META_FILE} (how to segment raw text); "
                             "export it with python -m fairseq_tying.export --format ctranslate2")
    record = json.loads(meta.read_text())
    if record.get("task") == LM_TASK:
        raise TranslateError(f"--model {model} is a language model ({record['arch']}), which "
                             "translates nothing: load it with ctranslate2.Generator to score "
                             "or generate text (docs/language_models.md)")
    return record


def text_processors(model: Path, meta: dict) -> tuple[Callable[[str], list[str]],
                                                      Callable[[list[str]], str]]:
    """(raw sentence → source tokens, target tokens → detokenized sentence) for the model."""
    kind = meta.get("subword", "none")
    if kind == "sentencepiece":
        sp = spm.SentencePieceProcessor(model_file=str(model / meta["subword_model"]))
        return (lambda line: sp.encode(line, out_type=str)), sp.decode
    if kind == "subword_nmt":
        # imported for a Moses-tokenized model only: sacremoses (0.7 s) is kept off --help
        from fairseq_tying.common import moses

        with open(model / meta["subword_model"], encoding="utf-8") as f:
            bpe = BPE(f)
        src, tgt = meta["source_lang"], meta["target_lang"]

        def encode(line: str) -> list[str]:
            return bpe.segment(moses.tokenize(line, src)).split()

        def decode(tokens: list[str]) -> str:
            words = " ".join(tokens).replace("@@ ", "").removesuffix("@@").split()
            return moses.detokenize(words, tgt) if meta.get("detokenizer") == "moses" else " ".join(
                words)

        return encode, decode
    if kind == "none":
        return str.split, " ".join
    raise TranslateError(f"{model / META_FILE}: unknown subword {kind!r}")


def ct2_options(beam: int = 5, lenpen: float = 1.0, max_len_a: float = 0.0,
                max_len_b: int = 200, min_len: int = 1, unkpen: float = 0.0,
                no_repeat_ngram_size: int = 0, nbest: int = 1) -> dict:
    """CTranslate2 ``translate_batch`` options equivalent to fairseq-generate's flags."""
    if max_len_a != 0:
        raise TranslateError(f"--max-len-a {max_len_a}: CTranslate2 bounds the output length "
                             "per batch, not per source length; use --max-len-a 0 and "
                             "--max-len-b N")
    if unkpen not in (0.0, float("inf")):
        raise TranslateError(f"--unkpen {unkpen}: CTranslate2 can only forbid <unk> "
                             "(--unkpen inf, its disable_unk) or leave it (0)")
    if max_len_b < 1:
        raise TranslateError(f"--max-len-b {max_len_b}: must be at least 1")
    return {"beam_size": beam, "length_penalty": lenpen, "max_decoding_length": max_len_b,
            "min_decoding_length": min_len, "disable_unk": unkpen == float("inf"),
            "no_repeat_ngram_size": no_repeat_ngram_size, "num_hypotheses": nbest}


def batches(items: list, size: int) -> Iterator[list]:
    for start in range(0, len(items), size):
        yield items[start:start + size]


def translate_tokens(translator, sources: list[list[str]], options: dict, batch_size: int,
                     progress: bool = False) -> list[list[str]]:
    """Best hypothesis (tokens) for each tokenized source; empty sources give empty outputs."""
    out: list[list[str]] = [[] for _ in sources]
    todo = [i for i, s in enumerate(sources) if s]
    bar = tqdm(total=len(sources), unit="sent", disable=not progress, file=sys.stderr,
               desc="translate")
    bar.update(len(sources) - len(todo))
    for chunk in batches(todo, batch_size):
        try:
            results = translator.translate_batch([sources[i] for i in chunk], **options)
        except RuntimeError as e:
            raise cuda_library_error(e) from e
        for i, result in zip(chunk, results, strict=True):
            out[i] = result.hypotheses[0]
        bar.update(len(chunk))
    bar.close()
    return out


def ctranslate2():
    """The decoder (the ``serve`` extra)."""
    return require("ctranslate2", extra="serve", for_what="python -m fairseq_tying.translate")


def load_translator(model: Path, device: str = "cpu", compute_type: str = "default",
                    threads: int = 0):
    return ctranslate2().Translator(str(model), device=device, compute_type=compute_type,
                                    intra_threads=threads)


def translate_lines(model: Path, lines: list[str], options: dict, batch_size: int = 32,
                    device: str = "cpu", compute_type: str = "default", threads: int = 0,
                    progress: bool = False) -> list[str]:
    """Raw source sentences → detokenized translations."""
    meta = read_meta(model)
    encode, decode = text_processors(model, meta)
    translator = load_translator(model, device, compute_type, threads)
    sources = [encode(line) if line.strip() else [] for line in lines]
    hyps = translate_tokens(translator, sources, options, batch_size, progress)
    return [decode(h) if h else "" for h in hyps]


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m fairseq_tying.translate",
                                description=__doc__.split("\n\n")[0])
    p.add_argument("--model", type=Path, required=True,
                   help="CTranslate2 model directory written by fairseq_tying.export")
    p.add_argument("--input", type=Path, help="source sentences, one per line (default: stdin)")
    p.add_argument("--output", type=Path, help="where to write translations (default: stdout)")
    p.add_argument("--beam", type=int, default=5)
    p.add_argument("--lenpen", type=float, default=1.0)
    p.add_argument("--max-len-a", type=float, default=0.0)
    p.add_argument("--max-len-b", type=int, default=200)
    p.add_argument("--min-len", type=int, default=1)
    p.add_argument("--unkpen", type=float, default=0.0, help="0 or inf (forbid <unk>)")
    p.add_argument("--no-repeat-ngram-size", type=int, default=0)
    p.add_argument("--batch-size", type=int, default=32, help="sentences per batch")
    p.add_argument("--device", default="cpu", choices=("cpu", "cuda", "auto"))
    p.add_argument("--compute-type", default="default",
                   help="CTranslate2 compute type: default (as saved), float32, int8, "
                        "int8_float16, float16, ...")
    p.add_argument("--threads", type=int, default=0, help="CPU threads (0: CTranslate2's default)")
    p.add_argument("--no-progress", action="store_true")
    return p


def _read_input(path: Path | None) -> list[str]:
    if path is None:
        return [line.rstrip("\n") for line in sys.stdin]
    if not path.is_file():
        raise TranslateError(f"--input {path} does not exist")
    return path.read_text(encoding="utf-8").splitlines()


def main(argv: list[str] | None = None) -> int:
    opts = parser().parse_args(argv)
    try:
        if opts.batch_size < 1:
            raise TranslateError(f"--batch-size {opts.batch_size}: must be at least 1")
        read_meta(opts.model)
        ctranslate2()  # before reading the input
        options = ct2_options(opts.beam, opts.lenpen, opts.max_len_a, opts.max_len_b,
                              opts.min_len, opts.unkpen, opts.no_repeat_ngram_size)
        lines = _read_input(opts.input)
        out = translate_lines(opts.model, lines, options, opts.batch_size, opts.device,
                              opts.compute_type, opts.threads, progress=not opts.no_progress)
    except (TranslateError, ValueError, RuntimeError, MissingExtra) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    if opts.output is None:
        sys.stdout.write("".join(line + "\n" for line in out))
    else:
        write_lines(opts.output, out)
    return 0


if __name__ == "__main__":
    sys.exit(run_main(main))
