"""``python -m fairseq_tying.launch slurm/SWEEP.yaml ...``: one sweep (launch/sweeps.py);
``python -m fairseq_tying.launch new-sweep --data DIR ...``: write a sweep (launch/new_sweep.py);
``python -m fairseq_tying.launch study NAME ...``: a study of slurm/studies.yaml
(launch/studies.py)."""

from __future__ import annotations

import sys

from fairseq_tying.common.extras import run_main
from fairseq_tying.launch import new_sweep


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    if argv[:1] == ["new-sweep"]:  # write an equal-training sweep file for a prepared data dir
        return new_sweep.run(argv[1:])  # needs no extra
    if argv[:1] == ["study"]:  # a study of slurm/studies.yaml, by name
        # the other commands imported on use, so that a missing extra gets its message
        # (run_main): a sweep needs the launch extra, a study also the analysis extra (plots)
        from fairseq_tying.launch import studies

        return studies.run(studies.build_parser().parse_args(argv[1:]))
    from fairseq_tying.launch import sweeps

    parser = sweeps.build_parser()
    return sweeps.run(parser.parse_args(argv), parser)


if __name__ == "__main__":
    sys.exit(run_main(main))
